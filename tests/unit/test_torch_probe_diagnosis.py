"""The failure classifier (torch_diagnosis.py) on real error texts, and diagnose() on report facts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_torch_probe_venvs import (
    MISSING_TORCH_SYMBOL,
    TORCH_CPU_REQUIREMENTS,
    cached_venv,
    missing_cudart_extension,
    undefined_symbol_extension,
)

from ansible_collections.gpufleet.fleet.plugins.module_utils import torch_diagnosis
from ansible_collections.gpufleet.fleet.plugins.module_utils.torch_diagnosis import (
    SIGNATURES,
    classify,
    classify_error,
    diagnose,
)

# The signature column of the failure table in the project's domain notes, verbatim.
DOMAIN_TABLE = [
    ("CUDA driver version is insufficient for CUDA runtime version", "driver_insufficient"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", "driver_unreachable"),
    ("Failed to initialize NVML: Driver/library version mismatch", "driver_library_mismatch"),
    ("no kernel image is available for execution on the device", "no_kernel_image"),
    ("libcudart.so.12: cannot open shared object file", "cuda_library_missing"),
    ("undefined symbol", "undefined_symbol"),
    ("FlashAttention is not available", "flash_attn_unavailable"),
    ("CUDA out of memory", "cuda_out_of_memory"),
]

# Error texts as users pasted them in public issues (the thread is named beside each).
REAL_TEXTS = [
    # vllm-project/vllm#5501
    (
        "ImportError: /usr/local/lib/python3.8/dist-packages/vllm/_C.abi3.so: undefined symbol: "
        "_ZN5torch7LibraryC1ENS0_4KindESsSt8optionalIN3c1011DispatchKeyEEPKcj",
        "undefined_symbol",
    ),
    # Dao-AILab/flash-attention#723
    (
        "ImportError: /usr/local/lib/python3.8/dist-packages/flash_attn_2_cuda.cpython-38-x86_64-linux-gnu.so: "
        "undefined symbol: _ZN3c104cuda9SetDeviceEi",
        "undefined_symbol",
    ),
    # lllyasviel/Fooocus#1313
    (
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver "
        "by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
        "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your "
        "version of the CUDA driver.",
        "driver_insufficient",
    ),
    # IEIT-Yuan/Yuan-2.0#65: the warning torch.cuda.is_available() emits in the same state
    (
        "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11000). Please "
        "update your GPU driver by downloading and installing a new version from the URL: "
        "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch "
        "version that has been compiled with your version of the CUDA driver. (Triggered internally at "
        "/opt/pytorch/pytorch/c10/cuda/CUDAFunctions.cpp:108.)",
        "driver_insufficient",
    ),
    # mlcommons/inference#54
    (
        "RuntimeError: cuda runtime error (35) : CUDA driver version is insufficient for CUDA runtime version at "
        "/pytorch/torch/csrc/cuda/Module.cpp:34",
        "driver_insufficient",
    ),
    # Comfy-Org/ComfyUI#10326
    (
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
        "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        "no_kernel_image",
    ),
    # vllm-project/vllm#1738
    ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", "cuda_library_missing"),
    # vllm-project/vllm#7721
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of "
        "44.53 GiB of which 187.94 MiB is free. Process 3909982 has 44.34 GiB memory in use.",
        "cuda_out_of_memory",
    ),
    # QwenLM/Qwen3#295 (vLLM refusing Qwen1.5-7B-Chat's 32768-token max_model_len)
    (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in "
        "KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
        "engine.",
        "kv_cache_too_small",
    ),
    # mozilla/translations#1167
    ("[nvidia-smi(stdout)] Failed to initialize NVML: Driver/library version mismatch", "driver_library_mismatch"),
]

UNRELATED_TEXTS = [
    "ModuleNotFoundError: No module named 'numpy'",
    "RuntimeError: operator torchvision::nms does not exist",
    "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm",
    "ImportError: libgomp.so.1: cannot open shared object file: No such file or directory",
]


def _ids(text: str) -> list[str]:
    return [signature.id for signature in classify(text)]


@pytest.mark.parametrize(("text", "expected"), DOMAIN_TABLE)
def test_every_row_of_the_domain_table_is_recognised(text: str, expected: str) -> None:
    assert _ids(text) == [expected]


@pytest.mark.parametrize(("text", "expected"), REAL_TEXTS)
def test_real_error_texts(text: str, expected: str) -> None:
    assert _ids(text) == [expected]


@pytest.mark.parametrize("text", UNRELATED_TEXTS)
def test_unrelated_errors_match_nothing(text: str) -> None:
    assert _ids(text) == []


def test_table_rows_have_cause_and_fix_and_unique_ids() -> None:
    assert len({signature.id for signature in SIGNATURES}) == len(SIGNATURES)
    for signature in SIGNATURES:
        assert signature.signature and signature.cause and signature.fix and signature.patterns


def _live_import_error(python: str, package_root: Path, module: str) -> str:
    code = "import %s" % module
    completed = subprocess.run([python, "-c", code], cwd=package_root, capture_output=True, text=True)
    assert completed.returncode == 1
    return completed.stderr.strip().splitlines()[-1]


def test_live_undefined_symbol_import_error(tmp_path: Path) -> None:
    undefined_symbol_extension(tmp_path / "gpufleet_symtest")
    (tmp_path / "gpufleet_symtest" / "__init__.py").write_text("")
    text = _live_import_error(sys.executable, tmp_path, "gpufleet_symtest._ext")
    assert text.startswith("ImportError: ") and text.endswith("undefined symbol: %s" % MISSING_TORCH_SYMBOL)
    [found] = classify_error("flash_attn", {"text": text})
    assert found["id"] == "undefined_symbol"
    assert found["fix"] == "rebuild against the installed torch"
    assert found["cause"] == "extension built against another torch"
    assert found["evidence"] == text


def test_live_missing_cudart_import_error(tmp_path: Path) -> None:
    missing_cudart_extension(tmp_path / "gpufleet_cudart", tmp_path / "build")
    (tmp_path / "gpufleet_cudart" / "__init__.py").write_text("")
    text = _live_import_error(sys.executable, tmp_path, "gpufleet_cudart._cudart_user")
    assert text == "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"
    assert _ids(text) == ["cuda_library_missing"]


def test_live_cpu_torch_cuda_init_error() -> None:
    python = str(cached_venv("torch-cpu", TORCH_CPU_REQUIREMENTS) / "bin" / "python")
    completed = subprocess.run([python, "-c", "import torch; torch.cuda.init()"], capture_output=True, text=True)
    text = completed.stderr.strip().splitlines()[-1]
    assert text == "AssertionError: Torch not compiled with CUDA enabled"
    assert _ids(text) == ["cpu_wheel"]


def test_root_cause_in_a_chained_exception_is_found() -> None:
    error = {
        "text": "RuntimeError: Failed to import transformers.models.bloom.modeling_bloom",
        "causes": [
            "ImportError: /x/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN2at4_ops5zeros"
        ],
    }
    [found] = classify_error("flash_attn", error)
    assert found["id"] == "undefined_symbol"
    assert found["evidence"].startswith("ImportError: /x/flash_attn_2_cuda")


def test_unexplained_error_is_kept_unclassified() -> None:
    [found] = classify_error("vllm", {"text": "ModuleNotFoundError: No module named 'numpy'"})
    assert found == {
        "id": "unclassified",
        "signature": None,
        "cause": torch_diagnosis.UNCLASSIFIED_CAUSE,
        "fix": torch_diagnosis.UNCLASSIFIED_FIX,
        "component": "vllm",
        "evidence": "ModuleNotFoundError: No module named 'numpy'",
    }


def _report(**parts: dict) -> dict:
    report = {
        "torch": {"installed": False},
        "gpu_compute": {},
        "vllm": {},
        "flash_attn": {},
        "imports": [],
        "probe": {"complete": True},
    }
    report.update(parts)
    return report


def test_driver_too_old_warning_from_is_available_is_diagnosed() -> None:
    torch = {
        "import_ok": True,
        "version": "2.11.0+cu130",
        "cuda": "13.0",
        "cuda_available": False,
        "cuda_warnings": [REAL_TEXTS[3][0].split("UserWarning: ", 1)[1], "Failed to initialize NumPy"],
        "cuda_error": {"text": "RuntimeError: " + REAL_TEXTS[2][0].split("RuntimeError: ", 1)[1]},
    }
    found = diagnose(_report(torch=torch))
    assert [(item["id"], item["component"]) for item in found] == [("driver_insufficient", "torch")]
    assert found[0]["fix"] == "newer driver, or an older torch CUDA variant"


def test_uncovered_gpu_is_diagnosed_as_no_kernel_image() -> None:
    torch = {
        "import_ok": True,
        "version": "2.1.2+cu118",
        "cuda": "11.8",
        "cuda_available": True,
        "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"],
        "arch_coverage": [
            {"index": 0, "name": "NVIDIA H200", "capability": "9.0", "covered": False, "source": "torch"}
        ],
    }
    [found] = diagnose(_report(torch=torch))
    assert found["id"] == "no_kernel_image"
    assert found["evidence"] == (
        "torch arch list [sm_50 sm_60 sm_70 sm_75 sm_80 sm_86] has nothing that runs on "
        "GPU 0 NVIDIA H200 (compute capability 9.0)"
    )


def test_flash_attn_that_does_not_import_gets_the_specific_row_only() -> None:
    flash_attn = {"installed": True, "version": "2.8.3", "import_ok": False, "import_error": {"text": REAL_TEXTS[1][0]}}
    assert [item["id"] for item in diagnose(_report(flash_attn=flash_attn))] == ["undefined_symbol"]


def test_flash_attn_that_does_not_import_for_another_reason_is_not_available() -> None:
    flash_attn = {
        "installed": True,
        "version": "2.8.3",
        "import_ok": False,
        "import_error": {"text": "ModuleNotFoundError: No module named 'einops'"},
    }
    found = diagnose(_report(flash_attn=flash_attn))
    assert [item["id"] for item in found] == ["unclassified", "flash_attn_unavailable"]
    assert found[1]["evidence"] == "flash-attn 2.8.3 is installed but does not import"


def test_wrong_gpu_results_and_a_stopped_probe_are_reported() -> None:
    gpu_compute = {
        "ran": True,
        "ok": False,
        "devices": [
            {"device": "cuda:0", "ok": False, "max_abs_error": 3.5, "tolerance": 0.006, "non_finite": False},
            {"device": "cuda:1", "ok": True, "max_abs_error": 1e-5, "tolerance": 0.006},
        ],
    }
    probe = {"complete": False, "stopped_in": "vllm", "exit": "killed by SIGSEGV"}
    found = diagnose(_report(gpu_compute=gpu_compute, probe=probe))
    assert [(item["component"], item["evidence"]) for item in found] == [
        ("gpu_compute cuda:0", "wrong results on cuda:0: max abs error 3.5 > tolerance 0.006"),
        ("probe", "the probe stopped in section vllm: killed by SIGSEGV"),
    ]


def test_duplicate_findings_are_reported_once() -> None:
    torch = {
        "import_ok": True,
        "version": "2.11.0+cu130",
        "cuda": "13.0",
        "cuda_available": False,
        "cuda_warnings": ["CUDA driver version is insufficient for CUDA runtime version"],
        "cuda_error": {"text": "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"},
    }
    assert [item["id"] for item in diagnose(_report(torch=torch))] == ["driver_insufficient"]


def test_diagnosis_entries_are_plain_json() -> None:
    torch = {"import_ok": True, "version": "2.13.0+cpu", "cuda": None, "cuda_available": False}
    found = diagnose(_report(torch=torch))
    assert json.loads(json.dumps(found)) == found
    assert found[0]["id"] == "cpu_wheel"
