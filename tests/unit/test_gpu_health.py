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
    dcgm_problems,
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


def run_gpu_health(args: dict[str, Any], check_mode: bool = False, module: str = "gpu_health") -> dict[str, Any]:
    command = [
        str(BIN / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        f"gpufleet.fleet.{module}",
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


def test_drift_reads_the_xids_beside_nvml_in_one_module_run(simgpu_machine: SimulatedMachine, kernel_log: Path) -> None:
    """Drift's gpu_health layer: drift_probe's gpus check (NVML) and gpu_faults (this boot's XIDs, DCGM's verdict)."""
    checks = [
        {"kind": "gpus", "library": str(simgpu_machine.library), "expect": {"ecc_errors": 0}},
        {"kind": "gpu_faults", "kernel_log": str(kernel_log), "xid_ignore": [13, 31, 43, 45], "dcgm_level": 0},
    ]
    args = {"layer": "gpu_health", "checks": checks}
    kernel_log.write_text("")  # a booted node's log, no XID yet
    clean = run_gpu_health(args, check_mode=True, module="drift_probe")["gpufleet_drift"]
    assert (clean["status"], clean["drift"], clean["errors"], clean["notes"]) == ("ok", [], [], [])
    simgpu_machine.ctl("xid", "79")
    simgpu_machine.ctl("xid", "13")  # an application's own fault, ignored by default
    simgpu_machine.ctl("ecc-errors", "2")  # the gpus check reports ECC: gpu_faults does not report it again
    drifted = run_gpu_health(args, check_mode=True, module="drift_probe")["gpufleet_drift"]
    assert drifted["status"] == "drifted"
    assert [(entry["field"], entry["expected"]) for entry in drifted["drift"]] == [
        ("ecc_errors", 0),
        ("xid 79", "none since boot"),
    ]
    assert drifted["drift"][1]["actual"].endswith(
        "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    unreadable = [checks[0], {**checks[1], "kernel_log": str(kernel_log.parent / "missing.log")}]
    noted = run_gpu_health({**args, "checks": unreadable}, check_mode=True, module="drift_probe")["gpufleet_drift"]
    assert noted["notes"] and noted["notes"][0].startswith("XIDs not checked: cannot read ")


# Real dcgmi diag outputs, where each came from and what was changed: tests/fixtures/dcgm/README.md.
DCGM = PROJECT_ROOT / "tests/fixtures/dcgm"
# dcgmi prints no exit status and none of the sources gives it: the parser must not depend on it for the
# outputs that have test results (226 = DCGM_ST_NVVS_ERROR, NVIDIA/DCGM#158; DCGM 4 exits so on a warning too).
DCGM_EXIT_STATUSES = (0, 226)
CUINIT = (
    "Error using CUDA API cuInit Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun "
    "diagnostics. Unable to initialize CUDA library: 'system not yet initialized'. . Please check if a CUDA "
    "sample program can be run successfully on this host. Refer to https://github.com/nvidia/cuda-samples"
)
PCIE_CHILD = (
    "There was an internal error during the test: 'A child process (%d) exited with non-zero status 1' Check DCGM "
    "and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
)
PCIE_PARSE = (
    "There was an internal error during the test: 'Output of child process (%d) couldn't be parsed: '* Line 1, "
    "Column 1 Syntax error: value, object or array expected. '' Check DCGM and system logs for errors. Reset GPU. "
    "Restart DCGM. Rerun diagnostics."
)
DIAGNOSTIC_INFO = (
    "Allocated space for 138 output matricies from 76077622886 bytes available.; "
    "Running with precisions: FP64 1, FP32 1, FP16 1"
)


def dcgm_failure(test: str, gpus: list[int], where: str, evidence: str, rc: int) -> dict[str, Any]:
    return {
        "check": "dcgm",
        "gpu": gpus[0] if len(gpus) == 1 else None,
        "gpus": gpus,
        "test": test,
        "evidence": "%s: %s" % (test, evidence),
        "message": "DCGM diagnostic level 2: test %s failed%s (dcgmi exit status %d): %s: %s"
        % (test, where, rc, test, evidence),
    }


def test_every_dcgm_fixture_is_tested() -> None:
    fixtures = {path.name for path in DCGM.iterdir() if path.name != "README.md"}
    tested = set(DCGM_PASSING) | {name for name, _ in DCGM_FAILING} | {name for name, _ in DCGM_NOT_RUN}
    assert fixtures == tested
    readme = (DCGM / "README.md").read_text()
    assert all("`%s`" % name in readme for name in fixtures)


# Pass, Skip and Info only (DCGM 3 table and JSON), or Pass only (DCGM 4 table and JSON).
DCGM_PASSING = (
    "dcgm3-r3-pass-skip.txt",
    "dcgm3-r3-skip-excerpt.json",
    "dcgm4-r2-pass.txt",
    "dcgm4-r3-pass-excerpt.json",
)


@pytest.mark.parametrize("rc", DCGM_EXIT_STATUSES)
@pytest.mark.parametrize("name", DCGM_PASSING)
def test_a_passing_dcgm_run_has_no_problem(name: str, rc: int) -> None:
    assert dcgm_problems(rc, (DCGM / name).read_text(), 2) == []


DCGM_FAILING = (
    # DCGM 3.3.8 table, `GPU Memory  Fail - All`, a Warning for each of 8 GPUs; the Persistence Mode Info of a
    # passing test is not evidence.
    (
        "dcgm3-r3-fail-memory.txt",
        lambda rc: [
            dcgm_failure(
                "GPU Memory",
                [],
                " on all GPUs",
                "GPU 0 %s; GPU 1 %s; and 6 more" % (CUINIT, CUINIT),
                rc,
            )
        ],
    ),
    # DCGM 3.3.1 table: `Pass - GPU: 1` then `Fail - GPU: 0`, then `Fail - All` with and without a Warning.
    (
        "dcgm3-r3-excerpt-fail-gpu0.txt",
        lambda rc: [
            dcgm_failure(
                "GPU Memory",
                [0],
                " on GPU 0",
                "GPU 0 Error using CUDA API cuCtxCreate Check DCGM and system logs for errors. Reset GPU. Restart "
                "DCGM. Rerun diagnostics. Unable to create CUDA context: 'CUDA-capable device(s) is/are busy or "
                "unavailable'.",
                rc,
            ),
            dcgm_failure(
                "Diagnostic",
                [],
                " on all GPUs",
                "GPU 0 API call cuMemGetInfo failed: 'context is destroyed' Check DCGM and system logs for errors. "
                "Reset GPU. Restart DCGM. Rerun diagnostics.",
                rc,
            ),
            dcgm_failure("Targeted Stress", [], " on all GPUs", "Fail", rc),
        ],
    ),
    # DCGM 3 JSON: gpu_id "0" of GPU Memory has status Fail and a warning.
    (
        "dcgm3-r3-fail-memory-adapted.json",
        lambda rc: [dcgm_failure("GPU Memory", [0], " on GPU 0", "GPU 0 " + CUINIT, rc)],
    ),
    # DCGM 4.2.3 table: pcie Fail with four global Warnings, every GPU row Pass: no GPU named.
    (
        "dcgm4-fail-pcie-4.2.3.txt",
        lambda rc: [
            dcgm_failure("pcie", [], "", "%s; %s; and 2 more" % (PCIE_CHILD % 152, PCIE_CHILD % 153), rc),
        ],
    ),
    # DCGM 4.4.1 table, 8 GPUs: pcie Fail with one global Warning.
    (
        "dcgm4-r2-fail-pcie.txt",
        lambda rc: [dcgm_failure("pcie", [], "", PCIE_PARSE % 11167, rc)],
    ),
    # DCGM 4 JSON: entity_id 2 and the test_summary Fail, no warning: the failing GPU's info is the evidence.
    (
        "dcgm4-r3-fail-gpu2-adapted.json",
        lambda rc: [dcgm_failure("diagnostic", [2], " on GPU 2", DIAGNOSTIC_INFO, rc)],
    ),
)


@pytest.mark.parametrize("rc", DCGM_EXIT_STATUSES)
@pytest.mark.parametrize(("name", "expected"), DCGM_FAILING)
def test_a_failing_dcgm_test_is_a_problem_with_its_gpus_and_warnings(name: str, expected: Any, rc: int) -> None:
    assert dcgm_problems(rc, (DCGM / name).read_text(), 2) == expected(rc)


DCGM_NOT_RUN = (
    (
        "dcgm3-error-mig.txt",
        "GPU 2's MIG configuration is incompatible with the diagnostic because it prevents access to the entire GPU.",
    ),
    (
        "dcgm3-error-test-not-found.txt",
        'Error: requested test "memory bandwidth" was not found among possible test choices.',
    ),
    (
        "dcgm-error-no-hostengine.txt",
        "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.",
    ),
)


@pytest.mark.parametrize(("name", "evidence"), DCGM_NOT_RUN)
def test_a_dcgmi_that_could_not_run_says_so_with_its_last_line(name: str, evidence: str) -> None:
    assert dcgm_problems(255, (DCGM / name).read_text(), 1) == [
        {
            "check": "dcgm",
            "gpu": None,
            "gpus": [],
            "test": None,
            "evidence": evidence,
            "message": "DCGM could not run: %s (dcgmi diag -r 1, exit status 255)" % evidence,
        }
    ]


def test_dcgm_json_runtime_error_is_dcgm_not_running() -> None:
    # No captured document with a runtime_error was found: this is the shape dcgmi/Diag.cpp's
    # HelperDisplayFailureMessage writes under -j ({"DCGM Diagnostic": {"runtime_error": ..., "version": ...}}),
    # with the message text of the real MIG refusal (tests/fixtures/dcgm/dcgm3-error-mig.txt).
    refusal = (DCGM / "dcgm3-error-mig.txt").read_text().strip()
    document = json.dumps({"DCGM Diagnostic": {"runtime_error": refusal, "version": "4.6.0"}}, indent="\t")
    problems = dcgm_problems(226, document, 1)
    assert [problem["evidence"] for problem in problems] == [refusal]
    assert problems[0]["message"].startswith("DCGM could not run: GPU 2's MIG configuration")


def test_an_empty_dcgm_output_with_exit_status_zero_is_no_problem() -> None:
    assert dcgm_problems(0, "", 1) == []
    assert dcgm_problems(226, "", 1)[0]["evidence"] == "no output"
