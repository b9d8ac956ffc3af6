"""The artifact role, run for real by ansible-playbook against this machine (connection local).

A loopback HTTP server plays the mirror; every cache lives in a temporary directory. Covers both fetch
modes, a controller path, reruns without a download, and a wrong sha256 refused with both hashes and
nothing written where the node keeps artifacts.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: artifact
      vars:
        artifact_name: test runfile
    - ansible.builtin.copy:
        content: "{{ artifact_file }}"
        dest: "{{ result_file }}"
        mode: "0644"
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args: object) -> None:
        _QuietHandler.requests.append(self.path)


@pytest.fixture()
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP mirror serving tmp_path/mirror."""
    root = tmp_path / "mirror"
    root.mkdir()
    _QuietHandler.requests = []
    handler = lambda *a, **k: _QuietHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


def _run(tmp_path: Path, spec: dict, fetch: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    extra = {
        "artifact_spec": spec,
        "artifact_fetch": fetch,
        "artifact_controller_cache": str(tmp_path / "controller-cache"),
        "artifact_node_cache": str(tmp_path / "node-cache"),
        "artifact_node_staging": str(tmp_path / "staging"),
        "result_file": str(tmp_path / "result.txt"),
        # Here the "node" is this machine too: run its modules with the project's Python.
        "ansible_python_interpreter": str(REPO / ".venv/bin/python"),
    }
    (tmp_path / "staging").mkdir(exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(book), "-e", json.dumps(extra)]
    if check:
        argv.append("--check")
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def _recap_changed(output: str) -> int:
    line = next(row for row in output.splitlines() if row.startswith("localhost") and "changed=" in row)
    return int(line.split("changed=")[1].split()[0])


@pytest.mark.parametrize("fetch", ["controller", "node"])
def test_url_fetched_once_verified_and_reused(tmp_path: Path, mirror: tuple[str, Path], fetch: str) -> None:
    url, root = mirror
    payload = b"#!/bin/sh\necho lab\n" * 1000
    (root / "tool.run").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    spec = {"url": f"{url}/tool.run", "sha256": digest}

    first = _run(tmp_path, spec, fetch)
    assert first.returncode == 0, first.stdout + first.stderr
    node_file = tmp_path / "node-cache" / digest / "tool.run"
    assert node_file.read_bytes() == payload
    assert (tmp_path / "result.txt").read_text() == str(node_file)
    assert not list((tmp_path / "staging").iterdir()), "the staging file is removed"
    assert len(_QuietHandler.requests) == 1
    if fetch == "controller":
        assert (tmp_path / "controller-cache" / digest).read_bytes() == payload, "kept by content on the controller"

    second = _run(tmp_path, spec, fetch)
    assert second.returncode == 0, second.stdout
    assert len(_QuietHandler.requests) == 1, "a verified cached artifact is not downloaded again"
    assert _recap_changed(second.stdout) == 0, "a rerun changes nothing"


@pytest.mark.parametrize("fetch", ["controller", "node"])
def test_wrong_sha256_refused_with_both_hashes(tmp_path: Path, mirror: tuple[str, Path], fetch: str) -> None:
    url, root = mirror
    payload = b"tampered content"
    (root / "tool.run").write_bytes(payload)
    pinned = "0" * 64
    result = _run(tmp_path, {"url": f"{url}/tool.run", "sha256": pinned}, fetch)
    assert result.returncode != 0
    assert pinned in result.stdout
    assert hashlib.sha256(payload).hexdigest() in result.stdout
    assert not (tmp_path / "node-cache").exists(), "nothing is written where the node keeps artifacts"
    assert not list((tmp_path / "staging").iterdir())


def test_controller_path_verified_then_copied(tmp_path: Path) -> None:
    source = tmp_path / "NVIDIA-Linux-x86_64-580.95.05.run"
    source.write_bytes(b"runfile bytes")
    digest = hashlib.sha256(b"runfile bytes").hexdigest()
    ok = _run(tmp_path, {"path": str(source), "sha256": digest}, "node")
    assert ok.returncode == 0, ok.stdout
    assert (tmp_path / "node-cache" / digest / source.name).read_bytes() == b"runfile bytes"

    source.write_bytes(b"changed on disk")
    refused = _run(tmp_path, {"path": str(source), "sha256": digest}, "controller")
    assert refused.returncode != 0
    assert digest in refused.stdout and hashlib.sha256(b"changed on disk").hexdigest() in refused.stdout


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"sha256": "a" * 64}, "declare it as {url: ..., sha256: <64 hex>}"),
        ({"url": "http://127.0.0.1:9/x.run", "path": "/x.run", "sha256": "a" * 64}, "declare it as {url: ..., sha256"),
        # What a value may be is the role's value rules' (role_values, first in the preflight).
        ({"url": "http://127.0.0.1:9/x.run", "sha256": "not-a-hash"}, "artifact_spec.sha256 has U+006E"),
    ],
)
def test_bad_declaration_is_refused_clearly(tmp_path: Path, spec: dict, said: str) -> None:
    result = _run(tmp_path, spec, "controller")
    assert result.returncode != 0
    assert said in " ".join(result.stdout.split())


def test_check_mode_changes_nothing(tmp_path: Path, mirror: tuple[str, Path]) -> None:
    url, root = mirror
    (root / "tool.run").write_bytes(b"payload")
    digest = hashlib.sha256(b"payload").hexdigest()
    result = _run(tmp_path, {"url": f"{url}/tool.run", "sha256": digest}, "node", check=True)
    assert result.returncode == 0, result.stdout
    assert not (tmp_path / "node-cache").exists()


def test_a_node_pull_never_lands_at_a_path_another_user_could_plant(tmp_path: Path, mirror: tuple[str, Path]) -> None:
    url, root = mirror
    payload = b"runfile bytes" * 100
    (root / "tool.run").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    # What any local user can make in a sticky, world-writable /var/tmp: the name a pull would land at.
    staging = tmp_path / "staging"
    staging.mkdir()
    staging.chmod(0o1777)
    planted = staging / f"gpufleet-artifact-{digest}.part"
    planted.mkdir()
    (planted / "tool.run").write_bytes(b"planted")

    result = _run(tmp_path, {"url": f"{url}/tool.run", "sha256": digest}, "node")
    assert result.returncode == 0, result.stdout[-3000:]
    assert (tmp_path / "node-cache" / digest / "tool.run").read_bytes() == payload
    assert (planted / "tool.run").read_bytes() == b"planted", "the planted path is neither used nor touched"
    assert sorted(path.name for path in staging.iterdir()) == [planted.name], "the pull's own directory is removed"
