"""One fleet operation at a time: the commands that change nodes (provision, upgrade, rebuild, prune, cordon,
uncordon) hold a lock per inventory on the controller for their whole run, and pass a lease to their playbooks,
which playbooks/lease.yml takes on every node they change and gives back at the end.

The controller lock is an flock: the kernel gives it back when the process ends, however it ends, so a second
operation of the same controller is refused only while the first runs, and the message names it. The node lease
is a file on the node (holder, command, start time): it also keeps out a second controller. A run that fails
gives its leases back here; only a controller that was killed leaves one, and the next operation then says so
and breaks it only when told to (--break-lease).
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import hashlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.errors import BusyError, GpufleetError

# The commands that change nodes; the playbooks that take the node lease (each imports playbooks/lease.yml).
CHANGING_COMMANDS = ("provision", "upgrade", "rebuild", "prune", "cordon", "uncordon")
LEASED_PLAYBOOKS = ("site.yml", "upgrade.yml", "rebuild.yml", "prune.yml", "cordon.yml")


def lock_dir() -> Path:
    """Where the controller's inventory locks live (GPUFLEET_LOCK_DIR, default /run/lock/gpufleet)."""
    return Path(os.environ.get("GPUFLEET_LOCK_DIR", "/run/lock/gpufleet"))


def lock_path(inventory: Path) -> Path:
    key = hashlib.sha256(str(inventory.absolute()).encode()).hexdigest()[:16]
    return lock_dir() / f"inventory-{key}.lock"


@dataclass
class Operation:
    """The running operation: its lease (what the playbooks write on each node) and the runs that failed."""

    command: str
    inventory: Path
    break_lease: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    holder: str = field(default_factory=lambda: f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}")
    since: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    failed_limits: list[str | None] = field(default_factory=list)

    def lease(self) -> dict[str, str]:
        return {"id": self.id, "command": f"gpufleet {self.command}", "holder": self.holder, "since": self.since}

    def extravars(self) -> dict:
        return {"gpufleet_lease": self.lease(), "gpufleet_break_lease": self.break_lease}


_current: Operation | None = None


def current_operation() -> Operation | None:
    return _current


def _holder_text(path: Path) -> str:
    try:
        holder = json.loads(path.read_text())
        return f"`{holder['command']}` of {holder['holder']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another gpufleet operation"


def slice_lock_path(inventory: Path, part: str) -> Path:
    """The lock of one slice (`K/N`) of the inventory's operation."""
    return lock_path(inventory).with_suffix(f".slice-{part.replace('/', '-of-')}.lock")


def _open_lock(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        raise GpufleetError(
            f"cannot take the fleet lock {path} ({error.strerror}): run as a user who can write there, or set "
            "GPUFLEET_LOCK_DIR"
        ) from error


def _try_lock(descriptor: int, kind: int) -> bool:
    try:
        fcntl.flock(descriptor, kind | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        return False
    return True


def _slice_holders(inventory: Path) -> list[str]:
    """The holders of the inventory's slices that run now."""
    holders = []
    for path in sorted(lock_dir().glob(lock_path(inventory).stem + ".slice-*.lock")):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            if not _try_lock(descriptor, fcntl.LOCK_SH):
                holders.append(_holder_text(path))
        finally:
            os.close(descriptor)
    return holders


@contextmanager
def fleet_operation(
    command: str, inventory: Path, break_lease: bool = False, part: str | None = None
) -> Iterator[Operation]:
    """Holds the inventory's lock for the operation; GpufleetError naming the holder when another one runs.

    A slice of an operation (`part`: K/N, gpufleet.slicing) shares the inventory's lock with the other slices and
    holds its own slice's: slices run side by side, never beside a whole operation or the same slice twice.
    """
    global _current
    operation = Operation(command, inventory, break_lease)
    path = lock_path(inventory)
    descriptor = _open_lock(path)
    slice_descriptor = None
    try:
        if not _try_lock(descriptor, fcntl.LOCK_SH if part else fcntl.LOCK_EX):
            holders = [] if part else _slice_holders(inventory)
            raise BusyError(
                f"{inventory} is held by {' and '.join(holders) or _holder_text(path)}: one operation changes a "
                f"fleet at a time; wait for it to end, then run gpufleet {command} again"
            )
        if part:
            held = slice_lock_path(inventory, part)
            slice_descriptor = _open_lock(held)
            if not _try_lock(slice_descriptor, fcntl.LOCK_EX):
                raise BusyError(
                    f"slice {part} of {inventory} is held by {_holder_text(held)}: wait for it to end, then run "
                    f"gpufleet {command} again"
                )
        lease_descriptor = slice_descriptor if slice_descriptor is not None else descriptor
        os.ftruncate(lease_descriptor, 0)
        os.write(lease_descriptor, json.dumps(operation.lease()).encode())
        _current = operation
        try:
            yield operation
        finally:
            _current = None
            if operation.failed_limits:
                try:
                    give_back_leases(operation)
                except GpufleetError as error:
                    # The run's own error is the one to report; this one is said beside it.
                    print(f"gpufleet: could not give the node leases back: {error}", file=sys.stderr)
    finally:
        if slice_descriptor is not None:
            os.close(slice_descriptor)
        os.close(descriptor)


def give_back_leases(operation: Operation) -> None:
    """After a failed run the playbook's own release did not reach every node: give this operation's leases back
    on the nodes that run targeted (a node held by another operation keeps its lease)."""
    from gpufleet.runner import run_playbook  # the runner reads the current operation: imported late

    limits = operation.failed_limits
    limit = None if None in limits else ",".join(sorted({str(item) for item in limits}))
    run_playbook(
        "lease.yml",
        operation.inventory,
        limit=limit,
        extravars={**operation.extravars(), "gpufleet_lease_action": "release"},
        quiet=True,
    )
