"""model_store keeps a model's tarball root-only (0640) and drops it once staged, unless kept on purpose.

ansible-playbook runs the role against localhost (connection local), every path in a temporary directory,
the tarball a controller file (the artifact role copies it into the node cache and verifies it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - model_store
"""


def _tarball(path: Path) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in {"config.json": b'{"model_type": "qwen2"}', "model.safetensors": b"\0" * 4096}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def _run(tmp_path: Path, models: list[dict], **extra: object) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    variables = {
        "model_store_models": models,
        "model_store_root": str(tmp_path / "models"),
        "model_store_group": "root",
        "artifact_controller_cache": str(tmp_path / "controller"),
        "artifact_node_cache": str(tmp_path / "node-cache"),
        "ansible_python_interpreter": sys.executable,
        **extra,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(book), "-e", json.dumps(variables)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_the_tarball_is_dropped_once_every_model_of_it_is_staged(tmp_path: Path) -> None:
    tarball = tmp_path / "tiny.tar.gz"
    digest = _tarball(tarball)
    # Two models from one tarball: it is copied once and dropped after the second is staged.
    models = [
        {"name": "tiny", "path": str(tarball), "sha256": digest},
        {
            "name": "tiny-greedy",
            "path": str(tarball),
            "sha256": digest,
            "generation_config_overrides": {"temperature": 0.0},
        },
    ]
    result = _run(tmp_path, models)
    assert result.returncode == 0, result.stdout[-4000:]
    assert (tmp_path / "models" / "tiny" / "model.safetensors").is_file()
    assert (tmp_path / "models" / "tiny-greedy" / "model.safetensors").is_file()
    copies = result.stdout.split("TASK [artifact : Copy to the node: model ")[1:]
    assert [copy.split("\n")[1].split(":")[0] for copy in copies] == ["changed", "ok"], (
        "copied once: the second model finds the tarball still there"
    )
    assert not (tmp_path / "node-cache" / digest).exists(), "dropped after staging"


def test_a_tarball_kept_on_purpose_is_root_only(tmp_path: Path) -> None:
    tarball = tmp_path / "tiny.tar.gz"
    digest = _tarball(tarball)
    result = _run(
        tmp_path, [{"name": "tiny", "path": str(tarball), "sha256": digest}], model_store_remove_archive=False
    )
    assert result.returncode == 0, result.stdout[-4000:]
    kept = tmp_path / "node-cache" / digest / "tiny.tar.gz"
    assert kept.is_file() and oct(kept.stat().st_mode & 0o777) == "0o640"
