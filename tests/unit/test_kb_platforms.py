"""Knowledge base, round three (issue 36 part 2): the wheels of a stack exist for its nodes' platform.

Primary facts, each read from PyPI's JSON API file list of the release on 2026-12-06 (stored, trimmed, in
tests/fixtures/compat_refresh/<name>-project.json) and recorded in data/compat/wheel_platforms.csv:
- vllm 0.9.2: vllm-0.9.2-cp38-abi3-manylinux1_x86_64.whl and vllm-0.9.2.tar.gz, no aarch64 wheel; vllm 0.10.2 is the
  first release with one (vllm-0.10.2-cp38-abi3-manylinux2014_aarch64.whl).
- vllm 0.20.0: vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl / _aarch64.whl (glibc >= 2.35); vllm 0.26.0:
  manylinux_2_28 on both architectures.
- flash-attn 2.8.3: flash_attn-2.8.3.tar.gz only (no wheel of any flash-attn release is on PyPI).
- torch 2.10.0 and 2.11.0: manylinux_2_28 wheels for x86_64 and aarch64; the aarch64 wheel of 2.10.0 is CPU-only
  (its METADATA restricts the CUDA runtime requirements to platform_machine == "x86_64"), that of 2.11.0 requires
  the CUDA runtime on every Linux (shared/data/compat/torch.csv, column pypi_linux_aarch64_cuda).
PEP 600: a manylinux_X_Y wheel installs on glibc >= X.Y; manylinux1 and manylinux2014 stand for glibc 2.5 and 2.17.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT, compat, compat_refresh

from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_artifacts, stack_declared

KB = compat.load_knowledge_base()
KB_DIR = PROJECT_ROOT / "data" / "compat"
STORED = PROJECT_ROOT / "tests" / "fixtures" / "compat_refresh"


def gh200(**overrides):
    """A GH200 node on Ubuntu 24.04 (glibc 2.39) with the H200 device machine's torch and vLLM 0.26.0."""
    base = {
        "gpu": ["NVIDIA GH200 480GB"],
        "driver": "580.159.04",
        "cuda": "13.0",
        "python": "3.12",
        "torch": "2.11.0",
        "torch_variant": "cu130",
        "vllm": "0.26.0",
        "platform": "manylinux_2_39_aarch64",
    }
    base.update(overrides)
    return base


def validate(raw, kb=KB):
    return stack_declared.validate_stack(stack_spec.normalize_stack(raw), kb)


def links(report, kind="errors"):
    return {entry["link"] for entry in report[kind]}


def messages(report, link, kind="errors"):
    return [entry["message"] for entry in report[kind] if entry["link"] == link]


def wheel_row(dist, version, arch):
    return [
        row
        for row in compat_refresh.read_csv(KB_DIR / "wheel_platforms.csv")
        if (row["distribution"], row["version"], row["arch"]) == (dist, version, arch)
    ][0]


# ---------------------------------------------------------------------------------------------------
# The table says what the file lists say


@pytest.mark.parametrize(
    "dist, version, arch, wheels, floor, sdist",
    [
        ("vllm", "0.9.2", "x86_64", "cp38-abi3:2.5", "2.5", "yes"),
        ("vllm", "0.9.2", "aarch64", "", "", "yes"),
        ("vllm", "0.10.2", "aarch64", "cp38-abi3:2.17", "2.17", "yes"),
        ("vllm", "0.20.0", "x86_64", "cp38-abi3:2.35", "2.35", "yes"),
        ("vllm", "0.20.0", "aarch64", "cp38-abi3:2.35", "2.35", "yes"),
        ("vllm", "0.34.0", "aarch64", "cp38-abi3:2.28", "2.28", "yes"),
        ("flash-attn", "2.8.3", "x86_64", "", "", "yes"),
        ("flash-attn", "2.8.3", "aarch64", "", "", "yes"),
        ("xformers", "0.0.30", "aarch64", "", "", "yes"),
        ("flashinfer-python", "0.7.2.post1", "aarch64", "py3-none:any", "any", "yes"),
    ],
)
def test_wheel_platforms_rows_are_the_file_lists(dist, version, arch, wheels, floor, sdist):
    row = wheel_row(dist, version, arch)
    assert (row["published"], row["wheels"], row["glibc_floor"], row["sdist"]) == ("yes", wheels, floor, sdist)
    assert f"PyPI's JSON API for {dist}" in row["source"] and "refreshed 2026-12-06" in row["source"]


@pytest.mark.parametrize(
    "name, version",
    [("vllm", "0.9.2"), ("vllm", "0.10.2"), ("vllm", "0.20.0"), ("vllm", "0.34.0"), ("flash-attn", "2.8.3")],
)
def test_the_rows_are_what_the_stored_file_list_gives(name, version):
    """The refresh's reading of the stored JSON answers reproduces the committed rows."""
    project = json.loads((STORED / f"{name}-project.json").read_text(encoding="utf-8"))
    fresh = compat_refresh.platform_rows(name, version, project, "2026-12-06")
    for row in fresh:
        committed = wheel_row(name, version, row["arch"])
        for column in ("published", "wheels", "glibc_floor", "sdist", "source"):
            assert row[column] == committed[column], (row["arch"], column)


@pytest.mark.parametrize(
    "tags, arch, floor",
    [
        ("manylinux1_x86_64", "x86_64", "2.5"),
        ("manylinux2014_aarch64", "aarch64", "2.17"),
        ("manylinux_2_17_x86_64.manylinux2014_x86_64", "x86_64", "2.17"),
        ("manylinux_2_35_aarch64", "x86_64", ""),
        ("any", "aarch64", "any"),
        ("macosx_14_0_arm64", "aarch64", ""),
        ("win_amd64", "x86_64", ""),
    ],
)
def test_platform_tag_floors(tags, arch, floor):
    assert stack_artifacts.wheel_tag_floor(tags, arch) == floor


# ---------------------------------------------------------------------------------------------------
# The validator


def test_gh200_stack_with_aarch64_wheels_is_compatible():
    report = validate(gh200(flash_attn="2.8.3"))
    assert report["errors"] == [] and report["warnings"] == [], (report["errors"], report["warnings"])
    facts = {fact["id"]: fact for fact in report["facts"]}
    assert "cp38-abi3 (glibc >= 2.28)" in facts["wheels:vllm==0.26.0:aarch64"]["statement"]
    assert "vllm-0.26.0-cp38-abi3-manylinux_2_28_aarch64.whl" in facts["wheels:vllm==0.26.0:aarch64"]["source"]
    assert "cu130 build" in facts["torch-build:2.11.0:aarch64"]["statement"]
    assert report["resolved"]["platform"] == "manylinux_2_39_aarch64"


def test_vllm_without_an_aarch64_wheel_is_refused_with_the_oldest_that_has_one():
    report = validate(gh200(torch="2.7.0", torch_variant="cu126", cuda="12.6", driver="575.57.08", vllm="0.9.2"))
    assert report["compatible"] is False
    (message,) = messages(report, "platform -> vllm")
    assert message.startswith("vllm 0.9.2 publishes no aarch64 wheel for manylinux_2_39_aarch64 (PyPI's file list")
    assert "refreshed 2026-12-06" in message
    assert "0.10.2 is the oldest that has one" in message
    assert "--only-binary=:all:" in message and "\n" not in message
    assert any(fact["id"] == "rule:wheelhouse_binary_only" for fact in report["facts"])


def test_a_wheel_above_the_nodes_glibc_is_refused_naming_the_floor():
    report = validate(gh200(vllm="0.20.0", platform="manylinux_2_31_x86_64", gpu=["H100"]))
    (message,) = messages(report, "platform -> vllm")
    assert "vllm 0.20.0's x86_64 wheels need glibc >= 2.35" in message
    assert "the platform manylinux_2_31_x86_64 has glibc 2.31" in message
    assert "0.21.0, …, 0.26.0 pin torch 2.11.0" in message  # releases whose wheels fit and pin the stack's torch
    assert "nodes with glibc >= 2.35 (platform: manylinux_2_35_x86_64)" in message
    assert any(fact["id"] == "rule:manylinux_glibc" for fact in report["facts"])


def test_the_same_wheel_fits_a_newer_glibc():
    report = validate(gh200(vllm="0.20.0", platform="manylinux_2_35_x86_64", gpu=["H100"]))
    assert not links(report) & {"platform -> vllm", "vllm -> pins", "torch -> platform"}, report["errors"]


def test_pins_above_the_nodes_glibc_are_named():
    """glibc 2.17 (manylinux2014, CentOS 7): vLLM 0.26.0's own wheel and its torch 2.11.0, torchvision 0.26.0 and
    torchaudio 2.11.0 pins are manylinux_2_28 only."""
    report = validate(gh200(platform="manylinux_2_17_aarch64"))
    assert {"platform -> vllm", "vllm -> pins", "torch -> platform"} <= links(report)
    pins = " ".join(messages(report, "vllm -> pins"))
    assert "pins torchvision==0.26.0, whose aarch64 wheels need glibc >= 2.28" in pins
    assert (
        "torch 2.11.0's aarch64 wheels (its cu130 build) need glibc >= 2.28" in messages(report, "torch -> platform")[0]
    )


def test_a_cuda_torch_that_pypi_ships_cpu_only_for_aarch64_is_a_warning_not_a_pass():
    report = validate(
        gh200(torch="2.10.0", torch_variant="cu128", cuda="12.8", driver="575.57.08", vllm="0.19.1", flash_attn="2.8.3")
    )
    assert report["errors"] == [], report["errors"]
    (torch_warning,) = messages(report, "torch -> platform", "warnings")
    assert "PyPI's aarch64 wheel of torch 2.10.0 is its cpu build (CPU only: no CUDA)" in torch_warning
    assert "unverified" in torch_warning
    (flash_warning,) = messages(report, "flash_attn -> platform", "warnings")
    assert "builds its sdist on the node with nvcc 12.8" in flash_warning


def test_without_a_platform_a_wheel_above_the_wheelhouse_default_is_warned():
    report = validate(gh200(vllm="0.20.0", platform=None, gpu=["H100"]))
    assert report["errors"] == []
    (warning,) = messages(report, "platform -> vllm", "warnings")
    assert "vllm 0.20.0's x86_64 wheels need glibc >= 2.35" in warning
    assert "the wheelhouse's default manylinux_2_28_x86_64 finds none" in warning


def test_without_the_table_the_check_says_it_did_not_run(tmp_path):
    kb = {key: value for key, value in KB.items() if key not in ("wheel_platforms", "vllm_installability")}
    kb["kb_dir"] = str(tmp_path)  # a knowledge base directory without wheel_platforms.csv
    report = validate(gh200(vllm="0.9.2", torch="2.7.0", torch_variant="cu126", cuda="12.6", driver="575.57.08"), kb)
    assert "platform -> vllm" not in links(report)
    (warning,) = messages(report, "platform", "warnings")
    assert "wheel_platforms.csv" in warning and "is not checked" in warning


@pytest.mark.parametrize("platform", ["linux_aarch64", "manylinux2014_aarch64", "manylinux_2_39_arm64", 2.39])
def test_a_malformed_platform_is_one_clear_line(platform):
    with pytest.raises(stack_spec.StackError) as caught:
        stack_spec.normalize_stack(gh200(platform=platform))
    assert "platform" in str(caught.value) and "\n" not in str(caught.value)


def test_the_wheelhouse_takes_the_stacks_platform_and_refuses_another():
    stack = stack_spec.normalize_stack(gh200())
    assert stack_artifacts.venv(stack, {})["platform"] == "manylinux_2_39_aarch64"
    assert stack_artifacts.venv(stack, {"platform": "manylinux_2_39_aarch64"})["platform"] == "manylinux_2_39_aarch64"
    with pytest.raises(stack_artifacts.ArtifactError) as caught:
        stack_artifacts.venv(stack, {"platform": "manylinux_2_39_x86_64"})
    assert "contradicts the stack's platform manylinux_2_39_aarch64" in str(caught.value)
    plain = stack_spec.normalize_stack(gh200(platform=None))
    assert stack_artifacts.venv(plain, {})["platform"] == "manylinux_2_28_x86_64"


def test_new_data_names_no_registry_host():
    for name in ("wheel_platforms.csv", "vllm_installability.csv", "currency.csv"):
        text = (KB_DIR / name).read_text(encoding="utf-8")
        assert "pypi.org" not in text and "pythonhosted" not in text, name
    assert isinstance(Path(STORED), Path)
