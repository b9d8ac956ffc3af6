"""Module vllm_gpu_memory (role vllm_service) run for real on the simulated H200: the simulated
libnvidia-ml.so.1 reports compute processes through nvmlDeviceGetComputeRunningProcesses_v3 with NVML's ABI,
and the module checks what an instance's processes hold against its gpu_memory_utilization.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT
from gpufleet.simgpu import SimulatedMachine

BIN = Path(sys.executable).parent
TOTAL = 150754820096  # the H200's memory
RESERVED = 644939776


@pytest.fixture
def instance_pid() -> Iterator[int]:
    """A real process standing for a vLLM instance's engine (the simulated GPU lists its pid)."""
    process = subprocess.Popen(["sleep", "300"])
    yield process.pid
    process.kill()
    process.wait()


def run_module(args: dict[str, Any]) -> dict[str, Any]:
    command = [
        str(BIN / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "vllm_gpu_memory",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LIBRARY": str(PROJECT_ROOT / "roles" / "vllm_service" / "library"),
    }
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False
    )
    found = re.search(r"^localhost \| (SUCCESS|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, f"ansible did not run (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end() :])
    host_result["failed"] = found.group(1) == "FAILED!"
    return host_result


def simulate(machine: SimulatedMachine, processes: list[tuple[int, float]]) -> None:
    """The H200 with these (pid, fraction of its memory) compute processes."""
    description = machine.read()
    gpu = description["gpus"][0]
    gpu["compute_processes"] = [{"pid": pid, "used_memory_bytes": int(share * TOTAL)} for pid, share in processes]
    gpu["memory_used_bytes"] = sum(p["used_memory_bytes"] for p in gpu["compute_processes"])
    machine.write(description)


def check(machine: SimulatedMachine, pid: int, utilization: float = 0.9) -> dict[str, Any]:
    return run_module(
        {
            "library": str(machine.library),
            "instances": [{"name": "main", "gpus": [0], "gpu_memory_utilization": utilization, "pids": [pid]}],
        }
    )


def test_an_instance_holding_its_share_passes_and_is_reported(
    simgpu_machine: SimulatedMachine, instance_pid: int
) -> None:
    simulate(simgpu_machine, [(instance_pid, 0.89)])
    result = check(simgpu_machine, instance_pid)
    assert not result["failed"] and result["changed"] is False, result
    assert result["instances"] == [
        {
            "name": "main",
            "gpu_memory_utilization": 0.9,
            "gpus": [
                {
                    "index": 0,
                    "held_mib": int(0.89 * TOTAL) // 2**20,
                    "share_mib": int(0.9 * TOTAL) // 2**20,
                    "total_mib": 143771,
                    "free_mib": (TOTAL - int(0.89 * TOTAL) - RESERVED) // 2**20,
                    "pids": [instance_pid],
                }
            ],
        }
    ]


def test_an_instance_below_its_share_fails_with_the_fix(simgpu_machine: SimulatedMachine, instance_pid: int) -> None:
    simulate(simgpu_machine, [(instance_pid, 0.5)])
    result = check(simgpu_machine, instance_pid)
    assert result["failed"]
    assert result["problems"] == [
        f"vllm@main: holds {int(0.5 * TOTAL) // 2**20} MiB of GPU 0, less than its share {int(0.9 * TOTAL) // 2**20}"
        " MiB (gpu_memory_utilization 0.9): the KV cache or the allocator did not warm up; rerun the warm-up"
        " (vllm_service_warmup_always) and read the journal's KV cache lines"
    ]


def test_an_instance_without_a_cuda_context_fails(simgpu_machine: SimulatedMachine, instance_pid: int) -> None:
    simulate(simgpu_machine, [])
    result = check(simgpu_machine, instance_pid)
    assert result["failed"] and "no process of the instance has a CUDA context on GPU 0" in result["msg"]


def test_memory_another_process_holds_fails_naming_it(simgpu_machine: SimulatedMachine, instance_pid: int) -> None:
    other = instance_pid + 100000
    simulate(simgpu_machine, [(instance_pid, 0.9), (other, 0.08)])
    result = check(simgpu_machine, instance_pid)
    assert result["failed"] and len(result["problems"]) == 1
    assert result["problems"][0].startswith("GPU 0: ") and f"pids [{other}]" in result["problems"][0]
    assert "stop them, or lower gpu_memory_utilization" in result["problems"][0]
