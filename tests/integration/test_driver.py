"""The nvidia_driver role on a lab host, from LAB-STANDIN runfiles served by the lab mirror.

One scenario, in order (each test builds on the state the previous one left): the missing-headers error,
a fresh install of R570, idempotence, check mode on a converged node, a wrong sha256 refused before any
change (controller cache and node pull), check mode on an outdated node, an upgrade to R580 whose installer
fails half-way (log tail) and whose rerun completes with a real reboot, a refused downgrade, and a pending
reboot with nvidia_driver_reboot: never. The host is left clean afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from test_driver_support import (
    FAIL_MARKER,
    PlayRun,
    boot_id,
    play,
    publish_standins,
    runfile_test_host,
    runfile_test_inventory,
    sh,
)

pytestmark = pytest.mark.lab

OLD, NEW = "570.124.06", "580.95.05"
CLEAN = f"""
rm -f {FAIL_MARKER}
if [ -x /usr/bin/nvidia-uninstall ]; then /usr/bin/nvidia-uninstall --silent; fi
systemctl disable --now nvidia-persistenced 2>/dev/null
rm -f /etc/systemd/system/nvidia-persistenced.service /etc/modprobe.d/blacklist-nouveau.conf
rm -rf /etc/gpufleet-simgpu /var/cache/gpufleet/artifacts /var/tmp/gpufleet-artifact-*
rm -f /var/log/nvidia-installer.log /var/log/nvidia-uninstall.log
# A half-way failed install leaves its files unrecorded (as the real installer does): remove its library too.
rm -f /lib/x86_64-linux-gnu/libnvidia-ml.so* /usr/lib/x86_64-linux-gnu/libnvidia-ml.so* && ldconfig
systemctl daemon-reload
"""


@pytest.fixture(scope="module")
def inventory(lab_inventory: Path) -> Path:
    return runfile_test_inventory(lab_inventory)


@pytest.fixture(scope="module")
def host(inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[str]:
    yield from runfile_test_host(inventory, lab_hosts, CLEAN, restore="driver.yml")


def driver_on_disk(inventory: Path, host: str) -> str:
    rc, text = sh(inventory, host, "sed -n '1s/.*(\\(.*\\)).*/\\1/p' /var/lib/nvidia/log 2>/dev/null; true")
    return text.strip()


def smi(inventory: Path, host: str) -> tuple[int, str]:
    return sh(inventory, host, "nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader")


def driver(inventory: Path, host: str, version: str, *args: str, **extra: object) -> PlayRun:
    return play(inventory, host, "driver.yml", *args, extra={"nvidia_driver_version": version, **extra})


def test_missing_headers_for_the_running_kernel_fail_clearly(inventory: Path, host: str) -> None:
    rc, kernel = sh(inventory, host, "uname -r")
    rc, shown = sh(inventory, host, f"apt-cache show linux-headers-{kernel.strip()} >/dev/null 2>&1")
    if rc == 0:
        pytest.skip(f"Debian has headers for this machine's kernel {kernel.strip()}: nothing missing to test")
    # The role's own default (the running kernel's headers), which the lab inventory overrides because of this.
    default = '{"nvidia_driver_kernel_headers_package": ""}'
    run = driver(inventory, host, OLD, "-e", default)
    assert run.rc != 0, run.describe()
    assert f"cannot install linux-headers-{kernel.strip()}, the headers of the running kernel" in run.output
    assert "Fix: boot a kernel your distribution ships headers for" in run.output
    assert driver_on_disk(inventory, host) == "", "nothing was installed"


def test_fresh_install(inventory: Path, host: str) -> None:
    run = driver(inventory, host, OLD)
    assert run.rc == 0, run.describe()
    assert run.changed > 0
    assert driver_on_disk(inventory, host) == OLD
    rc, text = smi(inventory, host)
    assert rc == 0 and text.strip() == f"{OLD}, Enabled", text
    rc, text = sh(inventory, host, "systemctl is-active nvidia-persistenced; dkms status -m nvidia")
    assert f"active\nnvidia/{OLD}" in text, text
    rc, text = sh(inventory, host, "cat /etc/modprobe.d/blacklist-nouveau.conf")
    assert "blacklist nouveau" in text and "options nouveau modeset=0" in text
    rc, text = sh(inventory, host, "head -16 /var/log/nvidia-installer.log")
    assert "--silent\n    --dkms\n    --kernel-module-type=open\n    --no-opengl-files\n    --no-x-check" in text, text


# make test-slow: molecule's driver scenario runs the role a second time on every lab host in make test and
# asserts that nothing changed; the check-mode run below does too, on this scenario's node.
@pytest.mark.slow
def test_second_run_changes_nothing(inventory: Path, host: str) -> None:
    run = driver(inventory, host, OLD)
    assert run.rc == 0 and run.changed == 0, run.describe()


def test_check_mode_on_a_converged_node_reports_nothing(inventory: Path, host: str) -> None:
    run = driver(inventory, host, OLD, "--check", "--diff")
    assert run.rc == 0 and run.changed == 0, run.describe()


@pytest.mark.parametrize("fetch", ["controller", "node"])
def test_wrong_checksum_refused_before_any_change(inventory: Path, host: str, fetch: str) -> None:
    pinned = "0" * 64
    standins = publish_standins()
    real = standins[f"NVIDIA-Linux-x86_64-{NEW}.run"]
    url = "{{ gpufleet_mirror_url }}/nvidia/NVIDIA-Linux-x86_64-" + NEW + ".run"
    run = driver(
        inventory, host, NEW, nvidia_driver_runfile={"url": url, "sha256": pinned}, gpufleet_artifact_fetch=fetch
    )
    assert run.rc != 0, run.describe()
    assert pinned in run.output and real in run.output, "both hashes are printed"
    assert run.changed == 0, run.describe()
    assert driver_on_disk(inventory, host) == OLD
    rc, text = sh(inventory, host, f"ls /var/cache/gpufleet/artifacts/{pinned} /var/tmp/gpufleet-artifact-* 2>&1")
    assert "No such file or directory" in text and f"NVIDIA-Linux-x86_64-{NEW}" not in text, text


def test_check_mode_on_an_outdated_node_reports_the_upgrade(inventory: Path, host: str) -> None:
    run = driver(inventory, host, NEW, "--check", "--diff")
    assert run.rc == 0, run.describe()
    assert run.changed > 0
    assert f"-driver: {OLD}\n+driver: {NEW}" in run.output
    assert driver_on_disk(inventory, host) == OLD, "check mode changed nothing"
    assert smi(inventory, host)[1].strip() == f"{OLD}, Enabled"


def test_installer_failing_half_way_gives_the_log_tail(inventory: Path, host: str) -> None:
    # Only the new runfile fails: the role then puts the previous driver back (test_driver_rollback.py covers
    # that with serving instances), so the node keeps a recorded driver and a rerun can upgrade it.
    sh(inventory, host, f"mkdir -p {Path(FAIL_MARKER).parent} && echo 'driver {NEW}' > {FAIL_MARKER}")
    run = driver(inventory, host, NEW)
    assert run.rc != 0, run.describe()
    assert f"NVIDIA-Linux-x86_64-{NEW}.run failed (exit 1); last lines of /var/log/nvidia-installer.log" in run.output
    assert "failure injected half-way through the installation" in run.output
    assert driver_on_disk(inventory, host) == OLD


def test_rerun_completes_the_upgrade_with_a_reboot(inventory: Path, host: str) -> None:
    sh(inventory, host, f"rm -f {FAIL_MARKER}")
    before = boot_id(inventory, host)
    run = driver(inventory, host, NEW, nvidia_driver_reboot="if_needed")
    assert run.rc == 0, run.describe()
    assert "TASK [nvidia_driver : Reboot the node]" in run.output
    assert boot_id(inventory, host) != before, "the node really rebooted"
    assert driver_on_disk(inventory, host) == NEW
    rc, text = smi(inventory, host)
    assert rc == 0 and text.strip() == f"{NEW}, Enabled", text
    again = driver(inventory, host, NEW)
    assert again.rc == 0 and again.changed == 0, again.describe()


@pytest.mark.slow
def test_hold_policy_holds_the_installed_kernel_packages(inventory: Path, host: str) -> None:
    try:
        run = driver(inventory, host, NEW, nvidia_driver_kernel_protection="hold")
        assert run.rc == 0 and run.changed > 0, run.describe()
        rc, held = sh(inventory, host, "apt-mark showhold")
        rc, installed = sh(
            inventory,
            host,
            "dpkg-query -W -f '${Package} ${db:Status-Status}\\n' 'linux-*' "
            "| awk '$2 == \"installed\" && $1 ~ /^linux-(image|headers|modules)-/ {print $1}'",
        )
        assert installed.split(), "the lab installs kernel headers packages, so there is something to hold"
        assert sorted(held.split()) == sorted(installed.split())
        # Debian 13's headers pull their kernel image, held with them (the lab leaves only its files out).
        assert any(name.startswith("linux-headers-") for name in held.split()), held
        again = driver(inventory, host, NEW, nvidia_driver_kernel_protection="hold")
        assert again.rc == 0 and again.changed == 0, again.describe()
    finally:
        sh(inventory, host, "apt-mark showhold | xargs -r apt-mark unhold")


def test_downgrade_refused_unless_allowed(inventory: Path, host: str) -> None:
    run = driver(inventory, host, OLD)
    assert run.rc != 0 and run.changed == 0, run.describe()
    assert f"{NEW} is installed and {OLD} is older: a downgrade is refused" in run.output


def test_pending_reboot_with_reboot_never_fails_clearly(inventory: Path, host: str) -> None:
    before = boot_id(inventory, host)
    run = driver(inventory, host, OLD, nvidia_driver_allow_downgrade=True, nvidia_driver_reboot="never")
    assert run.rc != 0, run.describe()
    assert f"reboot pending on {host}: driver {OLD} is installed but the loaded kernel module is another version" in (
        " ".join(run.output.split())
    )
    assert driver_on_disk(inventory, host) == OLD
    rc, text = smi(inventory, host)
    assert rc == 18 and "Driver/library version mismatch" in text, "the node is half-switched, as a real one"
    # Run again: it still stops there, and changes nothing, instead of carrying on with a broken node.
    again = driver(inventory, host, OLD, nvidia_driver_allow_downgrade=True, nvidia_driver_reboot="never")
    assert again.rc != 0 and again.changed == 0, again.describe()
    assert "reboot pending" in again.output
    assert boot_id(inventory, host) == before, "never means never"


def test_runfile_reached_the_node_with_its_pinned_sha256(inventory: Path, host: str) -> None:
    sha = publish_standins()[f"NVIDIA-Linux-x86_64-{OLD}.run"]
    rc, text = sh(inventory, host, f"sha256sum /var/cache/gpufleet/artifacts/{sha}/NVIDIA-Linux-x86_64-{OLD}.run")
    assert rc == 0 and text.split()[0] == sha, text
