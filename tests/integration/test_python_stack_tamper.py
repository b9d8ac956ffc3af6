"""A tampered wheel on the lab mirror is refused by the node; the genuine one installs.

Runs the real pip_lock module over SSH on the first lab host against a small wheelhouse published on the lab mirror,
with the host's own Debian Python (its python3.N-venv gives it ensurepip), so it needs only `gpufleet lab up`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))

from ansible_collections.gpufleet.fleet.plugins.module_utils import pip_lock  # noqa: E402
from wheel_factory import make_wheel, sha256  # noqa: E402

from gpufleet.lab import mirror  # noqa: E402

pytestmark = pytest.mark.lab

VENV = "/var/tmp/gpufleet-tamper-test-venv"
PLAYBOOK = """
- hosts: "{{ target }}"
  gather_facts: false
  become: true
  tasks:
    - name: Give the host's Python its ensurepip
      ansible.builtin.apt:
        name: "{{ ansible_python_interpreter | basename }}-venv"
        state: present
        update_cache: true
        cache_valid_time: 3600
    - name: Start from no venv
      ansible.builtin.file:
        path: "{{ venv }}"
        state: absent
    - name: Install the lock from the mirror
      gpufleet.fleet.pip_lock:
        venv: "{{ venv }}"
        python: "{{ ansible_python_interpreter }}"
        lock: "{{ lock }}"
        find_links: "{{ gpufleet_mirror_url }}{{ url_path }}"
      register: result
      ignore_errors: true
    - name: List what the venv holds
      ansible.builtin.command:
        argv: ["{{ venv }}/bin/python", -m, pip, list, --format=freeze]
      register: listing
      changed_when: false
      failed_when: false
    - name: Return both to the test
      ansible.builtin.copy:
        content: "{{ {'result': result, 'packages': listing.stdout_lines | default([])} | to_json }}"
        dest: "{{ result_file }}"
        mode: "0644"
      delegate_to: localhost
      vars:
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
    - name: Remove the test venv
      ansible.builtin.file:
        path: "{{ venv }}"
        state: absent
"""


@pytest.fixture()
def wheelhouse(tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """Two genuine wheels and their lock; the mirror directory is removed afterwards."""
    name = f"_tests/python-stack-{uuid.uuid4().hex[:8]}"
    genuine = tmp_path / "genuine"
    wheels = [make_wheel(genuine, "demo-app", "1.0"), make_wheel(genuine, "demo-lib", "2.0")]
    lock = pip_lock.format_lock(
        {"stack": "tamper-test"},
        [
            pip_lock.LockEntry(w.name.split("-")[0].replace("_", "-"), w.name.split("-")[1], (sha256(w),), w.name)
            for w in wheels
        ],
    )
    yield name, genuine, lock
    shutil.rmtree(mirror.mirror_dir() / name, ignore_errors=True)


def _publish(directory: Path, name: str) -> str:
    """The wheels and a find-links page naming them, as `gpufleet wheelhouse build` publishes a wheelhouse: the
    mirror lists no directory, so pip finds the wheels through the page."""
    wheels = sorted(directory.glob("*.whl"))
    for wheel in wheels:
        url_path = mirror.publish(wheel, f"{name}/{wheel.name}")
    page = directory / "index.html"
    page.write_text("".join(f'<a href="{wheel.name}">{wheel.name}</a><br/>\n' for wheel in wheels))
    mirror.publish(page, f"{name}/index.html")
    return url_path.rsplit("/", 1)[0] + "/"


def _run(tmp_path: Path, inventory: Path, host: str, lock: str, url_path: str) -> dict:
    book, result_file = tmp_path / "play.yml", tmp_path / "result.json"
    book.write_text(PLAYBOOK)
    result_file.unlink(missing_ok=True)
    extra = {"target": host, "venv": VENV, "lock": lock, "url_path": url_path, "result_file": str(result_file)}
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
    return json.loads(result_file.read_text())


def test_tampered_wheel_is_refused_and_the_genuine_one_installs(
    tmp_path: Path, lab_inventory: Path, lab_hosts: dict[str, dict], wheelhouse: tuple[str, Path, str]
) -> None:
    host = sorted(lab_hosts)[0]
    name, genuine, lock = wheelhouse
    tampered = tmp_path / "tampered"
    shutil.copytree(genuine, tampered)
    (tampered / "demo_lib-2.0-py3-none-any.whl").unlink()
    make_wheel(tampered, "demo-lib", "2.0", "VALUE = 'tampered'\n")
    url_path = _publish(tampered, name)

    refused = _run(tmp_path, lab_inventory, host, lock, url_path)
    assert refused["result"]["failed"] and refused["result"]["hash_mismatch"], refused["result"].get("msg")
    assert "a wheel's sha256 is not the pinned one" in refused["result"]["msg"]
    assert "DO NOT MATCH THE HASHES" in refused["result"]["msg"]
    assert not any(line.startswith("demo-lib==") for line in refused["packages"])

    _publish(genuine, name)
    installed = _run(tmp_path, lab_inventory, host, lock, url_path)
    assert not installed["result"].get("failed"), installed["result"].get("msg")
    assert installed["result"]["changed"] and installed["result"]["created"]
    assert {"demo-app==1.0", "demo-lib==2.0"} <= set(installed["packages"])
