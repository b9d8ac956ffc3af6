"""Processes the lab starts: pid files that survive pid reuse, liveness checks and stopping by pid."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard


@dataclass(frozen=True)
class PidRecord:
    """A pid plus the process start time, so a recycled pid is never mistaken for our process."""

    pid: int
    start_time: int

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "start_time": self.start_time})


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot), or None when the process does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, Z ...) or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat[stat.rindex(")") + 2]


def record_for(pid: int) -> PidRecord | None:
    start = process_start_time(pid)
    return PidRecord(pid, start) if start is not None else None


def write_pid_file(path: Path, pid: int) -> PidRecord | None:
    """Records a running process atomically; returns None (and writes nothing) if it already exited."""
    record = record_for(pid)
    if record is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary file per writer: the mirror server records itself in the file `lab up` records it in.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.to_json() + "\n")
    os.replace(tmp, path)
    return record


def read_pid_file(path: Path) -> PidRecord | None:
    """The record in a pid file, or None when the file is missing or unreadable (a crashed writer)."""
    try:
        data = json.loads(path.read_text())
        return PidRecord(int(data["pid"]), int(data["start_time"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def is_alive(record: PidRecord | None) -> TypeGuard[PidRecord]:
    """True if the recorded process still runs (same pid and start time, not a zombie); a TypeGuard, so a
    list filtered by it holds no None."""
    if record is None:
        return False
    if process_start_time(record.pid) != record.start_time:
        return False
    return process_state(record.pid) not in (None, "Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pids_with_argument(arguments: set[str]) -> list[PidRecord]:
    """Processes with one of these exact arguments: finds what a crashed run started but did not record."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if arguments.intersection(cmdline(int(entry.name))):
                record = record_for(int(entry.name))
                if record is not None:
                    found.append(record)
    return found


def wait_gone(records: list[PidRecord], timeout: float) -> list[PidRecord]:
    """Waits until every process has exited; returns those still alive at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [record for record in records if is_alive(record)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def signal_process(record: PidRecord, sig: int) -> None:
    if is_alive(record):
        try:
            os.kill(record.pid, sig)
        except ProcessLookupError:
            pass


def stop_processes(records: list[PidRecord], grace: float) -> list[PidRecord]:
    """SIGTERM, wait `grace` seconds, then SIGKILL; returns processes that survived even that."""
    for record in records:
        signal_process(record, signal.SIGTERM)
    alive = wait_gone(records, grace)
    for record in alive:
        signal_process(record, signal.SIGKILL)
    return wait_gone(alive, 10)
