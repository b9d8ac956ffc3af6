#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Module stack_host_check: check a node's real GPU stack facts against the sourced version chain."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stack_host_check
short_description: Check a node's real driver, GPUs, torch and nvcc against the version chain
description:
  - Runs on the node, on the facts the node really reports (gathered by M(gpufleet.fleet.nvidia_gpu_info), M(gpufleet.fleet.torch_stack_info)
    and C(nvcc --version)), with the same validator as C(gpufleet plan) and M(gpufleet.fleet.stack_validate).
  - Checks that the installed driver runs torch's CUDA (full support, or only minor-version compatibility,
    which is a warning), that torch's compiled arch list covers every GPU found, and that the toolkit (nvcc)
    matches torch's CUDA for building extensions such as flash-attn.
  - With I(stack), also reports drift between the declared stack and the node (driver, torch's CUDA, toolkit,
    GPU compute capabilities).
  - Read-only; never reports C(changed). Fails with every broken link; warnings do not fail.
  - The companion action plugin fills I(compat_facts) from the controller's knowledge base (C(data/compat)),
    so playbooks pass only the host facts.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  driver_version:
    description: The NVIDIA driver version the node runs (NVML), such as C(580.159.04). Null when none is loaded.
    type: str
  driver_cuda_version:
    description: The highest CUDA the driver reports, as C(13.0) (nvidia-smi) or C(13000) (NVML).
    type: str
  gpu_compute_capabilities:
    description: Compute capability of each GPU found, such as C(9.0) or C(sm_90).
    type: list
    elements: str
    default: []
  torch_cuda:
    description: C(torch.version.cuda) of the venv's torch, such as C(13.0); null for a CPU build.
    type: str
  torch_arch_list:
    description: C(torch.cuda.get_arch_list()) of the venv's torch, such as C([sm_80, sm_90, sm_100, compute_120]).
    type: list
    elements: str
    default: []
  torch_installed:
    description: False when the node has no venv yet (the venv layer has not run); torch is then not compared
      with I(stack).
    type: bool
    default: true
  nvcc_version:
    description: The toolkit's C(nvcc --version) release line (C(Cuda compilation tools, release 13.0, V13.0.88))
      or a version such as C(13.0). Null when no toolkit is installed.
    type: str
  stack:
    description: The declared stack (same keys as M(gpufleet.fleet.stack_validate)); when given, drift from it is an error.
    type: dict
  compat_facts:
    description:
      - The parts of the knowledge base the check needs (CUDA -> driver table, GPUs, compute capabilities,
        rules). Filled in by the stack_host_check action plugin on the controller; set it only to override.
    type: dict
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    description: Read-only; the check runs the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The check itself reads nothing on the node; pass the facts other modules gathered.
seealso:
  - module: gpufleet.fleet.stack_validate
  - module: gpufleet.fleet.nvidia_gpu_info
  - module: gpufleet.fleet.torch_stack_info
"""

EXAMPLES = r"""
- name: Read the GPUs and the driver
  gpufleet.fleet.nvidia_gpu_info:
  register: gpu_info

- name: Read the venv's torch
  gpufleet.fleet.torch_stack_info:
    venv: /opt/torch/.venv
  register: torch_info

- name: Read the toolkit's nvcc release
  ansible.builtin.command: /usr/local/cuda/bin/nvcc --version
  register: nvcc
  changed_when: false
  failed_when: false

- name: Check the node's real stack, and its drift from the declared one
  gpufleet.fleet.stack_host_check:
    driver_version: "{{ gpu_info.driver_version }}"
    driver_cuda_version: "{{ gpu_info.cuda_driver_version }}"
    gpu_compute_capabilities: "{{ gpu_info.gpus | map(attribute='compute_capability') | list }}"
    torch_cuda: "{{ torch_info.torch.cuda }}"
    torch_arch_list: "{{ torch_info.torch.arch_list }}"
    nvcc_version: "{{ nvcc.stdout if nvcc.rc == 0 else omit }}"
    stack: "{{ gpufleet_stack }}"
"""

RETURN = r"""
compatible:
  description: True when no link is broken.
  returned: always
  type: bool
  sample: true
errors:
  description: Every broken link; C(message) names both ends and the fix.
  returned: always
  type: list
  elements: dict
  contains:
    link:
      description: The link, such as C(driver -> torch) or C(stack -> host).
      type: str
    message:
      description: What is wrong and how to fix it.
      type: str
stack_warnings:
  description: Links that hold with a caveat, such as a driver relying on CUDA minor-version compatibility.
  returned: always
  type: list
  elements: dict
facts_used:
  description: Knowledge-base facts the check relied on, each with C(id), C(statement) and C(source).
  returned: always
  type: list
  elements: dict
host:
  description: The host facts as the check read them (normalised).
  returned: always
  type: dict
  sample:
    driver_version: "580.159.04"
    driver_cuda_version: "13.0"
    gpu_compute_capabilities: ["9.0"]
    torch_cuda: "13.0"
    torch_arch_list: ["sm_75", "sm_80", "sm_90"]
    nvcc_version: "13.0"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_host import check_host
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_spec import StackError

ARGUMENT_SPEC = dict(
    driver_version=dict(type="str"),
    driver_cuda_version=dict(type="str"),
    gpu_compute_capabilities=dict(type="list", elements="str", default=[]),
    torch_cuda=dict(type="str"),
    torch_arch_list=dict(type="list", elements="str", default=[]),
    nvcc_version=dict(type="str"),
    torch_installed=dict(type="bool", default=True),
    stack=dict(type="dict"),
    compat_facts=dict(type="dict"),
)
FACT_KEYS = (
    "driver_version",
    "driver_cuda_version",
    "gpu_compute_capabilities",
    "torch_cuda",
    "torch_arch_list",
    "nvcc_version",
    "torch_installed",
)


def run_module(module: AnsibleModule) -> dict:
    """Check the facts; returns the module result (never changed)."""
    compat_facts = module.params["compat_facts"]
    if not compat_facts:
        module.fail_json(
            msg="compat_facts is empty: run stack_host_check through its action plugin (plugins/action) "
            "so the controller fills it from data/compat"
        )
    facts = dict((key, module.params[key]) for key in FACT_KEYS)
    try:
        report = check_host(facts, compat_facts, stack=module.params["stack"])
    except StackError as error:
        module.fail_json(msg="stack_host_check input is invalid: %s" % error)
    return dict(
        changed=False,
        compatible=report["compatible"],
        errors=report["errors"],
        stack_warnings=report["warnings"],
        facts_used=report["facts"],
        host=report["host"],
    )


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result = run_module(module)
    for item in result["stack_warnings"]:
        module.warn("[%s] %s" % (item["link"], item["message"]))
    if result["errors"]:
        module.fail_json(
            msg="the node's stack is not consistent (%d error(s)): %s"
            % (
                len(result["errors"]),
                " | ".join("[%s] %s" % (item["link"], item["message"]) for item in result["errors"]),
            ),
            **result,
        )
    module.exit_json(msg="the node's stack is consistent (%d warning(s))" % len(result["stack_warnings"]), **result)


if __name__ == "__main__":
    main()
