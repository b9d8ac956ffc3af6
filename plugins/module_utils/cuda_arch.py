# -*- coding: utf-8 -*-
"""Does a CUDA binary's compiled architecture list cover a GPU? The SASS and PTX rules, as data.

Standard library only; shipped to targets with torch_stack_info and usable on the controller.

Rules (NVIDIA CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"; the
integrated-GPU exceptions as PyTorch encodes them in torch/cuda/__init__.py DEVICE_REQUIREMENT):
- SASS ``sm_XY`` runs on a device of the same major X whose minor is >= Y (sm_80 runs on 8.6 and 8.9,
  never on 9.0). Integrated GPUs (Jetson/Thor: 5.3, 6.2, 7.2, 8.7, 10.1) are not binary compatible with
  the discrete GPUs of their major: their code runs only on them, and discrete code never on them.
  sm_101 code also runs on 11.0 (CUDA 13 renamed Thor from sm_101 to sm_110).
- Arch-specific ``sm_XYa`` / ``compute_XYa`` run only on exactly X.Y.
- Family-specific ``sm_XYf`` / ``compute_XYf`` (CUDA 12.9+) run on the same major with minor >= Y.
- PTX ``compute_XY`` is JIT-compiled by the driver for any device of capability >= X.Y: it covers newer
  GPUs, at the price of a slow first load, and only if the driver is at least as new as the toolkit that
  produced the PTX (no PTX JIT under CUDA minor-version compatibility).
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import compute_capability

SASS = "sass"
PTX = "ptx"

INTEGRATED_GPUS = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (10, 1)})
# Code built for the key also runs on these devices (a product renamed between CUDA releases).
RENAMED_TARGETS = {(10, 1): frozenset({(11, 0)})}

_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


class ArchError(ValueError):
    """An architecture or compute capability that cannot be parsed."""


def parse_capability(text: str) -> tuple[int, int]:
    """'9.0' or 'sm_90' -> (9, 0)."""
    capability = compute_capability(text)
    if capability is not None:
        return capability
    raise ArchError("%r is not a compute capability: write it as MAJOR.MINOR, e.g. 9.0 for an H100/H200" % (text,))


def capability_text(capability: tuple[int, int]) -> str:
    """(9, 0) -> '9.0'."""
    return "%d.%d" % capability


def parse_arch(entry: str) -> tuple[str, tuple[int, int], str]:
    """'sm_90a' -> ('sass', (9, 0), 'a'); 'compute_120' -> ('ptx', (12, 0), '')."""
    match = _ARCH_RE.match(str(entry).strip())
    if not match or len(match.group(2)) < 2:
        raise ArchError("%r is not a CUDA architecture such as sm_90, sm_90a or compute_90" % (entry,))
    kind = SASS if match.group(1) == "sm" else PTX
    digits = match.group(2)
    return kind, (int(digits[:-1]), int(digits[-1])), match.group(3)


def _sass_runs_on(code: tuple[int, int], suffix: str, device: tuple[int, int]) -> bool:
    if device in RENAMED_TARGETS.get(code, frozenset()):
        return True
    if suffix == "a" or code in INTEGRATED_GPUS or device in INTEGRATED_GPUS:
        return code == device
    return code[0] == device[0] and device[1] >= code[1]


def _ptx_runs_on(code: tuple[int, int], suffix: str, device: tuple[int, int]) -> bool:
    if suffix == "a":
        return code == device
    if suffix == "f":
        return code[0] == device[0] and device[1] >= code[1]
    return device >= code


def runs_on(entry: str, device: tuple[int, int]) -> bool:
    """True when code compiled for the arch entry can execute on a device of that capability."""
    kind, code, suffix = parse_arch(entry)
    if kind == SASS:
        return _sass_runs_on(code, suffix, device)
    return _ptx_runs_on(code, suffix, device)


def gpu_coverage(arch_list: list[str], capability: tuple[int, int]) -> dict:
    """How the arch list covers one device: the SASS and PTX entries that run on it, and a note."""
    sass: list[str] = []
    ptx: list[str] = []
    unknown: list[str] = []
    for entry in arch_list:
        try:
            kind = parse_arch(entry)[0]
        except ArchError:
            unknown.append(entry)
            continue
        if runs_on(entry, capability):
            (sass if kind == SASS else ptx).append(entry)
    if sass:
        note = "native code (SASS) for this GPU: %s" % ", ".join(sass)
    elif ptx:
        note = (
            "no SASS for sm_%d%d; runs only by JIT-compiling PTX %s at load time (slow first start, needs a "
            "driver at least as new as the CUDA that built it)" % (capability[0], capability[1], ", ".join(ptx))
        )
    else:
        note = "nothing in the arch list runs on sm_%d%d: expect 'no kernel image is available'" % capability
    return {
        "capability": capability_text(capability),
        "covered": bool(sass or ptx),
        "sass": sass,
        "ptx": ptx,
        "unparsed": unknown,
        "note": note,
    }


def arch_coverage(arch_list: list[str], gpus: list[dict]) -> tuple[bool | None, list[dict]]:
    """Coverage of every GPU (dicts with 'capability' and optional 'index', 'name', 'source').

    Returns (covers_all, per_gpu). covers_all is None when there is no GPU to check.
    """
    per_gpu: list[dict] = []
    for gpu in gpus:
        result = gpu_coverage(arch_list, parse_capability(gpu["capability"]))
        for key in ("index", "name", "source"):
            if key in gpu:
                result[key] = gpu[key]
        per_gpu.append(result)
    if not per_gpu:
        return None, per_gpu
    return all(item["covered"] for item in per_gpu), per_gpu
