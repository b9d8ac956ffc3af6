"""The one parser per NVIDIA version format (plugins/module_utils/nvidia_versions.py), over real outputs.

The H200 rows come from tests/fixtures/h200-real and tests/unit/fixtures/compat (captured on the project's
H200); the others are the lab stand-ins' output (lab/runfiles) and the formats as NVIDIA prints them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT

from ansible_collections.gpufleet.fleet.plugins.module_utils import nvidia_versions, stack_host, stack_spec
from ansible_collections.gpufleet.fleet.plugins.module_utils.cuda_arch import ArchError, parse_capability

REAL = PROJECT_ROOT / "tests" / "fixtures" / "h200-real"
H200_FACTS = json.loads((Path(__file__).parent / "fixtures" / "compat" / "h200-stack-facts.json").read_text())
H200_NVCC = H200_FACTS["facts"]["nvcc_version"]
LAB_NVCC = (PROJECT_ROOT / "lab" / "runfiles" / "toolkit" / "nvcc.in").read_text()


def lab_nvcc_output(release: str, version: str) -> str:
    """What the lab's nvcc stand-in prints for a toolkit (its echo lines, with the build's substitutions)."""
    lines = [line.strip()[len('echo "') : -1] for line in LAB_NVCC.splitlines() if line.strip().startswith('echo "')]
    return "\n".join(lines[:-1]).replace("@RELEASE@", release).replace("@VERSION@", version)


def smi_compute_caps() -> list[str]:
    with (REAL / "nvidia-smi-query.csv").open(encoding="utf-8") as stream:
        return [row["compute_cap"] for row in csv.DictReader(stream, skipinitialspace=True)]


@pytest.mark.parametrize(
    ("output", "release", "version"),
    [
        (H200_NVCC, "13.0", "13.0.88"),
        (lab_nvcc_output("12.8", "12.8.93"), "12.8", "12.8.93"),
        ("Cuda compilation tools, release 11.8, V11.8.89", "11.8", "11.8.89"),
        ("bash: nvcc: command not found", None, None),
        ("", None, None),
        (None, None, None),
    ],
)
def test_nvcc_output(output: str | None, release: str | None, version: str | None) -> None:
    assert nvidia_versions.nvcc_release(output) == release
    assert nvidia_versions.nvcc_version(output) == version


def test_the_lab_stand_in_prints_nvidia_s_release_line() -> None:
    assert "Cuda compilation tools, release 12.8, V12.8.93" in lab_nvcc_output("12.8", "12.8.93").splitlines()


@pytest.mark.parametrize(("number", "text"), [(13000, "13.0"), (12080, "12.8"), (12090, "12.9"), (11080, "11.8")])
def test_nvml_cuda_version(number: int, text: str) -> None:
    assert nvidia_versions.nvml_cuda_version(number) == text


def test_nvml_cuda_version_of_the_h200() -> None:
    simulated = json.loads((PROJECT_ROOT / "lab" / "simgpu" / "h200.json").read_text())["driver"]
    real = json.loads((REAL / "nvidia_gpu_info.json").read_text())
    assert nvidia_versions.nvml_cuda_version(simulated["cuda_driver_version"]) == real["cuda_driver_version"]


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("Fabric Manager version is : 580.95.05\n", "580.95.05"),
        ("Fabric Manager version is : 570.124.06", "570.124.06"),
        ("nv-fabricmanager: error while loading shared libraries", None),
        ("", None),
    ],
)
def test_fabric_manager_version(output: str, version: str | None) -> None:
    assert nvidia_versions.fabric_manager_version(output) == version


def test_compute_capability_of_the_real_h200() -> None:
    caps = smi_compute_caps()
    assert caps == ["9.0"]
    assert [nvidia_versions.compute_capability(cap) for cap in caps] == [(9, 0)]


@pytest.mark.parametrize(
    ("text", "ptx", "capability"),
    [
        ("9.0", False, (9, 0)),
        (" 12.0 ", False, (12, 0)),
        ("sm_90", False, (9, 0)),
        ("sm_120", False, (12, 0)),
        ("sm_103", False, (10, 3)),
        ("compute_120", True, (12, 0)),
        ("compute_90", False, None),
        ("sm_90a", True, None),
        ("sm_9", True, None),
        ("9.10", False, None),
        ("90", False, None),
        ("", False, None),
        ("9.0.1", False, None),
        ("NVIDIA H200", True, None),
    ],
)
def test_compute_capability(text: str, ptx: bool, capability: tuple[int, int] | None) -> None:
    assert nvidia_versions.compute_capability(text, ptx=ptx) == capability


def test_callers_share_the_parser() -> None:
    """cuda_arch raises on what the parser refuses; the validator reports it as a malformed fact."""
    assert parse_capability("sm_90") == (9, 0)
    with pytest.raises(ArchError):
        parse_capability("compute_90")
    with pytest.raises(stack_spec.StackError, match="'sm_9' is not a compute capability"):
        stack_host.normalize_host_facts({"gpu_compute_capabilities": ["sm_9"]})
    facts = stack_host.normalize_host_facts(
        {
            "driver_cuda_version": "13000",
            "nvcc_version": H200_NVCC,
            "gpu_compute_capabilities": ["SM_90", "compute_120", [8, 6]],
        }
    )
    assert (facts["driver_cuda_version"], facts["nvcc_version"]) == ("13.0", "13.0")
    assert facts["gpu_compute_capabilities"] == ["9.0", "12.0", "8.6"]
