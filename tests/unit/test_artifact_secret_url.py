"""A model or runfile URL that carries credentials (a presigned query, user:password@) never reaches a run's output
or job events (issue 29, review L9): the artifact role pulls it with no_log and tells a failure with the URL without
its credentials. Run for real by ansible-playbook at -vvv (which prints every module's arguments) on this machine,
against an HTTP server on loopback, through the controller and through the node."""

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
SECRET = "gpufleet-secret-42"
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Fetch the artifact
      ansible.builtin.include_role:
        name: artifact
"""


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Serves tmp_path/served on loopback (the query is ignored, as a presigned URL's signature is to us)."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "tiny.tar").write_bytes(b"weights" * 100)
    handler = lambda *args: http.server.SimpleHTTPRequestHandler(*args, directory=str(served))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", hashlib.sha256(b"weights" * 100).hexdigest()
    finally:
        httpd.shutdown()


def fetch(tmp_path: Path, fetch_mode: str, url: str, sha256: str) -> subprocess.CompletedProcess[str]:
    variables = {
        "artifact_spec": {"url": url, "sha256": sha256},
        "artifact_name": "tiny model",
        "artifact_fetch": fetch_mode,
        "artifact_controller_cache": str(tmp_path / "controller"),
        "artifact_node_cache": str(tmp_path / "node"),
        "artifact_node_staging": str(tmp_path),
        "ansible_python_interpreter": str(REPO / ".venv/bin/python"),
    }
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-vvv", "-i", "localhost,", "play.yml", "-e", "@vars.json"]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize("fetch_mode", ["controller", "node"])
def test_a_url_with_credentials_is_pulled_without_showing_them(
    tmp_path: Path, server: tuple[str, str], fetch_mode: str
) -> None:
    base, sha256 = server
    result = fetch(tmp_path, fetch_mode, f"{base}/tiny.tar?X-Signature={SECRET}", sha256)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert SECRET not in output
    assert (tmp_path / "node" / sha256 / "tiny.tar").read_bytes() == b"weights" * 100


@pytest.mark.parametrize("fetch_mode", ["controller", "node"])
def test_a_failed_pull_is_told_with_the_url_without_its_credentials(
    tmp_path: Path, server: tuple[str, str], fetch_mode: str
) -> None:
    base, _ = server
    result = fetch(tmp_path, fetch_mode, f"http://reader:{SECRET}@{base.removeprefix('http://')}/tiny.tar", "0" * 64)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert SECRET not in output, output[-3000:]
    assert f"tiny model: {'downloading' if fetch_mode == 'controller' else 'pulling'} {base}/tiny.tar failed:" in output
    assert "did not match" in output or "Checksum mismatch" in output, output[-3000:]
