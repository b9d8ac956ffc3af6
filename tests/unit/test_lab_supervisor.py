"""The host supervisor's loop: restart on reboot (exit 133), stop on poweroff, stop on SIGTERM.

The child here is a real process that exits with the statuses systemd-nspawn uses; the real nspawn
is exercised by the integration tests (a reboot through Ansible).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.lab.supervisor import REBOOT_EXIT_STATUS, Supervisor, nspawn_command


def child_exiting_with(statuses: list[int], counter: Path) -> list[str]:
    """A command that exits with statuses[n] on its n-th run (the last one repeats)."""
    code = (
        "import pathlib, sys\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        f"statuses = {statuses!r}\n"
        "print(f'boot {n}', flush=True)\n"
        "sys.exit(statuses[min(n, len(statuses) - 1)])\n"
    )
    return [sys.executable, "-c", code]


def test_reboots_restart_and_poweroff_stops(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    supervisor = Supervisor("t-1", tmp_path, child_exiting_with([REBOOT_EXIT_STATUS, REBOOT_EXIT_STATUS, 0], counter))
    assert supervisor.run() == 0
    assert counter.read_text() == "3"
    assert (tmp_path / "console.log").read_text() == "boot 0\nboot 1\nboot 2\n"
    log = (tmp_path / "supervisor.log").read_text()
    assert log.count("host rebooted; starting it again") == 2
    assert not (tmp_path / "nspawn.pid").exists()


def test_failure_exit_stops_and_is_returned(tmp_path: Path) -> None:
    supervisor = Supervisor("t-1", tmp_path, child_exiting_with([1], tmp_path / "count"))
    assert supervisor.run() == 1
    assert "exited with status 1" in (tmp_path / "supervisor.log").read_text()


def test_a_reboot_loop_gives_up(tmp_path: Path) -> None:
    supervisor = Supervisor("t-1", tmp_path, child_exiting_with([REBOOT_EXIT_STATUS], tmp_path / "count"))
    assert supervisor.run() == 1
    assert "giving up" in (tmp_path / "supervisor.log").read_text()


def test_sigterm_is_passed_to_the_child_and_ends_the_loop(tmp_path: Path) -> None:
    got_term = tmp_path / "got-term"
    child = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(got_term)!r}).touch(), sys.exit(0)))\n"
        "time.sleep(60)\n"
    )
    runner = (
        "import sys\n"
        "from pathlib import Path\n"
        "from gpufleet.lab.supervisor import Supervisor\n"
        f"sys.exit(Supervisor('t-1', Path({str(tmp_path)!r}), [sys.executable, '-c', {child!r}]).run())\n"
    )
    process = subprocess.Popen([sys.executable, "-c", runner])
    deadline = time.monotonic() + 10
    while not (tmp_path / "nspawn.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "supervisor.pid").exists()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert got_term.exists()


def test_nspawn_command_boots_in_the_hosts_namespace(tmp_path: Path) -> None:
    command = nspawn_command("lab-1", tmp_path / "rootfs", "/run/netns/lab-1")
    assert command[0] == "systemd-nspawn"
    for flag in (
        "--machine=lab-1",
        "--register=no",
        "--keep-unit",
        "--boot",
        "--network-namespace-path=/run/netns/lab-1",
        f"--directory={tmp_path / 'rootfs'}",
    ):
        assert flag in command
