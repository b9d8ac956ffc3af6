# -*- coding: utf-8 -*-
"""What NVML does not hold about a node's GPUs, as drift (kind `gpu_faults`): XIDs of this boot in the kernel log
and DCGM's diagnostic verdict, read with the same parsers as the health gate (module_utils/gpu_health.py).

Shipped to targets with the drift_probe module: standard library and gpufleet's other module_utils only. In
drift_probe's one call per layer, beside the `gpus` check that reads NVML, so the gpu_health layer costs one
module run per node.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import Context, Finding
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpu_health import (
    dcgm_problems,
    kernel_log_this_boot,
    parse_xids,
    xid_problems,
)

# journalctl, dmesg and dcgmi live in sbin directories on some systems, which a module's PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def kernel_log(source: str, ctx: Context) -> tuple[list[str], str | None]:
    """This boot's kernel log lines (the journal's, or a file's), or ([], why) when they cannot be read."""
    if source != "journal":
        try:
            with open(source, encoding="utf-8", errors="replace") as stream:
                return kernel_log_this_boot(stream), None
        except OSError as error:
            return [], f"cannot read {source}: {error}"
    journalctl = shutil.which("journalctl", path=SEARCH_PATH)
    command = [journalctl, "-k", "-b", "0", "-o", "short-iso", "--no-pager", "-q"] if journalctl else ["dmesg"]
    rc, out, err = ctx.run(command)
    if rc != 0:
        return [], f"{command[0]} exited {rc}: {err.strip()}"
    return out.splitlines(), None


def dcgm_verdict(level: int, ctx: Context) -> list[dict[str, Any]]:
    """DCGM's problems at `level`; none when the level is 0 or DCGM is not installed (the gate says the same)."""
    dcgmi = shutil.which("dcgmi", path=SEARCH_PATH)
    if level == 0 or not dcgmi:
        return []
    rc, out, err = ctx.run([dcgmi, "diag", "-r", str(level)])
    return dcgm_problems(rc, out + err, level)


def check_gpu_faults(spec: dict, ctx: Context) -> list[Finding]:
    """One finding per XID of this boot that is not ignored and per failed DCGM test."""
    lines, unreadable = kernel_log(str(spec.get("kernel_log") or "journal"), ctx)
    if unreadable:
        ctx.notes.append(f"XIDs not checked: {unreadable}")
    findings = [
        Finding("kernel log", f"xid {problem['xid']}", "none since boot", problem["evidence"], problem["message"])
        for problem in xid_problems(parse_xids(lines), spec.get("xid_ignore") or [])
    ]
    findings += [
        Finding("DCGM diagnostic", "verdict", "pass", problem["evidence"], problem["message"])
        for problem in dcgm_verdict(int(spec.get("dcgm_level") or 0), ctx)
    ]
    return findings


KINDS: dict[str, Any] = {"gpu_faults": check_gpu_faults}
