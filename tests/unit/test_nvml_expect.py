"""check_expectations() on states read from the simulated library: every key, the full mismatch list."""

from __future__ import annotations

import pytest

from gpufleet.simgpu import SimulatedMachine

from ansible_collections.gpufleet.fleet.plugins.module_utils import nvml

H200_UUID = "GPU-1757f6d0-d02c-d95a-c569-55d572b0340a"

# Everything the default H200 satisfies.
H200_EXPECT = {
    "driver_version": "580.159.04",
    "driver_min": "570.0",
    "cuda_driver_min": "12.8",
    "gpu_count": 1,
    "model": "H200",
    "min_memory_mib": 140000,
    "compute_capability": "9.0",
    "persistence": True,
    "ecc": True,
    "mig": False,
    "ecc_errors": 0,
    "ecc_errors_aggregate": 0,
    "retired_pages_pending": False,
    "row_remap_pending": False,
    "row_remap_failure": False,
}


def check(machine: SimulatedMachine, expect: dict) -> list[dict]:
    return nvml.check_expectations(nvml.read_gpu_state(str(machine.library)), expect)


def test_the_h200_meets_every_expectation(simgpu_machine: SimulatedMachine) -> None:
    assert set(H200_EXPECT) == set(nvml.EXPECT_KEYS)
    assert check(simgpu_machine, H200_EXPECT) == []


def test_nothing_expected_nothing_checked(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("lose", "--gpu", "0")
    assert check(simgpu_machine, {}) == []
    assert check(simgpu_machine, {"ecc": None}) == []


def test_ecc_errors_name_the_gpu_and_the_count(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("ecc-errors", "12")
    [mismatch] = check(simgpu_machine, {"ecc_errors": 0})
    assert mismatch == {
        "gpu": 0,
        "uuid": H200_UUID,
        "field": "ecc_errors",
        "expected": 0,
        "actual": 12,
        "message": f"GPU 0 ({H200_UUID}): 12 uncorrectable volatile ECC errors, expected at most 0",
    }


def test_every_mismatch_is_listed(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("gpu-count", "8")
    simgpu_machine.ctl("driver-version", "550.54.15", "--cuda", "12040")
    simgpu_machine.ctl("ecc-errors", "--gpu", "2", "3")
    simgpu_machine.ctl("persistence", "off", "--gpu", "5")
    simgpu_machine.ctl("lose", "--gpu", "7")
    found = check(simgpu_machine, {**H200_EXPECT, "gpu_count": 4})
    summary = {(item["gpu"], item["field"]) for item in found}
    assert summary == {
        (None, "driver_version"),
        (None, "driver_min"),
        (None, "cuda_driver_min"),
        (None, "gpu_count"),
        (2, "ecc_errors"),
        (2, "ecc_errors_aggregate"),  # volatile errors count toward the lifetime total too
        (5, "persistence"),
        (7, "lost"),
    }
    messages = {item["field"]: item["message"] for item in found}
    assert messages["driver_version"] == "driver 550.54.15, expected 580.159.04"
    assert messages["driver_min"] == "driver 550.54.15 is older than the required 570.0"
    assert messages["cuda_driver_min"] == "the driver runs CUDA up to 12.4, expected at least 12.8"
    assert messages["gpu_count"] == "8 GPUs found, expected 4"
    assert messages["ecc_errors"].endswith("3 uncorrectable volatile ECC errors, expected at most 0")
    assert messages["persistence"].endswith("persistence mode is off, expected on")
    assert messages["lost"].startswith("GPU 7 (uuid unknown): GPU is lost")


@pytest.mark.parametrize(
    ("switch", "expect", "field", "message_end"),
    [
        (("mig", "on"), {"mig": False}, "mig", "MIG mode is on, expected off"),
        (("ecc", "off"), {"ecc": True}, "ecc", "ECC mode is off, expected on"),
        (
            ("set", "gpus.0.name", '"NVIDIA A100-SXM4-80GB"'),
            {"model": "H200"},
            "model",
            "model is 'NVIDIA A100-SXM4-80GB', expected 'H200'",
        ),
        (
            ("set", "gpus.0.memory_total_bytes", "85899345920"),
            {"min_memory_mib": 140000},
            "min_memory_mib",
            "81920 MiB of memory, expected at least 140000 MiB",
        ),
        (
            ("set", "gpus.0.compute_capability", "[8, 0]"),
            {"compute_capability": "9.0"},
            "compute_capability",
            "compute capability 8.0, expected 9.0",
        ),
        (
            ("ecc-errors", "0", "--aggregate", "7"),
            {"ecc_errors_aggregate": 2},
            "ecc_errors_aggregate",
            "7 uncorrectable aggregate ECC errors, expected at most 2",
        ),
        (
            ("retired-pages", "--double-bit", "1", "--pending"),
            {"retired_pages_pending": False},
            "retired_pages_pending",
            "retired pages pending: yes (a reboot or GPU reset retires them), expected no",
        ),
        (
            ("row-remap", "--pending"),
            {"row_remap_pending": False},
            "row_remap_pending",
            "row remapping pending: yes (a GPU reset applies it), expected no",
        ),
        (
            ("row-remap", "--failure"),
            {"row_remap_failure": False},
            "row_remap_failure",
            "row remapping failed: yes (the GPU needs service), expected no",
        ),
    ],
)
def test_each_per_gpu_expectation(
    simgpu_machine: SimulatedMachine, switch: tuple[str, ...], expect: dict, field: str, message_end: str
) -> None:
    assert check(simgpu_machine, expect) == []
    simgpu_machine.ctl(*switch)
    [mismatch] = check(simgpu_machine, expect)
    assert mismatch["field"] == field and mismatch["gpu"] == 0
    assert mismatch["message"] == f"GPU 0 ({H200_UUID}): {message_end}"


def test_model_matches_exact_name_and_part_case_insensitively(simgpu_machine: SimulatedMachine) -> None:
    for model in ("NVIDIA H200", "h200", "H2"):
        assert check(simgpu_machine, {"model": model}) == []
    assert check(simgpu_machine, {"model": "H100"})


def test_no_pending_retirement_holds_on_a_gpu_without_page_retirement(simgpu_machine: SimulatedMachine) -> None:
    # The H200 does not retire pages (unsupported): nothing can be pending.
    assert check(simgpu_machine, {"retired_pages_pending": False}) == []
    [mismatch] = check(simgpu_machine, {"retired_pages_pending": True})
    assert mismatch["actual"] is None
    assert "not supported by this GPU" in mismatch["message"]


def test_ecc_error_limit_fails_when_ecc_is_off(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("ecc", "off")
    [mismatch] = check(simgpu_machine, {"ecc_errors": 0})
    assert mismatch["actual"] is None
    assert mismatch["message"].endswith(
        "uncorrectable volatile ECC error count not counted while ECC is off, expected at most 0"
    )


def test_unsupported_value_fails_a_positive_expectation(simgpu_machine: SimulatedMachine) -> None:
    simgpu_machine.ctl("not-supported", "persistence_mode")
    [mismatch] = check(simgpu_machine, {"persistence": True})
    assert mismatch["message"].endswith("persistence mode not supported by this GPU, expected on")


@pytest.mark.parametrize(
    ("expect", "problem"),
    [
        ({"cuda_driver_min": "twelve"}, "cuda_driver_min='twelve' is not a version like 12.8"),
        ({"compute_capability": "sm_90"}, "compute_capability='sm_90' is not a version like 12.8"),
        ({"ecc_errors": -1}, "ecc_errors=-1 must not be negative"),
        ({"colour": "green"}, "unknown key 'colour'"),
    ],
)
def test_expectation_errors(expect: dict, problem: str) -> None:
    [found] = nvml.expectation_errors(expect)
    assert found.startswith(problem)


def test_valid_expectations_have_no_errors() -> None:
    assert nvml.expectation_errors(H200_EXPECT) == []
