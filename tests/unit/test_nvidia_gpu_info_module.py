"""The nvidia_gpu_info module run for real: `ansible localhost -m nvidia_gpu_info` with a local connection.

The module loads the simulated libnvidia-ml.so.1 (library=) and reads the description that
GPUFLEET_SIMGPU_CONFIG names; its output is compared with the nvidia-smi stand-in's.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT
from gpufleet.simgpu import NVIDIA_SMI, SimulatedMachine

BIN = Path(sys.executable).parent
H200_UUID = "GPU-1757f6d0-d02c-d95a-c569-55d572b0340a"


def run_module(args: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """Runs the module once on localhost; returns its result with `failed` set from Ansible's verdict.

    ansible-core's minimal callback prints "localhost | SUCCESS => {json}" or "localhost | FAILED! => {json}".
    """
    command = [
        str(BIN / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "gpufleet.fleet.nvidia_gpu_info",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    if check_mode:
        command.append("--check")
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
    }
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False
    )
    # A failure is also printed as an [ERROR] block before the result line.
    found = re.search(r"^localhost \| (SUCCESS|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, f"ansible did not run (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end() :])
    host_result["failed"] = found.group(1) == "FAILED!"
    assert (result.returncode != 0) == host_result["failed"], result.stderr
    return host_result


def nvidia_smi(machine: SimulatedMachine, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(machine.library.parent)}
    return subprocess.run(
        [sys.executable, str(NVIDIA_SMI), *arguments], capture_output=True, text=True, env=env, check=False
    )


@pytest.mark.parametrize("check_mode", [False, True])
def test_reads_the_h200_and_never_changes(simgpu_machine: SimulatedMachine, check_mode: bool) -> None:
    result = run_module({"library": str(simgpu_machine.library)}, check_mode=check_mode)
    assert result["changed"] is False and not result.get("failed")
    assert result["driver_version"] == "580.159.04"
    assert result["cuda_driver_version"] == "13.0"
    assert result["gpu_count"] == 1
    assert result["mismatches"] == []
    gpu = result["gpus"][0]
    assert (gpu["name"], gpu["uuid"], gpu["memory_total_mib"]) == ("NVIDIA H200", H200_UUID, 143771)


def test_expect_that_holds_passes(simgpu_machine: SimulatedMachine) -> None:
    expect = {
        "driver_version": "580.159.04",
        "cuda_driver_min": "12.8",
        "gpu_count": 1,
        "model": "H200",
        "min_memory_mib": 140000,
        "compute_capability": "9.0",
        "persistence": True,
        "ecc": True,
        "ecc_errors": 0,
        "retired_pages_pending": False,
        "row_remap_pending": False,
    }
    result = run_module({"library": str(simgpu_machine.library), "expect": expect}, check_mode=True)
    assert not result.get("failed") and result["changed"] is False and result["mismatches"] == []


def test_expect_fails_with_the_full_mismatch_list(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("gpu-count", "8")
    simgpu_machine.ctl("ecc-errors", "--gpu", "0", "12")
    simgpu_machine.ctl("persistence", "off", "--gpu", "3")
    simgpu_machine.ctl("lose", "--gpu", "6")
    expect = {"gpu_count": 8, "ecc_errors": 0, "persistence": True, "driver_version": "580.159.04"}
    result = run_module({"library": str(simgpu_machine.library), "expect": expect}, check_mode=True)
    assert result["failed"] is True and result["changed"] is False
    messages = [item["message"] for item in result["mismatches"]]
    assert messages[0] == f"GPU 0 ({H200_UUID}): 12 uncorrectable volatile ECC errors, expected at most 0"
    assert messages[1].startswith("GPU 3 (GPU-") and messages[1].endswith("persistence mode is off, expected on")
    assert messages[2].startswith("GPU 6 (uuid unknown): GPU is lost")
    assert len(messages) == 3
    assert result["msg"] == "3 mismatches with expect: " + "; ".join(messages)
    assert result["mismatches"][0] == {
        "gpu": 0,
        "uuid": H200_UUID,
        "field": "ecc_errors",
        "expected": 0,
        "actual": 12,
        "message": messages[0],
    }
    # The state is still returned so a drift run can use it.
    assert result["gpu_count"] == 8 and result["gpus"][6]["lost"] is True


@pytest.mark.parametrize(
    ("switch", "kind", "words"),
    [
        (("driver", "unload"), "driver_not_loaded", "couldn't communicate with the NVIDIA driver"),
        (("mismatch", "570.133.20"), "version_mismatch", "Driver/library version mismatch"),
    ],
)
def test_driver_failures_are_named(
    simgpu_machine: SimulatedMachine, switch: tuple[str, ...], kind: str, words: str
) -> None:
    simgpu_machine.ctl(*switch)
    result = run_module({"library": str(simgpu_machine.library)}, check_mode=True)
    assert result["failed"] is True and result["changed"] is False
    assert result["error_kind"] == kind
    assert words in result["msg"]
    assert "Traceback" not in json.dumps(result)


def test_missing_library_is_named(tmp_path: Path) -> None:
    result = run_module({"library": str(tmp_path / "libnvidia-ml.so.1")})
    assert result["failed"] is True and result["error_kind"] == "library_not_found"
    assert "install the NVIDIA driver" in result["msg"]


@pytest.mark.parametrize(
    ("expect", "words"),
    [
        ({"colour": "green"}, "colour"),
        ({"gpu_count": "eight"}, "gpu_count"),
        ({"cuda_driver_min": "twelve"}, "cuda_driver_min='twelve' is not a version like 12.8"),
    ],
)
def test_bad_expect_is_a_one_line_error(simgpu_machine: SimulatedMachine, expect: dict, words: str) -> None:
    result = run_module({"library": str(simgpu_machine.library), "expect": expect})
    assert result["failed"] is True
    assert words in result["msg"] and "\n" not in result["msg"]


def test_module_agrees_with_nvidia_smi(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("gpu-count", "4")
    simgpu_machine.ctl("ecc-errors", "--gpu", "2", "5")
    simgpu_machine.ctl("persistence", "off", "--gpu", "1")
    fields = [
        "index",
        "name",
        "uuid",
        "pci.bus_id",
        "driver_version",
        "compute_cap",
        "memory.total",
        "memory.used",
        "persistence_mode",
        "ecc.mode.current",
        "ecc.errors.uncorrected.volatile.total",
        "mig.mode.current",
        "power.limit",
        "temperature.gpu",
        "retired_pages.pending",
        "remapped_rows.pending",
    ]
    smi = nvidia_smi(simgpu_machine, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    assert smi.returncode == 0, smi.stderr
    rows = [dict(zip(fields, (value.strip() for value in row))) for row in csv.reader(smi.stdout.splitlines())]
    result = run_module({"library": str(simgpu_machine.library)}, check_mode=True)
    assert len(rows) == result["gpu_count"] == 4
    for row, gpu in zip(rows, result["gpus"]):
        assert int(row["index"]) == gpu["index"]
        assert row["name"] == gpu["name"] and row["uuid"] == gpu["uuid"] and row["pci.bus_id"] == gpu["pci_bus_id"]
        assert row["driver_version"] == result["driver_version"]
        assert row["compute_cap"] == gpu["compute_capability"]
        assert int(row["memory.total"]) == gpu["memory_total_mib"]
        assert int(row["memory.used"]) == gpu["memory_used_mib"]
        assert (row["persistence_mode"] == "Enabled") == gpu["persistence_mode"]
        assert (row["ecc.mode.current"] == "Enabled") == gpu["ecc_mode"]
        assert int(row["ecc.errors.uncorrected.volatile.total"]) == gpu["ecc_errors_uncorrected_volatile"]
        assert (row["mig.mode.current"] == "Enabled") == gpu["mig_mode"]
        assert float(row["power.limit"]) == gpu["power_limit_w"]
        assert int(row["temperature.gpu"]) == gpu["temperature_c"]
        assert row["retired_pages.pending"] == "[N/A]" and gpu["retired_pages_pending"] is None
        assert (row["remapped_rows.pending"] == "Yes") == gpu["row_remap_pending"]
    assert [gpu["persistence_mode"] for gpu in result["gpus"]] == [True, False, True, True]
    assert [gpu["ecc_errors_uncorrected_volatile"] for gpu in result["gpus"]] == [0, 0, 5, 0]


def test_nvidia_smi_table_header_matches_the_module(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("driver-version", "570.133.20", "--cuda", "12080")
    table = nvidia_smi(simgpu_machine).stdout.splitlines()
    result = run_module({"library": str(simgpu_machine.library)})
    header = table[2]
    assert f"Driver Version: {result['driver_version']}" in header
    assert f"CUDA Version: {result['cuda_driver_version']}" in header


def test_ansible_doc_renders_the_module() -> None:
    result = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "module", "gpufleet.fleet.nvidia_gpu_info"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "[WARNING]" not in result.stderr and "ERROR" not in result.stderr
    text = result.stdout
    for words in (
        "nvidia_gpu_info",
        "libnvidia-ml.so.1",
        "expect",
        "ecc_errors",
        "row_remap_pending",
        "EXAMPLES",
        "RETURN VALUES",
        "mismatches",
        "check_mode",
    ):
        assert words in text, words


def test_ansible_doc_json_has_suboptions_matching_the_argspec() -> None:
    result = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "module", "--json", "gpufleet.fleet.nvidia_gpu_info"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        check=True,
    )
    documented = json.loads(result.stdout)["gpufleet.fleet.nvidia_gpu_info"]["doc"]["options"]
    from ansible_collections.gpufleet.fleet.plugins.module_utils import nvml  # noqa: PLC0415

    assert set(documented) == {"library", "expect"}
    assert set(documented["expect"]["suboptions"]) == set(nvml.EXPECT_KEYS)
