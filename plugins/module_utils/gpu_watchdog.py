"""The GPU watchdog: what a node does on its own when a GPU fails between two gpufleet runs.

Standard library only: role gpu_watchdog ships this file (with nvml.py and gpu_health.py) to the node, where
`gpufleet-gpu-watchdog` runs it as a systemd service.

It follows two sources of the same faults: NVML's events (critical XIDs, double-bit ECC errors) and the kernel's
NVRM lines (`/dev/kmsg`, or a file). Each fault gets the action of NVIDIA's XID catalog row for it
(data/health/xid_catalog.csv, its immediate action mapped to one of ACTIONS):
- log: the application's own fault, the GPU is fine (the instance restarts itself if it died);
- stop_instances: this GPU needs a reset; the instances whose processes use it are stopped, the others serve on;
- cordon: the node needs a reboot or service; the cordon file makes the node's proxy answer 503 until
  `gpufleet uncordon` removes it. The watchdog never removes a cordon.
An XID the catalog does not know is logged with its evidence and nothing else is done. Every fault and what was
done is appended to the record (JSON lines) that `gpufleet doctor` reads.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable

from ansible_collections.gpufleet.fleet.plugins.module_utils import nvml
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_health import parse_xids

ACTIONS = ("log", "stop_instances", "cordon")
# Which action wins when one fault is seen twice (NVML and the kernel log) or several at once.
SEVERITY = {action: rank for rank, action in enumerate(ACTIONS)}
# The kernel's line and NVML's event of one XID arrive apart by at most this much; later ones are new faults.
SAME_FAULT_SECONDS = 30.0
INSTANCE_UNITS = "vllm@*.service"
CGROUP_UNIT = re.compile(r"/(vllm@[^/]+\.service)")
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def read_boot_id() -> str:
    """This boot's id: doctor names only the faults of the boot it looks at."""
    try:
        with open(BOOT_ID) as stream:
            return stream.read().strip()
    except OSError:
        return ""


def load_catalog(text: str) -> dict[int, dict[str, str]]:
    """The XID catalog (CSV with columns xid, mnemonic, description, gpufleet_action, ...): XID -> row."""
    catalog: dict[int, dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        action = row["gpufleet_action"]
        if action not in ACTIONS:
            raise ValueError("XID %s: gpufleet_action %r is not one of %s" % (row["xid"], action, ", ".join(ACTIONS)))
        catalog[int(row["xid"])] = row
    return catalog


def pci_key(address: str) -> str:
    """One spelling for a PCI address: NVML's 00000000:65:00.0 and the kernel's 0000:65:00 -> 0000:65:00."""
    parts = address.lower().split(":")
    domain, bus, slot = parts[-3][-4:], parts[-2], parts[-1].split(".")[0]
    return "%s:%s:%s" % (domain, bus, slot)


def decide(fault: dict[str, Any], catalog: dict[int, dict[str, str]]) -> dict[str, str]:
    """The action for a fault ({kind: xid|double_bit_ecc, xid, gpu, ...}) and the reason an operator reads."""
    where = "GPU %s" % fault["gpu"] if fault.get("gpu") is not None else "the GPU at PCI %s" % fault.get("pci")
    if fault["kind"] == "double_bit_ecc":
        return {"action": "stop_instances", "reason": "double-bit ECC error on %s: reset the GPU" % where}
    row = catalog.get(fault["xid"])
    if row is None:
        return {
            "action": "log",
            "reason": "XID %d on %s is not in the XID catalog: logged, no action" % (fault["xid"], where),
        }
    return {
        "action": row["gpufleet_action"],
        "reason": "XID %d on %s (%s: %s; NVIDIA's action %s)"
        % (fault["xid"], where, row["mnemonic"], row["description"], row["immediate_action"]),
    }


class KernelLog:
    """New kernel lines since the watchdog started: /dev/kmsg (one record per read) or a log file that grows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        if path == "/dev/kmsg":
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        elif os.path.exists(path):
            status = os.stat(path)
            self._inode, self._offset = status.st_ino, status.st_size

    def lines(self) -> list[str]:
        return self._kmsg() if self._fd is not None else self._file()

    def _kmsg(self) -> list[str]:
        found: list[str] = []
        while True:
            try:
                record = os.read(self._fd, 8192)  # type: ignore[arg-type]
            except BlockingIOError:
                return found
            except OSError:  # EPIPE: records were overwritten before we read them; go on from the next
                continue
            if not record:
                return found
            # "PRIORITY,SEQUENCE,TIMESTAMP,-;MESSAGE"
            found.append(record.decode("utf-8", "replace").split(";", 1)[-1].rstrip("\n"))

    def _file(self) -> list[str]:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            self._inode, self._offset, self._partial = None, 0, b""
            return []
        if status.st_ino != self._inode or status.st_size < self._offset:  # rotated, replaced or truncated
            self._inode, self._offset, self._partial = status.st_ino, 0, b""
        if status.st_size == self._offset:
            return []
        with open(self.path, "rb") as stream:
            stream.seek(self._offset)
            data = stream.read()
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]


def units_by_process(pids: Iterable[int]) -> list[str]:
    """The instance units (vllm@NAME.service) the processes belong to, from their cgroups."""
    units = set()
    for pid in pids:
        try:
            with open("/proc/%d/cgroup" % pid) as stream:
                match = CGROUP_UNIT.search(stream.read())
        except OSError:
            continue
        if match:
            units.add(match.group(1))
    return sorted(units)


def visible_devices(pid: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES of a running process (indexes or UUIDs), [] when unset or unreadable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as stream:
            variables = stream.read().split(b"\0")
    except OSError:
        return []
    for variable in variables:
        if variable.startswith(b"CUDA_VISIBLE_DEVICES="):
            return [item.strip() for item in variable.split(b"=", 1)[1].decode().split(",") if item.strip()]
    return []


def write_cordon(path: str, reason: str, evidence: str, now: float) -> bool:
    """Cordons the node (the proxy's cordon file) unless it is cordoned already; True when it wrote one."""
    if os.path.exists(path):
        return False
    record = {
        "reason": "gpu-watchdog: %s" % reason,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "evidence": evidence,
    }
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    partial = os.path.join(directory, ".cordon.%d" % os.getpid())
    with open(partial, "w") as stream:
        json.dump(record, stream)
    os.chmod(partial, 0o644)
    os.rename(partial, path)
    return True


class Watchdog:
    """Turns faults into actions, once per fault: see the module's docstring."""

    def __init__(
        self,
        catalog: dict[int, dict[str, str]],
        cordon_file: str,
        record_file: str,
        instances_on_gpu: Callable[[dict[str, Any]], list[str]],
        stop_units: Callable[[list[str]], str],
        clock: Callable[[], float] = time.time,
        boot_id: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self.cordon_file = cordon_file
        self.record_file = record_file
        self.instances_on_gpu = instances_on_gpu
        self.stop_units = stop_units
        self.clock = clock
        self._seen: dict[tuple[Any, ...], float] = {}

    def _duplicate(self, fault: dict[str, Any], now: float) -> bool:
        # NVML's double-bit ECC event and the kernel's XID 48 are one fault.
        xid = 48 if fault["kind"] == "double_bit_ecc" else fault.get("xid")
        key = (fault.get("pci") or fault.get("gpu"), xid)
        last = self._seen.get(key)
        self._seen[key] = now
        return last is not None and now - last < SAME_FAULT_SECONDS

    def handle(self, fault: dict[str, Any]) -> dict[str, Any] | None:
        """Acts on one fault; returns its record, or None for the second sighting of one fault."""
        now = self.clock()
        if self._duplicate(fault, now):
            return None
        decision = decide(fault, self.catalog)
        done = []
        if decision["action"] == "cordon":
            if write_cordon(self.cordon_file, decision["reason"], fault["evidence"], now):
                done.append("cordoned the node")
            else:
                done.append("the node was cordoned already")
        if decision["action"] in ("cordon", "stop_instances"):
            units = self.instances_on_gpu(fault)
            if decision["action"] == "stop_instances" or units:
                done.append(self.stop_units(units) if units else "no instance runs on that GPU")
        record = dict(
            fault,
            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            done="; ".join(done),
            boot_id=self.boot_id,
        )
        record.update(decision)
        self._append(record)
        return record

    def _append(self, record: dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(self.record_file), mode=0o755, exist_ok=True)
        with open(self.record_file, "a") as stream:
            stream.write(json.dumps(record, sort_keys=True) + "\n")


def kernel_faults(lines: Iterable[str], gpus_by_pci: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The XIDs among kernel lines, as faults with the GPU's index and UUID where NVML knows the address."""
    faults = []
    for xid in parse_xids(lines):
        gpu = gpus_by_pci.get(pci_key(xid["pci"]), {})
        faults.append(
            {
                "source": "kernel_log",
                "kind": "xid",
                "xid": xid["xid"],
                "pci": pci_key(xid["pci"]),
                "gpu": gpu.get("index"),
                "uuid": gpu.get("uuid"),
                "evidence": xid["line"],
            }
        )
    return faults


def nvml_fault(event: dict[str, Any], gpus_by_index: dict[int, dict[str, Any]], line: str) -> dict[str, Any]:
    """An NVML event ({index, uuid, type, data}) as a fault; `line` is its evidence as the watchdog logs it."""
    gpu = gpus_by_index.get(event["index"], {})
    return {
        "source": "nvml",
        "kind": event["type"],
        "xid": event["data"] if event["type"] == "xid" else None,
        "pci": gpu.get("pci"),
        "gpu": event["index"],
        "uuid": event["uuid"],
        "evidence": line,
    }


def read_records(text: str) -> list[dict[str, Any]]:
    """The watchdog's record (JSON lines), skipping a line cut short by a crash."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def systemctl(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *arguments], capture_output=True, text=True, check=False)


def active_instances() -> dict[str, int]:
    """Every active instance unit and its main process."""
    listed = systemctl("list-units", "--type=service", "--state=active", "--plain", "--no-legend", INSTANCE_UNITS)
    units = {}
    for line in listed.stdout.splitlines():
        unit = line.split()[0] if line.split() else ""
        if not unit.startswith("vllm@"):
            continue
        shown = systemctl("show", "--property=MainPID", "--value", unit).stdout.strip()
        units[unit] = int(shown) if shown.isdigit() else 0
    return units


def stop_units(units: list[str]) -> str:
    """Stops the units without waiting for them (vLLM's shutdown takes a while; the watchdog goes on watching)."""
    result = systemctl("stop", "--no-block", *units)
    if result.returncode != 0:
        return "stopping %s failed: %s" % (", ".join(units), result.stderr.strip() or "exit %d" % result.returncode)
    return "stopped %s" % ", ".join(units)


class Node:
    """What the watchdog knows of the node's GPUs (from NVML at start) and how it finds their instances."""

    def __init__(self, library: str | None, list_instances: Callable[[], dict[str, int]] = active_instances) -> None:
        self.library = library
        self.list_instances = list_instances
        self.by_index: dict[int, dict[str, Any]] = {}
        self.by_pci: dict[str, dict[str, Any]] = {}

    def learn(self, session: nvml.Nvml) -> None:
        for index in range(session.device_count()):
            gpu = session.device(index)
            pci = pci_key(gpu["pci_bus_id"]) if gpu.get("pci_bus_id") else None
            entry = {"index": index, "uuid": gpu.get("uuid"), "pci": pci}
            self.by_index[index] = entry
            if pci:
                self.by_pci[pci] = entry

    def instances_on_gpu(self, fault: dict[str, Any]) -> list[str]:
        """Running instances whose process sees the GPU (CUDA_VISIBLE_DEVICES) or has a CUDA context on it."""
        wanted = {str(fault["gpu"]), str(fault.get("uuid"))} - {"None"}
        units = {unit for unit, pid in self.list_instances().items() if pid and wanted & set(visible_devices(pid))}
        if fault.get("gpu") is not None:
            try:
                with nvml.Nvml(self.library) as session:
                    pids = [process["pid"] for process in session.compute_processes(fault["gpu"])]
                units.update(units_by_process(pids))
            except Exception:  # a lost GPU or a gone driver: the environment above is all there is
                pass
        return sorted(units)


def log(message: str) -> None:
    """A line for the service's journal."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def serve(
    config: dict[str, Any],
    stop: threading.Event,
    list_instances: Callable[[], dict[str, int]] = active_instances,
    stopper: Callable[[list[str]], str] = stop_units,
) -> None:
    """The service: NVML's events and the kernel log, until `stop` is set. The instances come from systemd."""
    with open(config["catalog"]) as stream:
        catalog = load_catalog(stream.read())
    node = Node(config.get("library") or None, list_instances)
    kernel = KernelLog(config["kernel_log"])
    watchdog = Watchdog(catalog, config["cordon_file"], config["record_file"], node.instances_on_gpu, stopper)
    session, events = None, None
    next_try = 0.0
    while not stop.is_set():
        if events is None and time.monotonic() >= next_try:
            session, events = _open_events(node)
            next_try = time.monotonic() + 60
        event = events.wait(config.get("poll_ms", 500)) if events is not None else None
        if events is None:
            stop.wait(config.get("poll_ms", 500) / 1000.0)
        faults = kernel_faults(kernel.lines(), node.by_pci)
        if event is not None:
            faults.append(
                nvml_fault(
                    event,
                    node.by_index,
                    "NVML event %s %s on GPU %s (%s)" % (event["type"], event["data"], event["index"], event["uuid"]),
                )
            )
        for fault in faults:
            record = watchdog.handle(fault)
            if record is not None:
                log("%s: %s: %s" % (record["action"], record["reason"], record["done"] or "nothing else done"))
    if events is not None:
        events.close()
    if session is not None:
        session.__exit__()


def _open_events(node: Node) -> tuple[nvml.Nvml | None, nvml.EventWatch | None]:
    """An NVML session watching every GPU's critical XIDs and double-bit ECC errors; (None, None) while NVML
    cannot be used (the kernel log is watched meanwhile, and NVML tried again a minute later)."""
    try:
        session = nvml.Nvml(node.library).__enter__()
    except nvml.NvmlError as error:
        log("NVML unavailable, watching the kernel log only: %s" % error)
        return None, None
    node.learn(session)
    events = session.watch_events(nvml.EVENT_XID_CRITICAL | nvml.EVENT_DOUBLE_BIT_ECC)
    for index, why in sorted(events.unwatched.items()):
        log("GPU %d: no NVML events (%s): its faults are seen in the kernel log only" % (index, why))
    log("watching %d GPU(s) through NVML and the kernel log" % len(events.registered))
    return session, events
