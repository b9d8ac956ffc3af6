"""Fabric manager on a lab host made an NVSwitch (HGX) system: the driver layer installs NVIDIA's fabric manager
archive of exactly the driver's version (the LAB-STANDIN archive of lab/runfiles) and runs it (check mode only
says so), a rerun changes nothing, and a fabric manager of another version is refused naming both. The host is given back as it was: its
own GPU description, no fabric manager file, unit or cached archive."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.lab import mirror

from test_driver_support import play, publish_standins, sh

HGX = PROJECT_ROOT / "lab" / "simgpu" / "hgx-h200x8.json"
DESCRIPTION = "/etc/gpufleet-simgpu/gpus.json"
SAVED = "/var/lib/gpufleet-test-fm-gpus.json"
# A real (empty) Debian package under the name NVIDIA's apt repository gives the fabric manager of R580.
APT_PACKAGE = "nvidia-fabricmanager-580"
# nvidia_fabric_manager_install's default record, which names every file it installed.
RECORD = "/var/lib/gpufleet/nvidia-fabricmanager.json"
ARTIFACT_CACHE = yaml.safe_load((PROJECT_ROOT / "roles/artifact/defaults/main.yml").read_text())["artifact_node_cache"]


def driver_version(inventory: Path, host: str) -> str:
    rc, out = sh(inventory, host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1")
    assert rc == 0, out
    return out.strip()


def restore(inventory: Path, host: str) -> None:
    """No fabric manager left (service, files, record, cached archive) and the host's own GPUs back."""
    script = f"""
set -e
systemctl disable --now nvidia-fabricmanager.service 2>/dev/null || true
dpkg --purge {APT_PACKAGE} > /dev/null 2>&1 || true
if [ -f {RECORD} ]; then
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("\\n".join(r["files"])); print(r["sha256"])' {RECORD} |
    while read -r path; do case "$path" in /*) rm -f "$path" ;; *) rm -rf {ARTIFACT_CACHE}/"$path" ;; esac; done
    rm -f {RECORD}
fi
rm -f /etc/systemd/system/nvidia-fabricmanager.service
rm -rf /var/run/nvidia-fabricmanager
ldconfig
rmdir /usr/share/nvidia/nvswitch /usr/share/nvidia /usr/share/doc/nvidia-fabricmanager 2>/dev/null || true
systemctl daemon-reload
systemctl reset-failed nvidia-fabricmanager.service 2>/dev/null || true
if [ -f {SAVED} ]; then mv {SAVED} {DESCRIPTION}; fi
"""
    rc, out = sh(inventory, host, script)
    assert rc == 0, out


@pytest.fixture
def hgx_host(lab_inventory: Path, lab_hosts: dict, ansible) -> Iterator[str]:
    """The last lab host, its simulated GPUs switched to the HGX board (8 H200 on an NVSwitch fabric) at its own
    driver version."""
    host = sorted(lab_hosts)[-1]
    version = driver_version(lab_inventory, host)
    rc, out = sh(lab_inventory, host, f"cp -p {DESCRIPTION} {SAVED}")
    assert rc == 0, out
    try:
        ansible(host, "ansible.builtin.copy", f"src={HGX} dest={DESCRIPTION} mode=0644")
        cuda = json.loads(sh(lab_inventory, host, f"cat {SAVED}")[1])["driver"]["cuda_driver_version"]
        rc, out = sh(lab_inventory, host, f"gpufleet-simgpuctl driver-version {version} --cuda {cuda}")
        assert rc == 0, out
        yield host
    finally:
        restore(lab_inventory, host)


def fabric_check(inventory: Path, host: str, version: str) -> tuple[int, dict]:
    """nvidia_fabric_manager on the host as the role's last step runs it; (ansible's rc, the module's result)."""
    args = json.dumps({"driver_version": version, "service_active": True})
    with tempfile.TemporaryDirectory(prefix="gpufleet-ansible-") as tree:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible"),
                "-i",
                str(inventory),
                host,
                "-m",
                "gpufleet.fleet.nvidia_fabric_manager",
                "-a",
                args,
                "--tree",
                tree,
            ],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            timeout=300,
            check=False,
        )
        return result.returncode, json.loads((Path(tree) / host).read_text())


def drift_findings(inventory: Path, host: str) -> list[tuple]:
    """`gpufleet drift --layers driver` on the host: (check, field, expected, actual) of each finding."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-drift-") as out:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "gpufleet"),
                "drift",
                "-i",
                str(inventory),
                "--limit",
                host,
                "--layers",
                "driver",
                "--out",
                out,
            ],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            timeout=300,
            check=False,
        )
        report = json.loads((Path(out) / "report.json").read_text())
    layer = report["nodes"][host]["layers"]["driver"]
    assert result.returncode in (0, 2) and not layer["errors"], result.stdout + result.stderr
    return [(item["check"], item["field"], item["expected"], item["actual"]) for item in layer["drift"]]


@pytest.mark.slow
def test_the_driver_layer_installs_and_runs_the_drivers_fabric_manager_and_refuses_another(
    lab_inventory: Path, hgx_host: str, ansible
) -> None:
    sums = publish_standins()
    version = driver_version(lab_inventory, hgx_host)
    other = next(name for name in sums if name.startswith("fabricmanager-") and f"-{version}-" not in name)
    assert f"fabricmanager-linux-x86_64-{version}-archive.tar.xz" in sums

    # Check mode says the fabric manager would be installed and started, and installs nothing.
    planned = play(lab_inventory, hgx_host, "driver.yml", "--check")
    assert planned.rc == 0 and planned.changed > 0, planned.describe()
    assert sh(lab_inventory, hgx_host, "test ! -e /usr/bin/nv-fabricmanager && test ! -e " + RECORD)[0] == 0

    first = play(lab_inventory, hgx_host, "driver.yml")
    assert first.rc == 0 and first.changed > 0, first.describe()
    rc, out = sh(
        lab_inventory,
        hgx_host,
        "systemctl is-active nvidia-fabricmanager.service; systemctl is-enabled "
        "nvidia-fabricmanager.service; nv-fabricmanager --version; readlink /usr/lib/x86_64-linux-gnu/libnvfm.so",
    )
    assert rc == 0 and out.split("\n")[:4] == [
        "active",
        "enabled",
        f"Fabric Manager version is : {version}",
        "libnvfm.so.1",
    ], out
    rc, checked = fabric_check(lab_inventory, hgx_host, version)
    assert rc == 0 and checked["nvswitch"] and checked["fabric_manager_version"] == version, checked
    # The running stand-in trained the simulated fabric, as nvidia-fabricmanager does.
    assert {gpu["state"] for gpu in checked["fabric"]} == {"completed"} and len(checked["fabric"]) == 8, checked

    assert drift_findings(lab_inventory, hgx_host) == []

    rerun = play(lab_inventory, hgx_host, "driver.yml")
    assert rerun.rc == 0 and rerun.changed == 0, rerun.describe()

    # Another driver's fabric manager binary in place of this one's: refused, naming both versions.
    other_version, top = other.split("-")[3], other[: -len(".tar.xz")]
    ansible(
        hgx_host, "ansible.builtin.copy", f"src={mirror.mirror_dir() / 'nvidia' / other} dest=/tmp/{other} mode=0600"
    )
    rc, out = sh(
        lab_inventory,
        hgx_host,
        f"tar -xJf /tmp/{other} -C /tmp && install -m 0755 "
        f"/tmp/{top}/bin/nv-fabricmanager /usr/bin/nv-fabricmanager && rm -rf /tmp/{other} /tmp/{top}",
    )
    assert rc == 0, out
    rc, refused = fabric_check(lab_inventory, hgx_host, version)
    assert rc != 0 and refused["fabric_manager_version"] == other_version, refused
    assert f"nvidia-fabricmanager {other_version} does not match the NVIDIA driver {version}" in refused["msg"]
    assert drift_findings(lab_inventory, hgx_host) == [("nvidia-fabricmanager", "version", version, other_version)]

    # A fabric manager installed from apt beside it: the driver layer refuses with the fix and installs nothing.
    rc, out = sh(
        lab_inventory,
        hgx_host,
        f"""set -e; d=$(mktemp -d); mkdir $d/DEBIAN
printf 'Package: {APT_PACKAGE}\\nVersion: {version}-1\\nArchitecture: all\\nMaintainer: gpufleet tests <tests@invalid>\\nDescription: gpufleet test package named as the apt fabric manager\\n' > $d/DEBIAN/control
dpkg-deb --build $d $d.deb > /dev/null && dpkg -i $d.deb > /dev/null && rm -rf $d $d.deb""",
    )
    assert rc == 0, out
    refused_apt = play(lab_inventory, hgx_host, "driver.yml")
    assert refused_apt.rc != 0 and refused_apt.changed == 0, refused_apt.describe()
    assert (
        f"{APT_PACKAGE} installed from apt" in refused_apt.output
        and f"apt-get purge {APT_PACKAGE}" in refused_apt.output
    )
