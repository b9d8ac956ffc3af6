"""Whether a node's GPUs are fit to serve: XID errors in the kernel log, NVML's ECC, row remapping and lost
GPUs, and DCGM's diagnostic where it is installed.

Standard library only: this file is shipped to targets with the gpu_health module, and the controller's
`gpufleet doctor` reads the same XID lines with it.

The kernel logs an XID as `NVRM: Xid (PCI:0000:44:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off
the bus.` (NVIDIA's XID catalog, docs.nvidia.com/deploy/xid-errors; the form seen in NVIDIA/NVSentinel#155).
Which XIDs stop a node: NVIDIA's catalog gives each XID an immediate action; those whose action is restarting
the application (a program's own fault, the GPU is fine) are XID_APPLICATION_ERRORS and do not fail the gate.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

XID_PATTERN = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+), ?(?P<detail>.*)")
# A boot banner in a kernel log file that spans several boots (rsyslog's /var/log/kern.log): what follows the
# last one is this boot.
BOOT_BANNER = re.compile(r"kernel: Linux version |^Linux version ")

# XIDs NVIDIA's catalog answers with RESTART_APP: a CUDA program's own error (graphics engine exception,
# MMU fault from a bad address, a stopped channel after the program's fault, preemptive cleanup).
XID_APPLICATION_ERRORS = (13, 31, 43, 45)

# What the most frequent hardware XIDs mean (NVIDIA's XID catalog and its page retirement / row remapping
# guides), for the message an operator reads.
XID_MEANING = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (reset the GPU to activate)",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# DCGM levels: 1 takes seconds (a readiness gate), 2 about two minutes, 3 about fifteen.
DCGM_LEVELS = (1, 2, 3, 4)


def kernel_log_this_boot(lines: Iterable[str]) -> list[str]:
    """The lines after the last boot banner; all of them when there is none (journalctl -k -b is one boot)."""
    kept: list[str] = []
    for line in lines:
        if BOOT_BANNER.search(line):
            kept = []
        kept.append(line.rstrip("\n"))
    return kept


def parse_xids(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Every XID line: pci, xid, detail, the line itself."""
    found = []
    for line in lines:
        match = XID_PATTERN.search(line)
        if match:
            found.append(
                {
                    "pci": match.group("pci").lower(),
                    "xid": int(match.group("xid")),
                    "detail": match.group("detail").strip(),
                    "line": line.strip(),
                }
            )
    return found


def xid_problems(xids: list[dict[str, Any]], ignore: Iterable[int]) -> list[dict[str, Any]]:
    """One problem per distinct (PCI, XID) that is not ignored, with its first line as evidence."""
    ignored = set(ignore)
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for event in xids:
        key = (event["pci"], event["xid"])
        if event["xid"] in ignored:
            continue
        if key in seen:
            seen[key]["count"] += 1
            continue
        meaning = XID_MEANING.get(event["xid"], "see NVIDIA's XID catalog")
        seen[key] = {
            "check": "xid",
            "gpu_pci": event["pci"],
            "xid": event["xid"],
            "count": 1,
            "evidence": event["line"],
            "message": "XID %d on the GPU at PCI %s since boot (%s)" % (event["xid"], event["pci"], meaning),
        }
    for problem in seen.values():
        if problem["count"] > 1:
            problem["message"] += ", %d times" % problem["count"]
    return list(seen.values())


def nvml_problems(report: dict[str, Any], ecc_errors_max: int) -> list[dict[str, Any]]:
    """Lost GPUs, uncorrectable ECC errors over the limit, pending or failed row remapping / page retirement."""
    problems = []
    for gpu in report["gpus"]:
        where = "GPU %d (%s)" % (gpu["index"], gpu.get("uuid") or "uuid unknown")
        if gpu["lost"]:
            problems.append(
                {
                    "check": "lost",
                    "gpu": gpu["index"],
                    "evidence": gpu["errors"].get("gpu", "lost"),
                    "message": "%s is lost (fell off the bus): reboot the node; reseat or replace the GPU "
                    "if it stays lost" % where,
                }
            )
            continue
        problems.extend(_gpu_problems(gpu, where, ecc_errors_max))
    return problems


def _gpu_problems(gpu: dict[str, Any], where: str, ecc_errors_max: int) -> list[dict[str, Any]]:
    found = []
    errors = gpu.get("ecc_errors_uncorrected_volatile")
    if errors is not None and errors > ecc_errors_max:
        found.append(
            (
                "ecc",
                "ecc_errors_uncorrected_volatile=%d" % errors,
                "%d uncorrectable volatile ECC errors (at most %d allowed): drain the node and reset the GPU"
                % (errors, ecc_errors_max),
            )
        )
    if gpu.get("row_remap_failure"):
        found.append(
            (
                "row_remap",
                "row_remap_failure=true",
                "row remapping failed: the GPU's memory cannot be repaired, the GPU needs service",
            )
        )
    elif gpu.get("row_remap_pending"):
        found.append(
            ("row_remap", "row_remap_pending=true", "a row remapping is pending: reset the GPU (or reboot) to apply it")
        )
    if gpu.get("retired_pages_pending"):
        found.append(
            (
                "retired_pages",
                "retired_pages_pending=true",
                "retired pages are pending: reboot (or reset the GPU) to retire them",
            )
        )
    return [
        {"check": check, "gpu": gpu["index"], "evidence": evidence, "message": "%s: %s" % (where, message)}
        for check, evidence, message in found
    ]


def dcgm_problems(rc: int, output: str, level: int) -> list[dict[str, Any]]:
    """dcgmi diag exits non-zero when a test failed; its failing lines are the evidence."""
    if rc == 0:
        return []
    failing = [line.strip(" |") for line in output.splitlines() if re.search(r"\bFail|\bError", line)]
    evidence = "; ".join(failing[:5]) or (output.strip().splitlines() or ["exit status %d" % rc])[-1]
    return [
        {
            "check": "dcgm",
            "gpu": None,
            "evidence": evidence,
            "message": "DCGM diagnostic level %d failed (exit status %d): %s" % (level, rc, evidence),
        }
    ]
