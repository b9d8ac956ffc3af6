"""The NVML binding (plugins/module_utils/nvml.py) loaded through ctypes against the simulated library.

No Python-level mock: every value comes from the compiled libnvidia-ml.so.1 reading a description file,
and every state switch goes through the real simgpuctl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.simgpu import SimulatedMachine as SimGpu

from ansible_collections.gpufleet.fleet.plugins.module_utils import nvml

CAPTURE = Path(__file__).resolve().parents[3] / "shared" / "data" / "h200-capture.json"
H200_UUID = "GPU-1757f6d0-d02c-d95a-c569-55d572b0340a"


def read(machine: SimGpu) -> dict:
    return nvml.read_gpu_state(str(machine.library))


def test_h200_defaults(simgpu_machine: SimGpu) -> None:
    state = read(simgpu_machine)
    assert state["driver_version"] == "580.159.04"
    assert state["cuda_driver_version"] == "13.0"
    assert state["nvml_version"] == "13.580.159.04"
    assert state["gpu_count"] == 1
    gpu = state["gpus"][0]
    assert gpu["index"] == 0 and gpu["lost"] is False
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["uuid"] == H200_UUID
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert gpu["compute_capability"] == "9.0"
    assert gpu["memory_total_bytes"] == 150754820096
    assert gpu["memory_total_mib"] == 143771
    assert gpu["memory_used_mib"] == 0  # as nvidia-smi shows it: without the driver's reserved memory
    assert gpu["memory_reserved_bytes"] == 644939776 and gpu["memory_reserved_mib"] == 615
    assert gpu["persistence_mode"] is True
    assert gpu["ecc_mode"] is True and gpu["ecc_mode_pending"] is True
    assert gpu["ecc_errors_uncorrected_volatile"] == 0
    assert gpu["ecc_errors_uncorrected_aggregate"] == 0
    assert gpu["mig_mode"] is False
    assert gpu["power_limit_w"] == 700.0
    assert gpu["power_draw_w"] == 114.0
    assert gpu["temperature_c"] == 31
    assert gpu["row_remap_pending"] is False and gpu["row_remap_failure"] is False
    assert gpu["remapped_rows_corrected"] == 0 and gpu["remapped_rows_uncorrected"] == 0
    # Hopper has row remapping instead of page retirement: reported as unsupported, not as an error.
    assert gpu["unsupported"] == [
        "retired_pages_single_bit_ecc",
        "retired_pages_double_bit_ecc",
        "retired_pages_pending",
    ]
    assert gpu["retired_pages_pending"] is None
    assert gpu["errors"] == {}
    assert set(gpu) == {"index", "lost", "unsupported", "errors", *nvml.GPU_FIELDS}


@pytest.mark.skipif(not CAPTURE.is_file(), reason="the real H200 capture (../shared/data) is not present")
def test_h200_defaults_equal_the_real_capture(simgpu_machine: SimGpu) -> None:
    capture = json.loads(CAPTURE.read_text())["nvml"]
    device = capture["devices"][0]
    state = read(simgpu_machine)
    gpu = state["gpus"][0]
    assert state["driver_version"] == capture["system_driver_version"]
    assert state["nvml_version"] == capture["nvml_version"]
    assert state["cuda_driver_version"] == "%d.%d" % divmod(capture["system_cuda_driver_version"] // 10, 100)
    assert state["gpu_count"] == len(capture["devices"])
    assert (gpu["name"], gpu["uuid"], gpu["pci_bus_id"]) == (device["name"], device["uuid"], device["pci_bus_id"])
    assert gpu["memory_total_bytes"] == device["memory_total_bytes"]
    assert gpu["memory_total_mib"] == device["memory_total_mib"]
    assert gpu["compute_capability"] == "%d.%d" % tuple(device["cuda_compute_capability"])
    assert gpu["persistence_mode"] == bool(device["persistence_mode"])
    assert gpu["ecc_mode"] == (device["ecc_mode_current"] == "Enabled")
    assert gpu["mig_mode"] == (device["mig_mode_current"] == "Enabled")
    assert gpu["power_limit_w"] == device["power_limit_w"]
    assert gpu["power_draw_w"] == device["power_draw_w_idle"]


def test_driver_version_switch(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("driver-version", "570.133.20", "--cuda", "12080")
    state = read(simgpu_machine)
    assert state["driver_version"] == "570.133.20"
    assert state["cuda_driver_version"] == "12.8"
    assert state["nvml_version"] == "12.570.133.20"


def test_eight_gpus_have_distinct_identities(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "8")
    state = read(simgpu_machine)
    assert state["gpu_count"] == 8
    assert [gpu["index"] for gpu in state["gpus"]] == list(range(8))
    assert len({gpu["uuid"] for gpu in state["gpus"]}) == 8
    assert len({gpu["pci_bus_id"] for gpu in state["gpus"]}) == 8
    assert {gpu["name"] for gpu in state["gpus"]} == {"NVIDIA H200"}
    assert state["gpus"][7]["pci_bus_id"] == "00000000:00:0D.0"


def test_gpu_count_zero(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "0")
    state = read(simgpu_machine)
    assert state["gpu_count"] == 0 and state["gpus"] == []


def test_ecc_errors_on_one_gpu(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "2")
    simgpu_machine.ctl("ecc-errors", "--gpu", "1", "12", "--aggregate", "30")
    first, second = read(simgpu_machine)["gpus"]
    assert first["ecc_errors_uncorrected_volatile"] == 0
    assert second["ecc_errors_uncorrected_volatile"] == 12
    assert second["ecc_errors_uncorrected_aggregate"] == 30


def test_ecc_off_makes_counts_unsupported(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("ecc", "off")
    gpu = read(simgpu_machine)["gpus"][0]
    assert gpu["ecc_mode"] is False and gpu["ecc_mode_pending"] is False
    assert gpu["ecc_errors_uncorrected_volatile"] is None
    assert "ecc_errors_uncorrected_volatile" in gpu["unsupported"]


def test_persistence_off(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("persistence", "off")
    assert read(simgpu_machine)["gpus"][0]["persistence_mode"] is False


def test_mig_on(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("mig", "on")
    gpu = read(simgpu_machine)["gpus"][0]
    assert gpu["mig_mode"] is True and gpu["mig_mode_pending"] is True


def test_lost_gpu_is_reported_not_raised(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "3")
    simgpu_machine.ctl("lose", "--gpu", "1")
    state = read(simgpu_machine)
    assert state["gpu_count"] == 3
    lost = state["gpus"][1]
    assert lost["lost"] is True
    assert lost["uuid"] is None and lost["name"] is None
    assert "NVML_ERROR_GPU_IS_LOST" in lost["errors"]["gpu"]
    assert state["gpus"][0]["lost"] is False and state["gpus"][2]["name"] == "NVIDIA H200"


def test_not_supported_fields_are_none_and_listed(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("not-supported", "temperature", "power_limit", "mig", "persistence_mode", "row_remapping")
    gpu = read(simgpu_machine)["gpus"][0]
    for field in (
        "temperature_c",
        "power_limit_w",
        "mig_mode",
        "mig_mode_pending",
        "persistence_mode",
        "remapped_rows_corrected",
        "row_remap_pending",
        "row_remap_failure",
    ):
        assert gpu[field] is None
        assert field in gpu["unsupported"]
    assert gpu["name"] == "NVIDIA H200" and gpu["errors"] == {}


def test_retired_pages_on_a_gpu_that_retires_pages(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("retired-pages", "--single-bit", "3", "--double-bit", "2", "--pending")
    gpu = read(simgpu_machine)["gpus"][0]
    assert gpu["retired_pages_single_bit_ecc"] == 3
    assert gpu["retired_pages_double_bit_ecc"] == 2
    assert gpu["retired_pages_pending"] is True
    assert not any(field.startswith("retired_pages") for field in gpu["unsupported"])


def test_row_remapping_pending_and_failure(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("row-remap", "--corrected", "1", "--uncorrected", "4", "--pending", "--failure")
    gpu = read(simgpu_machine)["gpus"][0]
    assert (gpu["remapped_rows_corrected"], gpu["remapped_rows_uncorrected"]) == (1, 4)
    assert gpu["row_remap_pending"] is True and gpu["row_remap_failure"] is True


def test_driver_not_loaded(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("driver", "unload")
    with pytest.raises(nvml.NvmlDriverNotLoaded) as caught:
        read(simgpu_machine)
    assert caught.value.code == nvml.NVML_ERROR_DRIVER_NOT_LOADED
    message = str(caught.value)
    assert "couldn't communicate with the NVIDIA driver" in message
    assert "DKMS" in message and "nouveau" in message and "reboot" in message


def test_driver_library_version_mismatch(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("mismatch", "570.133.20")
    with pytest.raises(nvml.NvmlVersionMismatch) as caught:
        read(simgpu_machine)
    assert caught.value.code == nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    assert "Driver/library version mismatch" in str(caught.value)
    assert "reboot" in str(caught.value)


def test_reloading_the_driver_recovers(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("driver", "unload")
    with pytest.raises(nvml.NvmlDriverNotLoaded):
        read(simgpu_machine)
    simgpu_machine.ctl("driver", "load")
    assert read(simgpu_machine)["gpu_count"] == 1


def test_missing_library(tmp_path: Path) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    with pytest.raises(nvml.NvmlLibraryNotFound) as caught:
        nvml.read_gpu_state(str(missing))
    assert str(missing) in str(caught.value)
    assert "install the NVIDIA driver" in str(caught.value)


def test_the_exception_classes_are_distinct() -> None:
    classes = {nvml.NvmlLibraryNotFound, nvml.NvmlDriverNotLoaded, nvml.NvmlVersionMismatch}
    assert len(classes) == 3
    assert all(issubclass(cls, nvml.NvmlError) for cls in classes)
    assert not any(issubclass(a, b) for a in classes for b in classes if a is not b)


def test_a_broken_description_is_a_plain_nvml_error(simgpu_machine: SimGpu) -> None:
    simgpu_machine.description.write_text("{not json")
    with pytest.raises(nvml.NvmlError) as caught:
        read(simgpu_machine)
    assert type(caught.value) is nvml.NvmlError
    assert "NVML_ERROR_UNKNOWN" in str(caught.value)


def test_an_entry_point_missing_from_the_library_reads_as_unsupported(simgpu_machine: SimGpu) -> None:
    """An older driver's NVML may lack a function: the binding treats that as "not supported"."""
    with nvml.Nvml(str(simgpu_machine.library)) as session:
        with pytest.raises(nvml._NotSupported):
            session.call("nvmlDeviceGetNoSuchFunction")
        assert session.device(0)["name"] == "NVIDIA H200"
