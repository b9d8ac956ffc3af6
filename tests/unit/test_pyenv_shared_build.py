"""The shared CPython build (roles/pyenv_python/tasks/shared_build.yml) run for real on this machine.

ansible-playbook runs the role's task file against localhost (connection local) with every path in a
temporary directory: the builder packs the build of its key into the run's root-only directory and records
the archive's sha256; another node unpacks only an archive whose sha256 is the recorded one, checked on the
controller and on the node. The "build" is a prefix whose interpreter is this machine's pyenv CPython, so
nothing is compiled.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION, KEY = "3.11.7", "0123456789abcdef"
SERVING = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions" / VERSION
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role's shared build for one version
      module_defaults:
        gpufleet.fleet.pyenv_install:
          pyenv_root: "{{ pyenv_python_root }}"
          version: "{{ __pyenv_python_version.version }}"
          build_key: "{{ __pyenv_python_build_key }}"
          cache_path: "{{ pyenv_python_root }}/cache"
          configure_opts: []
          build_tmpdir: "{{ __pyenv_python_run_dir.path | default(omit) }}"
      block:
        - name: Probe
          gpufleet.fleet.pyenv_install:
          check_mode: true
          register: __pyenv_python_probe
        - name: Run directory
          ansible.builtin.tempfile:
            state: directory
            path: "{{ build_parent }}"
          register: __pyenv_python_run_dir
        - name: Shared build
          ansible.builtin.include_tasks: "{{ repo }}/roles/pyenv_python/tasks/shared_build.yml"
        - name: Install (switch to the unpacked build)
          gpufleet.fleet.pyenv_install:
      always:
        - name: Remove the run directory
          ansible.builtin.file:
            path: "{{ __pyenv_python_run_dir.path }}"
            state: absent
"""


def _run(tmp_path: Path, node: str) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    (tmp_path / "parent").mkdir(exist_ok=True)
    extra = {
        "repo": str(REPO),
        "build_parent": str(tmp_path / "parent"),
        "pyenv_python_root": str(tmp_path / node / "pyenv"),
        "pyenv_python_controller_cache": str(tmp_path / "controller" / "python-builds"),
        "artifact_controller_cache": str(tmp_path / "controller" / "artifacts"),
        "artifact_node_cache": str(tmp_path / node / "artifacts"),
        "artifact_node_staging": str(tmp_path / "parent"),
        "__pyenv_python_version": {"version": VERSION, "sha256": "a" * 64},
        "__pyenv_python_build_key": KEY,
        "pyenv_python_pyenv": {"sha256": "b" * 64},
        "ansible_python_interpreter": sys.executable,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(book), "-e", json.dumps(extra)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _built_on(tmp_path: Path) -> Path:
    """The builder's correct build at its key's own prefix, ready to be packed."""
    prefix = tmp_path / "builder" / "pyenv" / "builds" / f"{VERSION}-{KEY}"
    (prefix / "bin").mkdir(parents=True)
    # A wrapper, not a link: the archive of a build may hold no link that leaves its tree (archive_members).
    wrapper = prefix / "bin" / "python3.11"
    wrapper.write_text(f'#!/bin/sh\nexec {SERVING / "bin" / "python3.11"} "$@"\n')
    wrapper.chmod(0o755)
    return prefix


def _entry(tmp_path: Path) -> Path:
    return tmp_path / "controller" / "python-builds" / f"{VERSION}-{KEY}"


def test_the_builder_records_the_sha256_of_what_it_stored(tmp_path: Path) -> None:
    _built_on(tmp_path)
    result = _run(tmp_path, "builder")
    assert result.returncode == 0, result.stdout[-4000:]
    record = json.loads((_entry(tmp_path) / "build.json").read_text())
    archive = _entry(tmp_path) / record["archive"]
    assert record["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert not list((tmp_path / "parent").iterdir()), "packed in the run's own directory, removed afterwards"


def test_another_node_unpacks_only_the_recorded_archive(tmp_path: Path) -> None:
    _built_on(tmp_path)
    assert _run(tmp_path, "builder").returncode == 0
    record = json.loads((_entry(tmp_path) / "build.json").read_text())
    archive = _entry(tmp_path) / record["archive"]
    good = archive.read_bytes()

    # Half-written (an interrupted transfer) or swapped: refused with both hashes before anything is unpacked.
    archive.write_bytes(good[: len(good) // 2])
    refused = _run(tmp_path, "node")
    assert refused.returncode != 0
    assert record["sha256"] in refused.stdout and hashlib.sha256(good[: len(good) // 2]).hexdigest() in refused.stdout
    assert not (tmp_path / "node" / "pyenv" / "builds").exists()
    assert not (tmp_path / "node" / "pyenv" / "versions").exists()

    archive.write_bytes(good)
    unpacked = _run(tmp_path, "node")
    assert unpacked.returncode == 0, unpacked.stdout[-4000:]
    link = tmp_path / "node" / "pyenv" / "versions" / VERSION
    assert os.readlink(link) == str(tmp_path / "node" / "pyenv" / "builds" / f"{VERSION}-{KEY}")
    assert subprocess.run([str(link / "bin" / "python3.11"), "-c", "import ssl"], check=False).returncode == 0
    assert not list((tmp_path / "node" / "artifacts").iterdir()), "the node's copy of the archive is dropped"
