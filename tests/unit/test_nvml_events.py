"""NVML's event API (nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2) through the binding,
against the simulated library, with events raised by the real simgpuctl as the lab raises them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from gpufleet.simgpu import SimulatedMachine as SimGpu

from ansible_collections.gpufleet.fleet.plugins.module_utils import nvml

WANTED = nvml.EVENT_XID_CRITICAL | nvml.EVENT_DOUBLE_BIT_ECC


@contextlib.contextmanager
def watching(machine: SimGpu) -> Iterator[nvml.EventWatch]:
    """An NVML session of the simulated machine with every GPU registered for WANTED, closed afterwards."""
    with nvml.Nvml(str(machine.library)) as session:
        events = session.watch_events(WANTED)
        try:
            yield events
        finally:
            events.close()


def test_an_xid_reaches_the_set_with_its_gpu_and_number(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "2")
    with watching(simgpu_machine) as events:
        assert events.registered == {0: WANTED, 1: WANTED} and events.unwatched == {}
        started = time.monotonic()
        assert events.wait(100) is None
        assert time.monotonic() - started >= 0.09
        simgpu_machine.ctl("xid", "79", "--gpu", "1")
        event = events.wait(1000)
        second_uuid = simgpu_machine.read()["gpus"][1]["uuid"]
        assert event == {"index": 1, "uuid": second_uuid, "type": "xid", "data": 79}
        assert events.wait(0) is None


def test_events_from_before_the_set_are_not_delivered(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("xid", "48")
    with watching(simgpu_machine) as events:
        assert events.wait(50) is None
        simgpu_machine.ctl("xid", "119")
        assert events.wait(1000) == {
            "index": 0,
            "uuid": simgpu_machine.read()["gpus"][0]["uuid"],
            "type": "xid",
            "data": 119,
        }


def test_a_rising_uncorrectable_count_is_a_double_bit_event(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "2")
    with watching(simgpu_machine) as events:
        simgpu_machine.ctl("ecc-errors", "--gpu", "0", "1")
        assert events.wait(1000) == {
            "index": 0,
            "uuid": simgpu_machine.read()["gpus"][0]["uuid"],
            "type": "double_bit_ecc",
            "data": 0,
        }
        simgpu_machine.ctl("ecc-errors", "--gpu", "0", "1")  # unchanged: no new error, no event
        assert events.wait(100) is None


def test_a_lost_gpu_and_one_without_ecc_are_named(simgpu_machine: SimGpu) -> None:
    simgpu_machine.ctl("gpu-count", "3")
    simgpu_machine.ctl("lose", "--gpu", "1")
    simgpu_machine.ctl("ecc", "off", "--gpu", "2")
    with watching(simgpu_machine) as events:
        assert events.unwatched == {1: "lost"}
        assert events.registered == {0: WANTED, 2: nvml.EVENT_XID_CRITICAL}


def test_a_line_still_being_written_waits_for_its_end(simgpu_machine: SimGpu) -> None:
    uuid = simgpu_machine.read()["gpus"][0]["uuid"]
    queue = Path(os.environ["GPUFLEET_SIMGPU_EVENTS"])
    with watching(simgpu_machine) as events:
        with queue.open("a") as stream:
            stream.write(f"{uuid} 8 7")
        assert events.wait(50) is None
        with queue.open("a") as stream:
            stream.write("9\n")
        assert events.wait(1000) == {"index": 0, "uuid": uuid, "type": "xid", "data": 79}
