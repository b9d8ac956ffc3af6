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

import pytest

from ansible_collections.gpufleet.fleet.plugins.modules import archive_members

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - model_store
"""


def _tarball(path: Path, extra: tuple[tarfile.TarInfo, ...] = ()) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in {"config.json": b'{"model_type": "qwen2"}', "model.safetensors": b"\0" * 4096}.items():
            if any(member.name == name for member in extra):
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for member in extra:
            tar.addfile(member)
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def _member(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


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
    assert [copy.split("\n")[1].split(":")[0] for copy in copies] == ["changed", "skipping"], (
        "copied once: the second model finds the tarball still there, with its sha256, and copies nothing"
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


@pytest.mark.parametrize(
    ("member", "said"),
    [
        # The review's reproduction: root copied the link's target into .gpufleet-original, readable by vllm.
        (_member("config.json", tarfile.SYMTYPE, "SECRET"), "'config.json' is a symbolic link"),
        (_member("model.safetensors", tarfile.LNKTYPE, "SECRET"), "'model.safetensors' is a hard link"),
        (_member("../escape.json", tarfile.REGTYPE), "'../escape.json' has a .. component"),
        (_member("/etc/escape.json", tarfile.REGTYPE), "'/etc/escape.json' has an absolute path"),
        (_member("nvidia0", tarfile.CHRTYPE), "'nvidia0' is a device or a FIFO"),
    ],
)
def test_a_tarball_that_could_reach_outside_its_tree_is_refused_with_nothing_written(
    tmp_path: Path, member: tarfile.TarInfo, said: str
) -> None:
    secret = tmp_path / "root-only-secret"
    secret.write_text("root-only secret")
    secret.chmod(0o600)
    if member.linkname == "SECRET":
        member.linkname = str(secret)
    tarball = tmp_path / "evil.tar.gz"
    digest = _tarball(tarball, (member,))
    result = _run(tmp_path, [{"name": "evil", "path": str(tarball), "sha256": digest}])
    output = " ".join(result.stdout.split())
    assert result.returncode != 0 and said in output and "nothing was unpacked" in output, result.stdout[-3000:]
    models = tmp_path / "models"
    written = [path for path in models.rglob("*") if path.is_file()] if models.exists() else []
    assert written == [], "nothing of the tarball was written"
    assert not (tmp_path / "escape.json").exists() and not Path("/etc/escape.json").exists()


@pytest.mark.parametrize(
    ("member", "links", "refused"),
    [
        (_member("bin/python3", tarfile.SYMTYPE, "python3.12"), "inside", False),
        (_member("lib/libpython.so", tarfile.SYMTYPE, "../lib/libpython3.12.so"), "inside", False),
        (_member("bin/python3", tarfile.SYMTYPE, "../../usr/bin/python3"), "inside", True),
        (_member("bin/python3", tarfile.SYMTYPE, "/usr/bin/python3"), "inside", True),
        (_member("bin/python3", tarfile.LNKTYPE, "bin/python3.12"), "inside", False),
        (_member("bin/python3", tarfile.LNKTYPE, "../etc/passwd"), "inside", True),
        (_member("bin/python3", tarfile.SYMTYPE, "python3.12"), "refuse", True),
    ],
)
def test_links_inside_the_tree_are_allowed_where_a_build_needs_them(
    member: tarfile.TarInfo, links: str, refused: bool
) -> None:
    assert (archive_members.problem(member, 0, links) is not None) is refused


def test_a_url_is_recorded_without_its_credentials() -> None:
    from ansible_collections.gpufleet.fleet.plugins.filter.gpufleet_urls import url_without_credentials

    assert (
        url_without_credentials("https://user:secret@mirror.example:8443/m/tiny.tar.gz?X-Amz-Signature=abc#x")
        == "https://mirror.example:8443/m/tiny.tar.gz"
    )
    assert url_without_credentials("/srv/models/tiny.tar.gz") == "/srv/models/tiny.tar.gz"
