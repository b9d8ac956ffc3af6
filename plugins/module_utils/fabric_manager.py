# -*- coding: utf-8 -*-
"""What nvidia-fabricmanager must be on an NVSwitch system, shared by the nvidia_fabric_manager module (the driver
role's check) and drift's driver layer, so both agree: exactly the driver's version, its service active.

Standard library only.
"""

from __future__ import annotations

import os

UNIT = "nvidia-fabricmanager.service"
NVSWITCH_DEVICES = "/proc/driver/nvidia-nvswitch/devices"


def count_nvswitches(path: str = NVSWITCH_DEVICES) -> int:
    """Entries of the driver's NVSwitch list (one per NVSwitch it found); 0 where it does not exist."""
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def problem(nvswitch: bool, driver: str, installed: str | None, service: str | None = None) -> str | None:
    """What is wrong, with the fix; service is the unit's state when it must be active, None when it need not be."""
    if not nvswitch:
        return None
    if installed is None:
        return (
            "NVSwitch system without nvidia-fabricmanager: install fabric manager %s, the driver's version "
            "(CUDA fails with error 802, system not yet initialized, until it runs)" % driver
        )
    if installed != driver:
        return (
            "nvidia-fabricmanager %s does not match the NVIDIA driver %s: install fabric manager %s with the "
            "driver (CUDA fails with error 802 while they differ)" % (installed, driver, driver)
        )
    if service is not None and service != "active":
        return (
            "%s is %s, not active: CUDA fails with error 802 until it runs (journalctl -u %s says why; "
            "systemctl start %s)" % (UNIT, service or "unknown", UNIT, UNIT)
        )
    return None
