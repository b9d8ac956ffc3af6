"""nvidia_fabric_manager run for real against the simulated GPU: the real H200 (no NVSwitch, as captured) needs no
fabric manager; the simulated HGX board (lab/simgpu/hgx-h200x8.json) needs one of exactly the driver's version."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT
from gpufleet.simgpu import SimulatedMachine

HGX = PROJECT_ROOT / "lab" / "simgpu" / "hgx-h200x8.json"


def run_module(args: dict) -> dict:
    command = [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
               "nvidia_fabric_manager", "-a", json.dumps(args), "-e", f"ansible_python_interpreter={sys.executable}",
               "--check"]
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
           "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False)
    found = re.search(r"^localhost \| (SUCCESS|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, result.stdout + result.stderr
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end():])
    host_result["failed"] = found.group(1) == "FAILED!"
    return host_result


@pytest.fixture
def fabric_manager(tmp_path: Path) -> Path:
    """A stand-in nv-fabricmanager that prints its version as `--version` does (NVIDIA's is not downloadable here)."""
    binary = tmp_path / "nv-fabricmanager"
    binary.write_text("#!/bin/sh\necho \"Fabric Manager version is : ${FM_VERSION}\"\n")
    binary.chmod(0o755)
    return binary


def args(machine: SimulatedMachine, tmp_path: Path, binary: Path | str = "nv-fabricmanager-absent") -> dict:
    return {"library": str(machine.library), "binary": str(binary), "nvswitch_devices": str(tmp_path / "none")}


def test_the_real_h200_is_no_nvswitch_system(simgpu_machine: SimulatedMachine, tmp_path: Path) -> None:
    result = run_module(args(simgpu_machine, tmp_path))
    assert not result["failed"] and result["nvswitch"] is False and result["changed"] is False
    assert [gpu["state"] for gpu in result["fabric"]] == ["not_supported"]


def test_an_hgx_board_without_fabric_manager_is_refused(simgpu_machine: SimulatedMachine, tmp_path: Path) -> None:
    shutil.copy(HGX, simgpu_machine.description)
    result = run_module(args(simgpu_machine, tmp_path))
    assert result["failed"] and result["nvswitch"] is True and len(result["fabric"]) == 8
    assert "install fabric manager 580.159.04" in result["msg"]


def test_a_fabric_manager_of_another_version_is_refused_naming_both(
        simgpu_machine: SimulatedMachine, tmp_path: Path, fabric_manager: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(HGX, simgpu_machine.description)
    monkeypatch.setenv("FM_VERSION", "580.95.05")
    refused = run_module(args(simgpu_machine, tmp_path, fabric_manager))
    assert refused["failed"] and refused["fabric_manager_version"] == "580.95.05"
    assert "nvidia-fabricmanager 580.95.05 does not match the NVIDIA driver 580.159.04" in refused["msg"]
    monkeypatch.setenv("FM_VERSION", "580.159.04")
    assert not run_module(args(simgpu_machine, tmp_path, fabric_manager))["failed"]
