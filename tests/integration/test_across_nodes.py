"""One model served across two lab hosts (issue 31): an instance whose `nodes` are lab-1 and lab-2, tensor parallel
over both with vLLM's multiprocessing backend (--nnodes 2), the leader serving through its proxy and the other
member headless. vLLM's CPU build serves this way (Ray it refuses: test_ray_cluster.py). The declaration is a
host_vars file per member, removed after, and the serve layer prunes the instance again. Then the group as one unit:
a rerun restarts nothing; a member stopped and started again, and a leader restarted alone, each leave the group
serving again with nobody's help; `gpufleet upgrade` of the member drains the leader's node first, so its clients
get 503 (which a load balancer retries elsewhere) and never a broken group's 502, and puts it back into service once
the group answers again (make test-slow: about 15 minutes)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_drift_support import gpufleet
from test_rollout import SERVE_VARS, THROUGH_PROXY, state
from test_serve import ServedLab, https, run_playbooks, served_lab  # noqa: F401 (the fixture)

pytestmark = pytest.mark.lab

WIDE = {
    "name": "wide",
    "model": "/var/lib/gpufleet/models/tiny-qwen2",
    "served_model_name": "tiny-wide",
    "port": 8002,
    "tensor_parallel_size": 2,
    "distributed_executor_backend": "mp",
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
}
# The instance's processes on a member, and the peers of their TCP connections.
PROCESSES = "pgrep -c -f 'VLLM::Worker' -u $(stat -c %u /proc/$(systemctl show -P MainPID vllm@wide))"
PEERS = (
    "for pid in $(systemctl show -P ControlGroup vllm@wide | xargs -I{} cat /sys/fs/cgroup{}/cgroup.procs); do "
    "ss -tnpH | grep \"pid=$pid,\" | awk '{print $5}'; done | sed 's/:[0-9]*$//' | sort -u"
)
STARTED = "systemctl show -P ActiveEnterTimestamp vllm@wide"
RESTARTS = "systemctl show -P NRestarts vllm@wide"


def served_again(lab: ServedLab, leader: str, within: float = 300) -> float:
    """Seconds until the group answers a completion through the leader's proxy again."""
    started = time.monotonic()
    body = {"model": "tiny-wide", "prompt": "again", "max_tokens": 4}
    answer: Any = None
    while time.monotonic() - started < within:
        try:
            status, answer = https(
                lab.addresses[leader], "/instances/wide/v1/completions", lab.api_key, body, timeout=30
            )
        except OSError as error:  # the proxy's upstream timed out while the engine starts
            status, answer = 0, str(error)
        if status == 200:
            return time.monotonic() - started
        time.sleep(5)
    raise AssertionError(f"the group did not serve again within {within} s: {answer}")


def statuses_while(lab: ServedLab, leader: str, done: threading.Event) -> Counter[int]:
    """The status of each completion sent to the group through its leader's proxy until `done` (0: no answer)."""
    seen: Counter[int] = Counter()
    body = {"model": "tiny-wide", "prompt": "during the upgrade", "max_tokens": 4}
    while not done.is_set():
        try:
            status, _ = https(lab.addresses[leader], "/instances/wide/v1/completions", lab.api_key, body, timeout=30)
        except OSError:
            status = 0
        seen[status] += 1
        time.sleep(0.5)
    return seen


@pytest.mark.slow
def test_one_model_is_served_across_two_lab_hosts(
    served_lab: ServedLab,  # noqa: F811
    host_vars: Path,
    tmp_path: Path,
) -> None:
    first, second = sorted(served_lab.addresses)[:2]
    instances = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
    for host in (first, second):
        declared = [*instances, {**WIDE, "nodes": [first, second]}]
        (host_vars / f"{host}.yml").write_text(yaml.safe_dump({"vllm_service_instances": declared}))
    try:
        started = time.monotonic()
        run_playbooks(served_lab.inventory, ["serve.yml", "proxy.yml"], "--limit", f"{first},{second}")
        healthy = time.monotonic() - started
        body = {"model": "tiny-wide", "prompt": "one model on two hosts", "max_tokens": 16}
        status, answer = https(served_lab.addresses[first], "/instances/wide/v1/completions", served_lab.api_key, body)
        assert status == 200 and answer["usage"]["completion_tokens"] == 16, answer
        # A worker of the instance on each member, talking to the other over the cluster link only.
        workers = {host: int(state(served_lab.inventory, host, PROCESSES)) for host in (first, second)}
        peers = {host: state(served_lab.inventory, host, PEERS).split() for host in (first, second)}
        print(f"across {first},{second}: healthy after {healthy:.0f} s, workers {workers}, peers {peers}")
        assert all(count >= 1 for count in workers.values())
        assert all(
            peer.startswith(("10.254.0.", "127.", "[::ffff:127.", "[::ffff:10.254.0."))
            for p in peers.values()
            for peer in p
        )

        # One unit: a rerun restarts neither member.
        started = {host: state(served_lab.inventory, host, STARTED) for host in (first, second)}
        run_playbooks(served_lab.inventory, ["serve.yml", "proxy.yml"], "--limit", f"{first},{second}")
        assert {host: state(served_lab.inventory, host, STARTED) for host in (first, second)} == started
        # A member stopped: the leader's engine dies with it and systemd restarts the leader, which waits for it;
        # started again, it joins and the group serves.
        state(served_lab.inventory, second, "systemctl stop vllm@wide")
        status, _ = https(served_lab.addresses[first], "/instances/wide/v1/completions", served_lab.api_key, body)
        assert status != 200
        state(served_lab.inventory, second, "systemctl start vllm@wide")
        rejoined = served_again(served_lab, first)
        # The leader restarted alone (a crash, an operator): the member notices its leader's rendezvous store gone,
        # exits, and systemd starts it for the leader's next rendezvous. (vLLM's own member would wait forever.)
        restarts = int(state(served_lab.inventory, second, RESTARTS))
        state(served_lab.inventory, first, "systemctl restart vllm@wide")
        releader = served_again(served_lab, first)
        assert int(state(served_lab.inventory, second, RESTARTS)) == restarts + 1
        said = state(served_lab.inventory, second, "journalctl -u vllm@wide --since -10min --no-pager -o cat")
        assert "the leader's rendezvous store at 10.254.0.1:" in said
        print(f"serving again {rejoined:.0f} s after the member started, {releader:.0f} s after the leader restarted")

        # The member upgraded (a change of its own that restarts it): the leader's node is drained first and put
        # back once the group answers, so the group's clients see 503 meanwhile, never the broken group's 502.
        changed = {**WIDE, "nodes": [first, second], "env": {**WIDE["env"], "GPUFLEET_TEST_MEMBER": "1"}}
        (host_vars / f"{second}.yml").write_text(yaml.safe_dump({"vllm_service_instances": [*instances, changed]}))
        done = threading.Event()
        seen: Counter[int] = Counter()
        client = threading.Thread(target=lambda: seen.update(statuses_while(served_lab, first, done)))
        client.start()
        try:
            result = gpufleet(
                tmp_path, "upgrade", "-i", str(served_lab.inventory), "--limit", second, "--layers", "serve"
            )
        finally:
            done.set()
            client.join()
        output = result.stdout + result.stderr
        print(f"the group's clients during the member's upgrade: {dict(seen)}")
        assert result.returncode == 0 and f"upgrade: {second}: upgraded" in output, output[-6000:]
        assert seen[503] > 0 and set(seen) <= {200, 503}, seen
        assert state(served_lab.inventory, first, THROUGH_PROXY).split() == ["200", "not-drained"]
        served_again(served_lab, first, within=30)
    finally:
        for host in (first, second):
            (host_vars / f"{host}.yml").unlink(missing_ok=True)
        run_playbooks(served_lab.inventory, ["serve.yml", "proxy.yml"], "--limit", f"{first},{second}")


def test_a_member_is_cordoned_only_with_its_leader(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    """Cordoned alone, a member would be stopped under a leader still taking the group's traffic: refused before any
    node is taken, naming the command that cordons both. (Only the declaration matters: nothing is served.)"""
    first, second = sorted(lab_hosts)[:2]
    instances = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
    for host in (first, second):
        declared = [*instances, {**WIDE, "nodes": [first, second]}]
        (host_vars / f"{host}.yml").write_text(yaml.safe_dump({"vllm_service_instances": declared}))
    cordon = ["cordon", "-i", str(lab_inventory), "--reason", "fan noise"]
    result = gpufleet(tmp_path, *cordon, "--limit", second)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output[-4000:]
    assert f"{second} is a member of vllm@wide, which {first} leads and serves" in output, output[-4000:]
    assert f"gpufleet cordon --limit {second},{first}" in output, output[-4000:]
    assert state(lab_inventory, second, THROUGH_PROXY).split()[-1] == "not-drained"
    assert "cordon" not in state(lab_inventory, second, "ls /etc/gpufleet 2>/dev/null || true")
