# -*- coding: utf-8 -*-
"""What NVML does not hold about a node's GPUs, as drift (kind `gpu_faults`): XIDs of this boot in the kernel log
and DCGM's diagnostic verdict, read with the same parsers as the health gate (module_utils/gpu_health.py).

Shipped to targets with the drift_probe module: standard library and gpufleet's other module_utils only. In
drift_probe's one call per layer, beside the `gpus` check that reads NVML, so the gpu_health layer costs one
module run per node.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import Context, Finding
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_health import (
    dcgm_problems,
    parse_xids,
    read_kernel_log,
    run_dcgm,
    xid_problems,
)


def check_gpu_faults(spec: dict, ctx: Context) -> list[Finding]:
    """One finding per XID of this boot that is not ignored and per failed DCGM test."""
    lines, unreadable = read_kernel_log(str(spec.get("kernel_log") or "journal"), ctx.run)
    if unreadable:
        ctx.notes.append(f"XIDs not checked: {unreadable}")
    findings = [
        Finding("kernel log", f"xid {problem['xid']}", "none since boot", problem["evidence"], problem["message"])
        for problem in xid_problems(parse_xids(lines), spec.get("xid_ignore") or [])
    ]
    dcgm = run_dcgm(int(spec.get("dcgm_level") or 0), ctx.run)
    if dcgm["ran"]:
        findings += [
            Finding("DCGM diagnostic", "verdict", "pass", problem["evidence"], problem["message"])
            for problem in dcgm_problems(dcgm["rc"], dcgm["output"], dcgm["level"])
        ]
    return findings


KINDS: dict[str, Any] = {"gpu_faults": check_gpu_faults}
