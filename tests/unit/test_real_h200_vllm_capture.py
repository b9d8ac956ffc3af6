"""What vLLM 0.26.0 did on the real H200 (tests/fixtures/h200-real/vllm_*, scripts/verify-local-vllm.sh),
held against gpufleet's code here:

- openai_probe's client reads vLLM's real answers (models, completions, a stream with usage, the 401 without
  a key), replayed byte for byte by a loopback server;
- the vllm_service role still renders the ExecStart= that served on the GPU, so a change to the command line
  shows up as not yet proven there;
- torch_stack_info's probe finds the compiled extension vLLM 0.26.0 ships (vllm._C_stable_libtorch; there is
  no vllm._C in its wheel), which the probe of before reported missing on the GPU where vLLM served.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT

from ansible_collections.gpufleet.fleet.plugins.module_utils import openai_http
from ansible_collections.gpufleet.fleet.plugins.module_utils import torch_probe

MODULE_UTILS = PROJECT_ROOT / "plugins" / "module_utils"

CAPTURE = PROJECT_ROOT / "tests" / "fixtures" / "h200-real"
SERVE = json.loads((CAPTURE / "vllm_serve.json").read_text())
RESPONSES = CAPTURE / "vllm_responses"
ROLE = PROJECT_ROOT / "roles" / "vllm_service"
API_KEY = "REDACTED"


class Replay(BaseHTTPRequestHandler):
    """Answers as vLLM did on the H200: the captured bodies, and 401 without the bearer token."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {API_KEY}":
            return True
        self._send(401, b'{"error":"Unauthorized"}', "application/json")
        return False

    def do_GET(self) -> None:
        if self._authorized() and self.path == "/v1/models":
            self._send(200, (RESPONSES / "models.json").read_bytes(), "application/json")

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._authorized():
            return
        if payload.get("stream"):
            self._send(200, (RESPONSES / "completion-stream.txt").read_bytes(), "text/event-stream")
        else:
            self._send(200, (RESPONSES / "completion.json").read_bytes(), "application/json")


@pytest.fixture()
def replay_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def stream_usage() -> dict[str, int]:
    chunks = [
        json.loads(line[len("data:") :])
        for line in (RESPONSES / "completion-stream.txt").read_text().splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]
    return next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))


def test_probe_reads_the_models_vllm_listed(replay_url: str) -> None:
    models, reply = openai_http.model_ids(openai_http.Server(replay_url, API_KEY))
    assert reply.ok and models == ["gpu0"]
    models, reply = openai_http.model_ids(openai_http.Server(replay_url, ""))
    assert models == [] and reply.status == 401
    assert SERVE["api_key_required"] == {"GET /v1/models without a key": "401"}


def test_probe_counts_the_tokens_of_vllms_completions(replay_url: str) -> None:
    usage = json.loads((RESPONSES / "completion.json").read_text())["usage"]
    result = openai_http.run_class(
        openai_http.Server(replay_url, API_KEY),
        openai_http.RequestClass(name="typical", count=3, concurrency=3),
        "gpu0",
    )
    assert (result["succeeded"], result["failed"]) == (3, 0)
    assert result["prompt_tokens"] == 3 * usage["prompt_tokens"]
    assert result["completion_tokens"] == 3 * usage["completion_tokens"] == 24


def test_probe_reads_the_usage_at_the_end_of_vllms_stream(replay_url: str) -> None:
    result = openai_http.run_class(
        openai_http.Server(replay_url, API_KEY),
        openai_http.RequestClass(name="chat", stream=True, max_tokens=4),
        "gpu0",
    )
    assert result["succeeded"] == 1
    assert result["completion_tokens"] == stream_usage()["completion_tokens"] == 4
    assert result["ttft_s"]["max"] > 0


def test_the_figures_come_from_the_probe_classes_of_the_role() -> None:
    # The capture's classes are the role's warm-up classes, each request answered, first run and steady state.
    import yaml

    classes = [
        entry["name"]
        for entry in yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["vllm_service_warmup_requests"]
    ]
    figures = SERVE["figures"]
    for run in ("first", "steady"):
        assert list(figures[run]) == classes
        assert all(entry["succeeded"] == entry["count"] for entry in figures[run].values())
    assert figures["typical_completion_tokens_per_s"] == figures["steady"]["typical"]["completion_tokens_per_s"]


def render_exec_start(tmp_path: Path) -> str:
    """The drop-in's ExecStart= rendered from the role's template, defaults and vars for the captured instance."""
    playbook = tmp_path / "render.yml"
    playbook.write_text(f"""
- name: Render the instance drop-in
  hosts: localhost
  gather_facts: true
  vars_files: [{ROLE}/defaults/main.yml, {ROLE}/vars/main.yml]
  tasks:
    - name: Render it
      ansible.builtin.template:
        src: {ROLE}/templates/etc/systemd/system/vllm@.service.d/gpufleet.conf.j2
        dest: {tmp_path}/gpufleet.conf
        mode: "0600"
      vars:
        vllm_service_instance: "{{{{ __vllm_service_instances[0] }}}}"
""")
    variables = tmp_path / "vars.json"
    variables.write_text(
        json.dumps(
            {
                "ansible_python_interpreter": sys.executable,
                "vllm_service_venv": "/WORK/venv",
                "vllm_service_instances": [
                    {"name": "gpu0", "model": "/WORK/models/tiny-qwen2-gpu", "port": 8000, "gpus": [0]}
                ],
            }
        )
    )
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"@{variables}",
        str(playbook),
    ]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"))
    result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return exec_start((tmp_path / "gpufleet.conf").read_text())


def exec_start(dropin: str) -> str:
    return [line for line in dropin.splitlines() if line.startswith("ExecStart=") and line != "ExecStart="][-1]


def test_the_role_renders_the_command_line_that_served_on_the_h200(tmp_path: Path) -> None:
    captured = exec_start((CAPTURE / "vllm_rendered" / "gpu0.gpufleet.conf").read_text())
    assert shlex.split(captured[len("ExecStart=") :]) == SERVE["argv"]
    assert render_exec_start(tmp_path) == captured, (
        "the role's ExecStart= differs from the one vLLM 0.26.0 served with on the H200: run "
        "scripts/verify-local-vllm.sh on a GPU machine and refresh tests/fixtures/h200-real/vllm_*"
    )


def test_probe_finds_the_compiled_extension_vllm_0_26_ships(tmp_path: Path) -> None:
    # A vllm distribution whose modules have the names of the real wheel's compiled extensions (kept in the
    # capture from the wheel itself); as plain modules, since CUDA objects cannot load here.
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in SERVE["wheel"]["compiled_extensions"]:
        (package / f"{name}.py").write_text("")
    info = tmp_path / "vllm-0.26.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    completed = subprocess.run(
        [sys.executable, str(MODULE_UTILS / "torch_probe_script.py"), "{}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path)},
        check=False,
    )
    vllm = torch_probe.parse_probe_lines(completed.stdout)["sections"]["vllm"]
    assert vllm["version"] == "0.26.0" and vllm["import_ok"] is True
    assert vllm["extension_ok"] is True, vllm.get("extension_error")
    assert vllm["extension_file"] == str(package / "_C_stable_libtorch.py")
    # On the H200 that module loaded with vLLM serving, while the old probe's vllm._C did not exist.
    on_gpu = {entry["module"]: entry["ok"] for entry in SERVE["torch_stack_info"]["imports"]}
    assert on_gpu["vllm._C_stable_libtorch"] is True
    assert (
        SERVE["torch_stack_info"]["vllm"]["extension_error"]["text"] == "ModuleNotFoundError: No module named 'vllm._C'"
    )
