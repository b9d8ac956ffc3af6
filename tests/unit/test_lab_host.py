"""Per-host files written into a host's root file system, and SSH key handling (no root network needed)."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from gpufleet.lab import host as hostlib
from gpufleet.lab import keys
from gpufleet.lab.addressing import host_address
from gpufleet.lab.config import LabConfig
from gpufleet.lab.fleet import make_host, prepare_keys
from gpufleet.lab.procs import is_alive
from gpufleet.lab.releases import RELEASES


@pytest.fixture
def config(tmp_path: Path) -> LabConfig:
    return LabConfig(
        cache_dir=tmp_path / "cache", lab_dir=tmp_path / "lab", prefix="lab", inventory_path=tmp_path / "hosts.yml"
    )


@pytest.fixture
def fake_tree(config: LabConfig) -> hostlib.Host:
    """A host whose rootfs holds the few files the image has before per-host configuration."""
    host = make_host(config, "10.213.7.0/24", 2)
    (host.rootfs / "etc/ssh").mkdir(parents=True)
    (host.rootfs / "etc/apt").mkdir(parents=True)
    (host.rootfs / "root").mkdir(parents=True)
    (host.rootfs / "etc/machine-id").write_text("")
    return host


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_are_generated_once(config: LabConfig) -> None:
    keys.generate_key(config.private_key, "test")
    first = keys.public_key(config.private_key)
    keys.generate_key(config.private_key, "test")
    assert keys.public_key(config.private_key) == first
    assert first.startswith("ssh-ed25519 ")
    assert mode(config.private_key) == 0o600


def test_known_hosts_lists_every_host_key(config: LabConfig) -> None:
    hosts = [make_host(config, "10.213.7.0/24", index) for index in (1, 2)]
    prepare_keys(config, hosts)
    lines = config.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["10.213.7.6,lab-1", "10.213.7.10,lab-2"]
    host_key = keys.public_key(hostlib.host_key_path(config, "lab-2")).split()[1]
    assert lines[1].split()[1:] == ["ssh-ed25519", host_key]


def test_configure_writes_identity_keys_and_sources(config: LabConfig, fake_tree: hostlib.Host) -> None:
    prepare_keys(config, [fake_tree])
    hostlib.configure_rootfs(fake_tree, config, "http://10.213.7.9:8780", RELEASES["debian12"])
    root = fake_tree.rootfs
    assert (root / "etc/hostname").read_text() == "lab-2\n"
    assert "127.0.1.1\tlab-2" in (root / "etc/hosts").read_text()
    assert len((root / "etc/machine-id").read_text().strip()) == 32
    authorized = root / "root/.ssh/authorized_keys"
    assert authorized.read_text().strip() == keys.public_key(config.private_key)
    assert mode(authorized) == 0o600 and mode(root / "root/.ssh") == 0o700
    host_key = root / "etc/ssh/ssh_host_ed25519_key"
    assert host_key.read_text() == hostlib.host_key_path(config, "lab-2").read_text()
    assert mode(host_key) == 0o600
    sources = (root / "etc/apt/sources.list").read_text()
    assert "deb http://10.213.7.9:8780/debian bookworm main" in sources
    assert "deb http://10.213.7.9:8780/debian-security bookworm-security main" in sources


def test_a_debian13_host_gets_trixie_sources(config: LabConfig, fake_tree: hostlib.Host) -> None:
    prepare_keys(config, [fake_tree])
    hostlib.configure_rootfs(fake_tree, config, "http://10.213.7.9:8780", RELEASES["debian13"])
    sources = (fake_tree.rootfs / "etc/apt/sources.list").read_text().splitlines()
    assert sources == [
        "deb http://10.213.7.9:8780/debian trixie main",
        "deb http://10.213.7.9:8780/debian trixie-updates main",
        "deb http://10.213.7.9:8780/debian-security trixie-security main",
    ]


def test_machine_id_survives_reconfiguration(config: LabConfig, fake_tree: hostlib.Host) -> None:
    prepare_keys(config, [fake_tree])
    hostlib.configure_rootfs(fake_tree, config, "http://x:1", RELEASES["debian12"])
    first = (fake_tree.rootfs / "etc/machine-id").read_text()
    hostlib.configure_rootfs(fake_tree, config, "http://x:1", RELEASES["debian12"])
    assert (fake_tree.rootfs / "etc/machine-id").read_text() == first


def test_configure_does_not_follow_links_out_of_the_tree(
    config: LabConfig, fake_tree: hostlib.Host, tmp_path: Path
) -> None:
    outside = tmp_path / "controller-file"
    outside.write_text("precious\n")
    (fake_tree.rootfs / "etc/hostname").symlink_to(outside)
    prepare_keys(config, [fake_tree])
    hostlib.configure_rootfs(fake_tree, config, "http://x:1", RELEASES["debian12"])
    assert outside.read_text() == "precious\n"
    assert (fake_tree.rootfs / "etc/hostname").read_text() == "lab-2\n"


def test_rootfs_ready_needs_the_current_image_marker(config: LabConfig, fake_tree: hostlib.Host) -> None:
    assert not hostlib.rootfs_ready(fake_tree, "abc")
    fake_tree.marker.write_text('{"image": "abc", "name": "lab-2"}\n')
    assert hostlib.rootfs_ready(fake_tree, "abc")
    assert not hostlib.rootfs_ready(fake_tree, "def")


def test_ssh_command_verifies_host_keys(config: LabConfig) -> None:
    command = hostlib.ssh_command(config, "10.213.7.6", "true")
    assert f"UserKnownHostsFile={config.known_hosts}" in command
    assert "StrictHostKeyChecking=yes" in command
    assert command[-2:] == ["root@10.213.7.6", "true"]


def test_console_tail_reports_logs(fake_tree: hostlib.Host) -> None:
    assert hostlib.console_tail(fake_tree) == "(no log written)"
    fake_tree.file("console_log").write_text("".join(f"line {n}\n" for n in range(100)))
    tail = hostlib.console_tail(fake_tree, lines=3)
    assert tail.endswith("line 97\nline 98\nline 99")


def test_host_address_matches_inventory_index(config: LabConfig) -> None:
    assert make_host(config, "10.213.7.0/24", 2).address == host_address("10.213.7.0/24", 2)


def test_a_started_supervisor_is_recorded_before_start_supervisor_returns(
    fake_tree: hostlib.Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lab up` checks a host right after starting it: a supervisor whose interpreter is slow to start (a loaded
    controller) must already be recorded, or the check reports the booting host as stopped (seen on 2026-12-07:
    "lab host lab-3 stopped while booting" with an empty supervisor log)."""
    python = sys.executable
    slow_supervisor = tmp_path / "slow-supervisor"
    pid_file = fake_tree.file("supervisor_pid")
    slow_supervisor.write_text(
        "#!/bin/sh\nsleep 0.5\n"
        f"exec {python} -c 'import os, time; from pathlib import Path; from gpufleet.lab.procs import write_pid_file; "
        f'write_pid_file(Path("{pid_file}"), os.getpid()); time.sleep(30)\'\n'
    )
    slow_supervisor.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow_supervisor))
    fake_tree.file("supervisor_log").parent.mkdir(parents=True, exist_ok=True)
    hostlib.start_supervisor(fake_tree)
    record = fake_tree.supervisor()
    try:
        assert is_alive(record)
    finally:
        if record is not None:
            os.kill(record.pid, signal.SIGKILL)
