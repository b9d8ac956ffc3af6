"""Arch-list coverage rules (cuda_arch.py), checked by hand on known GPUs and against torch's own table."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from test_torch_probe_venvs import TORCH_CPU_REQUIREMENTS, cached_venv

from ansible_collections.gpufleet.fleet.plugins.module_utils.cuda_arch import (
    ArchError,
    arch_coverage,
    gpu_coverage,
    parse_arch,
    parse_capability,
    runs_on,
)

H200 = (9, 0)
# torch.cuda.get_arch_list() of torch 2.11.0+cu130 on the real H200 (tests/unit/data/torch_stack_info_h200.json);
# the same set as PYTORCH_RELEASES_CODE_CC["13.0"]["x86_64"] in torch/cuda/__init__.py. No PTX in it.
CU130_ARCH_LIST = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
DEVICES = [
    (5, 0),
    (5, 2),
    (5, 3),
    (6, 0),
    (6, 1),
    (6, 2),
    (7, 0),
    (7, 2),
    (7, 5),
    (8, 0),
    (8, 6),
    (8, 7),
    (8, 9),
    (9, 0),
    (10, 0),
    (10, 1),
    (10, 3),
    (11, 0),
    (12, 0),
    (12, 1),
]


@pytest.mark.parametrize(
    ("text", "capability"),
    [("9.0", (9, 0)), ("8.6", (8, 6)), ("12.0", (12, 0)), (" 10.3 ", (10, 3)), ("sm_90", (9, 0)), ("sm_120", (12, 0))],
)
def test_parse_capability(text: str, capability: tuple[int, int]) -> None:
    assert parse_capability(text) == capability


@pytest.mark.parametrize("text", ["9", "90", "sm90", "9.0.1", "", "compute_90", "sm_9"])
def test_parse_capability_refuses_garbage(text: str) -> None:
    with pytest.raises(ArchError, match="is not a compute capability"):
        parse_capability(text)


@pytest.mark.parametrize(
    ("entry", "parsed"),
    [
        ("sm_90", ("sass", (9, 0), "")),
        ("sm_90a", ("sass", (9, 0), "a")),
        ("sm_100f", ("sass", (10, 0), "f")),
        ("compute_120", ("ptx", (12, 0), "")),
        ("compute_90a", ("ptx", (9, 0), "a")),
        ("sm_121", ("sass", (12, 1), "")),
    ],
)
def test_parse_arch(entry: str, parsed: tuple) -> None:
    assert parse_arch(entry) == parsed


@pytest.mark.parametrize("entry", ["sm_9", "gfx90a", "sm_90x", "compute90", ""])
def test_parse_arch_refuses_garbage(entry: str) -> None:
    with pytest.raises(ArchError):
        parse_arch(entry)


@pytest.mark.parametrize(
    ("entry", "device", "runs"),
    [
        ("sm_90", H200, True),
        ("sm_80", (8, 6), True),
        ("sm_80", (8, 9), True),  # same major, higher minor
        ("sm_86", (8, 0), False),  # never a lower minor
        ("sm_80", H200, False),
        ("sm_90", (10, 0), False),  # never across majors
        ("sm_90", (8, 9), False),
        ("compute_90", (10, 0), True),
        ("compute_90", (12, 0), True),
        ("compute_90", (8, 9), False),  # PTX JIT forward
        ("sm_90a", H200, True),
        ("sm_90a", (9, 1), False),
        ("compute_90a", (10, 0), False),  # arch-specific
        ("sm_100f", (10, 3), True),
        ("sm_100f", (12, 0), False),
        ("compute_100f", (10, 3), True),  # family
        ("compute_100f", (11, 0), False),
        ("sm_80", (8, 7), False),
        ("sm_87", (8, 9), False),
        ("sm_87", (8, 7), True),  # integrated Orin
        ("sm_100", (10, 1), False),
        ("sm_101", (11, 0), True),  # Thor renamed sm_101 -> sm_110
    ],
)
def test_runs_on(entry: str, device: tuple[int, int], runs: bool) -> None:
    assert runs_on(entry, device) is runs


def test_cu130_wheel_covers_an_h200_with_native_code() -> None:
    coverage = gpu_coverage(CU130_ARCH_LIST, H200)
    assert coverage["covered"] is True
    assert coverage["sass"] == ["sm_90"] and coverage["ptx"] == []


def test_ptx_only_coverage_is_reported_as_jit() -> None:
    coverage = gpu_coverage(["sm_80", "sm_90", "compute_90"], (12, 0))
    assert coverage["covered"] is True
    assert coverage["sass"] == [] and coverage["ptx"] == ["compute_90"]
    assert "JIT-compiling PTX compute_90" in coverage["note"]


def test_uncovered_gpu_says_what_will_fail() -> None:
    coverage = gpu_coverage(["sm_80", "sm_86"], H200)
    assert coverage["covered"] is False
    assert coverage["note"] == "nothing in the arch list runs on sm_90: expect 'no kernel image is available'"


def test_arch_coverage_of_several_gpus() -> None:
    gpus = [
        {"index": 0, "name": "NVIDIA H200", "capability": "9.0", "source": "torch"},
        {"capability": "12.0", "source": "gpu_capabilities"},
    ]
    covers_all, per_gpu = arch_coverage(["sm_80", "sm_90", "gfx90a"], gpus)
    assert covers_all is False
    assert [item["covered"] for item in per_gpu] == [True, False]
    assert per_gpu[0]["name"] == "NVIDIA H200" and per_gpu[1]["source"] == "gpu_capabilities"
    assert per_gpu[0]["unparsed"] == ["gfx90a"]


def test_cu130_wheel_has_no_code_for_a_newer_major() -> None:
    # Without PTX in the list, a GPU of a major the wheel was not built for gets nothing.
    assert gpu_coverage(CU130_ARCH_LIST, (11, 0))["covered"] is False
    assert gpu_coverage(CU130_ARCH_LIST, (12, 1))["sass"] == ["sm_120"]


def test_no_gpu_means_no_answer() -> None:
    assert arch_coverage(CU130_ARCH_LIST, []) == (None, [])


def test_sass_rules_agree_with_torchs_device_requirement_table() -> None:
    # torch/cuda/__init__.py DEVICE_REQUIREMENT maps each SASS target torch can be built for to the devices
    # that can run it; torch uses it to warn about unsupported GPUs. Compare every pair with runs_on().
    python = str(cached_venv("torch-cpu", TORCH_CPU_REQUIREMENTS) / "bin" / "python")
    code = (
        "import json, torch.cuda as c\n"
        "devices = %s\n"
        "print(json.dumps({str(code): [d for d in devices if 10 * d[0] + d[1] in c.DEVICE_REQUIREMENT[code]]"
        " for code in c.DEVICE_REQUIREMENT}))" % json.dumps(DEVICES)
    )
    completed = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONWARNINGS="ignore")
    )
    torch_table = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(torch_table) >= 15
    for code, torch_devices in torch_table.items():
        entry = "sm_%s" % code
        ours = [list(device) for device in DEVICES if runs_on(entry, device)]
        assert ours == torch_devices, entry
