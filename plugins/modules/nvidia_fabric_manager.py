#!/usr/bin/python
"""Ansible module nvidia_fabric_manager: on an NVSwitch system, nvidia-fabricmanager must be the driver's version."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_fabric_manager
short_description: Check that an NVSwitch system's fabric manager is exactly the driver's version
description:
  - Detects an NVSwitch (HGX) system from the driver, not from the product name, through NVML's
    C(nvmlDeviceGetGpuFabricInfo) (a GPU outside an NVSwitch fabric answers C(not_supported)) and
    C(/proc/driver/nvidia-nvswitch/devices) (one entry per NVSwitch the driver found).
  - On such a system reads the installed C(nv-fabricmanager --version) and C(nvidia-fabricmanager.service)'s state,
    and fails, naming both versions, when the fabric manager is missing or is not the driver's exact version
    (CUDA then fails with error 802, "system not yet initialized").
  - With O(service_active), also fails on such a system unless C(nvidia-fabricmanager.service) is active (CUDA
    waits for the fabric manager to train the fabric). With O(refuse=false), reports the problem in RV(problem)
    instead of failing (the role asks first, then installs).
  - Read-only; never reports a change.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  library:
    description: Path of C(libnvidia-ml.so.1) to load instead of the one on the loader path.
    type: path
  driver_version:
    description: The driver version the fabric manager must match; default the one NVML reports.
    type: str
  binary:
    description: The fabric manager's executable.
    type: str
    default: nv-fabricmanager
  nvswitch_devices:
    description: The driver's list of NVSwitch devices.
    type: path
    default: /proc/driver/nvidia-nvswitch/devices
  service_active:
    description: Require C(nvidia-fabricmanager.service) to be active on an NVSwitch system.
    type: bool
    default: false
  refuse:
    description: Fail on a problem; false reports it in RV(problem) and succeeds.
    type: bool
    default: true
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Refuse a fabric manager of another version than the driver
  gpufleet.fleet.nvidia_fabric_manager:
    driver_version: 580.159.04
"""

RETURN = r"""
nvswitch:
  description: Whether the node is an NVSwitch system.
  type: bool
  returned: always
fabric:
  description: Each GPU's fabric state (not_supported, not_started, in_progress, completed) from NVML.
  type: list
  elements: dict
  returned: always
nvswitch_count:
  description: Entries of O(nvswitch_devices) (0 where it does not exist).
  type: int
  returned: always
driver_version:
  description: The driver version compared with.
  type: str
  returned: always
fabric_manager_version:
  description: The installed fabric manager's version, or null.
  type: str
  returned: always
service:
  description: C(systemctl is-active nvidia-fabricmanager.service).
  type: str
  returned: always
problem:
  description: What is wrong with the fabric manager, with the fix, or null.
  type: str
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.fabric_manager import (
    NVSWITCH_DEVICES,
    UNIT,
    count_nvswitches,
    problem,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import fabric_manager_version
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import NvmlError, read_fabric

C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C"}


def installed_version(module: AnsibleModule, binary: str) -> str | None:
    path = module.get_bin_path(binary) if "/" not in binary else (binary if os.access(binary, os.X_OK) else None)
    if not path:
        return None
    rc, out, err = module.run_command([path, "--version"], environ_update=C_LOCALE)
    return fabric_manager_version(out + err) if rc == 0 else None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "library": {"type": "path"},
            "driver_version": {"type": "str"},
            "binary": {"type": "str", "default": "nv-fabricmanager"},
            "nvswitch_devices": {"type": "path", "default": NVSWITCH_DEVICES},
            "service_active": {"type": "bool", "default": False},
            "refuse": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    try:
        state = read_fabric(module.params["library"])
    except NvmlError as error:
        module.fail_json(msg="cannot read the GPU fabric through NVML: %s" % error, changed=False)
    switches = count_nvswitches(module.params["nvswitch_devices"])
    nvswitch = state["nvswitch"] or switches > 0
    driver = module.params["driver_version"] or state["driver_version"]
    installed = installed_version(module, module.params["binary"])
    systemctl = module.get_bin_path("systemctl")
    service = module.run_command([systemctl, "is-active", UNIT])[1].strip() if systemctl else "unknown"
    result = {
        "changed": False,
        "nvswitch": nvswitch,
        "fabric": state["gpus"],
        "nvswitch_count": switches,
        "driver_version": driver,
        "fabric_manager_version": installed,
        "service": service,
    }
    result["problem"] = problem(nvswitch, driver, installed, service if module.params["service_active"] else None)
    if result["problem"] and module.params["refuse"]:
        module.fail_json(msg=result["problem"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
