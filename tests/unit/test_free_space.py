"""free_space and its callers, run for real: ansible-playbook against localhost, a 1 MiB tmpfs as the small disk.

The artifact role refuses to copy a 2 MiB artifact there, and model_store refuses to unpack a tarball whose
members (4 MiB of zeros, a few KB compressed) do not fit, both naming the path, the free and the needed bytes
before anything is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def _play(tmp_path: Path, tasks: str, variables: dict) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(f"- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n{tasks}")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [
        str(REPO / ".venv/bin/ansible-playbook"),
        "-i",
        "localhost,",
        str(book),
        "-e",
        json.dumps({"ansible_python_interpreter": sys.executable, **variables}),
    ]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def _zeros_tarball(path: Path, size: int) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("config.json", "model.safetensors"):
            info = tarfile.TarInfo(name)
            info.size = size if name.endswith("safetensors") else 2
            tar.addfile(info, io.BytesIO(b"\0" * size if name.endswith("safetensors") else b"{}"))
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def test_the_module_counts_unpacked_sizes_and_names_path_free_and_needed(tmp_path: Path, small_disk: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    _zeros_tarball(archive, 3 * 2**20)
    result = _play(
        tmp_path,
        (
            "    - gpufleet.fleet.free_space: {path: '{{ where }}', archives: ['{{ archive }}'], bytes: 100,"
            " what: a test}\n"
        ),
        {"where": str(small_disk / "not" / "yet"), "archive": str(archive)},
    )
    assert result.returncode != 0
    assert (
        f"not enough free space for a test: {small_disk}/not/yet (file system of {small_disk}) has 1048576 bytes "
        f"(0.00 GiB) free, {3 * 2**20 + 2 + 100} bytes"
    ) in result.stdout, result.stdout[-2000:]
    fits = _play(
        tmp_path, "    - gpufleet.fleet.free_space: {path: '{{ where }}', bytes: 4096}\n", {"where": str(small_disk)}
    )
    assert fits.returncode == 0 and "changed=0" in fits.stdout


def test_the_artifact_copy_is_refused_before_it_fills_the_node(tmp_path: Path, small_disk: Path) -> None:
    source = tmp_path / "NVIDIA-Linux-x86_64-580.95.05.run"
    source.write_bytes(os.urandom(2 * 2**20))
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    result = _play(
        tmp_path,
        "    - ansible.builtin.include_role: {name: artifact}\n",
        {
            "artifact_spec": {"path": str(source), "sha256": digest},
            "artifact_name": "test runfile",
            "artifact_node_cache": str(small_disk / "artifacts"),
        },
    )
    assert result.returncode != 0
    assert (
        f"not enough free space for copying test runfile: {small_disk}/artifacts/{digest} (file system of "
        f"{small_disk}) has 1048576 bytes (0.00 GiB) free, {2 * 2**20} bytes (0.00 GiB) needed" in result.stdout
    ), result.stdout[-3000:]
    assert not (small_disk / "artifacts").exists()


def test_a_model_is_not_unpacked_where_it_does_not_fit(tmp_path: Path, small_disk: Path) -> None:
    tarball = tmp_path / "tiny.tar.gz"
    digest = _zeros_tarball(tarball, 4 * 2**20)
    result = _play(
        tmp_path,
        "    - ansible.builtin.include_role: {name: model_store}\n",
        {
            "model_store_models": [{"name": "tiny", "path": str(tarball), "sha256": digest}],
            "model_store_root": str(small_disk / "models"),
            "model_store_group": "root",
            "artifact_controller_cache": str(tmp_path / "controller"),
            "artifact_node_cache": str(tmp_path / "node-cache"),
        },
    )
    assert result.returncode != 0
    assert (
        f"not enough free space for unpacking model tiny: {small_disk}/models (file system of {small_disk}/models)"
        in result.stdout
    ), result.stdout[-3000:]
    assert f"{4 * 2**20 + 2} bytes (0.00 GiB) needed" in result.stdout
    assert os.listdir(small_disk / "models") == []
