"""Knowledge base, round three (issue 36 part 3): a vLLM release whose own exact pins cannot be installed is recorded
as such by the refresh and refused by the plan, naming the pin.

Primary facts (stored in tests/fixtures/compat_refresh/, read on 2026-12-06):
- vllm 0.34.0's wheels (vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl and ..._aarch64.whl) carry
  `Requires-Dist: flashinfer-python==0.7.3` in their METADATA, beside torch==2.14.0, torchaudio==2.11.0 and
  torchvision==0.29.0;
- PyPI's JSON API for flashinfer-python lists 0.7.2.post1 and then 0.7.4: 0.7.3 was never published, so
  `pip install vllm==0.34.0` cannot resolve on any platform;
- vllm 0.33.0 pins flashinfer-python==0.7.2.post1 (published, a py3-none-any wheel) and the same torch 2.14.0;
- xformers 0.0.30 (pinned by vllm 0.9.2 on x86_64 only: `platform_machine == "x86_64"`) has manylinux_2_28_x86_64
  wheels and an sdist, no aarch64 wheel.
"""

from __future__ import annotations

import copy
import json
import shutil

from gpufleet import PROJECT_ROOT, compat, compat_refresh

from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_declared

from test_refresh_compat import loopback_pypi, serve_project  # noqa: F401 (the loopback index fixture)

KB = compat.load_knowledge_base()
KB_DIR = PROJECT_ROOT / "data" / "compat"
STORED = PROJECT_ROOT / "tests" / "fixtures" / "compat_refresh"
WHEEL = "vllm-0.34.0-cp38-abi3-manylinux_2_28_{arch}.whl"


def h200(**overrides):
    base = {
        "gpu": ["NVIDIA H200"],
        "driver": "580.159.04",
        "cuda": "13.0",
        "python": "3.12",
        "torch": "2.14.0",
        "torch_variant": "cu130",
        "vllm": "0.34.0",
    }
    base.update(overrides)
    return base


def validate(raw):
    return stack_declared.validate_stack(stack_spec.normalize_stack(raw), KB)


def stored(name):
    return json.loads((STORED / f"{name}-project.json").read_text(encoding="utf-8"))


def installability(dist, version, arch):
    return [
        row
        for row in compat_refresh.read_csv(KB_DIR / "vllm_installability.csv")
        if (row["distribution"], row["vllm_version"], row["arch"]) == (dist, version, arch)
    ][0]


def test_the_stored_index_never_published_the_pin():
    metadata = compat_refresh.parse_metadata(
        (STORED / f"{WHEEL.format(arch='aarch64')}.METADATA").read_text(encoding="utf-8")
    )
    assert compat_refresh.requirement(metadata, "flashinfer-python", "aarch64") == "==0.7.3"
    names = stored("flashinfer-python")["release_names"]
    assert "0.7.3" not in names and names.index("0.7.4") == names.index("0.7.2.post1") + 1


def test_the_release_is_recorded_as_not_installable_on_both_architectures():
    for arch in ("x86_64", "aarch64"):
        row = installability("vllm", "0.34.0", arch)
        assert row["status"] == "not-installable"
        assert row["missing"].startswith("flashinfer-python==0.7.3 (not published")
        assert "flashinfer-python==0.7.3" in row["pins"].split(";")
    assert "markers for aarch64" in installability("vllm", "0.34.0", "aarch64")["pins_source"]
    assert installability("vllm", "0.33.0", "aarch64")["status"] == "installable"


def test_plan_refuses_it_naming_the_pin_and_the_release_before():
    report = validate(h200())
    assert report["compatible"] is False
    (message,) = [error["message"] for error in report["errors"] if error["link"] == "vllm -> pins"]
    assert message.startswith("vllm 0.34.0 cannot be installed on x86_64: its own exact pin flashinfer-python==0.7.3")
    assert "lists no release 0.7.3" in message
    assert "choose vllm 0.33.0" in message and "it pins torch 2.14.0" in message
    fact = {fact["id"]: fact for fact in report["facts"]}["pins:vllm==0.34.0:x86_64"]
    assert "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl METADATA" in fact["source"]


def test_plan_refuses_it_on_aarch64_too():
    report = validate(h200(gpu=["NVIDIA GH200 480GB"], platform="manylinux_2_39_aarch64"))
    (message,) = [error["message"] for error in report["errors"] if error["link"] == "vllm -> pins"]
    assert "vllm 0.34.0 cannot be installed on aarch64" in message and "flashinfer-python==0.7.3" in message


def test_a_pin_with_no_wheel_for_the_architecture_is_missing():
    """Were a release to pin xformers 0.0.30 on aarch64 (vLLM's markers keep it to x86_64), the wheelhouse could not
    install it: sdist only."""
    rows = {
        ("vllm", "0.9.2", "aarch64"): {"wheels": "cp38-abi3:2.17", "glibc_floor": "2.17", "source": "test"},
        ("xformers", "0.0.30", "aarch64"): dict(
            compat_refresh.platform_rows("xformers", "0.0.30", stored("xformers"), "2026-12-06")[1]
        ),
    }
    row = compat_refresh.installability_row(
        "vllm", "0.9.2", "aarch64", ["xformers==0.0.30"], "test", rows, "2026-12-06"
    )
    assert row["status"] == "not-installable"
    assert row["missing"] == "xformers==0.0.30 (no aarch64 wheel; sdist only)"


def replay_kb(tmp_path, loopback, flashinfer_has_073=False):
    """A copy of data/compat without vllm 0.34.0's platform rows, on a loopback index of the stored answers."""
    root, base = loopback
    project = stored("vllm")
    wheels = {
        WHEEL.format(arch=arch): (
            "vllm-0.34.0.dist-info",
            (STORED / f"{WHEEL.format(arch=arch)}.METADATA").read_text(encoding="utf-8"),
            {},
        )
        for arch in ("x86_64", "aarch64")
    }
    serve_project(root, base, "vllm", project, wheels)
    flashinfer = stored("flashinfer-python")
    if flashinfer_has_073:
        # Not a fact: what the index would show had 0.7.3 been published (a pure-Python wheel like 0.7.2.post1's).
        flashinfer = copy.deepcopy(flashinfer)
        entry = dict(flashinfer["releases"]["0.7.2.post1"][-1])
        entry["filename"] = "flashinfer_python-0.7.3-py3-none-any.whl"
        flashinfer["releases"]["0.7.3"] = [entry]
    serve_project(root, base, "flashinfer-python", flashinfer, {})
    kb = tmp_path / "kb"
    shutil.copytree(KB_DIR, kb)
    for table, key, columns in (
        ("wheel_platforms.csv", "version", compat_refresh.PLATFORM_COLUMNS),
        ("vllm_installability.csv", "vllm_version", compat_refresh.INSTALL_COLUMNS),
    ):
        rows = [
            row
            for row in compat_refresh.read_csv(kb / table)
            if (row["distribution"], row[key]) not in (("vllm", "0.34.0"), ("flashinfer-python", "0.7.3"))
        ]
        compat_refresh.write_csv(kb / table, columns, rows)
    (tmp_path / "cache").mkdir()
    return kb, compat_refresh.MetadataCache(tmp_path / "cache")


def test_the_refresh_records_the_unpublished_pin(loopback_pypi, tmp_path, monkeypatch):  # noqa: F811
    _, base = loopback_pypi
    monkeypatch.setattr(compat_refresh, "PYPI_JSON", base + "/pypi/{name}/json")
    kb, cache = replay_kb(tmp_path, loopback_pypi)
    platforms, installs = compat_refresh.refresh_platforms(
        kb, compat_refresh.kb_tables(kb), cache=cache, today="2026-12-06", log=lambda _: None, scope={}
    )
    fresh = {compat_refresh.install_key(row): row for row in installs.rows}
    for arch in ("x86_64", "aarch64"):
        row = fresh[("vllm", "0.34.0", arch)]
        committed = installability("vllm", "0.34.0", arch)
        for column in ("status", "missing", "unverified", "glibc_floor", "pins"):
            assert row[column] == committed[column], (arch, column)
    assert "vllm_installability vllm 0.34.0 x86_64: new row (status 'not-installable'" in installs.changes[0]
    published = {compat_refresh.platform_key(row): row["published"] for row in platforms.rows}
    assert published[("flashinfer-python", "0.7.3", "x86_64")] == "no"
    assert len(installs.changes) == 2 and len(platforms.changes) == 4, (installs.changes, platforms.changes)


def test_a_pin_published_later_is_read_again(loopback_pypi, tmp_path, monkeypatch):  # noqa: F811
    _, base = loopback_pypi
    monkeypatch.setattr(compat_refresh, "PYPI_JSON", base + "/pypi/{name}/json")
    kb, cache = replay_kb(tmp_path, loopback_pypi, flashinfer_has_073=True)
    # The committed rows record 0.7.3 as never published; the refresh reads its file list again.
    shutil.copy(KB_DIR / "wheel_platforms.csv", kb / "wheel_platforms.csv")
    shutil.copy(KB_DIR / "vllm_installability.csv", kb / "vllm_installability.csv")
    _, installs = compat_refresh.refresh_platforms(
        kb, compat_refresh.kb_tables(kb), cache=cache, today="2026-12-07", log=lambda _: None, scope={}
    )
    fresh = {compat_refresh.install_key(row): row for row in installs.rows}
    assert fresh[("vllm", "0.34.0", "x86_64")]["status"] == "installable"
    assert any("vllm 0.34.0 x86_64: status 'not-installable' -> 'installable'" in change for change in installs.changes)
