"""openai_probe and its client (plugins/module_utils/openai_http.py), over real HTTP on loopback.

The server here is a scripted OpenAI-protocol endpoint: it lets a test make health fail a number of times,
hold requests to measure concurrency, stream chunks with a delay or require a key, which a real vLLM cannot
be told to do. The same module runs against the real vLLM of the lab in tests/integration/test_serve.py.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT
from ansible_collections.gpufleet.fleet.plugins.module_utils import openai_http

BIN = Path(sys.executable).parent


class Script:
    """What the scripted server does; tests change it between requests."""

    def __init__(self) -> None:
        self.health_failures = 0
        self.models = ["tiny"]
        self.api_key = ""
        self.delay = 0.0
        self.stream_gap = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()


def make_handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if script.api_key and self.headers.get("Authorization") != f"Bearer {script.api_key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                with script.lock:
                    failing = script.health_failures > 0
                    script.health_failures -= 1
                self._send(503 if failing else 200, "")
            elif self.path == "/v1/models" and self._authorized():
                self._send(200, {"object": "list", "data": [{"id": name} for name in script.models]})
            elif self.path != "/v1/models":
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.bodies.append(body)
                script.in_flight += 1
                script.max_in_flight = max(script.max_in_flight, script.in_flight)
            time.sleep(script.delay)
            with script.lock:
                script.in_flight -= 1
            if body.get("model") not in script.models:
                self._send(404, {"error": f"model {body.get('model')} does not exist"})
                return
            usage = {
                "prompt_tokens": len(str(body.get("prompt", body.get("messages"))).split()),
                "completion_tokens": body["max_tokens"],
            }
            if body.get("stream"):
                self._stream(usage)
            else:
                self._send(200, {"choices": [{"text": "x"}], "usage": usage})

        def _stream(self, usage: dict[str, int]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
            self.wfile.flush()
            time.sleep(script.stream_gap)
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


@pytest.fixture
def script() -> Script:
    return Script()


def _serve(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(script))
    scheme = "http"
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def base_url(script: Script) -> Iterator[str]:
    yield from _serve(script)


# --- figures ---------------------------------------------------------------------------------------------


def test_percentiles_use_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert openai_http.percentile(values, 0.5) == 5.0
    assert openai_http.percentile(values, 0.9) == 9.0
    assert openai_http.percentile(values, 0.99) == 10.0
    assert openai_http.percentile([], 0.5) == 0.0


def test_latency_summary_rounds_to_tenths_of_a_millisecond() -> None:
    summary = openai_http.latency_summary([0.3, 0.1, 0.2])
    assert summary == {"min": 0.1, "p50": 0.2, "p90": 0.3, "p99": 0.3, "max": 0.3, "mean": 0.2}
    assert openai_http.latency_summary([]) == {}


def test_prompts_have_the_requested_length_and_differ_by_index() -> None:
    first, second = openai_http.make_prompt(50, 0), openai_http.make_prompt(50, 1)
    assert len(first.split()) == 50 and len(second.split()) == 50
    assert first != second


def test_payloads_for_each_endpoint() -> None:
    spec = openai_http.RequestClass(
        name="t", endpoint="chat", prompt="hi", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert openai_http.build_payload(spec, "m", 0) == {
        "model": "m",
        "max_tokens": 3,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": "hi"}],
        "ignore_eos": True,
    }
    streamed = openai_http.build_payload(openai_http.RequestClass(name="s", stream=True, prompt="p"), "m", 0)
    assert streamed["prompt"] == "p" and streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True}


# --- HTTP behaviour --------------------------------------------------------------------------------------


def test_health_wait_polls_until_the_server_answers(script: Script, base_url: str) -> None:
    script.health_failures = 3
    health = openai_http.wait_for_health(openai_http.Server(base_url), "/health", timeout=10, interval=0.05)
    assert health["ok"] and health["attempts"] == 4 and health["status"] == 200


def test_health_wait_gives_up_after_the_timeout(script: Script, base_url: str) -> None:
    script.health_failures = 1000
    started = time.monotonic()
    health = openai_http.wait_for_health(openai_http.Server(base_url), "/health", timeout=0.5, interval=0.1)
    assert not health["ok"] and health["status"] == 503 and health["error"].startswith("HTTP 503")
    assert time.monotonic() - started < 2


def test_health_wait_stops_when_the_server_will_not_answer(script: Script, base_url: str) -> None:
    """A crash loop that hit systemd's start limit never answers: the wait stops there, not at the timeout."""
    script.health_failures = 1000
    checks: list[str] = []

    def unit_failed_after_three_polls() -> str:
        checks.append("checked")
        return "vllm@main.service is failed" if len(checks) >= 3 else ""

    health = openai_http.wait_for_health(
        openai_http.Server(base_url), "/health", timeout=3600, interval=0.01, given_up=unit_failed_after_three_polls
    )
    assert not health["ok"] and health["attempts"] == 3
    assert health["given_up"] == "vllm@main.service is failed" and health["error"].startswith("HTTP 503")


def test_refused_connection_is_reported_not_raised() -> None:
    reply = openai_http.call(openai_http.Server("http://127.0.0.1:9", timeout=2), "GET", "/health")
    assert reply.status == 0 and not reply.ok and "refused" in reply.error.lower()


def test_key_is_sent_and_a_missing_key_is_a_401(script: Script, base_url: str) -> None:
    script.api_key = "sekrit"
    models, reply = openai_http.model_ids(openai_http.Server(base_url))
    assert models == [] and reply.status == 401 and "Unauthorized" in reply.error
    models, reply = openai_http.model_ids(openai_http.Server(base_url, api_key="sekrit"))
    assert models == ["tiny"] and reply.ok


def test_a_class_runs_at_its_concurrency_and_sums_usage(script: Script, base_url: str) -> None:
    script.delay = 0.2
    spec = openai_http.RequestClass(name="burst", count=6, concurrency=3, prompt_words=10, max_tokens=7)
    result = openai_http.run_class(openai_http.Server(base_url), spec, "tiny")
    assert script.max_in_flight == 3
    assert result["succeeded"] == 6 and result["failed"] == 0
    assert result["completion_tokens"] == 42 and result["prompt_tokens"] == 60
    # Two waves of 0.2 s: the wall time shows the requests overlapped.
    assert 0.4 <= result["wall_s"] < 1.0
    assert result["latency_s"]["min"] >= 0.2


def test_failed_requests_are_counted_with_their_error(script: Script, base_url: str) -> None:
    result = openai_http.run_class(openai_http.Server(base_url), openai_http.RequestClass(name="x", count=2), "nope")
    assert result["succeeded"] == 0 and result["failed"] == 2
    assert result["errors"] == ['HTTP 404: {"error": "model nope does not exist"}']
    assert result["latency_s"] == {}


def test_streaming_measures_time_to_first_chunk(script: Script, base_url: str) -> None:
    script.stream_gap = 0.3
    spec = openai_http.RequestClass(name="s", stream=True, max_tokens=5)
    result = openai_http.run_class(openai_http.Server(base_url), spec, "tiny")
    assert result["succeeded"] == 1 and result["completion_tokens"] == 5
    assert result["ttft_s"]["max"] < 0.2 <= result["latency_s"]["min"]


# --- TLS ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cryptography comes with ansible-core)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("tls")
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return directory / "cert.pem", directory / "key.pem"


@pytest.fixture
def tls_url(script: Script, tls_files: tuple[Path, Path]) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*tls_files)
    yield from _serve(script, context)


def test_tls_is_verified_against_the_given_ca(tls_url: str, tls_files: tuple[Path, Path]) -> None:
    unverified = openai_http.call(openai_http.Server(tls_url), "GET", "/health")
    assert unverified.status == 0 and "CERTIFICATE_VERIFY_FAILED" in unverified.error
    assert openai_http.call(openai_http.Server(tls_url, ca_path=str(tls_files[0])), "GET", "/health").ok
    assert openai_http.call(openai_http.Server(tls_url, validate_certs=False), "GET", "/health").ok


# --- the module, run by Ansible ------------------------------------------------------------------------------


def run_module(args: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    """`ansible localhost -m openai_probe`; returns the host result with `failed` from Ansible's verdict."""
    command = [
        str(BIN / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "gpufleet.fleet.openai_probe",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    if check_mode:
        command.append("--check")
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
    }
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False
    )
    found = re.search(r"^localhost \| (SUCCESS|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, f"ansible did not run (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end() :])
    host_result["failed"] = found.group(1) == "FAILED!"
    return host_result


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_warms_up_and_never_changes(script: Script, base_url: str, check_mode: bool) -> None:
    script.health_failures = 2
    result = run_module(
        {
            "url": base_url,
            "health_timeout": 10,
            "health_interval": 0.1,
            "expect_models": ["tiny"],
            "requests": [
                {"name": "probe", "max_tokens": 1},
                {"name": "burst", "count": 4, "concurrency": 4, "max_tokens": 8},
            ],
        },
        check_mode=check_mode,
    )
    assert not result["failed"] and result["changed"] is False
    assert result["health"]["attempts"] == 3 and result["models"] == ["tiny"]
    assert [(r["name"], r["succeeded"], r["completion_tokens"]) for r in result["results"]] == [
        ("probe", 1, 1),
        ("burst", 4, 32),
    ]
    assert [body["model"] for body in script.bodies] == ["tiny"] * 5


def test_module_fails_when_the_served_model_is_missing(script: Script, base_url: str) -> None:
    result = run_module({"url": base_url, "expect_models": ["tiny", "big"]})
    assert result["failed"] and result["missing_models"] == ["big"]
    assert result["msg"] == "the server lists models ['tiny']; missing ['big']"


def test_module_fails_on_request_errors_and_keeps_the_figures(script: Script, base_url: str) -> None:
    script.api_key = "sekrit-key-123"
    result = run_module(
        {"url": base_url, "api_key": "sekrit-key-123", "model": "other", "requests": [{"name": "probe"}]}
    )
    assert result["failed"] and result["results"][0]["failed"] == 1
    assert result["msg"].startswith(f"requests to {base_url} failed: probe: 1/1 failed (HTTP 404")
    assert "sekrit-key-123" not in json.dumps(result), "the key is no_log"


def test_module_rejects_meaningless_classes_in_one_line(base_url: str) -> None:
    result = run_module({"url": base_url, "requests": [{"name": "b", "count": 0, "concurrency": 0}]})
    assert result["failed"]
    assert (
        result["msg"]
        == "requests[b].count must be at least 1 (got 0); requests[b].concurrency must be at least 1 (got 0)"
    )


def test_module_reports_a_server_that_never_gets_healthy(script: Script, base_url: str) -> None:
    script.health_failures = 1000
    result = run_module({"url": base_url, "health_timeout": 0.5, "health_interval": 0.1})
    assert result["failed"] and result["health"]["ok"] is False
    assert result["msg"] == f"{base_url}/health did not answer 2xx within 0.5 s (last: HTTP 503)"
