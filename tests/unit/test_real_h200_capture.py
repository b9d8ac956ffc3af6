"""The simulated H200 must read, through nvidia_gpu_info, like the real H200 did.

tests/fixtures/h200-real/ holds what the module returned on a real H200 (see its README). Running the same
module on the simulated default H200 must give the same shape and the same static values; only live
readings (power draw, temperature) and the UUID may differ.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.simgpu import SimulatedMachine
from test_nvidia_gpu_info_module import run_module

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "h200-real"
LIVE_FIELDS = {"power_draw_w", "temperature_c", "uuid"}


def real_gpu_info() -> dict:
    return json.loads((REAL / "nvidia_gpu_info.json").read_text())


def test_simulated_h200_has_the_real_shape_and_values(simgpu_machine: SimulatedMachine) -> None:
    real = real_gpu_info()
    simulated = run_module({"library": str(simgpu_machine.library)})
    for key in ("driver_version", "cuda_driver_version", "nvml_version", "gpu_count", "mismatches", "changed"):
        assert simulated[key] == real[key], key
    real_gpu, simulated_gpu = real["gpus"][0], simulated["gpus"][0]
    assert sorted(simulated_gpu) == sorted(real_gpu)
    differing = {key for key in real_gpu if simulated_gpu[key] != real_gpu[key]}
    assert differing <= LIVE_FIELDS, {key: (real_gpu[key], simulated_gpu[key]) for key in differing - LIVE_FIELDS}


def test_real_capture_agrees_with_real_nvidia_smi() -> None:
    real = real_gpu_info()["gpus"][0]
    header, row = (REAL / "nvidia-smi-query.csv").read_text().strip().splitlines()[-2:]
    smi = dict(zip([h.strip() for h in header.split(",")], [v.strip() for v in row.split(",")]))
    assert smi["name"] == real["name"]
    assert smi["memory.total [MiB]"] == f"{real['memory_total_mib']} MiB"
    assert smi["compute_cap"] == real["compute_capability"]
    assert smi["pci.bus_id"] == real["pci_bus_id"]
    assert smi["persistence_mode"] == ("Enabled" if real["persistence_mode"] else "Disabled")


def test_real_torch_probe_saw_the_gpu_and_computed_correctly() -> None:
    torch_info = json.loads((REAL / "torch_stack_info.json").read_text())
    assert torch_info["torch"]["cuda_available"] is True
    assert torch_info["torch"]["arch_covers_gpus"] is True
    assert torch_info["gpu_compute"]["ok"] is True
    assert torch_info["diagnosis"] == []
