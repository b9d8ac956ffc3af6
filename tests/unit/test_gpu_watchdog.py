"""The GPU watchdog (plugins/module_utils/gpu_watchdog.py): its decisions, its kernel log reader, and the whole
service against the simulated NVML, with faults raised by the real simgpuctl as on a lab node."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.simgpu import SimulatedMachine as SimGpu

from ansible_collections.gpufleet.fleet.plugins.module_utils import gpu_watchdog

CATALOG = """xid,mnemonic,description,immediate_action,investigatory_action,gpufleet_action,source
13,ROBUST_CHANNEL_GR_EXCEPTION,Graphics Engine Exception,RESTART_APP,WORKFLOW_XID_13,log,test
48,ROBUST_CHANNEL_ECC_DBE,DBE (Double Bit Error) ECC Error,RESET_GPU,WORKFLOW_XID_48,stop_instances,test
79,ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS,GPU has fallen off the bus,RESTART_BM,CONTACT_SUPPORT,cordon,test
"""
REAL_CATALOG = Path(__file__).resolve().parents[2] / "data" / "health" / "xid_catalog.csv"


def fault(xid: int, gpu: int = 0, kind: str = "xid", source: str = "kernel_log") -> dict[str, Any]:
    return {"source": source, "kind": kind, "xid": xid, "gpu": gpu, "pci": "0000:0%d:00" % gpu, "evidence": "line"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def watchdog(tmp_path: Path, units: list[str], stopped: list[list[str]], clock: Clock) -> gpu_watchdog.Watchdog:
    def stop(names: list[str]) -> str:
        stopped.append(names)
        return "stopped %s" % ", ".join(names)

    return gpu_watchdog.Watchdog(
        gpu_watchdog.load_catalog(CATALOG),
        str(tmp_path / "state" / "cordon"),
        str(tmp_path / "records" / "events.jsonl"),
        lambda fault: units,
        stop,
        clock,
    )


def test_each_fault_gets_its_catalog_action() -> None:
    catalog = gpu_watchdog.load_catalog(CATALOG)
    assert gpu_watchdog.decide(fault(79), catalog)["action"] == "cordon"
    assert "GPU has fallen off the bus" in gpu_watchdog.decide(fault(79), catalog)["reason"]
    assert gpu_watchdog.decide(fault(48), catalog)["action"] == "stop_instances"
    assert gpu_watchdog.decide(fault(13), catalog)["action"] == "log"
    assert gpu_watchdog.decide(fault(0, kind="double_bit_ecc"), catalog)["action"] == "stop_instances"
    unknown = gpu_watchdog.decide(fault(250), catalog)
    assert unknown == {"action": "log", "reason": "XID 250 on GPU 0 is not in the XID catalog: logged, no action"}


def test_a_catalog_row_with_an_unknown_action_is_refused() -> None:
    with pytest.raises(ValueError, match="XID 79: gpufleet_action 'reboot' is not one of log, stop_instances, cordon"):
        gpu_watchdog.load_catalog(
            CATALOG.replace("RESTART_BM,CONTACT_SUPPORT,cordon", "RESTART_BM,CONTACT_SUPPORT,reboot")
        )


def test_the_shipped_catalog_loads_and_maps_the_usual_faults() -> None:
    catalog = gpu_watchdog.load_catalog(REAL_CATALOG.read_text())
    assert catalog[79]["gpufleet_action"] == "cordon"
    assert catalog[13]["gpufleet_action"] == "log"
    assert all(row["source"] for row in catalog.values())


def test_pci_addresses_of_nvml_and_the_kernel_are_one_key() -> None:
    assert gpu_watchdog.pci_key("00000000:65:00.0") == gpu_watchdog.pci_key("0000:65:00") == "0000:65:00"


def test_a_cordon_keeps_the_first_one_and_names_the_xid(tmp_path: Path) -> None:
    clock, stopped = Clock(), []
    dog = watchdog(tmp_path, [], stopped, clock)
    first = dog.handle(fault(79))
    assert first is not None and first["done"] == "cordoned the node"
    cordon = json.loads((tmp_path / "state" / "cordon").read_text())
    assert cordon["reason"].startswith("gpu-watchdog: XID 79 on GPU 0 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    assert cordon["since"] == "2027-01-15T08:00:00Z" and cordon["evidence"] == "line"
    # The same fault from NVML moments later is one fault; another GPU's is a new one, on a cordoned node.
    clock.now += 1
    assert dog.handle(fault(79, source="nvml")) is None
    second = dog.handle(fault(79, gpu=1))
    assert second is not None and second["done"] == "the node was cordoned already"
    assert json.loads((tmp_path / "state" / "cordon").read_text()) == cordon
    records = gpu_watchdog.read_records((tmp_path / "records" / "events.jsonl").read_text())
    assert [(r["xid"], r["gpu"], r["action"]) for r in records] == [(79, 0, "cordon"), (79, 1, "cordon")]
    assert stopped == []


def test_a_gpu_reset_fault_stops_that_gpus_instances_only(tmp_path: Path) -> None:
    clock, stopped = Clock(), []
    dog = watchdog(tmp_path, ["vllm@greedy.service"], stopped, clock)
    record = dog.handle(fault(0, gpu=1, kind="double_bit_ecc", source="nvml"))
    assert record is not None and record["done"] == "stopped vllm@greedy.service"
    # The kernel's XID 48 for the same error is not a second fault; one after the window is.
    clock.now += 5
    assert dog.handle(fault(48, gpu=1)) is None
    clock.now += gpu_watchdog.SAME_FAULT_SECONDS
    assert dog.handle(fault(48, gpu=1)) is not None
    assert stopped == [["vllm@greedy.service"], ["vllm@greedy.service"]]
    assert not (tmp_path / "state" / "cordon").exists()


def test_an_unknown_xid_is_recorded_and_nothing_is_done(tmp_path: Path) -> None:
    clock, stopped = Clock(), []
    record = watchdog(tmp_path, ["vllm@main.service"], stopped, clock).handle(fault(250))
    assert record is not None and record["action"] == "log" and record["done"] == ""
    assert stopped == [] and not (tmp_path / "state" / "cordon").exists()


def test_the_kernel_log_gives_new_complete_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    reader = gpu_watchdog.KernelLog(str(log))
    assert reader.lines() == []
    with log.open("a") as stream:
        stream.write("new line\nhalf")
    assert reader.lines() == ["new line"]
    with log.open("a") as stream:
        stream.write(" done\n")
    assert reader.lines() == ["half done"]
    log.write_text("after rotation\n")  # truncated and written again
    assert reader.lines() == ["after rotation"]


def test_the_service_cordons_on_xid_79_and_stops_the_instance_on_a_double_bit_error(
    simgpu_machine: SimGpu, tmp_path: Path
) -> None:
    simgpu_machine.ctl("gpu-count", "2")
    catalog = tmp_path / "xid_catalog.csv"
    catalog.write_text(CATALOG)
    config = {
        "catalog": str(catalog),
        "cordon_file": str(tmp_path / "cordon"),
        "record_file": str(tmp_path / "events.jsonl"),
        "kernel_log": os.environ["GPUFLEET_SIMGPU_KERNEL_LOG"],
        "library": str(simgpu_machine.library),
        "poll_ms": 100,
    }
    # An instance process on GPU 1, found as the service finds one: by its CUDA_VISIBLE_DEVICES.
    instance = subprocess.Popen(["sleep", "60"], env={"CUDA_VISIBLE_DEVICES": "1", "PATH": os.environ["PATH"]})
    stopped: list[list[str]] = []
    stop = threading.Event()
    service = threading.Thread(
        target=gpu_watchdog.serve,
        args=(config, stop, lambda: {"vllm@greedy.service": instance.pid}, lambda units: stopped.append(units) or "ok"),
    )
    service.start()
    try:
        time.sleep(0.5)  # the service opens its event set: faults before it are not its
        simgpu_machine.ctl("ecc-errors", "--gpu", "1", "1")
        wait_for(lambda: stopped == [["vllm@greedy.service"]])
        assert not (tmp_path / "cordon").exists()
        simgpu_machine.ctl("xid", "79", "--gpu", "0")
        wait_for(lambda: (tmp_path / "cordon").exists())
        time.sleep(0.5)  # the kernel's line of the same XID is read too, and is not a second fault
    finally:
        stop.set()
        service.join(10)
        instance.kill()
    reason = json.loads((tmp_path / "cordon").read_text())["reason"]
    assert reason.startswith("gpu-watchdog: XID 79 on GPU 0 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    records = gpu_watchdog.read_records((tmp_path / "events.jsonl").read_text())
    assert [(r["kind"], r["gpu"], r["action"]) for r in records] == [
        ("double_bit_ecc", 1, "stop_instances"),
        ("xid", 0, "cordon"),
    ]
    assert stopped == [["vllm@greedy.service"]]


def wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within %.0f s" % seconds
        time.sleep(0.05)
