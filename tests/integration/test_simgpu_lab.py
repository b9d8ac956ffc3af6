"""The simulated GPU on a lab host, read by nvidia_gpu_info over SSH.

The simulated files go under a private prefix on the host (not where a driver lives), so this test neither
disturbs nor is disturbed by driver installs on the shared lab; the prefix is removed afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT, simgpu

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
PREFIX = "/opt/gpufleet-simgpu-test"
H200_UUID = "GPU-1757f6d0-d02c-d95a-c569-55d572b0340a"
PRIVATE_PLACES = {
    "simgpu_library_dir": f"{PREFIX}/lib",
    "simgpu_bin_dir": f"{PREFIX}/bin",
    "simgpu_sbin_dir": f"{PREFIX}/sbin",
    "simgpu_description_path": f"{PREFIX}/etc/gpus.json",
    "simgpu_share_dir": f"{PREFIX}/share",
}

# Reads the GPU state, switches ECC errors on with the installed control tool, checks expect, and writes
# every result to a file on the controller for the test to read.
PLAYBOOK = textwrap.dedent(f"""\
    - name: Read the simulated GPU, then switch ECC errors on and check expect
      hosts: "{{{{ simgpu_test_host }}}}"
      gather_facts: false
      environment:
        GPUFLEET_SIMGPU_CONFIG: {PREFIX}/etc/gpus.json
        # This machine's faults stay in its own queues: the node's GPU watchdog follows the host's.
        GPUFLEET_SIMGPU_EVENTS: {PREFIX}/nvml-events
        GPUFLEET_SIMGPU_KERNEL_LOG: {PREFIX}/kern.log
        LD_LIBRARY_PATH: {PREFIX}/lib
      tasks:
        - name: Read the clean state
          gpufleet.fleet.nvidia_gpu_info:
            library: {PREFIX}/lib/libnvidia-ml.so.1
            expect: {{ecc_errors: 0, model: H200, gpu_count: 1}}
          register: clean
          check_mode: true
        - name: Query the nvidia-smi stand-in
          ansible.builtin.command: >-
            {PREFIX}/bin/nvidia-smi --query-gpu=name,uuid,memory.total --format=csv,noheader,nounits
          register: smi
          changed_when: false
        - name: Switch 12 uncorrectable ECC errors on GPU 0
          ansible.builtin.command: >-
            {PREFIX}/sbin/gpufleet-simgpuctl --description {PREFIX}/etc/gpus.json ecc-errors --gpu 0 12
          changed_when: true
        - name: Check expect against the new state
          gpufleet.fleet.nvidia_gpu_info:
            library: {PREFIX}/lib/libnvidia-ml.so.1
            expect: {{ecc_errors: 0}}
          register: drifted
          ignore_errors: true
        - name: Hand the results to the test
          ansible.builtin.copy:
            content: "{{{{ {{'clean': clean, 'smi': smi.stdout, 'drifted': drifted}} | to_json }}}}"
            dest: "{{{{ simgpu_test_output }}}}"
            mode: "0600"
          delegate_to: localhost
    """)


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600, check=False)
    assert result.returncode == 0, f"{' '.join(command[:4])} ... failed:\n{result.stdout[-4000:]}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def lab_host(lab_hosts: dict[str, dict]) -> str:
    return next(iter(lab_hosts))


@pytest.fixture(scope="module")
def installed(lab_inventory: Path, lab_host: str) -> Iterator[str]:
    """The simulated H200 installed on one lab host under PREFIX; removed afterwards."""
    simgpu.install_on_hosts(lab_inventory, lab_host, extra_vars=PRIVATE_PLACES)
    yield lab_host
    run(
        [
            str(BIN / "ansible"),
            "-i",
            str(lab_inventory),
            lab_host,
            "-m",
            "ansible.builtin.file",
            "-a",
            f"path={PREFIX} state=absent",
        ]
    )


@pytest.fixture(scope="module")
def results(installed: str, lab_inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("simgpu-lab")
    playbook, output = work / "playbook.yml", work / "results.json"
    playbook.write_text(PLAYBOOK)
    run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(lab_inventory),
            str(playbook),
            "-e",
            json.dumps({"simgpu_test_host": installed, "simgpu_test_output": str(output)}),
        ]
    )
    return json.loads(output.read_text())


def test_nvidia_gpu_info_returns_the_h200(results: dict[str, Any]) -> None:
    clean = results["clean"]
    assert not clean.get("failed") and clean["changed"] is False
    assert clean["driver_version"] == "580.159.04" and clean["cuda_driver_version"] == "13.0"
    assert clean["gpu_count"] == 1 and clean["mismatches"] == []
    gpu = clean["gpus"][0]
    assert (gpu["name"], gpu["uuid"], gpu["memory_total_mib"]) == ("NVIDIA H200", H200_UUID, 143771)
    assert gpu["compute_capability"] == "9.0" and gpu["ecc_errors_uncorrected_volatile"] == 0


def test_nvidia_smi_on_the_host_agrees(results: dict[str, Any]) -> None:
    assert results["smi"] == f"NVIDIA H200, {H200_UUID}, 143771"


def test_ecc_errors_fail_expect_naming_the_gpu_and_count(results: dict[str, Any]) -> None:
    drifted = results["drifted"]
    assert drifted["failed"] is True and drifted["changed"] is False
    expected = f"GPU 0 ({H200_UUID}): 12 uncorrectable volatile ECC errors, expected at most 0"
    assert drifted["msg"] == f"1 mismatch with expect: {expected}"
    assert drifted["mismatches"] == [
        {"gpu": 0, "uuid": H200_UUID, "field": "ecc_errors", "expected": 0, "actual": 12, "message": expected}
    ]
