"""Drift finds configuration gpufleet did not write that changes what a managed component does (issue 39): an
administrator's or another tool's module options, udev rule, package hold, linker path, profile, pip configuration,
systemd environment and preload list, each planted on a converged lab node and reported on the layer that owns the
component, with the file, the line and the effect; the loader's resolution and systemd's environment are read as
they are in effect. A stock converged node reports none of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_drift_support import findings, gpufleet, last_report
from test_driver_support import sh

pytestmark = pytest.mark.lab

LAYERS = "driver,toolkit,venv,serve"
DRIVER = "foreign configuration of the nvidia kernel module"
TOOLKIT = "foreign configuration of the CUDA toolkit"
VENV = "foreign configuration of the inference venv"
SERVE = "foreign configuration of the vLLM instances"
HELD = "libnvidia-gpufleet-test"
# What a colleague's "quick fix" leaves behind, one of each kind (the package is a real one, built and installed
# here, so that apt really holds it).
PLANT = f"""set -e
printf 'options nvidia NVreg_EnableGpuFirmware=0\\n' > /etc/modprobe.d/zz-gpufleet-test.conf
printf 'KERNEL=="nvidia*", MODE="0666"\\n' > /etc/udev/rules.d/70-zz-gpufleet-test.rules
mkdir -p /opt/cuda-12.1/lib64 /tmp/gpufleet-test-pkg/DEBIAN /etc/systemd/system.conf.d
cp /usr/local/cuda-12.8/targets/x86_64-linux/lib/libcudart.so.12 /opt/cuda-12.1/lib64/libcudart.so.12
printf '/opt/cuda-12.1/lib64\\n' > /etc/ld.so.conf.d/zz-gpufleet-test.conf
ldconfig
printf 'export CUDA_HOME=/opt/cuda-12.1\\n' > /etc/profile.d/zz-gpufleet-test.sh
printf '[global]\\nindex-url = https://mirror.invalid/simple\\n' > /etc/pip.conf
cp -p /etc/environment /etc/environment.gpufleet-test
printf 'PIP_INDEX_URL=https://mirror.invalid/simple\\n' >> /etc/environment
printf '[Manager]\\nDefaultEnvironment=LD_LIBRARY_PATH=/opt/cuda-12.1/lib64\\n' > /etc/systemd/system.conf.d/zz-gpufleet-test.conf
systemctl set-environment NCCL_DEBUG=INFO
printf '/lib/x86_64-linux-gnu/libdl.so.2\\n' > /etc/ld.so.preload
printf 'Package: {HELD}\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: gpufleet tests <root@localhost>\\nDescription: test\\n' \\
  > /tmp/gpufleet-test-pkg/DEBIAN/control
dpkg-deb --build /tmp/gpufleet-test-pkg /tmp/{HELD}.deb >/dev/null
dpkg -i /tmp/{HELD}.deb >/dev/null
apt-mark hold {HELD} >/dev/null
"""
REMOVE = f"""apt-mark unhold {HELD} >/dev/null 2>&1; dpkg -r {HELD} >/dev/null 2>&1
rm -rf /etc/modprobe.d/zz-gpufleet-test.conf /etc/udev/rules.d/70-zz-gpufleet-test.rules /opt/cuda-12.1 \\
  /etc/ld.so.conf.d/zz-gpufleet-test.conf /etc/profile.d/zz-gpufleet-test.sh /etc/pip.conf \\
  /etc/systemd/system.conf.d/zz-gpufleet-test.conf /etc/ld.so.preload /tmp/gpufleet-test-pkg /tmp/{HELD}.deb
rmdir /etc/systemd/system.conf.d 2>/dev/null
[ -e /etc/environment.gpufleet-test ] && mv /etc/environment.gpufleet-test /etc/environment
systemctl unset-environment NCCL_DEBUG
ldconfig
"""


@pytest.fixture(scope="module")
def node(lab_inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[tuple[Path, str]]:
    host = sorted(lab_hosts)[0]
    yield lab_inventory, host
    rc, text = sh(lab_inventory, host, REMOVE)
    assert rc == 0, text


def test_foreign_configuration_is_found_on_the_layer_that_owns_the_component(
    node: tuple[Path, str], tmp_path: Path
) -> None:
    inventory, host = node
    stock = gpufleet(tmp_path, "drift", "-i", str(inventory), "--limit", host, "--layers", LAYERS)
    assert stock.returncode == 0, stock.stdout + stock.stderr
    rc, text = sh(inventory, host, PLANT)
    assert rc == 0, text

    planted = gpufleet(tmp_path, "drift", "-i", str(inventory), "--limit", host, "--layers", LAYERS)

    assert planted.returncode == 2, planted.stdout + planted.stderr
    report = last_report(tmp_path)
    driver = findings(report, host, "driver")
    assert (
        DRIVER,
        "/etc/modprobe.d/zz-gpufleet-test.conf:1",
        "nothing gpufleet did not write",
        "options nvidia NVreg_EnableGpuFirmware=0",
    ) in driver
    assert (
        DRIVER,
        "/etc/udev/rules.d/70-zz-gpufleet-test.rules:1",
        "nothing gpufleet did not write",
        'KERNEL=="nvidia*", MODE="0666"',
    ) in driver
    assert (DRIVER, "apt-mark showhold", "nothing gpufleet did not write", f"{HELD} held") in driver
    toolkit = findings(report, host, "toolkit")
    assert (
        TOOLKIT,
        "/etc/ld.so.conf.d/zz-gpufleet-test.conf:1",
        "nothing gpufleet did not write",
        "/opt/cuda-12.1/lib64",
    ) in toolkit
    assert (
        TOOLKIT,
        "/etc/profile.d/zz-gpufleet-test.sh:1",
        "nothing gpufleet did not write",
        "export CUDA_HOME=/opt/cuda-12.1",
    ) in toolkit
    # The loader's cache, as in effect: libcudart.so.12 now resolves outside the declared toolkits.
    loader = {item for item in toolkit if item[1] == "loader: libcudart.so.12"}
    assert {actual for *_, actual in loader} == {"/opt/cuda-12.1/lib64/libcudart.so.12"}
    venv = {(field, actual) for check, field, _, actual in findings(report, host, "venv") if check == VENV}
    assert {("/etc/pip.conf:1", "[global]"), ("/etc/pip.conf:2", "index-url = https://mirror.invalid/simple")} <= venv
    assert any(
        field.startswith("/etc/environment:") and actual == "PIP_INDEX_URL=https://mirror.invalid/simple"
        for field, actual in venv
    )
    serve = {(field, actual) for check, field, _, actual in findings(report, host, "serve") if check == SERVE}
    assert serve == {
        (
            "/etc/systemd/system.conf.d/zz-gpufleet-test.conf:2",
            "DefaultEnvironment=LD_LIBRARY_PATH=/opt/cuda-12.1/lib64",
        ),
        ("/etc/ld.so.preload:1", "/lib/x86_64-linux-gnu/libdl.so.2"),
        ("systemctl show-environment", "NCCL_DEBUG=INFO"),
    }
    # Each finding says what it does to the component.
    layer = report.nodes[host].layers["serve"]
    effect = next(item.detail for item in layer.drift if item.actual == "NCCL_DEBUG=INFO")
    assert "vllm@ included" in effect
    # Nothing else: every finding of these layers is one planted above.
    assert {layer for layer, item in report.nodes[host].layers.items() if item.status == "drifted"} == set(
        LAYERS.split(",")
    )
    assert all(
        check.startswith("foreign configuration of ")
        for layer in LAYERS.split(",")
        for check, *_ in findings(report, host, layer)
    )
