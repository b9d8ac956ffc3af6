"""The flash_attn role refuses, with a clear message, to build a kernel it cannot build.

Runs the real role over SSH on the first lab host against a venv without torch (made with the host's Debian Python), so
it needs only `gpufleet lab up`: a CUDA package without nvcc, and any kernel package without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
VENV = "/var/tmp/gpufleet-kernel-errors-venv"
# A CUDA home that no layer installs: the lab hosts may carry a (stand-in) toolkit from the toolkit scenario.
NO_CUDA_HOME = "/var/tmp/gpufleet-kernel-errors-no-cuda"
LAB_KERNEL = yaml.safe_load((REPO / "inventories/lab/group_vars/all/lab.yml").read_text())["flash_attn_packages"][0]
PLAYBOOK = """
- hosts: "{{ target }}"
  become: true
  gather_facts: true
  tasks:
    - name: A venv without torch
      ansible.builtin.command:
        argv: ["{{ ansible_python_interpreter }}", -m, venv, --without-pip, "{{ venv }}"]
        creates: "{{ venv }}/bin/python"
    - name: The kernel role against it
      block:
        - name: Run the role
          ansible.builtin.include_role:
            name: flash_attn
      rescue:
        - name: Return the failure to the test
          ansible.builtin.copy:
            content: "{{ ansible_failed_result | to_json }}"
            dest: "{{ result_file }}"
            mode: "0644"
          delegate_to: localhost
          vars:
            ansible_python_interpreter: "{{ ansible_playbook_python }}"
      always:
        - name: Remove the venv
          ansible.builtin.file:
            path: "{{ venv }}"
            state: absent
"""


def _failure(tmp_path: Path, inventory: Path, host: str, package: dict) -> dict:
    book, result_file = tmp_path / "play.yml", tmp_path / "result.json"
    book.write_text(PLAYBOOK)
    extra = {
        "target": host,
        "venv": VENV,
        "result_file": str(result_file),
        "flash_attn_venv": VENV,
        "flash_attn_packages": [package],
        "flash_attn_arch_list": "9.0",
        "flash_attn_cuda_home": NO_CUDA_HOME,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    process = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(book),
            "-e",
            json.dumps(extra),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-2000:]
    assert result_file.exists(), "the role was expected to fail:\n" + process.stdout[-3000:]
    return json.loads(result_file.read_text())


def test_a_cuda_kernel_without_nvcc_is_refused(tmp_path: Path, lab_inventory: Path, lab_hosts: dict[str, dict]) -> None:
    package = {**LAB_KERNEL, "name": "flash-attn-like", "requires_cuda": True}
    failure = _failure(tmp_path, lab_inventory, sorted(lab_hosts)[0], package)
    assert failure["msg"].startswith(f"flash-attn-like compiles CUDA code but nvcc is not at {NO_CUDA_HOME}/bin/nvcc")
    assert "install the CUDA toolkit (tag toolkit) or set flash_attn_cuda_home" in failure["msg"]


def test_a_kernel_without_torch_in_the_venv_is_refused(
    tmp_path: Path, lab_inventory: Path, lab_hosts: dict[str, dict]
) -> None:
    failure = _failure(tmp_path, lab_inventory, sorted(lab_hosts)[0], LAB_KERNEL)
    assert failure["msg"].startswith(
        "torch is not importable in the venv (ModuleNotFoundError: No module named 'torch')"
    )
    assert "built without build isolation against the venv's torch; install the venv first" in failure["msg"]
