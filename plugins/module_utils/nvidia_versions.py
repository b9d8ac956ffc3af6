# -*- coding: utf-8 -*-
"""The one parser of each version text NVIDIA's tools print; every module, drift check and the validator use these.

Standard library only, Python 3.8+: shipped to hosts inside modules and imported by the controller.
Each function returns None for text that is not of its format; callers decide whether that is an error.

Formats (real samples in tests/unit/test_nvidia_versions.py):
- `nvcc --version`: "Cuda compilation tools, release 13.0, V13.0.88".
- NVML's nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor (13000 is CUDA 13.0).
- `nv-fabricmanager --version`: "Fabric Manager version is : 580.95.05".
- A compute capability as nvidia-smi's compute_cap prints it ("9.0") or as an arch list names it ("sm_90").
The files the installers leave (nvidia-installer's record, /proc/driver/nvidia/version, a toolkit's
version.json) have one reader each, in runfile.py beside the install logic that writes and reads them.
"""

from __future__ import annotations

import re

_NVCC_RELEASE_RE = re.compile(r"release (\d+\.\d+)")
_NVCC_VERSION_RE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")
_FABRIC_MANAGER_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")
# Capability minors are one digit: sm_XY cannot name any other.
_CAPABILITY_RE = re.compile(r"^(\d+)\.(\d)$", re.ASCII)
_SASS_RE = re.compile(r"^sm_(\d{2,})$", re.ASCII)
_PTX_RE = re.compile(r"^compute_(\d{2,})$", re.ASCII)


def nvcc_release(output: str | None) -> str | None:
    """The CUDA release (major.minor) of `nvcc --version`: 'release 13.0, V13.0.88' -> '13.0'."""
    match = _NVCC_RELEASE_RE.search(output or "")
    return match.group(1) if match else None


def nvcc_version(output: str | None) -> str | None:
    """The full toolkit version of `nvcc --version`: 'release 13.0, V13.0.88' -> '13.0.88'."""
    match = _NVCC_VERSION_RE.search(output or "")
    return match.group(2) if match else None


def nvml_cuda_version(number: int) -> str:
    """NVML's CUDA driver version as X.Y: 13000 -> '13.0', 12080 -> '12.8'."""
    return "%d.%d" % (number // 1000, (number % 1000) // 10)


def fabric_manager_version(output: str | None) -> str | None:
    """The version `nv-fabricmanager --version` prints: 'Fabric Manager version is : 580.95.05' -> '580.95.05'."""
    match = _FABRIC_MANAGER_RE.search(output or "")
    return match.group(1) if match else None


def compute_capability(text: str, ptx: bool = False) -> tuple[int, int] | None:
    """'9.0' or 'sm_90' -> (9, 0); with ptx, 'compute_90' too (a stack may name a GPU by its PTX target)."""
    value = str(text).strip()
    match = _CAPABILITY_RE.match(value)
    if match:
        return int(match.group(1)), int(match.group(2))
    match = _SASS_RE.match(value) or (_PTX_RE.match(value) if ptx else None)
    if match:
        digits = match.group(1)
        return int(digits[:-1]), int(digits[-1])
    return None
