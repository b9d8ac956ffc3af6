#!/usr/bin/python
"""Ansible module gpu_health: whether the node's GPUs are fit to serve (XIDs, ECC, row remapping, lost GPUs, DCGM)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Gate a node on the health of its GPUs
description:
  - "Reads the kernel log of this boot for NVIDIA XID errors (C(NVRM: Xid (PCI:...): N, ...)), NVML for lost GPUs,
    uncorrectable ECC errors and pending or failed row remapping and page retirement, and, where DCGM is
    installed, runs C(dcgmi diag -r LEVEL) and reads its verdict."
  - Fails, listing every problem with its evidence, unless O(fail) is false; RV(healthy) says the verdict either way.
  - Read-only (a DCGM diagnostic exercises the GPUs but changes no state); never reports a change.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  library:
    description: Path of C(libnvidia-ml.so.1) to load instead of the one on the loader path.
    type: path
  kernel_log:
    description:
      - C(journal) reads this boot's kernel messages with C(journalctl -k -b 0) (C(dmesg) where journalctl is
        missing); a path reads a kernel log file such as rsyslog's C(/var/log/kern.log), from its last boot banner.
    type: str
    default: journal
  xid_ignore:
    description:
      - XIDs that do not fail the gate. The default is NVIDIA's XID catalog's application errors (13, 31, 43, 45),
        whose action is restarting the application.
    type: list
    elements: int
    default: [13, 31, 43, 45]
  ecc_errors_max:
    description: Most uncorrectable volatile ECC errors a GPU may have.
    type: int
    default: 0
  dcgm_level:
    description:
      - Level of C(dcgmi diag -r) to run where C(dcgmi) is installed; C(0) runs none. Level 1 takes seconds,
        2 about two minutes, 3 about fifteen.
    type: int
    default: 1
    choices: [0, 1, 2, 3, 4]
  fail:
    description: Whether an unhealthy node fails the task.
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
- name: Refuse to start vLLM on a GPU with XID 79 or uncorrectable ECC errors
  gpufleet.fleet.gpu_health:
    dcgm_level: 1
"""

RETURN = r"""
healthy:
  description: Whether no problem was found.
  type: bool
  returned: always
problems:
  description: Each problem, most severe checks first, with C(check) (xid, lost, ecc, row_remap, retired_pages, nvml,
    dcgm), C(gpu) or C(gpu_pci), C(evidence) (the log line or value) and C(message).
  type: list
  elements: dict
  returned: always
xids:
  description: Every XID line of this boot (ignored ones too), with pci, xid, detail and line.
  type: list
  elements: dict
  returned: always
dcgm:
  description: C(ran) (false where dcgmi is not installed or O(dcgm_level) is 0), C(level), C(rc), C(output).
  type: dict
  returned: always
kernel_log_error:
  description: Why the kernel log could not be read, or null.
  type: str
  returned: always
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_health import (
    dcgm_problems,
    nvml_problems,
    parse_xids,
    read_kernel_log,
    run_dcgm,
    xid_problems,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import NvmlError, code_name, read_gpu_state

ARGUMENT_SPEC: dict[str, Any] = {
    "library": {"type": "path"},
    "kernel_log": {"type": "str", "default": "journal"},
    "xid_ignore": {"type": "list", "elements": "int", "default": [13, 31, 43, 45]},
    "ecc_errors_max": {"type": "int", "default": 0},
    "dcgm_level": {"type": "int", "default": 1, "choices": [0, 1, 2, 3, 4]},
    "fail": {"type": "bool", "default": True},
}
C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C"}


def nvml_state(library: str | None, ecc_errors_max: int) -> list[dict[str, Any]]:
    """NVML's problems; a driver NVML cannot reach is itself the problem."""
    try:
        return nvml_problems(read_gpu_state(library), ecc_errors_max)
    except NvmlError as error:
        evidence = code_name(error.code) if error.code is not None else str(error)
        return [{"check": "nvml", "gpu": None, "evidence": evidence, "message": str(error)}]


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params

    def run(argv: list) -> tuple:
        return module.run_command(argv, environ_update=C_LOCALE)

    lines, kernel_log_error = read_kernel_log(params["kernel_log"], run)
    xids = parse_xids(lines)
    problems = nvml_state(params["library"], params["ecc_errors_max"])
    problems += xid_problems(xids, params["xid_ignore"])
    dcgm = run_dcgm(params["dcgm_level"], run)
    if dcgm["ran"]:
        problems += dcgm_problems(dcgm["rc"], dcgm["output"], params["dcgm_level"])
    result = {
        "changed": False,
        "healthy": not problems,
        "problems": problems,
        "xids": xids,
        "dcgm": dcgm,
        "kernel_log_error": kernel_log_error,
    }
    if kernel_log_error:
        module.warn("XIDs not checked: " + kernel_log_error)
    if problems and params["fail"]:
        module.fail_json(
            msg="the GPUs are not fit to serve on %s: %s"
            % (os.uname().nodename, "; ".join(problem["message"] for problem in problems)),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
