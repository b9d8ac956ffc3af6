"""Drift kind `foreign` (issue 39): configuration gpufleet did not write that changes a managed component, found
in the places each role declares (roles/*/vars/main.yml), without noise from what else lives there."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.module_utils import drift_foreign
from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import Context, SpecError
from gpufleet import PROJECT_ROOT

DRIVER = yaml.safe_load((PROJECT_ROOT / "roles/nvidia_driver/vars/main.yml").read_text())[
    "__nvidia_driver_foreign_config"
]
# A lab node's /proc/cmdline (a Firecracker guest): nvproxy.enable=1 must not pass for an NVIDIA parameter.
LAB_CMDLINE = (
    "mitigations=auto,no_guest_host,no_guest_guest console=ttyS0 quiet reboot=k panic=1 nomodule "
    "random.trust_cpu=1 swiotlb=noforce psi=1 nvproxy.enable=1 page_reporting.page_reporting_order=11 "
    "rdinit=/process_api -- --firecracker-init --addr 0.0.0.0:2024"
)


def test_the_kernel_command_line_reports_nvidia_parameters_only(tmp_path: Path) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(LAB_CMDLINE + "\n")
    assert drift_foreign.foreign_cmdline(DRIVER["cmdline"], "x", str(cmdline)) == []
    cmdline.write_text(
        LAB_CMDLINE.replace("quiet", "quiet nvidia-drm.modeset=1 modprobe.blacklist=nvidia_uvm nouveau.modeset=0")
    )
    found = [item.actual for item in drift_foreign.foreign_cmdline(DRIVER["cmdline"], "x", str(cmdline))]
    assert found == ["nvidia-drm.modeset=1", "modprobe.blacklist=nvidia_uvm", "nouveau.modeset=0"]


def test_module_options_are_found_but_debian_s_own_modprobe_files_are_not(tmp_path: Path) -> None:
    """Debian 12's /lib/modprobe.d/fbdev-blacklist.conf (its head, as on a lab node) and nvidiafb, a framebuffer driver,
    name stay unreported; the role's own file is left out; an options line and an alias are found."""
    (tmp_path / "fbdev-blacklist.conf").write_text(
        "# This file blacklists most old-style PCI framebuffer drivers.\n\nblacklist arkfb\nblacklist aty128fb\n"
        "blacklist nvidiafb\n"
    )
    (tmp_path / "ours.conf").write_text("blacklist nouveau\noptions nouveau modeset=0\n")
    (tmp_path / "local.conf").write_text(
        "# tuning\noptions nvidia NVreg_EnableGpuFirmware=0\nalias pci:v000010DEd* nvidia\noptions nvidia_drm modeset=1\n"
    )
    place = dict(DRIVER["files"][0], glob=[str(tmp_path / "*.conf")])
    found = drift_foreign.foreign_files(place, {str(tmp_path / "ours.conf")}, "x")
    assert [(item.field, item.actual) for item in found] == [
        (f"{tmp_path}/local.conf:2", "options nvidia NVreg_EnableGpuFirmware=0"),
        (f"{tmp_path}/local.conf:3", "alias pci:v000010DEd* nvidia"),
        (f"{tmp_path}/local.conf:4", "options nvidia_drm modeset=1"),
    ]


def test_the_loader_s_resolution_outside_the_declared_prefixes_is_reported() -> None:
    """Read from this machine's own loader cache (`ldconfig -p`): libc resolves under /lib or /usr/lib."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    libc = next(line.split(" => ")[1] for line in listing.splitlines() if line.strip().startswith("libc.so.6 "))
    spec = {"libraries": ["libc.so"], "prefixes": ["/usr/local/cuda"], "effect": "e"}
    found = drift_foreign.foreign_loader(spec, Context(), "x")
    assert [(item.field, item.actual) for item in found] == [("loader: libc.so.6", libc)]
    inside = dict(spec, prefixes=[str(Path(libc).parent)])
    assert drift_foreign.foreign_loader(inside, Context(), "x") == []


def test_every_finding_names_its_effect_and_that_gpufleet_leaves_it(tmp_path: Path) -> None:
    (tmp_path / "pip.conf").write_text("[global]\nindex-url = https://mirror.invalid/simple\n")
    spec = {
        "component": "the venv",
        "files": [{"glob": str(tmp_path / "pip.conf"), "match": r"\S", "effect": "pip reads it"}],
    }
    found = drift_foreign.check_foreign(spec, Context())
    assert [item.check for item in found] == ["foreign configuration of the venv"] * 2
    assert found[0].detail.startswith("pip reads it; gpufleet leaves it in place")
    with pytest.raises(SpecError):
        drift_foreign.check_foreign({"component": "c", "files": ["/etc/pip.conf"]}, Context())
