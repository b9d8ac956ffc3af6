"""A reused lab host tree was written by its guest as root: configuring it again must not follow a link the
guest planted, at the file or at any directory above it (a guest's /root/.ssh -> the controller's)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpufleet.lab import host as hostlib
from gpufleet.lab.config import LabConfig
from gpufleet.lab.fleet import make_host, prepare_keys
from gpufleet.lab.releases import RELEASES
from gpufleet.lab.rootfs import PlantedLinkError, tree_read, tree_write


@pytest.fixture
def config(tmp_path: Path) -> LabConfig:
    return LabConfig(
        cache_dir=tmp_path / "cache", lab_dir=tmp_path / "lab", prefix="lab", inventory_path=tmp_path / "hosts.yml"
    )


@pytest.fixture
def reused(config: LabConfig) -> hostlib.Host:
    """A host tree as a previous boot left it, keys prepared."""
    host = make_host(config, "10.213.7.0/24", 1)
    for directory in ("etc/ssh", "etc/apt", "root/.ssh"):
        (host.rootfs / directory).mkdir(parents=True)
    (host.rootfs / "etc/machine-id").write_text("")
    prepare_keys(config, [host])
    return host


@pytest.fixture
def controller(tmp_path: Path) -> Path:
    """Stands for a controller directory (/root/.ssh, /etc/apt) a guest's link could aim at."""
    directory = tmp_path / "controller"
    directory.mkdir()
    (directory / "authorized_keys").write_text("the controller's own keys\n")
    (directory / "sources.list").write_text("the controller's sources\n")
    return directory


def snapshot(directory: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(directory.iterdir())}


@pytest.mark.parametrize("planted", ["root/.ssh", "etc/apt", "etc/ssh", "etc", "root"])
def test_a_planted_directory_link_is_refused_and_nothing_outside_is_written(
    config: LabConfig, reused: hostlib.Host, controller: Path, planted: str
) -> None:
    link = reused.rootfs / planted
    os.rename(link, link.with_name(link.name + ".moved"))
    link.symlink_to(controller, target_is_directory=True)
    before = snapshot(controller)
    with pytest.raises(PlantedLinkError, match="is a symbolic link or not a directory"):
        hostlib.configure_rootfs(reused, config, "http://x:1", RELEASES["debian12"])
    assert snapshot(controller) == before


def test_planted_file_links_are_replaced_not_followed(
    config: LabConfig, reused: hostlib.Host, controller: Path
) -> None:
    (reused.rootfs / "root/.ssh/authorized_keys").symlink_to(controller / "authorized_keys")
    (reused.rootfs / "etc/apt/sources.list").symlink_to(controller / "sources.list")
    (reused.rootfs / "etc/machine-id").unlink()
    (reused.rootfs / "etc/machine-id").symlink_to(controller / "authorized_keys")
    before = snapshot(controller)
    hostlib.configure_rootfs(reused, config, "http://x:1", RELEASES["debian12"])
    assert snapshot(controller) == before
    for name in ("root/.ssh/authorized_keys", "etc/apt/sources.list", "etc/machine-id"):
        assert not (reused.rootfs / name).is_symlink()
    assert len((reused.rootfs / "etc/machine-id").read_text().strip()) == 32


def test_a_planted_fifo_does_not_hang_the_read(reused: hostlib.Host) -> None:
    (reused.rootfs / "etc/machine-id").unlink()
    os.mkfifo(reused.rootfs / "etc/machine-id")
    assert tree_read(reused.rootfs, "etc/machine-id") == ""
    tree_write(reused.rootfs, "etc/machine-id", "0" * 32 + "\n", 0o444)
    machine_id = reused.rootfs / "etc/machine-id"
    assert stat.S_ISREG(machine_id.lstat().st_mode) and stat.S_IMODE(machine_id.stat().st_mode) == 0o444


def test_missing_directories_are_made_inside_the_tree(reused: hostlib.Host) -> None:
    tree_write(reused.rootfs, "etc/ssh/sshd_config.d/gpufleet-lab.conf", "HostKey x\n")
    assert (reused.rootfs / "etc/ssh/sshd_config.d/gpufleet-lab.conf").read_text() == "HostKey x\n"
    assert not list(reused.rootfs.glob("etc/ssh/sshd_config.d/.*"))
