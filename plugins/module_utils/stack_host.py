# -*- coding: utf-8 -*-
"""check_host(facts, kb, stack=None): the facts a host really reports (NVML, torch, nvcc) checked against the
same links as a declared stack, and, with the stack, against what it declares.

Standard library only, Python 3.8+: the stack_host_check module runs it on the host.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import nvml_cuda_version
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_links import driver_runs_cuda, report_arch_coverage
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_report import Report
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_spec import DRIVER_RE, StackError, normalize_stack
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_versions import (
    cuda_variant,
    major_minor,
    parse_compute_capability,
    parse_nvcc_release,
    variant_cuda,
    version_key,
)

_RELEASE_RE = re.compile(r"^(\d+)\.(\d+)$", re.ASCII)


def normalize_host_facts(facts: dict) -> dict:
    """Check and normalise the facts a host reported; raises StackError on a malformed value."""
    driver = facts.get("driver_version")
    if driver is not None and not DRIVER_RE.match(str(driver)):
        raise StackError("driver_version %r is not a driver version like 580.159.04" % (driver,))
    gpus = []
    for item in facts.get("gpu_compute_capabilities") or []:
        cc = parse_compute_capability(item)
        if cc is None:
            raise StackError('gpu_compute_capabilities entry %r is not a compute capability like "9.0"' % (item,))
        gpus.append(cc)
    nvcc = facts.get("nvcc_version")
    nvcc_release = parse_nvcc_release(nvcc) if nvcc else None
    if nvcc and nvcc_release is None:
        raise StackError("nvcc_version %r is neither an nvcc --version line nor a version like 13.0" % (nvcc,))
    torch_cuda = facts.get("torch_cuda") or None
    if torch_cuda is not None and not _RELEASE_RE.match(str(torch_cuda)):
        raise StackError("torch_cuda %r is not a CUDA version like 13.0 (torch.version.cuda)" % (torch_cuda,))
    return {
        "driver_version": None if driver is None else str(driver),
        "driver_cuda_version": _driver_cuda(facts.get("driver_cuda_version")),
        "gpu_compute_capabilities": gpus,
        "torch_cuda": None if torch_cuda is None else str(torch_cuda),
        "torch_arch_list": [str(item) for item in (facts.get("torch_arch_list") or [])],
        "nvcc_version": nvcc_release,
        # False before the venv layer has run: torch is then not compared with the stack.
        "torch_installed": facts.get("torch_installed") is not False,
    }


def _driver_cuda(value):
    """NVML reports the driver's CUDA as 13000; nvidia-smi as '13.0'."""
    if value in (None, ""):
        return None
    text = str(value)
    if text.isdigit():
        return nvml_cuda_version(int(text))
    if _RELEASE_RE.match(text):
        return text
    raise StackError("driver_cuda_version %r is neither NVML's 13000 form nor 13.0" % (value,))


def check_host(facts: dict, kb: dict, stack=None) -> dict:
    """Check a host's real facts: the driver runs torch's CUDA, torch's arch list covers every GPU,
    nvcc matches torch's CUDA; with `stack`, also that the host matches the declared stack."""
    index = KbIndex(kb)
    report = Report()
    facts = normalize_host_facts(facts)
    _host_driver(index, report, facts)
    _host_arch(index, report, facts)
    _host_toolkit(index, report, facts)
    if stack is not None:
        _host_vs_stack(index, report, facts, stack)
    return report.as_dict({"host": facts})


def _host_driver(index: KbIndex, report: Report, facts: dict) -> None:
    driver, torch_cuda = facts["driver_version"], facts["torch_cuda"]
    if torch_cuda is None:
        return
    if driver is None:
        report.error(
            "driver -> torch",
            "torch is built with CUDA %s but no NVIDIA driver was found (NVML) — install "
            "the driver and load its module" % torch_cuda,
        )
        return
    driver_runs_cuda(
        index,
        report,
        driver,
        torch_cuda,
        "the installed torch",
        "driver -> torch",
        "install a newer driver or a torch variant for an older CUDA",
        holder="the host runs",
    )
    driver_cuda = facts["driver_cuda_version"]
    if driver_cuda and version_key(driver_cuda) < version_key(torch_cuda):
        if driver_cuda.split(".")[0] == torch_cuda.split(".")[0]:
            report.warn(
                "driver -> torch",
                "the driver reports CUDA %s, older than torch's CUDA %s: this relies on "
                "minor-version compatibility" % (driver_cuda, torch_cuda),
            )
        else:
            report.error(
                "driver -> torch",
                'the driver reports CUDA %s but torch is built with CUDA %s: "CUDA driver '
                'version is insufficient for CUDA runtime version" — install a driver for CUDA %s'
                % (driver_cuda, torch_cuda, torch_cuda),
            )


def _host_arch(index: KbIndex, report: Report, facts: dict) -> None:
    gpus, torch_cuda, arch_list = facts["gpu_compute_capabilities"], facts["torch_cuda"], facts["torch_arch_list"]
    if not gpus:
        return
    if torch_cuda is None:
        report.error(
            "torch -> gpu",
            "torch is a CPU build (torch.version.cuda is None) on a host with %d GPU(s) — "
            "install the +cuXYZ variant" % len(gpus),
        )
        return
    if not arch_list:
        report.error(
            "torch -> gpu",
            "torch reports an empty compiled arch list (torch.cuda.get_arch_list()): CUDA "
            "is not usable from torch on this host — check the driver and CUDA_VISIBLE_DEVICES",
        )
        return
    for cc in sorted(set(gpus)):
        gpu = {"label": _cc_label(index, cc), "cc": cc}
        report_arch_coverage(index, report, "torch -> gpu", "the installed torch", arch_list, gpu)


def _cc_label(index: KbIndex, cc: str) -> str:
    row = index.ccs.get(cc)
    return "the %s GPU" % row["architecture"] if row else "the GPU of compute capability %s" % cc


def _host_toolkit(index: KbIndex, report: Report, facts: dict) -> None:
    nvcc, torch_cuda = facts["nvcc_version"], facts["torch_cuda"]
    if nvcc is None or torch_cuda is None or major_minor(torch_cuda) == nvcc:
        return
    index.rule(report, "cpp_extension_cuda_match")
    if nvcc.split(".")[0] != torch_cuda.split(".")[0]:
        report.error(
            "cuda -> torch",
            "nvcc %s and torch's CUDA %s differ in major version: torch refuses to build "
            "extensions (flash-attn) — install toolkit %s or a torch variant %s"
            % (nvcc, torch_cuda, torch_cuda, cuda_variant(nvcc)),
        )
    else:
        report.warn(
            "cuda -> torch",
            "nvcc %s differs from torch's CUDA %s in minor version: extensions build with a "
            "warning" % (nvcc, torch_cuda),
        )


def _host_vs_stack(index: KbIndex, report: Report, facts: dict, stack: dict) -> None:
    """Drift between the declared stack and what the host reports."""
    stack = normalize_stack(stack)
    if stack["driver"] and facts["driver_version"] and stack["driver"] != facts["driver_version"]:
        report.error(
            "stack -> host",
            "the host runs driver %s but the stack declares %s — install driver %s or update "
            "the stack" % (facts["driver_version"], stack["driver"], stack["driver"]),
        )
    if stack["cuda"] and facts["driver_version"]:
        driver_runs_cuda(
            index,
            report,
            facts["driver_version"],
            stack["cuda"],
            "the stack's CUDA toolkit",
            "driver -> cuda",
            "install a driver for CUDA %s" % stack["cuda"],
            holder="the host runs",
        )
    declared_cuda = variant_cuda(stack["torch_variant"])
    if facts["torch_installed"] and declared_cuda != facts["torch_cuda"]:
        report.error(
            "stack -> host",
            "the host's torch is built with CUDA %s but the stack declares torch_variant %s — "
            "reinstall torch+%s"
            % (facts["torch_cuda"] or "none (CPU build)", stack["torch_variant"], stack["torch_variant"]),
        )
    if stack["cuda"] and facts["nvcc_version"] != major_minor(stack["cuda"]):
        report.error(
            "stack -> host",
            "the stack declares CUDA toolkit %s but nvcc reports %s — install toolkit %s"
            % (stack["cuda"], facts["nvcc_version"] or "nothing (nvcc not found)", stack["cuda"]),
        )
    declared = []
    for entry in stack["gpu"]:
        gpu = index.resolve_gpu(entry)
        if gpu is not None:
            declared.append(gpu["cc"])
    found = sorted(set(facts["gpu_compute_capabilities"]))
    if declared and found and sorted(set(declared)) != found:
        report.error(
            "stack -> host",
            "the stack declares GPUs of compute capability %s but the host has %s — fix the "
            "stack's gpu list" % (", ".join(sorted(set(declared))), ", ".join(found)),
        )
