# -*- coding: utf-8 -*-
"""Classify what went wrong in a torch/vLLM/flash-attn stack, from the real texts the probe caught.

Standard library only. The table is the "What goes wrong" table of the project's domain notes: each row has
the signature as operators know it, the usual cause and the fix. Patterns match the exception texts (and the
warnings torch emits) exactly as the libraries print them; a few rows carry the variants that the same
failure produces in another layer (torch's own wording, the CUDA runtime's, the dynamic loader's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EVIDENCE_CHARS = 400


@dataclass(frozen=True)
class Signature:
    """One row of the failure table."""

    id: str
    signature: str
    patterns: tuple
    cause: str
    fix: str

    def matches(self, text: str) -> bool:
        return any(re.search(pattern, text) for pattern in self.patterns)


DRIVER_INSUFFICIENT = Signature(
    "driver_insufficient",
    "CUDA driver version is insufficient for CUDA runtime version",
    (
        r"CUDA driver version is insufficient for CUDA runtime version",
        # torch's wording when the driver's CUDA version is below the wheel's runtime.
        r"The NVIDIA driver on your system is too old",
    ),
    "driver older than the CUDA in the torch wheel",
    "newer driver, or an older torch CUDA variant",
)
DRIVER_UNREACHABLE = Signature(
    "driver_unreachable",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    (
        r"couldn't communicate with the NVIDIA driver",
        # torch, when libcuda cannot be loaded or reports no driver.
        r"Found no NVIDIA driver on your system",
        r"libcuda\.so[.\d]*: cannot open shared object file",
        r"libnvidia-ml\.so[.\d]*: cannot open shared object file",
    ),
    "module not loaded / kernel changed without DKMS / nouveau",
    "rebuild module (DKMS), blacklist nouveau, reboot",
)
DRIVER_LIBRARY_MISMATCH = Signature(
    "driver_library_mismatch",
    "Failed to initialize NVML: Driver/library version mismatch",
    (
        r"Driver/library version mismatch",
        # cudaErrorSystemDriverMismatch (803): the CUDA runtime's wording of the same state.
        r"system has unsupported display driver / cuda driver combination",
    ),
    "userspace libs updated, old module still loaded",
    "reboot or reload the module",
)
CPU_WHEEL = Signature(
    "cpu_wheel",
    "torch.cuda.is_available() False, torch.version.cuda None",
    (r"Torch not compiled with CUDA enabled",),
    "CPU wheel installed",
    "install the `+cuXYZ` variant",
)
NO_KERNEL_IMAGE = Signature(
    "no_kernel_image",
    "no kernel image is available for execution on the device",
    (r"no kernel image is available for execution on the device",),
    "wheel/extension not compiled for this sm",
    "matching arch list / newer wheel",
)
CUDA_LIBRARY_MISSING = Signature(
    "cuda_library_missing",
    "libcudart.so.12: cannot open shared object file",
    (
        r"lib(cudart|cublas|cublasLt|cudnn\w*|nccl|nvrtc|nvJitLink|cusparse|cusparseLt|cufft|curand|cusolver|cupti)"
        r"\.so[.\d]*: cannot open shared object file",
    ),
    "runtime libs missing from loader path",
    "install toolkit/runtime, ld.so.conf.d",
)
UNDEFINED_SYMBOL = Signature(
    "undefined_symbol",
    "undefined symbol importing vllm._C or flash_attn",
    (r"undefined symbol",),
    "extension built against another torch",
    "rebuild against the installed torch",
)
FLASH_ATTN_UNAVAILABLE = Signature(
    "flash_attn_unavailable",
    "FlashAttention is not available / slow fallback",
    (r"FlashAttention is not available",),
    "flash-attn missing or mismatched",
    "rebuild flash-attn",
)
# The memory signatures point at the capacity planner, which sizes each instance before any host is touched.
PLANNER_FIX = "`gpufleet plan -i INVENTORY --limit HOST` shows the instance's predicted memory and the smallest fix"
CUDA_OUT_OF_MEMORY = Signature(
    "cuda_out_of_memory",
    "CUDA out of memory at start",
    (r"CUDA out of memory", r"CUDA error: out of memory"),
    "--gpu-memory-utilization or --max-model-len too high",
    "lower them: " + PLANNER_FIX,
)
# vLLM's _check_enough_kv_cache_memory (vllm/v1/core/kv_cache_utils.py): the weights and overheads leave no room
# for the KV cache, or less than one request at max_model_len needs.
KV_CACHE_TOO_SMALL = Signature(
    "kv_cache_too_small",
    "max seq len is larger than the maximum number of tokens that can be stored in KV cache",
    (
        r"larger than the maximum number of tokens that can be stored in KV cache",
        r"No available memory for the cache blocks",
    ),
    "the model and max_model_len do not fit the GPUs at this tensor_parallel_size",
    "lower max_model_len or raise tensor_parallel_size or gpu_memory_utilization: " + PLANNER_FIX,
)

SIGNATURES = (
    DRIVER_INSUFFICIENT,
    DRIVER_UNREACHABLE,
    DRIVER_LIBRARY_MISMATCH,
    CPU_WHEEL,
    NO_KERNEL_IMAGE,
    CUDA_LIBRARY_MISSING,
    UNDEFINED_SYMBOL,
    FLASH_ATTN_UNAVAILABLE,
    CUDA_OUT_OF_MEMORY,
    KV_CACHE_TOO_SMALL,
)

UNCLASSIFIED_CAUSE = "not in the signature table"
UNCLASSIFIED_FIX = "read the evidence, and the probe's stderr in the result"


def classify(text: str) -> list[Signature]:
    """Every signature whose patterns occur in the text, in table order."""
    return [signature for signature in SIGNATURES if signature.matches(text or "")]


def entry(signature: Signature | None, component: str, evidence: str) -> dict:
    """One diagnosis: the table row (or an unclassified one), where it was seen and the text that shows it."""
    evidence = " ".join(evidence.split())[:EVIDENCE_CHARS]
    if signature is None:
        return {
            "id": "unclassified",
            "signature": None,
            "cause": UNCLASSIFIED_CAUSE,
            "fix": UNCLASSIFIED_FIX,
            "component": component,
            "evidence": evidence,
        }
    return {
        "id": signature.id,
        "signature": signature.signature,
        "cause": signature.cause,
        "fix": signature.fix,
        "component": component,
        "evidence": evidence,
    }


def error_text(error: dict) -> str:
    """An error record's own text followed by the texts of its causes."""
    return "\n".join([error.get("text") or error.get("message") or ""] + list(error.get("causes") or []))


def classify_error(component: str, error: dict | None) -> list[dict]:
    """Diagnoses for one caught error; an error no signature explains is kept as unclassified."""
    if not error:
        return []
    text = error_text(error)
    found = classify(text)
    if not found:
        return [entry(None, component, text)]
    return [entry(signature, component, _matching_line(signature, text)) for signature in found]


def _matching_line(signature: Signature, text: str) -> str:
    for line in text.splitlines():
        if signature.matches(line):
            return line
    return text


def _torch_errors(torch: dict) -> list[tuple[str, dict | None]]:
    """(component, error record or None where that step did not fail); _component_errors drops the None."""
    errors = [
        ("torch", torch.get(key))
        for key in ("import_error", "cuda_error", "cudnn_error", "nccl_error", "arch_list_error")
    ]
    errors += [("torch device %s" % device.get("index"), device.get("error")) for device in torch.get("devices", [])]
    errors += [("torch", {"text": warning}) for warning in torch.get("cuda_warnings", []) if classify(warning)]
    return errors


def _component_errors(report: dict) -> list[tuple[str, dict]]:
    """(component, error record) for every real error text in the report."""
    errors = _torch_errors(report.get("torch") or {})
    for check in (report.get("gpu_compute") or {}).get("devices", []):
        errors.append(("gpu_compute %s" % check.get("device"), check.get("error")))
    vllm = report.get("vllm") or {}
    errors += [("vllm", vllm.get("import_error")), ("vllm._C", vllm.get("extension_error"))]
    flash_attn = report.get("flash_attn") or {}
    errors += [
        ("flash_attn", flash_attn.get("import_error")),
        ("flash_attn kernel", (flash_attn.get("kernel") or {}).get("error")),
    ]
    errors += [("import %s" % item.get("module"), item.get("error")) for item in report.get("imports", [])]
    return [(component, error) for component, error in errors if error]


def _cpu_wheel(torch: dict) -> list[dict]:
    if not torch.get("import_ok") or torch.get("cuda") or torch.get("hip") or torch.get("cuda_available"):
        return []
    evidence = "torch %s: torch.version.cuda is None and torch.cuda.is_available() is False" % torch.get("version")
    return [entry(CPU_WHEEL, "torch", evidence)]


def _arch_gaps(torch: dict) -> list[dict]:
    findings = []
    for gpu in torch.get("arch_coverage") or []:
        if gpu.get("covered"):
            continue
        who = (
            "GPU %s %s" % (gpu.get("index", "?"), gpu.get("name", ""))
            if gpu.get("source") == "torch"
            else "a GPU of the given capabilities"
        )
        evidence = "torch arch list [%s] has nothing that runs on %s (compute capability %s)" % (
            " ".join(torch.get("arch_list") or []),
            who.strip(),
            gpu.get("capability"),
        )
        findings.append(entry(NO_KERNEL_IMAGE, "torch", evidence))
    return findings


def _wrong_results(report: dict) -> list[dict]:
    findings = []
    for check in (report.get("gpu_compute") or {}).get("devices", []):
        if not check.get("ok") and not check.get("error"):
            findings.append(entry(None, "gpu_compute %s" % check.get("device"), _result_text(check)))
    kernel = (report.get("flash_attn") or {}).get("kernel") or {}
    if kernel.get("ran") and not kernel.get("ok") and not kernel.get("error"):
        findings.append(entry(None, "flash_attn kernel", "flash_attn_func: " + _result_text(kernel)))
    return findings


def _result_text(check: dict) -> str:
    if check.get("non_finite"):
        return "non-finite results on %s" % check.get("device")
    return "wrong results on %s: max abs error %s > tolerance %s" % (
        check.get("device"),
        check.get("max_abs_error"),
        check.get("tolerance"),
    )


def _flash_attn_state(flash_attn: dict, found: list[dict]) -> list[dict]:
    """flash-attn installed but unusable, or its kernel requested without it, when no specific row said why."""
    kernel = flash_attn.get("kernel") or {}
    if any(item["component"].startswith("flash_attn") and item["id"] != "unclassified" for item in found):
        return []
    if flash_attn.get("installed") and flash_attn.get("import_ok") is False:
        return [
            entry(
                FLASH_ATTN_UNAVAILABLE,
                "flash_attn",
                "flash-attn %s is installed but does not import" % flash_attn.get("version"),
            )
        ]
    if kernel.get("requested") and not flash_attn.get("installed"):
        return [entry(FLASH_ATTN_UNAVAILABLE, "flash_attn", "flash_attn_kernel requested; flash-attn is not installed")]
    return []


def _probe_stop(probe: dict) -> list[dict]:
    if probe.get("complete", True):
        return []
    return [entry(None, "probe", "the probe stopped in section %s: %s" % (probe.get("stopped_in"), probe.get("exit")))]


def _unique(findings: list[dict]) -> list[dict]:
    seen = set()
    unique = []
    for item in findings:
        key = (item["id"], item["component"], item["id"] == "unclassified" and item["evidence"])
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique


def diagnose(report: dict) -> list[dict]:
    """All diagnoses for a torch_stack_info report: classified error texts plus what the facts themselves show."""
    torch = report.get("torch") or {}
    # The fact-based CPU-wheel finding comes first: its evidence says more than "not compiled with CUDA".
    found = _cpu_wheel(torch)
    for component, error in _component_errors(report):
        found.extend(classify_error(component, error))
    found.extend(_arch_gaps(torch))
    found.extend(_wrong_results(report))
    found.extend(_flash_attn_state(report.get("flash_attn") or {}, found))
    found.extend(_probe_stop(report.get("probe") or {}))
    return _unique(found)
