"""The cuda_toolkit role on a lab host, from LAB-STANDIN runfiles served by the lab mirror.

One scenario, in order: two toolkits side by side (13.0 active), idempotence and check mode, switching the
active toolkit, a wrong sha256 refused, and an installer failing half-way whose rerun completes. The host is
left clean afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from test_driver_support import (
    FAIL_MARKER,
    PlayRun,
    play,
    publish_standins,
    runfile_test_host,
    runfile_test_inventory,
    sh,
)

pytestmark = pytest.mark.lab

CLEAN = f"""
rm -f {FAIL_MARKER}
rm -rf /usr/local/cuda /usr/local/cuda-12.8 /usr/local/cuda-13.0 /etc/profile.d/cuda.sh /etc/ld.so.conf.d/cuda.conf
rm -rf /var/cache/gpufleet/artifacts /var/log/cuda-installer.log
ldconfig
"""


@pytest.fixture(scope="module")
def inventory(lab_inventory: Path) -> Path:
    return runfile_test_inventory(lab_inventory)


@pytest.fixture(scope="module")
def host(inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[str]:
    yield from runfile_test_host(inventory, lab_hosts, CLEAN)


def toolkit(inventory: Path, host: str, *args: str, **extra: object) -> PlayRun:
    return play(inventory, host, "toolkit.yml", *args, extra=extra or None)


def login_shell(inventory: Path, host: str, command: str) -> str:
    """What a login shell on the host (with /etc/profile.d) prints."""
    rc, text = sh(inventory, host, f"bash -lc '{command}'")
    assert rc == 0, text
    return text


def test_two_toolkits_side_by_side(inventory: Path, host: str) -> None:
    run = toolkit(inventory, host)
    assert run.rc == 0, run.describe()
    assert run.changed > 0
    for prefix, version in (("/usr/local/cuda-12.8", "12.8.1"), ("/usr/local/cuda-13.0", "13.0.2")):
        rc, text = sh(inventory, host, f"cat {prefix}/version.json")
        assert f'"version": "{version}"' in text, text
    rc, text = sh(inventory, host, "readlink /usr/local/cuda")
    assert text.strip() == "/usr/local/cuda-13.0"
    shell = login_shell(inventory, host, "nvcc --version; echo CUDA_HOME=$CUDA_HOME")
    assert "Cuda compilation tools, release 13.0, V13.0.2" in shell and "CUDA_HOME=/usr/local/cuda" in shell
    rc, text = sh(inventory, host, "ldconfig -p | grep libcudart.so.13")
    assert "=> /usr/local/cuda/lib64/libcudart.so.13" in text, text
    rc, text = sh(inventory, host, "tail -3 /var/log/cuda-installer.log")
    assert "Logfile is /var/log/cuda-installer.log" in text


def test_second_run_and_check_mode_change_nothing(inventory: Path, host: str) -> None:
    run = toolkit(inventory, host)
    assert run.rc == 0 and run.changed == 0, run.describe()
    check = toolkit(inventory, host, "--check", "--diff")
    assert check.rc == 0 and check.changed == 0, check.describe()


def test_switching_the_active_toolkit(inventory: Path, host: str) -> None:
    check = toolkit(inventory, host, "--check", cuda_toolkit_active="12.8.1")
    assert check.rc == 0 and check.changed > 0, check.describe()
    assert sh(inventory, host, "readlink /usr/local/cuda")[1].strip() == "/usr/local/cuda-13.0", "check mode"
    run = toolkit(inventory, host, cuda_toolkit_active="12.8.1")
    assert run.rc == 0 and run.changed > 0, run.describe()
    assert "RUNNING HANDLER [cuda_toolkit : Refresh the dynamic linker cache]" in run.output
    assert "release 12.8, V12.8.1" in login_shell(inventory, host, "nvcc --version")
    rc, text = sh(inventory, host, "ldconfig -p | grep libcudart")
    assert "libcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12" in text, text
    back = toolkit(inventory, host)
    assert back.rc == 0 and back.changed > 0, back.describe()
    assert "release 13.0" in login_shell(inventory, host, "nvcc --version")


def test_wrong_checksum_refused_before_any_change(inventory: Path, host: str) -> None:
    sh(inventory, host, "/usr/local/cuda-12.8/bin/cuda-uninstaller --silent")
    pinned = "f" * 64
    real = publish_standins()["cuda_12.8.1_570.124.06_linux.run"]
    url = "{{ gpufleet_mirror_url }}/nvidia/cuda_12.8.1_570.124.06_linux.run"
    versions = [{"version": "12.8.1", "runfile": {"url": url, "sha256": pinned}}]
    run = toolkit(inventory, host, cuda_toolkit_versions=versions, cuda_toolkit_active="12.8.1")
    assert run.rc != 0, run.describe()
    assert pinned in run.output and real in run.output, "both hashes are printed"
    assert run.changed == 0, run.describe()
    rc, text = sh(inventory, host, "ls /usr/local/cuda-12.8; readlink /usr/local/cuda")
    assert "No such file or directory" in text and "/usr/local/cuda-13.0" in text, text


def test_installer_failing_half_way_then_rerun_completes(inventory: Path, host: str) -> None:
    sh(inventory, host, f"mkdir -p {Path(FAIL_MARKER).parent} && echo toolkit > {FAIL_MARKER}")
    run = toolkit(inventory, host)
    assert run.rc != 0, run.describe()
    assert "cuda_12.8.1_570.124.06_linux.run failed (exit 1); last lines of /var/log/cuda-installer.log" in run.output
    assert "failure injected half-way through the installation" in run.output
    sh(inventory, host, f"rm -f {FAIL_MARKER}")
    rerun = toolkit(inventory, host)
    assert rerun.rc == 0 and rerun.changed > 0, rerun.describe()
    rc, text = sh(inventory, host, "/usr/local/cuda-12.8/bin/nvcc --version")
    assert "release 12.8, V12.8.1" in text, text
    last = toolkit(inventory, host)
    assert last.rc == 0 and last.changed == 0, last.describe()
