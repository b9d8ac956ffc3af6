#!/usr/bin/python
"""Ansible module nvidia_gpu_info: the NVIDIA driver's and GPUs' state through NVML, optionally checked."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu_info
short_description: Read the NVIDIA driver and GPU state through NVML, and check it against expectations
description:
  - Loads C(libnvidia-ml.so.1) through ctypes (no Python packages needed on the host) and returns the driver
    version, the highest CUDA version the driver runs, the NVML version, and one entry per GPU with its
    identity, memory, persistence, ECC, MIG, power, temperature, page retirement and row remapping state.
  - A value the GPU does not support is returned as null and named in that GPU's C(unsupported) list; it is not
    an error. A GPU that fell off the bus is returned with C(lost=true).
  - A missing library, a driver that is not loaded, and a driver/library version mismatch fail with distinct
    messages that name the fix, and with C(error_kind) set.
  - With O(expect), the module fails when the state differs, listing every mismatch (which GPU, expected and
    actual) in the message and in RV(mismatches). Any lost GPU is a mismatch whenever O(expect) is given.
  - Read-only; never reports a change.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  library:
    description:
      - Path of C(libnvidia-ml.so.1) to load instead of the one on the loader path.
    type: path
  expect:
    description:
      - The state the node should be in. Only the keys given are checked; per-GPU keys apply to every GPU.
    type: dict
    suboptions:
      driver_version:
        description: Exact driver version, for example C(580.159.04).
        type: str
      driver_min:
        description: Lowest acceptable driver version, for example C(570.0).
        type: str
      cuda_driver_min:
        description: Lowest acceptable CUDA version the driver runs (RV(cuda_driver_version)), for example C(12.8).
        type: str
      gpu_count:
        description: Number of GPUs NVML reports (lost GPUs included).
        type: int
      model:
        description: GPU name or a part of it, case-insensitive; C(H200) matches C(NVIDIA H200).
        type: str
      min_memory_mib:
        description: Least total memory per GPU, in MiB.
        type: int
      compute_capability:
        description: Compute capability of every GPU, for example C("9.0") (quote it in YAML).
        type: str
      persistence:
        description: Whether persistence mode must be on.
        type: bool
      ecc:
        description: Whether ECC must be on.
        type: bool
      mig:
        description: Whether MIG mode must be on.
        type: bool
      ecc_errors:
        description:
          - Most uncorrectable volatile ECC errors (since the driver loaded) per GPU, usually C(0).
          - Fails when the count is unavailable (ECC off or not supported).
        type: int
      ecc_errors_aggregate:
        description: Most uncorrectable aggregate (lifetime) ECC errors per GPU.
        type: int
      retired_pages_pending:
        description:
          - Whether page retirement may be pending; C(false) fails when pages wait for a reboot.
          - A GPU without page retirement (Ampere and newer) meets C(false).
        type: bool
      row_remap_pending:
        description:
          - Whether row remapping may be pending; C(false) fails when a remap waits for a GPU reset.
          - A GPU without row remapping meets C(false).
        type: bool
      row_remap_failure:
        description: Whether a row remapping failure is acceptable; C(false) fails on a GPU that needs service.
        type: bool
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; check mode runs it the same way.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Needs the NVIDIA driver's C(libnvidia-ml.so.1) on the host; no Python package is installed or required.
seealso:
  - name: NVML API reference
    description: The NVIDIA Management Library this module reads.
    link: https://docs.nvidia.com/deploy/nvml-api/
"""

EXAMPLES = r"""
- name: Read the GPU state
  gpufleet.fleet.nvidia_gpu_info:
  register: gpu_state

- name: Show the driver and the first GPU
  ansible.builtin.debug:
    msg: "{{ gpu_state.driver_version }} {{ gpu_state.gpus[0].name }}"

- name: Verify a node of 8 healthy H200 GPUs
  gpufleet.fleet.nvidia_gpu_info:
    expect:
      driver_version: "580.159.04"
      cuda_driver_min: "12.8"
      gpu_count: 8
      model: H200
      min_memory_mib: 140000
      compute_capability: "9.0"
      persistence: true
      ecc: true
      ecc_errors: 0
      retired_pages_pending: false
      row_remap_pending: false

- name: Collect mismatches for a drift report without failing
  gpufleet.fleet.nvidia_gpu_info:
    expect:
      ecc_errors: 0
  register: gpu_drift
  failed_when: false

- name: Use a library outside the loader path
  gpufleet.fleet.nvidia_gpu_info:
    library: /usr/local/nvidia/lib64/libnvidia-ml.so.1
"""

RETURN = r"""
driver_version:
  description: Driver version.
  returned: success
  type: str
  sample: "580.159.04"
cuda_driver_version:
  description: Highest CUDA version the driver runs, major.minor.
  returned: success
  type: str
  sample: "13.0"
nvml_version:
  description: NVML library version.
  returned: success
  type: str
  sample: "13.580.159.04"
gpu_count:
  description: Number of GPUs NVML reports, lost ones included.
  returned: success
  type: int
  sample: 1
gpus:
  description: One entry per GPU, in NVML index order. Values the GPU does not support are null.
  returned: success
  type: list
  elements: dict
  contains:
    index:
      description: NVML index.
      type: int
      sample: 0
    lost:
      description: Whether the GPU fell off the bus; all other values are then null.
      type: bool
      sample: false
    name:
      description: Product name.
      type: str
      sample: NVIDIA H200
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-1757f6d0-d02c-d95a-c569-55d572b0340a
    pci_bus_id:
      description: PCI bus id, domain:bus:device.function.
      type: str
      sample: "00000000:00:06.0"
    compute_capability:
      description: CUDA compute capability, major.minor.
      type: str
      sample: "9.0"
    memory_total_bytes:
      description: Total memory in bytes.
      type: int
      sample: 150754820096
    memory_total_mib:
      description: Total memory in MiB.
      type: int
      sample: 143771
    memory_used_bytes:
      description: Used memory in bytes, without the driver's reserved memory (as nvidia-smi shows it) when NVML
        reports that apart (nvmlDeviceGetMemoryInfo_v2).
      type: int
      sample: 0
    memory_used_mib:
      description: Used memory in MiB, as RV(gpus[].memory_used_bytes).
      type: int
      sample: 0
    memory_reserved_bytes:
      description: Memory the driver and firmware reserve, in bytes; null on an NVML without nvmlDeviceGetMemoryInfo_v2.
      type: int
      sample: 644939776
    memory_reserved_mib:
      description: Reserved memory in MiB.
      type: int
      sample: 615
    persistence_mode:
      description: Whether persistence mode is on.
      type: bool
      sample: true
    ecc_mode:
      description: Whether ECC is on now.
      type: bool
      sample: true
    ecc_mode_pending:
      description: Whether ECC will be on after the next reboot.
      type: bool
      sample: true
    ecc_errors_uncorrected_volatile:
      description: Uncorrectable ECC errors since the driver loaded; null while ECC is off.
      type: int
      sample: 0
    ecc_errors_uncorrected_aggregate:
      description: Uncorrectable ECC errors over the GPU's life; null while ECC is off.
      type: int
      sample: 0
    mig_mode:
      description: Whether MIG mode is on.
      type: bool
      sample: false
    mig_mode_pending:
      description: Whether MIG mode will be on after the next GPU reset.
      type: bool
      sample: false
    power_limit_w:
      description: Power management limit in watts.
      type: float
      sample: 700.0
    power_draw_w:
      description: Current power draw in watts.
      type: float
      sample: 114.0
    temperature_c:
      description: GPU temperature in degrees Celsius.
      type: int
      sample: 31
    retired_pages_single_bit_ecc:
      description: Pages retired for repeated single-bit ECC errors (GPUs before Ampere).
      type: int
      sample: 0
    retired_pages_double_bit_ecc:
      description: Pages retired for double-bit ECC errors (GPUs before Ampere).
      type: int
      sample: 0
    retired_pages_pending:
      description: Whether pages wait to be retired at the next reboot.
      type: bool
      sample: false
    remapped_rows_corrected:
      description: Rows remapped for correctable errors (Ampere and newer).
      type: int
      sample: 0
    remapped_rows_uncorrected:
      description: Rows remapped for uncorrectable errors (Ampere and newer).
      type: int
      sample: 0
    row_remap_pending:
      description: Whether a row remap waits for a GPU reset.
      type: bool
      sample: false
    row_remap_failure:
      description: Whether a row remap failed; the GPU then needs service.
      type: bool
      sample: false
    unsupported:
      description: Names of the values above that this GPU does not support (they are null).
      type: list
      elements: str
      sample: [retired_pages_single_bit_ecc, retired_pages_double_bit_ecc, retired_pages_pending]
    errors:
      description: Values NVML could not read for another reason, with the NVML error.
      type: dict
      sample: {}
mismatches:
  description: Every difference from O(expect); empty when it matches or when nothing is expected.
  returned: always
  type: list
  elements: dict
  contains:
    gpu:
      description: Index of the GPU, or null for a node-wide value (driver, GPU count).
      type: int
      sample: 0
    uuid:
      description: UUID of the GPU, or null.
      type: str
      sample: GPU-1757f6d0-d02c-d95a-c569-55d572b0340a
    field:
      description: The O(expect) key that does not hold, or C(lost).
      type: str
      sample: ecc_errors
    expected:
      description: The expected value.
      type: raw
      sample: 0
    actual:
      description: The value found; null when it could not be read.
      type: raw
      sample: 12
    message:
      description: The mismatch in one sentence.
      type: str
      sample: "GPU 0 (GPU-1757f6d0-d02c-d95a-c569-55d572b0340a): 12 uncorrectable volatile ECC errors,
        expected at most 0"
error_kind:
  description: On a driver-level failure, which one.
  returned: failure
  type: str
  sample: version_mismatch
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import (
    EXPECT_KEYS,
    NvmlDriverNotLoaded,
    NvmlError,
    NvmlLibraryNotFound,
    NvmlVersionMismatch,
    check_expectations,
    expectation_errors,
    read_gpu_state,
)

_EXPECT_TYPES = {
    "gpu_count": "int",
    "min_memory_mib": "int",
    "ecc_errors": "int",
    "ecc_errors_aggregate": "int",
    "persistence": "bool",
    "ecc": "bool",
    "mig": "bool",
    "retired_pages_pending": "bool",
    "row_remap_pending": "bool",
    "row_remap_failure": "bool",
}

ARGUMENT_SPEC = {
    "library": {"type": "path"},
    "expect": {
        "type": "dict",
        "options": {key: {"type": _EXPECT_TYPES.get(key, "str")} for key in EXPECT_KEYS},
    },
}


def error_kind(error: NvmlError) -> str:
    """A stable name for a driver-level failure, for drift reports."""
    if isinstance(error, NvmlLibraryNotFound):
        return "library_not_found"
    if isinstance(error, NvmlDriverNotLoaded):
        return "driver_not_loaded"
    if isinstance(error, NvmlVersionMismatch):
        return "version_mismatch"
    return "nvml_error"


def mismatch_summary(mismatches: list[dict]) -> str:
    count = len(mismatches)
    noun = "mismatch" if count == 1 else "mismatches"
    return "%d %s with expect: %s" % (count, noun, "; ".join(item["message"] for item in mismatches))


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    expect = module.params["expect"] or {}
    problems = expectation_errors(expect)
    if problems:
        module.fail_json(msg="invalid expect: " + "; ".join(problems), changed=False)
    try:
        state = read_gpu_state(module.params["library"])
    except NvmlError as error:
        module.fail_json(msg=str(error), error_kind=error_kind(error), mismatches=[], changed=False)
    mismatches = check_expectations(state, expect)
    if mismatches:
        module.fail_json(msg=mismatch_summary(mismatches), mismatches=mismatches, changed=False, **state)
    module.exit_json(changed=False, mismatches=[], **state)


if __name__ == "__main__":
    main()
