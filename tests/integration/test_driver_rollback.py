"""A driver upgrade on a node whose GPUs are in use, on a lab host with the LAB-STANDIN runfiles.

The stand-in installer refuses, as NVIDIA's does, to install while the loaded module is in use; the role
stops the units that hold the GPUs (a serving vllm@ instance among them) first, and when the new runfile
fails it reinstalls the previous one and says so. The holder is a unit file for one vllm@ instance (it
takes precedence over the serve layer's template for that instance only); the host is cleaned before and
after, as test_driver.py does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_driver_support import FAIL_MARKER, play, runfile_test_host, runfile_test_inventory, sh

from gpufleet import PROJECT_ROOT

pytestmark = pytest.mark.lab

OLD, NEW = "570.124.06", "580.95.05"
HOLDER = "vllm@gpufleet-test-holder.service"
BUSY = "An NVIDIA kernel module 'nvidia' appears to already be loaded in your kernel."
CLEAN = f"""
rm -f {FAIL_MARKER}
systemctl stop {HOLDER} 2>/dev/null; rm -f /etc/systemd/system/{HOLDER}
if [ -x /usr/bin/nvidia-uninstall ]; then /usr/bin/nvidia-uninstall --silent; fi
systemctl disable --now nvidia-persistenced 2>/dev/null
rm -f /etc/systemd/system/nvidia-persistenced.service /etc/modprobe.d/blacklist-nouveau.conf
rm -rf /etc/gpufleet-simgpu /var/cache/gpufleet/artifacts /root/gpufleet-test-new.run
rm -f /var/log/nvidia-installer.log /var/log/nvidia-uninstall.log /var/lib/gpufleet/nvidia-driver.json
# A half-way failed install leaves its files unrecorded (as the real installer does): remove its library too.
rm -f /lib/x86_64-linux-gnu/libnvidia-ml.so* /usr/lib/x86_64-linux-gnu/libnvidia-ml.so* && ldconfig
systemctl daemon-reload
"""
START_HOLDER = f"""
printf '[Unit]\\nDescription=gpufleet test: a serving instance holding the GPUs\\n[Service]\\nExecStart=/bin/sleep infinity\\n' \\
  > /etc/systemd/system/{HOLDER}
systemctl daemon-reload && systemctl start {HOLDER} && systemctl is-active {HOLDER}
"""


@pytest.fixture(scope="module")
def inventory(lab_inventory: Path) -> Path:
    return runfile_test_inventory(lab_inventory)


@pytest.fixture(scope="module")
def host(inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[str]:
    yield from runfile_test_host(inventory, lab_hosts, CLEAN, restore="driver.yml")


def _driver_on_disk(inventory: Path, host: str) -> str:
    return sh(inventory, host, "sed -n '1s/.*(\\(.*\\)).*/\\1/p' /var/lib/nvidia/log 2>/dev/null; true")[1].strip()


def _new_runfile_on(inventory: Path, host: str) -> str:
    """The NEW stand-in, copied to the host as an operator would before running it by hand."""
    built = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "lab" / "runfiles" / "build.py"), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    path = next(item["path"] for item in json.loads(built.stdout) if NEW in item["name"])
    command = [
        str(Path(sys.executable).parent / "ansible"),
        "-i",
        str(inventory),
        host,
        "-m",
        "ansible.builtin.copy",
        "-a",
        f"src={path} dest=/root/gpufleet-test-new.run mode=0700",
    ]
    assert subprocess.run(command, capture_output=True, check=False, cwd=PROJECT_ROOT, timeout=300).returncode == 0
    return "/root/gpufleet-test-new.run"


def test_the_installer_refuses_a_module_in_use(inventory: Path, host: str) -> None:
    run = play(inventory, host, "driver.yml", extra={"nvidia_driver_version": OLD})
    assert run.rc == 0, run.describe()
    rc, text = sh(inventory, host, START_HOLDER)
    assert rc == 0 and text.strip() == "active", text
    runfile = _new_runfile_on(inventory, host)
    rc, text = sh(inventory, host, f"sh {runfile} --silent --no-dkms")
    assert rc == 1, text
    assert BUSY in text and "module's usage count, for which the simplest remedy is to reboot your computer." in text
    assert "in use by: " in sh(inventory, host, "cat /var/log/nvidia-installer.log")[1]
    assert _driver_on_disk(inventory, host) == OLD, "nothing was installed or removed"


def test_a_failed_upgrade_stops_the_instances_first_and_puts_the_previous_driver_back(
    inventory: Path, host: str
) -> None:
    rc, text = sh(
        inventory,
        host,
        f"mkdir -p {Path(FAIL_MARKER).parent} && echo 'driver {NEW}' > {FAIL_MARKER} && systemctl is-active {HOLDER}",
    )
    assert rc == 0 and text.strip() == "active", text
    run = play(inventory, host, "driver.yml", extra={"nvidia_driver_version": NEW})
    assert run.rc != 0, run.describe()
    stopping = run.output.split("Stop the services and serving instances that hold the GPUs open] ***")[1].split(
        "TASK ["
    )[0]
    assert f"changed: [{host}] => (item={HOLDER})" in stopping, run.describe()
    assert "failure injected half-way through the installation" in run.output
    assert BUSY not in run.output, "nothing held the module when the installer ran"
    assert f"The previous driver {OLD} was reinstalled from /var/cache/gpufleet/artifacts/" in run.output
    assert _driver_on_disk(inventory, host) == OLD
    rc, text = sh(inventory, host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u")
    assert rc == 0 and text.strip() == OLD, text
    assert sh(inventory, host, f"systemctl is-active {HOLDER}")[1].strip() == "inactive"
