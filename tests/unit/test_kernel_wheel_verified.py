"""flash_attn installs a shared kernel wheel only when its sha256 is the one its build recorded.

ansible-playbook runs the role's install.yml against localhost (connection local): a real venv, a real
wheel in a controller cache entry (key.json as the builder writes it), every cache in a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from wheel_factory import make_wheel, sha256

REPO = Path(__file__).resolve().parents[2]
KEY = "k" * 16
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Install the cached build of one key
      ansible.builtin.include_tasks: "{{ repo }}/roles/flash_attn/tasks/install.yml"
"""


def _run(tmp_path: Path, venv: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    extra = {
        "repo": str(REPO),
        "flash_attn_venv": str(venv),
        "__flash_attn_cache_dir": str(cache_dir),
        "__flash_attn_key": {
            "key": KEY,
            "up_to_date": False,
            "probe": {"python": "3.11.2", "torch": "2.13.0+cpu"},
            "torch_identity": None,
        },
        "__flash_attn_package": {"name": "demo-kernel", "version": "1.0", "import_name": "demo_kernel"},
        "__flash_attn_builder": "builder-1",
        "__flash_attn_built_here": False,
        "artifact_controller_cache": str(tmp_path / "controller-artifacts"),
        "artifact_node_cache": str(tmp_path / "node-artifacts"),
        "ansible_python_interpreter": sys.executable,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(book), "-e", json.dumps(extra)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _installed(venv: Path) -> str:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import demo_kernel; print(demo_kernel.VALUE)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def test_a_swapped_wheel_is_refused_and_the_recorded_one_installed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    cache_dir = tmp_path / "kernels" / "demo-kernel" / KEY
    cache_dir.mkdir(parents=True)
    built = make_wheel(tmp_path / "built", "demo_kernel", "1.0", "VALUE = 'built'\n")
    (cache_dir / "key.json").write_text(
        json.dumps({"key": KEY, "wheel": built.name, "sha256": sha256(built), "built_on": "builder-1"})
    )

    # What sits in the cache is not what the builder recorded (swapped, or cut short by an interrupted copy).
    swapped = make_wheel(tmp_path / "swapped", "demo_kernel", "1.0", "VALUE = 'swapped'\n")
    (cache_dir / built.name).write_bytes(swapped.read_bytes())
    refused = _run(tmp_path, venv, cache_dir)
    assert refused.returncode != 0
    assert sha256(built) in refused.stdout and sha256(swapped) in refused.stdout
    assert _installed(venv) == ""

    (cache_dir / built.name).write_bytes(built.read_bytes())
    installed = _run(tmp_path, venv, cache_dir)
    assert installed.returncode == 0, installed.stdout[-3000:]
    assert _installed(venv) == "built"
    marker = json.loads((venv / "gpufleet-kernels" / "demo-kernel.json").read_text())
    assert marker["key"] == KEY and marker["installed_from"] == "the controller cache, without building"
