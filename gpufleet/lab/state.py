"""The lab's small persistent state (its address pool) and the lock that serializes lab commands."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufleet.errors import GpufleetError


def load(path: Path) -> dict:
    """The saved state, or {} when there is none (first run, or after `lab down`)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        # A torn write of an older run: start over, the pool is re-validated anyway.
        return {}
    return data if isinstance(data, dict) else {}


def save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)


LOCK_WAIT_SECONDS = 900


@contextmanager
def locked(lock_file: Path, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[None]:
    """Holds an exclusive lock for one changing lab command; a concurrent one waits for it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_seconds
    announced = False
    while True:
        handle = lock_file.open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            if time.monotonic() > deadline:
                raise GpufleetError(
                    f"another `gpufleet lab` command held {lock_file} for {wait_seconds:.0f}s; "
                    "check it with `gpufleet lab status`"
                ) from None
            if not announced:
                print(f"lab: waiting for another `gpufleet lab` command to finish ({lock_file})", file=sys.stderr)
                announced = True
            time.sleep(0.5)
            continue
        # `lab down` deletes the lock file; a lock on a deleted file protects nothing, so take it again.
        if _same_file(handle.fileno(), lock_file):
            break
        handle.close()
    try:
        yield
    finally:
        handle.close()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
