"""The build key of kernel packages: what it depends on, MAX_JOBS, arch lists, and the clear refusals."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import kernel_key
from ansible_collections.gpufleet.fleet.plugins.module_utils.kernel_key import KernelKeyError

FLASH_ATTN = {"name": "flash-attn", "version": "2.8.3", "sha256": "a" * 64, "requires_cuda": True}
CPU_KERNEL = {"name": "gpufleet-kernel-demo", "version": "0.1.0", "sha256": "b" * 64, "requires_cuda": False}
CUDA_VENV = {"python": "3.12.3", "machine": "x86_64", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "cxx11_abi": True}
CPU_VENV = {"python": "3.11.2", "machine": "x86_64", "torch": "2.13.0+cpu", "torch_cuda": None, "cxx11_abi": True}


def _key(package: dict, probe: dict, nvcc: str | None = "13.0.88", arch: str = "9.0", env: dict | None = None) -> str:
    return kernel_key.build_key(kernel_key.key_components(package, probe, nvcc, arch, env or {}))


def test_key_is_stable_and_changes_with_each_input() -> None:
    base = _key(FLASH_ATTN, CUDA_VENV)
    assert base == _key(dict(FLASH_ATTN), dict(CUDA_VENV)) and len(base) == 16
    variants = [
        _key(FLASH_ATTN, {**CUDA_VENV, "torch": "2.11.1+cu130"}),
        _key(FLASH_ATTN, {**CUDA_VENV, "python": "3.12.4"}),
        _key(FLASH_ATTN, CUDA_VENV, nvcc="13.0.48"),
        _key(FLASH_ATTN, CUDA_VENV, arch="8.0;9.0"),
        _key({**FLASH_ATTN, "version": "2.8.2"}, CUDA_VENV),
        _key({**FLASH_ATTN, "sha256": "c" * 64}, CUDA_VENV),
        _key(FLASH_ATTN, CUDA_VENV, env={"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


def test_arch_list_order_and_spelling_do_not_change_the_key() -> None:
    assert _key(FLASH_ATTN, CUDA_VENV, arch="9.0;8.0") == _key(FLASH_ATTN, CUDA_VENV, arch="8.0 9.0 8.0")
    assert kernel_key.normalize_arch_list("9.0+PTX, 8.9;10.0a 8.0") == "8.0;8.9;9.0+PTX;10.0a"


def test_cpu_kernels_ignore_nvcc_and_arch_list() -> None:
    components = kernel_key.key_components(CPU_KERNEL, CPU_VENV, None, "", {})
    assert components["nvcc"] == "none" and components["arch_list"] == "none" and components["torch_cuda"] == "none"
    assert _key(CPU_KERNEL, CPU_VENV, nvcc=None, arch="") == _key(CPU_KERNEL, CPU_VENV, nvcc="12.8.93", arch="9.0")


@pytest.mark.parametrize("bad", ["sm_90", "9", "nine"])
def test_bad_arch_entries_are_named(bad: str) -> None:
    with pytest.raises(KernelKeyError, match=f"arch list entries {bad} "):
        kernel_key.normalize_arch_list(f"8.0;{bad}")


def test_absent_torch_is_a_clear_error() -> None:
    probe = {"python": "3.11.2", "torch": None, "torch_error": "ModuleNotFoundError: No module named 'torch'"}
    with pytest.raises(
        KernelKeyError, match="torch is not importable in the venv .*No module named 'torch'.*install the venv first"
    ):
        kernel_key.key_components(CPU_KERNEL, probe, None, "", {})


def test_missing_nvcc_is_a_clear_error() -> None:
    with pytest.raises(
        KernelKeyError,
        match=r"nvcc is not at /usr/local/cuda/bin/nvcc \(CUDA_HOME=/usr/local/cuda\): install the CUDA toolkit",
    ):
        kernel_key.check_cuda_build(FLASH_ATTN, CUDA_VENV, None, "/usr/local/cuda", "9.0")


def test_cuda_kernel_against_cpu_torch_is_refused() -> None:
    with pytest.raises(KernelKeyError, match=r"torch 2.13.0\+cpu is a CPU build"):
        kernel_key.check_cuda_build(FLASH_ATTN, CPU_VENV, "12.8.93", "/usr/local/cuda", "9.0")


def test_empty_arch_list_for_cuda_is_refused() -> None:
    with pytest.raises(KernelKeyError, match="no GPU architecture to compile for"):
        kernel_key.check_cuda_build(FLASH_ATTN, CUDA_VENV, "13.0.88", "/usr/local/cuda", "")


def test_toolkit_and_torch_cuda_of_different_releases_warn() -> None:
    assert kernel_key.check_cuda_build(FLASH_ATTN, CUDA_VENV, "13.0.88", "/usr/local/cuda", "9.0") == []
    warnings = kernel_key.check_cuda_build(FLASH_ATTN, CUDA_VENV, "12.8.93", "/usr/local/cuda", "9.0")
    assert len(warnings) == 1 and "nvcc 12.8.93 and torch's CUDA 13.0 differ" in warnings[0]


def test_nvcc_version_is_read_from_its_banner() -> None:
    banner = (
        "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
        "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n"
    )
    assert kernel_key.parse_nvcc_version(banner) == "13.0.88"
    with pytest.raises(KernelKeyError):
        kernel_key.parse_nvcc_version("command not found")


@pytest.mark.parametrize(
    ("requested", "cores", "memory_mb", "per_job", "expected"),
    [
        (0, 2, 24 * 1024, 4, 2),  # this lab machine: cores bound it
        (0, 128, 64 * 1024, 4, 16),  # many cores, little memory: memory bounds it
        (0, 8, 2 * 1024, 4, 1),  # never below one job
        (64, 16, 512 * 1024, 4, 16),  # an operator's cap above what the node can take is lowered
        (4, 16, 512 * 1024, 4, 4),
    ],
)
def test_max_jobs_from_cores_and_memory(
    requested: int, cores: int, memory_mb: int, per_job: float, expected: int
) -> None:
    assert kernel_key.max_jobs(requested, cores, memory_mb, per_job) == expected
