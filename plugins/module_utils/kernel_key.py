# -*- coding: utf-8 -*-
"""The build key of a compiled kernel package (flash-attn and the like), free of Ansible for unit tests.

Shipped to targets with the kernel_build_key module: standard library only.

A wheel of such a package is only valid for the exact torch it was compiled against (its C++ ABI and
symbols), the Python it was built for, the CUDA toolkit that compiled it and the GPU architectures in
TORCH_CUDA_ARCH_LIST. The key is a digest of exactly those facts plus the package's source and build
environment: two nodes with the same key can share one wheel; a change of any of them means a rebuild.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import nvcc_version

# Printed by the probe, run with the venv's interpreter: what a build without isolation would link against.
TORCH_PROBE = (
    "import json, platform, sys\n"
    "out = {'python': platform.python_version(), 'machine': platform.machine()}\n"
    "try:\n"
    "    import torch\n"
    "    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda,\n"
    "               cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI))\n"
    "except Exception as error:\n"
    "    out.update(torch=None, torch_error=f'{type(error).__name__}: {error}')\n"
    "print(json.dumps(out))\n"
)


def torch_identity(venv: str) -> str | None:
    """A digest of what the probe's answer depends on: torch's RECORD (each installed file with its hash, rewritten
    by every install), the venv's pyvenv.cfg and the interpreter binary it runs. The probe recorded with an
    identity stands for a new probe while the identity is unchanged; None when torch has no RECORD to read."""
    records = sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "torch-*.dist-info", "RECORD")))
    if len(records) != 1:
        return None
    digest = hashlib.sha256()
    for path in (records[0], os.path.join(venv, "pyvenv.cfg")):
        try:
            with open(path, "rb") as handle:
                digest.update(handle.read())
        except OSError:
            return None
    interpreter = os.path.realpath(os.path.join(venv, "bin", "python"))
    try:
        stat = os.stat(interpreter)
    except OSError:
        return None
    digest.update(f"{interpreter}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


_ARCH_RE = re.compile(r"^\d+\.\d+(a|f)?(\+PTX)?$")


class KernelKeyError(ValueError):
    """A kernel cannot be keyed or built here: the message names the problem and the fix."""


def normalize_arch_list(text: str) -> str:
    """'9.0 8.0;8.0' -> '8.0;9.0': sorted, unique, ';'-separated as TORCH_CUDA_ARCH_LIST takes it."""
    items = [item for item in re.split(r"[;\s,]+", text or "") if item]
    bad = [item for item in items if not _ARCH_RE.match(item)]
    if bad:
        raise KernelKeyError(
            f"arch list entries {', '.join(bad)} are not compute capabilities like 8.0, 9.0a or 9.0+PTX"
        )

    def order(item: str) -> tuple[int, int, str]:
        major, minor = re.match(r"(\d+)\.(\d+)", item).groups()  # type: ignore[union-attr]
        return int(major), int(minor), item

    return ";".join(sorted(set(items), key=order))


def parse_nvcc_version(output: str) -> str:
    """'Cuda compilation tools, release 12.8, V12.8.93' -> '12.8.93'."""
    version = nvcc_version(output)
    if version is None:
        raise KernelKeyError(f"cannot read the CUDA release from nvcc --version: {output.strip()[-200:]!r}")
    return version


def max_jobs(requested: int, cores: int, memory_mb: int, memory_per_job_gb: float) -> int:
    """Parallel compile jobs: bounded by cores and by memory (each nvcc job can take several GB)."""
    by_memory = int(memory_mb / 1024 / memory_per_job_gb) if memory_per_job_gb > 0 else cores
    automatic = max(1, min(cores, by_memory))
    return automatic if requested <= 0 else max(1, min(requested, automatic))


def key_components(package: dict, probe: dict, nvcc: str | None, arch_list: str, build_env: dict) -> dict:
    """Everything the wheel depends on; CUDA facts are 'none' for packages that do not compile CUDA."""
    if not probe.get("torch"):
        raise KernelKeyError(
            f"torch is not importable in the venv ({probe.get('torch_error', 'not installed')}): "
            f"{package['name']} is built without build isolation against the venv's torch; install the venv first"
        )
    requires_cuda = bool(package.get("requires_cuda", True))
    return {
        "package": package["name"],
        "version": str(package["version"]),
        "source_sha256": str(package["sha256"]).lower(),
        "python": probe["python"],
        "machine": probe.get("machine", ""),
        "torch": probe["torch"],
        "torch_cuda": probe.get("torch_cuda") or "none",
        "cxx11_abi": bool(probe.get("cxx11_abi")),
        "nvcc": nvcc if requires_cuda else "none",
        "arch_list": normalize_arch_list(arch_list) if requires_cuda else "none",
        "build_env": {str(k): str(v) for k, v in sorted((build_env or {}).items())},
    }


def build_key(components: dict) -> str:
    """The first 16 hex digits of the sha256 of the components, as canonical JSON."""
    canonical = json.dumps(components, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def check_cuda_build(package: dict, probe: dict, nvcc: str | None, cuda_home: str, arch_list: str) -> list[str]:
    """Refuses a CUDA kernel build that cannot work; returns warnings for one that may work."""
    if not package.get("requires_cuda", True):
        return []
    name = package["name"]
    if nvcc is None:
        raise KernelKeyError(
            f"{name} compiles CUDA code but nvcc is not at {cuda_home}/bin/nvcc (CUDA_HOME={cuda_home}): "
            "install the CUDA toolkit (tag toolkit) or set flash_attn_cuda_home"
        )
    if not probe.get("torch_cuda"):
        raise KernelKeyError(
            f"{name} compiles CUDA code but the venv's torch {probe.get('torch')} is a CPU build "
            "(torch.version.cuda is None): lock a +cuXYZ torch variant"
        )
    if not normalize_arch_list(arch_list):
        raise KernelKeyError(
            f"{name}: no GPU architecture to compile for: no GPU was found on the fleet's nodes and "
            "flash_attn_arch_list is empty; set it, e.g. '8.0;9.0'"
        )
    torch_release = ".".join(str(probe["torch_cuda"]).split(".")[:2])
    nvcc_release = ".".join(nvcc.split(".")[:2])
    if torch_release != nvcc_release:
        return [
            f"{name}: nvcc {nvcc} and torch's CUDA {probe['torch_cuda']} differ in major.minor; "
            "the extension may fail to load (undefined symbols); install toolkit "
            f"{torch_release} or lock the matching torch variant"
        ]
    return []
