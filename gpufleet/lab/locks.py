"""systemd-nspawn's image locks: found through /proc/locks, waited for, and removed once released."""

from __future__ import annotations

import os
import time
from pathlib import Path

NSPAWN_LOCK_DIR = Path("/run/systemd/nspawn/locks")


def lock_files_for(rootfs: Path) -> list[Path]:
    """The lock files nspawn creates for a directory image: `.#NAME.lck` beside it and one per inode."""
    files = [rootfs.parent / f".#{rootfs.name}.lck"]
    try:
        stat = rootfs.stat()
    except FileNotFoundError:
        return files
    return files + [NSPAWN_LOCK_DIR / f"inode-{stat.st_dev}:{stat.st_ino}"]


def _lock_key(path: Path) -> str | None:
    """How /proc/locks names a file: MAJOR:MINOR:INODE with the device numbers in hex."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"


def is_locked(path: Path) -> bool:
    """True if any process holds a lock (flock, POSIX or OFD) on `path`."""
    key = _lock_key(path)
    if key is None:
        return False
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # "1: OFDLCK ADVISORY WRITE -1 00:2e:1234 0 EOF"; a blocked waiter has "->" in field 2.
        if key in fields:
            return True
    return False


def wait_released(paths: list[Path], timeout: float) -> list[Path]:
    """Waits until no lock is held on the paths; returns those still locked at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        held = [path for path in paths if is_locked(path)]
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(0.2)


def remove_released(paths: list[Path]) -> list[Path]:
    """Deletes lock files nobody holds; returns the ones deleted."""
    removed = []
    for path in paths:
        if path.exists() and not is_locked(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
