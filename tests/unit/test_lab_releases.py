"""Mixed lab fleets: which OS each host runs, the Python its root file system gives Ansible, the --os flag."""

from __future__ import annotations

import fnmatch
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.cli import main
from gpufleet.errors import GpufleetError
from gpufleet.lab import fleet, inventory, rootfs
from gpufleet.lab.config import LabConfig
from gpufleet.lab.releases import RELEASES, host_releases, parse_os_list


def test_a_list_is_cycled_over_the_hosts() -> None:
    releases = parse_os_list("debian12,debian13")
    assert [r.name for r in host_releases(releases, 3)] == ["debian12", "debian13", "debian12"]
    assert [r.name for r in host_releases(parse_os_list("debian13"), 2)] == ["debian13", "debian13"]


def test_one_name_per_host_is_kept_in_order() -> None:
    releases = parse_os_list("debian13, debian12")
    assert [r.suite for r in host_releases(releases, 2)] == ["trixie", "bookworm"]


@pytest.mark.parametrize("text", ["ubuntu24", "debian12,", "Debian12", ""])
def test_an_os_the_lab_cannot_boot_is_refused_by_name(text: str) -> None:
    with pytest.raises(GpufleetError, match="the lab boots debian12, debian13"):
        parse_os_list(text)


def test_the_cli_refuses_an_unknown_os_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "up", "--hosts", "1", "--os", "debian12,rhel9"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--os 'rhel9'" in err


def test_every_lab_release_is_a_release_gpufleet_supports() -> None:
    supported = yaml.safe_load((PROJECT_ROOT / "playbooks/vars/platforms.yml").read_text())
    for release in RELEASES.values():
        assert release.release_key in supported["gpufleet_supported_releases"]


def make_tree(root: Path, link: str) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    os.symlink(link, root / "usr/bin/python3")
    return root


@pytest.mark.parametrize("link", ["python3.11", "python3.13"])
def test_the_interpreter_is_the_one_the_rootfs_carries(tmp_path: Path, link: str) -> None:
    assert rootfs.python_interpreter(make_tree(tmp_path, link)) == f"/usr/bin/{link}"


def test_a_python3_link_out_of_usr_bin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GpufleetError, match="not at python3.N"):
        rootfs.python_interpreter(make_tree(tmp_path, "../../opt/evil/python3.13"))


def test_a_linked_usr_bin_is_not_followed(tmp_path: Path) -> None:
    make_tree(tmp_path / "elsewhere", "python3.13")
    (tmp_path / "root/usr").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere/usr/bin", tmp_path / "root/usr/bin")
    with pytest.raises(rootfs.PlantedLinkError):
        rootfs.python_interpreter(tmp_path / "root")


def test_the_inventory_records_each_hosts_os_and_python(tmp_path: Path) -> None:
    config = LabConfig(cache_dir=tmp_path, lab_dir=tmp_path, prefix="h", inventory_path=tmp_path / "h.yml")
    hosts = [
        inventory.InventoryHost("h-1", "10.0.0.2", "http://10.0.0.1:8780", "debian12", "/usr/bin/python3.11"),
        inventory.InventoryHost("h-2", "10.0.0.6", "http://10.0.0.5:8780", "debian13", "/usr/bin/python3.13"),
    ]
    entries = yaml.safe_load(inventory.render(config, hosts))["all"]["children"]["gpu_nodes"]["hosts"]
    assert entries["h-1"]["gpufleet_lab_os"] == "debian12"
    assert entries["h-2"]["gpufleet_lab_os"] == "debian13"
    assert entries["h-2"]["ansible_python_interpreter"] == "/usr/bin/python3.13"


def test_without_os_each_host_keeps_the_os_it_was_made_with(tmp_path: Path) -> None:
    config = LabConfig(cache_dir=tmp_path, lab_dir=tmp_path, prefix="h", inventory_path=tmp_path / "h.yml")
    hosts = [fleet.make_host(config, "10.213.7.0/24", index) for index in (1, 2, 3)]
    for host, marker in zip(
        hosts, ['{"image": "a", "name": "h-1", "os": "debian13"}', '{"image": "b", "name": "h-2"}']
    ):
        host.host_dir.mkdir(parents=True)
        host.marker.write_text(marker + "\n")
    # h-2 was made before hosts recorded their OS (a Debian 12 image), h-3 does not exist yet.
    assert [r.name for r in fleet.kept_releases(hosts)] == ["debian13", "debian12", "debian12"]


def test_debian12s_image_keeps_its_recipe() -> None:
    """Bookworm's headers pull no kernel image: its image (and the cached tar every lab boots) is unchanged."""
    assert rootfs.recipe(RELEASES["debian12"])["customize_hooks"] == list(rootfs.CUSTOMIZE_HOOKS)


def written_excludes(tmp_path: Path) -> list[str]:
    """Runs the Debian 13 image's last customize hook as mmdebstrap does (sh, "$1" the root) on a tree."""
    (tmp_path / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True)
    hook = rootfs.recipe(RELEASES["debian13"])["customize_hooks"][-1]
    subprocess.run(["sh", "-c", hook, "sh", str(tmp_path)], check=True)
    lines = (tmp_path / rootfs.UNRUN_KERNEL_CONF).read_text().splitlines()
    assert lines[0].startswith("# "), "the file says why"
    return [line.removeprefix("path-exclude=") for line in lines[1:] if line.startswith("path-exclude=")]


# Paths as trixie's linux-image-6.12.118+deb13-amd64 and linux-headers-6.12.118+deb13-amd64 list them (dpkg -c).
KERNEL = "6.12.118+deb13-amd64"
LEFT_OUT = [f"/boot/vmlinuz-{KERNEL}", f"/usr/lib/modules/{KERNEL}/kernel/drivers/gpu/drm/nouveau/nouveau.ko.xz"]
KEPT = [
    f"/usr/lib/modules/{KERNEL}/build",
    f"/usr/lib/modules/{KERNEL}/modules.order",
    f"/boot/config-{KERNEL}",
    f"/usr/src/linux-headers-{KERNEL}/Module.symvers",
    f"/usr/share/doc/linux-image-{KERNEL}/copyright",
]


def test_debian13_hosts_leave_the_unrun_kernels_image_and_modules_out(tmp_path: Path) -> None:
    """dpkg matches path-exclude with fnmatch(3) without flags ('*' crosses '/'), as fnmatchcase does."""
    excludes = written_excludes(tmp_path)
    assert excludes == list(RELEASES["debian13"].unrun_kernel_paths)
    assert [path for path in LEFT_OUT if not any(fnmatch.fnmatchcase(path, glob) for glob in excludes)] == []
    # The headers (and their build link, which the installer and DKMS build against) stay.
    assert [path for path in KEPT if any(fnmatch.fnmatchcase(path, glob) for glob in excludes)] == []
