# -*- coding: utf-8 -*-
"""The rules of single links that both the declared stack and a host's facts are checked with: a driver runs a
CUDA, a CUDA or a prebuilt binary covers a GPU, an arch list covers a GPU, a distribution installs on a Python.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

from ansible_collections.gpufleet.fleet.plugins.module_utils.cuda_arch import ArchError, gpu_coverage, parse_arch
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_report import Report
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_versions import (
    cc_tuple,
    specifier_allows,
    version_key,
)


def driver_runs_cuda(
    index: KbIndex, report: Report, driver: str, cuda: str, what: str, link: str, fix: str, holder: str = "stack has"
) -> None:
    """Check that `driver` runs CUDA `cuda` (toolkit, torch wheel or vLLM wheel): error, warning or fine."""
    rows = index.cuda_rows(cuda)
    named = "" if rows else index.name_component(cuda)
    if named:
        report.error(
            link,
            "%s needs CUDA %s, which is not a toolkit release: %s is the version of %s — name the toolkit release"
            % (what, cuda, cuda, named),
        )
        return
    if not rows:
        report.error(
            link,
            "%s needs CUDA %s, which is not in the knowledge base (data/compat/cuda_driver.csv); "
            "add its NVIDIA driver row with a source" % (what, cuda),
        )
        return
    row = rows[0]
    floor = row["min_driver"]
    compat_min, compat_upper = row["minor_compat_min"], row["minor_compat_upper"]
    if floor:
        report.fact(
            "cuda:" + row["cuda_version"],
            "CUDA %s (%s) needs driver >= %s; minor-version compatibility: >= %s%s"
            % (
                row["cuda_version"],
                row["cuda_release"],
                floor,
                compat_min,
                (", < %s" % compat_upper) if compat_upper else "",
            ),
            row["source"],
        )
        if row["min_driver_status"] == "third-party":
            report.warn(
                link,
                "the driver floor of CUDA %s (>= %s) comes from a third-party copy of NVIDIA's "
                "release notes, not from NVIDIA's page itself" % (row["cuda_version"], floor),
            )
        if version_key(driver) >= version_key(floor):
            return
    else:
        report.fact(
            "cuda:" + row["cuda_version"],
            "CUDA %s: toolkit driver unverified; minor-version compatibility: >= %s"
            % (row["cuda_version"], compat_min),
            row["source"],
        )
        report.warn(
            link,
            "the driver needed by CUDA %s is unverified in the knowledge base; only its "
            "minor-version-compatibility floor (>= %s) is checked" % (row["cuda_version"], compat_min),
        )
    if compat_upper and version_key(driver) >= version_key(compat_upper):
        # The upper end of the minor-version range is where the next major's drivers start: a newer driver
        # runs every older CUDA (backward compatibility), so it is no limit.
        index.rule(report, "driver_backward_compatibility")
        return
    if compat_min and version_key(driver) >= version_key(compat_min):
        if floor:
            index.rule(report, "minor_version_compatibility")
            report.warn(
                link,
                "driver %s is older than %s, the driver of CUDA %s (%s): it runs only through CUDA "
                "minor-version compatibility (no PTX JIT of newer code, some APIs unavailable) — prefer "
                "driver >= %s" % (driver, floor, cuda, what, floor),
            )
        return
    report.error(
        link,
        "%s needs CUDA %s, which needs driver >= %s; %s driver %s — %s"
        % (what, cuda, floor or compat_min, holder, driver, fix),
    )


def cuda_dropped_gpu(report: Report, gpu: dict, cuda: str, what: str) -> bool:
    """A CUDA major after the last one that supports the GPU's arch (CUDA 13 for Maxwell, Pascal and Volta): an
    error naming that major; True when it was reported."""
    last = gpu["cc_row"].get("last_cuda_major", "")
    major = str(cuda).split(".", maxsplit=1)[0]
    if not last or not major.isdigit() or int(major) <= int(last):
        return False
    report.error(
        "gpu -> cuda",
        "%s (sm_%s, %s) is not supported by CUDA %s: CUDA %s dropped compute capability %s, whose last CUDA is "
        "CUDA %s.x; %s uses CUDA %s — use a build of CUDA %s.x or older for this GPU"
        % (
            gpu["label"],
            gpu["cc"].replace(".", ""),
            gpu["cc_row"]["architecture"],
            major,
            major,
            gpu["cc"],
            last,
            what,
            cuda,
            last,
        ),
    )
    return True


def check_cuda_covers_gpu(report: Report, gpu: dict, cuda: str, what: str, fix: str) -> None:
    """The CUDA a toolkit compiles with must be new enough to target the GPU's arch, and not of a major that
    dropped it."""
    if cuda_dropped_gpu(report, gpu, cuda, what):
        return
    need = gpu["cc_row"]["min_cuda"]
    if version_key(cuda) < version_key(need):
        report.error(
            "gpu -> cuda",
            "%s (sm_%s, %s) needs CUDA >= %s to compile for it; %s uses CUDA %s — %s"
            % (gpu["label"], gpu["cc"].replace(".", ""), gpu["cc_row"]["architecture"], need, what, cuda, fix),
        )


def check_binary_covers_gpu(index: KbIndex, report: Report, gpu: dict, cuda: str, what: str, fix: str) -> None:
    """A prebuilt binary (torch, vLLM) runs on the GPU when its CUDA could compile for the GPU's arch or for an
    older arch of the same major (cubins run on a higher minor: sm_100 code on a 10.3 B300), and its CUDA major has not
    dropped that arch."""
    if cuda_dropped_gpu(report, gpu, cuda, what):
        return
    native = gpu["cc_row"]["min_cuda"]
    if version_key(cuda) >= version_key(native):
        return
    oldest = _oldest_same_major(index, gpu["cc"])
    if oldest is None or version_key(cuda) < version_key(oldest["min_cuda"]):
        check_cuda_covers_gpu(report, gpu, cuda, what, fix)
        return
    index.rule(report, "cubin_same_major")
    report.warn(
        "gpu -> cuda",
        "%s uses CUDA %s, older than CUDA %s, the first to compile for %s (sm_%s): it can "
        "run only code built for %s (same major) on it"
        % (what, cuda, native, gpu["label"], gpu["cc"].replace(".", ""), oldest["sm"]),
    )


def _oldest_same_major(index: KbIndex, cc: str):
    """The compute-capability row of the lowest minor of `cc`'s major (10.0 for 10.3)."""
    major, minor = cc_tuple(cc)
    rows = [row for key, row in index.ccs.items() if cc_tuple(key)[0] == major and cc_tuple(key)[1] <= minor]
    return min(rows, key=lambda row: cc_tuple(row["compute_capability"])) if rows else None


def report_arch_coverage(index: KbIndex, report: Report, link: str, what: str, arch_list: list, gpu: dict) -> None:
    coverage = arch_coverage(arch_list, gpu["cc"])
    label = "%s (sm_%s)" % (gpu["label"], gpu["cc"].replace(".", ""))
    if coverage == "cubin":
        index.rule(report, "cubin_same_major")
        return
    if coverage == "ptx":
        index.rule(report, "ptx_jit")
        report.warn(
            link, "%s covers %s only through PTX: kernels are JIT-compiled at first use (slow start)" % (what, label)
        )
        return
    report.error(
        link,
        '%s is not compiled for %s (arch list: %s%s): "no kernel image is available for execution '
        'on the device" — choose a build whose arch list includes sm_%s'
        % (what, label, " ".join(arch_list), _starts_above(arch_list, gpu["cc"]), gpu["cc"].replace(".", "")),
    )


def _starts_above(arch_list: list, cc: str) -> str:
    """'; it starts at sm_75, above sm_60' when every entry of the arch list is newer than the GPU, else ''."""
    lowest = None
    for entry in arch_list:
        try:
            code = parse_arch(entry)[1]
        except ArchError:
            return ""
        if lowest is None or code < lowest[1]:
            lowest = (entry, code)
    if lowest is None or lowest[1] <= cc_tuple(cc):
        return ""
    return "; it starts at %s, above sm_%s" % (lowest[0], cc.replace(".", ""))


def arch_coverage(arch_list: list, cc: str) -> str:
    """'cubin' when native code (SASS) in the arch list runs on compute capability `cc`, 'ptx' when only
    PTX can be JIT-compiled for it, else 'none'. The rules themselves live in cuda_arch.py."""
    coverage = gpu_coverage(arch_list, cc_tuple(cc))
    if coverage["sass"]:
        return "cubin"
    return "ptx" if coverage["ptx"] else "none"


def check_python(report: Report, link: str, python: str, what: str, requires_python: str, tags: str, fix: str) -> None:
    """Python vs a distribution's Requires-Python and its wheel tags (cpXY-cpXY or cp38-abi3)."""
    if requires_python and not specifier_allows(requires_python, python):
        report.error(link, "%s requires Python %s; stack has python %s — %s" % (what, requires_python, python, fix))
        return
    if not tags:
        return
    major, minor = python.split(".")[:2]
    wanted = "cp%s%s" % (major, minor)
    for tag in tags.split(";"):
        interpreter, dummy, abi = tag.partition("-")
        if interpreter == wanted and abi == wanted:
            return
        if abi == "none" and interpreter in ("py3", "py%s" % major, wanted):
            return  # a pure-Python wheel (py3-none-any) installs on every CPython 3
        if (
            abi == "abi3"
            and interpreter.startswith("cp")
            and int(interpreter[3:] or 0) <= int(minor)
            and interpreter[2] == major
        ):
            return
    report.error(
        link,
        "%s ships no wheel for CPython %s.%s (wheel tags: %s); stack has python %s — %s"
        % (what, major, minor, tags.replace(";", " "), python, fix),
    )
