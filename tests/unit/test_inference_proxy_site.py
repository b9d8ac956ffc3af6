"""Role inference_proxy: the nginx site it renders (limits, TLS, HSTS, real_ip) and the preflight that keeps
keys, tokens and names from adding nginx directives.

Rendered for real by ansible-playbook against this machine (connection local): the role's defaults and vars,
then its template into a temporary directory. The lab test (tests/integration/test_serve.py) runs the site in nginx.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE_TEMPLATE = REPO / "roles/inference_proxy/templates/etc/nginx/conf.d/gpufleet-inference.conf.j2"
MOZILLA_INTERMEDIATE = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384"
)
API_KEYS = ["client-one-0123456789abcdef", "client-two-0123456789abcdef"]
VLLM_KEY = "vllm-own-key-0123456789abcdef"
BASE = {
    "inference_proxy_tls_cert": "-----BEGIN CERTIFICATE-----\nQ0VSVA==\n-----END CERTIFICATE-----\n",
    "inference_proxy_tls_key": "-----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n",
    "inference_proxy_api_keys": API_KEYS,
    "inference_proxy_metrics_token": "metrics-token-0123456789",
    "inference_proxy_backends": [{"name": "main", "port": 8000}, {"name": "greedy", "port": 8001}],
    "inference_proxy_backend_api_key": VLLM_KEY,
}
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role's defaults, vars and preflight
      ansible.builtin.include_role:
        name: inference_proxy
        tasks_from: preflight.yml
        public: true
    - name: Render the site
      ansible.builtin.template:
        src: "{{ site_template }}"
        dest: "{{ site_out }}"
        mode: "0600"
      check_mode: false
"""


def run_role(tmp_path: Path, overrides: dict[str, object]) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    variables = {
        **BASE,
        **overrides,
        "site_template": str(SITE_TEMPLATE),
        "site_out": str(tmp_path / "site.conf"),
        "ansible_python_interpreter": str(REPO / ".venv/bin/python"),
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(book), "-e", f"@{tmp_path / 'vars.json'}"]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def render(tmp_path: Path, **overrides: object) -> str:
    result = run_role(tmp_path, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return (tmp_path / "site.conf").read_text()


def servers(site: str) -> list[str]:
    """The text of each top-level server block."""
    return re.split(r"^server \{$", site, flags=re.M)[1:]


def blocks(server: str, header: str) -> list[str]:
    """The bodies of the location blocks whose header line matches."""
    return re.findall(rf"^    location {header} \{{\n(.*?)^    \}}$", server, flags=re.M | re.S)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> str:
    return render(tmp_path_factory.mktemp("site"))


def test_the_limit_counts_by_key_and_unauthenticated_requests_by_address(site: str) -> None:
    zones = dict(re.findall(r"^limit_req_zone (\S+) zone=(\w+):", site, flags=re.M)[i][::-1] for i in range(3))
    assert zones == {
        "gpufleet_per_key": "$gpufleet_api_key_id",
        "gpufleet_unauthenticated": "$gpufleet_unauthenticated_client",
        "gpufleet_metrics_unauthenticated": "$gpufleet_metrics_unauthenticated_client",
    }
    # Each valid key has a bucket of its own, named by a hash of the key, not by the client's address.
    for key in API_KEYS:
        assert f'"Bearer {key}" {hashlib.sha256(key.encode()).hexdigest()[:16]};' in site
    assert re.search(
        r'map \$gpufleet_api_key_id \$gpufleet_unauthenticated_client \{\n\s+"" \$binary_remote_addr;', site
    )
    api, metrics = servers(site)
    assert "limit_req zone=gpufleet_per_key burst=40 nodelay;" in api
    assert "limit_req zone=gpufleet_unauthenticated burst=10 nodelay;" in api
    assert "limit_req zone=gpufleet_metrics_unauthenticated burst=10 nodelay;" in metrics


def test_keys_are_checked_after_the_limit(site: str) -> None:
    # "return 401" runs in nginx's rewrite phase, before limit_req: the 401 must come from auth_request.
    for server, realm in zip(servers(site), ("inference", "metrics")):
        forwarding = [body for body in blocks(server, r"\S+ ?\S*") if "proxy_pass" in body]
        guarded = [body for body in forwarding if "/health;" not in body]
        assert guarded and all(f"auth_request /_gpufleet/auth/{realm};" in body for body in guarded)
        assert "return 401 '" not in "".join(forwarding)
        assert "error_page 401 = @gpufleet_unauthorized;" in server
        assert "internal;" in blocks(server, rf"= /_gpufleet/auth/{realm}")[0]


def test_modern_tls_no_banner_and_hsts_on_both_ports(site: str) -> None:
    for server in servers(site):
        assert "ssl_protocols TLSv1.2 TLSv1.3;" in server
        assert f"ssl_ciphers {MOZILLA_INTERMEDIATE};" in server
        assert "ssl_session_tickets off;" in server and "server_tokens off;" in server
        hsts = 'add_header Strict-Transport-Security "max-age=63072000" always;'
        assert hsts in server
        # add_header in a location replaces the server's: the error answers repeat HSTS.
        for name in ("@gpufleet_unauthorized", "@gpufleet_limited"):
            assert hsts in blocks(server, name)[0]


def test_no_hsts_when_its_age_is_zero(tmp_path: Path) -> None:
    assert "Strict-Transport-Security" not in render(tmp_path, inference_proxy_hsts_max_age=0)


def test_real_ip_is_off_by_default_and_trusts_only_the_given_balancers(site: str, tmp_path: Path) -> None:
    assert "real_ip" not in site
    balanced = render(tmp_path, inference_proxy_real_ip_from=["10.1.0.0/24", "192.0.2.7"])
    for server in servers(balanced):
        assert "set_real_ip_from 10.1.0.0/24;\n    set_real_ip_from 192.0.2.7;" in server
        assert "real_ip_header X-Forwarded-For;" in server and "real_ip_recursive on;" in server


def test_vllm_gets_its_own_key_not_the_clients(site: str) -> None:
    assert site.count(f'proxy_set_header Authorization "Bearer {VLLM_KEY}";') == site.count("proxy_pass ")


@pytest.mark.parametrize(
    "bad",
    [
        'x" ; return 200 "0123456789abcdef',
        "0123456789abcdef;",
        "$0123456789abcdef",
        "0123456789 abcdef",
        "0123456789abcdef\nallow all",
        "",
        "short",
    ],
)
@pytest.mark.parametrize("where", ["instance", "default", "api", "metrics"])
def test_keys_that_could_add_a_directive_are_refused(tmp_path: Path, where: str, bad: str) -> None:
    overrides: dict[str, object] = {
        "instance": {"inference_proxy_backends": [{"name": "main", "port": 8000, "api_key": bad}]},
        "default": {"inference_proxy_backend_api_key": bad},
        "api": {"inference_proxy_api_keys": [API_KEYS[0], bad]},
        "metrics": {"inference_proxy_metrics_token": bad},
    }[where]
    result = run_role(tmp_path, overrides)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    named = {
        "instance": "the vLLM key of instance 'main'",
        "default": "the vLLM key of instance 'greedy'",
        "api": "API key number 2 of inference_proxy_api_keys",
        "metrics": "inference_proxy_metrics_token",
    }[where]
    # The role's value rules refuse what a key may not hold, naming the value's path; its own check what is short.
    path = {
        "instance": "inference_proxy_backends[main].api_key",
        "default": "inference_proxy_backend_api_key",
        "api": "inference_proxy_api_keys[1]",
        "metrics": "inference_proxy_metrics_token",
    }[where]
    assert f"localhost: {path} " in output or f"{named} must be 16 or more characters" in output, output
    assert not (tmp_path / "site.conf").exists()
    if len(bad) > 5:
        assert bad not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("inference_proxy_backends", [{"name": "main;", "port": 8000}]),
        ("inference_proxy_routes", [{"path": "/v1 { return 200; }", "instances": ["main"]}]),
        ("inference_proxy_metrics_allow", ["10.0.0.0/8; allow all"]),
        ("inference_proxy_real_ip_from", ["0.0.0.0/0 all"]),
        ("inference_proxy_rate_limit", "20r/s burst=1000"),
        ("inference_proxy_server_name", "node; return 200"),
    ],
)
def test_values_that_could_add_a_directive_are_refused(tmp_path: Path, variable: str, value: object) -> None:
    result = run_role(tmp_path, {variable: value})
    assert result.returncode == 2
    output = " ".join(result.stdout.split())
    assert f"localhost: {variable}" in output and "(rule " in output, output
    assert not (tmp_path / "site.conf").exists()


def test_a_drained_or_cordoned_node_answers_503_with_retry_after_on_the_api_port_only(site: str) -> None:
    api, metrics = servers(site)
    # Server-level: tested in the server's rewrite phase, before any location (/health too) is chosen.
    head = api.split("    location = /metrics {")[0]
    assert "if (-f /etc/gpufleet/cordon) {\n        set $gpufleet_out_of_service 1;" in head
    assert "if (-f /etc/gpufleet/drain) {\n        set $gpufleet_out_of_service 1;" in head
    # Refused unless the request is the gate's probe: /health, from the node itself, with the gate's header (the
    # connection's address, not one real_ip took from a forwarded header). The lab test asks nginx for real.
    assert 'set $gpufleet_refused "$gpufleet_out_of_service$gpufleet_gate_probe";' in head
    assert "if ($gpufleet_refused = 1) {\n        return 503;" in head
    (probe,) = re.findall(r'map "([^"]+)" \$gpufleet_gate_probe \{([^}]*)\}', site)
    assert probe[0] == "$realip_remote_addr $http_x_gpufleet_gate $uri"
    assert sorted(re.findall(r'"([^"]+)" probe;', probe[1])) == ["127.0.0.1 1 /health", "::1 1 /health"]
    assert "error_page 503 = @gpufleet_drained;" in head
    (drained,) = blocks(api, "@gpufleet_drained")
    assert "add_header Retry-After 30 always;" in drained
    assert "return 503 " in drained
    # Prometheus still reads a drained node.
    assert "/etc/gpufleet" not in metrics


def test_the_certificate_and_its_key_are_one_file(site: str) -> None:
    """Review L14: the certificate and the key were two files written one after the other, so a run killed between
    them left a pair nginx refuses at its next start. One file is replaced by one rename."""
    for server in servers(site):
        assert "ssl_certificate /etc/nginx/tls/gpufleet-inference.pem;" in server
        assert "ssl_certificate_key /etc/nginx/tls/gpufleet-inference.pem;" in server


def test_the_drain_files_follow_the_state_dir(tmp_path: Path) -> None:
    site = render(tmp_path, inference_proxy_state_dir="/srv/state", inference_proxy_drain_retry_after=5)
    assert "if (-f /srv/state/cordon)" in site and "if (-f /srv/state/drain)" in site
    assert "Retry-After 5 always" in site


def test_only_the_openai_api_is_forwarded(site: str) -> None:
    """vLLM answers any path under /metrics and exposes /tokenize, /docs and development endpoints: the API port
    forwards /v1/ (and /health) only (issue 29, L1)."""
    api, _ = servers(site)
    (root,) = blocks(api, "/")
    assert 'if ($uri !~ "^/v1/") {\n            return 404' in root
    assert root.index("return 404") < root.index("auth_request"), "refused before anything is forwarded"
    (instance,) = blocks(api, "/instances/main/v1/")
    assert "proxy_pass http://gpufleet_vllm_main/v1/;" in instance
    assert "location /instances/main/ {" not in api
