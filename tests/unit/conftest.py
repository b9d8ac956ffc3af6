"""Shared unit-test fixtures. Keep this file small: fixtures used by one test file belong in that file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import simgpu


@pytest.fixture(scope="session")
def simgpu_library() -> Path:
    """The simulated libnvidia-ml.so.1, compiled with gcc (cached by source digest)."""
    return simgpu.build_library()


@pytest.fixture
def simgpu_machine(tmp_path: Path, simgpu_library: Path, monkeypatch: pytest.MonkeyPatch) -> simgpu.SimulatedMachine:
    """The default H200 in a temporary description file that GPUFLEET_SIMGPU_CONFIG points at."""
    description = tmp_path / "gpus.json"
    description.write_text(simgpu.DEFAULT_DESCRIPTION.read_text())
    monkeypatch.setenv(simgpu.DESCRIPTION_ENV, str(description))
    # The driver's queues of the simulated machine: its kernel log and NVML's events.
    monkeypatch.setenv("GPUFLEET_SIMGPU_KERNEL_LOG", str(tmp_path / "kern.log"))
    monkeypatch.setenv("GPUFLEET_SIMGPU_EVENTS", str(tmp_path / "nvml-events"))
    return simgpu.SimulatedMachine(description, simgpu_library)
