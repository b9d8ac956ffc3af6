"""The gpu_health module run for real on localhost against the simulated GPU, and its log parsing on real lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT
from gpufleet.simgpu import SimulatedMachine
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_health import (
    kernel_log_this_boot,
    parse_xids,
    xid_problems,
)

BIN = Path(sys.executable).parent
# Real driver lines: NVIDIA/NVSentinel#155 (XID 79), stas00/ml-engineering's debug guide (XID 63).
REAL_XID_79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
REAL_XID_63 = (
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."
)
# What the H200 device machine's kernel printed at boot (tests/fixtures/h200-real/fabric_and_kernel_log.txt): no XID.
H200_LOG = (PROJECT_ROOT / "tests/fixtures/h200-real/fabric_and_kernel_log.txt").read_text().splitlines()


def run_gpu_health(args: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    command = [
        str(BIN / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "gpufleet.fleet.gpu_health",
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
    found = re.search(r"^localhost \| (SUCCESS|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, f"ansible did not run (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end() :])
    host_result["failed"] = found.group(1) == "FAILED!"
    return host_result


@pytest.fixture
def kernel_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kern.log"
    monkeypatch.setenv("GPUFLEET_SIMGPU_KERNEL_LOG", str(path))
    return path


def module_args(machine: SimulatedMachine, log: Path, **extra: Any) -> dict[str, Any]:
    return {"library": str(machine.library), "kernel_log": str(log), "dcgm_level": 0, **extra}


def test_real_lines_parse() -> None:
    events = parse_xids([REAL_XID_79, REAL_XID_63, *H200_LOG])
    assert [(event["pci"], event["xid"]) for event in events] == [("0000:44:00", 79), ("0000:10:1c", 63)]
    assert parse_xids(H200_LOG) == []


def test_an_earlier_boot_does_not_count() -> None:
    lines = [
        "Nov 30 kernel: Linux version 6.1.0",
        "Nov 30 kernel: " + REAL_XID_79,
        "Dec 01 kernel: Linux version 6.1.0",
        "Dec 01 kernel: " + REAL_XID_63,
    ]
    assert [event["xid"] for event in parse_xids(kernel_log_this_boot(lines))] == [63]


def test_repeated_xids_are_one_problem_and_application_errors_are_ignored() -> None:
    app = "NVRM: Xid (PCI:0000:44:00): 13, pid=7, Graphics Exception"
    problems = xid_problems(parse_xids([REAL_XID_79, REAL_XID_79, app]), ignore=[13])
    assert len(problems) == 1 and problems[0]["count"] == 2
    assert "fallen off the bus" in problems[0]["message"] and problems[0]["message"].endswith("2 times")


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_healthy_h200_passes(simgpu_machine: SimulatedMachine, kernel_log: Path, check_mode: bool) -> None:
    result = run_gpu_health(module_args(simgpu_machine, kernel_log), check_mode)
    assert not result["failed"] and result["healthy"] and result["changed"] is False
    assert result["kernel_log_error"] is not None  # no kernel log file yet: said, not passed silently
    simgpu_machine.ctl("xid", "13")  # an application's error: logged, ignored
    result = run_gpu_health(module_args(simgpu_machine, kernel_log), check_mode)
    assert result["healthy"] and [event["xid"] for event in result["xids"]] == [13]
    assert result["kernel_log_error"] is None


@pytest.mark.parametrize(
    "break_it, check, words",
    [
        (("xid", "79"), "xid", "XID 79 on the GPU at PCI 0000:00:06 since boot (GPU has fallen off the bus)"),
        (("ecc-errors", "3"), "ecc", "3 uncorrectable volatile ECC errors"),
        (("row-remap", "--uncorrected", "1", "--pending"), "row_remap", "a row remapping is pending"),
        (("row-remap", "--uncorrected", "1", "--failure"), "row_remap", "row remapping failed"),
        (("lose",), "lost", "is lost (fell off the bus)"),
        (("mismatch", "570.133.20"), "nvml", "Driver/library version mismatch"),
    ],
)
def test_each_failure_fails_the_gate(
    simgpu_machine: SimulatedMachine, kernel_log: Path, break_it: tuple[str, ...], check: str, words: str
) -> None:
    simgpu_machine.ctl(*break_it)
    result = run_gpu_health(module_args(simgpu_machine, kernel_log))
    assert result["failed"] and not result["healthy"]
    assert [problem["check"] for problem in result["problems"]] == [check]
    assert words in result["problems"][0]["message"] and words in result["msg"]
    report_only = run_gpu_health(module_args(simgpu_machine, kernel_log, fail=False))
    assert not report_only["failed"] and not report_only["healthy"]


def test_no_dcgm_installed_is_said(simgpu_machine: SimulatedMachine, kernel_log: Path) -> None:
    assert run_gpu_health(module_args(simgpu_machine, kernel_log, dcgm_level=1))["dcgm"]["ran"] is False


def test_drift_layer_result_gets_the_xids(simgpu_machine: SimulatedMachine, kernel_log: Path) -> None:
    probe = {"layer": "gpu_health", "status": "ok", "drift": [], "errors": [], "checked": 1, "notes": []}
    clean = run_gpu_health(
        module_args(simgpu_machine, kernel_log, fail=False, drift_layer_result=probe), check_mode=True
    )
    assert clean["gpufleet_drift"] == probe
    simgpu_machine.ctl("xid", "79")
    simgpu_machine.ctl("ecc-errors", "2")  # drift_probe's gpus check reports ECC itself: not added twice
    drifted = run_gpu_health(
        module_args(simgpu_machine, kernel_log, fail=False, drift_layer_result=probe), check_mode=True
    )["gpufleet_drift"]
    assert drifted["status"] == "drifted" and [entry["field"] for entry in drifted["drift"]] == ["xid 79"]
    assert drifted["drift"][0]["actual"].endswith(
        "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
