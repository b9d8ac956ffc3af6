"""Keeps one lab host running: starts systemd-nspawn and starts it again when the host reboots.

Run as `python -m gpufleet.lab.supervisor --name lab-1 --host-dir DIR`. systemd-nspawn exits with
status 133 when the container asks for a reboot; any other exit (0 = poweroff) ends the supervisor,
and so does SIGTERM (sent by `gpufleet lab down`), which is passed on to nspawn for a clean poweroff.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpufleet.lab import cgroups
from gpufleet.lab.procs import write_pid_file

REBOOT_EXIT_STATUS = 133
# How long nspawn gets to power the container off after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 45
# A host that reboots this often in a row is broken; stop instead of spinning.
MAX_QUICK_REBOOTS = 5
QUICK_REBOOT_SECONDS = 10


def host_paths(host_dir: Path) -> dict[str, Path]:
    """The files the supervisor and `gpufleet lab` share for one host."""
    return {
        "rootfs": host_dir / "rootfs",
        "supervisor_pid": host_dir / "supervisor.pid",
        "nspawn_pid": host_dir / "nspawn.pid",
        "console_log": host_dir / "console.log",
        "supervisor_log": host_dir / "supervisor.log",
    }


NSPAWN_ENVIRONMENT = {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def nspawn_command(name: str, rootfs: Path, netns_path: str) -> list[str]:
    return [
        "systemd-nspawn",
        f"--directory={rootfs}",
        f"--machine={name}",
        "--register=no",
        "--keep-unit",
        "--boot",
        f"--network-namespace-path={netns_path}",
        # stdin is not a terminal: copy the console to the log, take no input.
        "--console=read-only",
        "--link-journal=no",
        # With bpf() (nspawn's seccomp filter refuses it by default) and the unified cgroup hierarchy
        # (NSPAWN_ENVIRONMENT), the container's systemd enforces DevicePolicy=/DeviceAllow= and IPAddressDeny=;
        # on this hybrid host nspawn otherwise gives it read-only v1 controllers and they are silently not applied.
        "--system-call-filter=bpf",
    ]


class Supervisor:
    """Runs nspawn in a loop; a small state machine driven by nspawn's exit status and SIGTERM.

    With a cgroup (cgroups.host_cgroup), nspawn runs in it, apart from every other host's nspawn."""

    def __init__(self, name: str, host_dir: Path, command: list[str], cgroup: Path | None = None) -> None:
        self.name = name
        self.paths = host_paths(host_dir)
        self.command = command
        self.cgroup = cgroup
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def log(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with self.paths["supervisor_log"].open("a") as handle:
            handle.write(f"{stamp} {self.name}: {message}\n")

    def on_stop_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only a flag: the wait loop passes the stop on to nspawn, also when it started after the signal.
        self.stopping = True

    def run_once(self) -> int:
        """Boots the host once and returns nspawn's exit status."""
        if self.cgroup is not None:
            self.cgroup.mkdir(exist_ok=True)
        with self.paths["console_log"].open("ab") as console:
            self.child = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=console,
                env={**os.environ, **NSPAWN_ENVIRONMENT},
                # Moved before nspawn runs: nspawn reads its own cgroup at start.
                preexec_fn=None if self.cgroup is None else functools.partial(cgroups.enter, self.cgroup),
            )
        write_pid_file(self.paths["nspawn_pid"], self.child.pid)
        self.log(f"started systemd-nspawn pid {self.child.pid}" + (f" in {self.cgroup}" if self.cgroup else ""))
        return self.wait_child()

    def wait_child(self) -> int:
        assert self.child is not None
        deadline: float | None = None
        while True:
            try:
                return self.child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if self.stopping and deadline is None:
                # nspawn turns SIGTERM into an orderly poweroff of the container.
                self.child.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_SECONDS
            if deadline is not None and time.monotonic() > deadline:
                self.log("nspawn did not power off in time; killing it")
                self.child.kill()

    def run(self) -> int:
        write_pid_file(self.paths["supervisor_pid"], os.getpid())
        signal.signal(signal.SIGTERM, self.on_stop_signal)
        signal.signal(signal.SIGINT, self.on_stop_signal)
        try:
            return self.boot_until_stopped()
        finally:
            if self.cgroup is not None:
                cgroups.remove(self.cgroup)

    def boot_until_stopped(self) -> int:
        quick_reboots = 0
        while True:
            started = time.monotonic()
            status = self.run_once()
            self.paths["nspawn_pid"].unlink(missing_ok=True)
            self.log(f"systemd-nspawn exited with status {status}")
            if self.stopping or status != REBOOT_EXIT_STATUS:
                self.log("supervisor stopping")
                return 0 if status in (0, REBOOT_EXIT_STATUS) or self.stopping else status
            quick_reboots = quick_reboots + 1 if time.monotonic() - started < QUICK_REBOOT_SECONDS else 0
            if quick_reboots >= MAX_QUICK_REBOOTS:
                self.log(f"{quick_reboots} reboots within {QUICK_REBOOT_SECONDS}s each; giving up")
                return 1
            self.log("host rebooted; starting it again")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--host-dir", required=True, type=Path)
    parser.add_argument("--netns", required=True, help="path of the network namespace, /run/netns/NAME")
    args = parser.parse_args(argv)
    command = nspawn_command(args.name, args.host_dir / "rootfs", args.netns)
    return Supervisor(args.name, args.host_dir, command, cgroups.host_cgroup(args.name)).run()


if __name__ == "__main__":
    sys.exit(main())
