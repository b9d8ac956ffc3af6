#!/usr/bin/python
"""Module vllm_gpu_memory: what each vLLM instance holds on its GPUs after warm-up, read through NVML."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_gpu_memory
short_description: Check the GPU memory each vLLM instance holds against its gpu_memory_utilization
description:
  - Reads every GPU's memory and the processes with a CUDA context on it through NVML
    (C(nvmlDeviceGetComputeRunningProcesses_v3)), and sums per instance the memory of the processes in its
    systemd unit's cgroup (the API server and its engine and worker processes).
  - Fails, naming the fix, when an instance holds less than C(gpu_memory_utilization) x the GPU's memory
    (less O(tolerance)): vLLM sizes its KV cache to that share at start, so less means the cache or the
    allocator did not come up as configured. Fails too when a GPU's free memory is below what the
    instances' shares leave free (less O(tolerance)): something else holds the memory vLLM was promised.
  - Read-only; the same in check mode.
options:
  instances:
    description:
      - "The instances: C(name), C(gpus) (indexes; empty: every GPU), C(gpu_memory_utilization) (null: vLLM's
        default 0.9), optional C(unit) (default C(vllm@<name>.service)) and C(pids) (default: the processes of
        the unit's cgroup)."
    type: list
    elements: dict
    required: true
  tolerance:
    description: Fraction of a GPU's memory an instance may hold below its share, and free memory may lack.
    type: float
    default: 0.05
  library:
    description: Path of libnvidia-ml.so.1 (default, the loader's).
    type: path
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the GPU memory of an instance after its warm-up
  gpufleet.fleet.vllm_gpu_memory:
    instances:
      - name: main
        gpus: [0, 1]
        gpu_memory_utilization: 0.9
"""

RETURN = r"""
instances:
  description: Per instance and GPU, what it holds and its share, in MiB.
  returned: always
  type: list
  elements: dict
  sample: [{name: main, gpus: [{index: 0, held_mib: 129030, share_mib: 129393, total_mib: 143771, free_mib: 13900,
            pids: [4121, 4188]}]}]
problems:
  description: What is wrong, with the fix, one line each (the module fails when any).
  returned: always
  type: list
  elements: str
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import MIB, Nvml, NvmlError

VLLM_DEFAULT_UTILIZATION = 0.9
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd")


def cgroup_pids(relative: str) -> set[int]:
    """Every pid in a cgroup and below it (unified hierarchy, else systemd's v1 one)."""
    for root in CGROUP_ROOTS:
        top = os.path.join(root, relative.lstrip("/"))
        if os.path.isfile(os.path.join(top, "cgroup.procs")):
            pids: set[int] = set()
            for directory, _dirs, files in os.walk(top):
                if "cgroup.procs" in files:
                    with open(os.path.join(directory, "cgroup.procs")) as procs:
                        pids |= {int(line) for line in procs if line.strip()}
            return pids
    return set()


def unit_pids(module: AnsibleModule, unit: str) -> set[int]:
    rc, out, err = module.run_command(["systemctl", "show", "--property", "ControlGroup", "--value", unit])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    return cgroup_pids(out.strip()) if out.strip() else set()


def read_gpus(library: str | None) -> list[dict[str, Any]]:
    """Per GPU: total and free memory and its compute processes, in one NVML session."""
    with Nvml(library) as nvml:
        gpus = []
        for index in range(nvml.device_count()):
            state = nvml.device(index)
            total = state["memory_total_bytes"] or 0
            used = (state["memory_used_bytes"] or 0) + (state["memory_reserved_bytes"] or 0)
            gpus.append(
                {"index": index, "total": total, "free": total - used, "processes": nvml.compute_processes(index)}
            )
        return gpus


def utilization(instance: dict[str, Any]) -> float:
    value = instance.get("gpu_memory_utilization")
    return VLLM_DEFAULT_UTILIZATION if value is None else float(value)


def check(
    instances: list[dict[str, Any]], gpus: list[dict[str, Any]], tolerance: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """The per-instance report and the problems, from instances with their pids resolved."""
    report, problems = [], []
    promised = {gpu["index"]: 0.0 for gpu in gpus}
    for instance in instances:
        share = utilization(instance)
        rows = []
        for index in instance.get("gpus") or [gpu["index"] for gpu in gpus]:
            gpu = next((g for g in gpus if g["index"] == int(index)), None)
            if gpu is None:
                problems.append(
                    f"vllm@{instance['name']}: GPU {index} does not exist (NVML sees {len(gpus)}); fix its gpus"
                )
                continue
            promised[gpu["index"]] += share
            mine = [p for p in gpu["processes"] if p["pid"] in instance["pids"]]
            held = sum(p["used_memory_bytes"] or 0 for p in mine)
            row = {
                "index": gpu["index"],
                "held_mib": held // MIB,
                "share_mib": int(share * gpu["total"]) // MIB,
                "total_mib": gpu["total"] // MIB,
                "free_mib": gpu["free"] // MIB,
                "pids": sorted(p["pid"] for p in mine),
            }
            rows.append(row)
            if not mine:
                problems.append(
                    f"vllm@{instance['name']}: no process of the instance has a CUDA context on GPU {gpu['index']}: "
                    "it runs without the GPU (a CPU build, or CUDA_VISIBLE_DEVICES/gpus point elsewhere); "
                    "check torch_stack_info and the instance's gpus"
                )
            elif any(p["used_memory_bytes"] is None for p in mine):
                problems.append(
                    f"vllm@{instance['name']}: NVML does not report per-process memory on GPU "
                    f"{gpu['index']} (no permission or a vGPU); read it with nvidia-smi as root"
                )
            elif held < (share - tolerance) * gpu["total"]:
                problems.append(
                    f"vllm@{instance['name']}: holds {row['held_mib']} MiB of GPU {gpu['index']}, less than its share "
                    f"{row['share_mib']} MiB (gpu_memory_utilization {share}): the KV cache or the allocator did not "
                    "warm up; rerun the warm-up (vllm_service_warmup_always) and read the journal's KV cache lines"
                )
        report.append({"name": instance["name"], "gpu_memory_utilization": share, "gpus": rows})
    for gpu in gpus:
        headroom = (1 - promised[gpu["index"]] - tolerance) * gpu["total"]
        if promised[gpu["index"]] and gpu["free"] < headroom:
            others = sorted(p["pid"] for p in gpu["processes"] if not any(p["pid"] in i["pids"] for i in instances))
            problems.append(
                f"GPU {gpu['index']}: {gpu['free'] // MIB} MiB free, less than the {int(headroom) // MIB} MiB the "
                f"instances' gpu_memory_utilization leaves free: other processes hold GPU memory (pids {others}); "
                "stop them, or lower gpu_memory_utilization"
            )
    return report, problems


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "list", "elements": "dict", "required": True},
            "tolerance": {"type": "float", "default": 0.05},
            "library": {"type": "path"},
        },
        supports_check_mode=True,
    )
    instances = []
    for instance in module.params["instances"]:
        pids = instance.get("pids")
        resolved = (
            set(pids)
            if pids is not None
            else unit_pids(module, instance.get("unit") or f"vllm@{instance['name']}.service")
        )
        instances.append({**instance, "pids": {int(pid) for pid in resolved}})
    try:
        gpus = read_gpus(module.params["library"])
    except NvmlError as error:
        module.fail_json(msg=f"cannot read the GPUs through NVML: {error}")
    report, problems = check(instances, gpus, module.params["tolerance"])
    if problems:
        module.fail_json(msg="; ".join(problems), instances=report, problems=problems)
    module.exit_json(changed=False, instances=report, problems=[])


if __name__ == "__main__":
    main()
