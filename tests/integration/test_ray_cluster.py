"""Issue 17 on the suite's two-host lab: the ray_cluster layer forms a cluster of the lab's Ray group (`gpufleet
lab up` links hosts 1 and 2 by a network of their own), both members are listed alive with their CPUs and the
same Ray, Python and vLLM (one lock), a Ray task that must run on both members does, a stopped worker is
detected by name and rejoins once started again, and a crashed worker is restarted by systemd and rejoins.

vLLM's CPU build cannot serve across the cluster: its platform has no Ray device key, and `vllm serve` with
`--distributed-executor-backend ray --pipeline-parallel-size 2` on the head exits with "current platform cpu
does not support ray." (run and asserted below, so the day it can this test says so); the instance's command
line for a GPU cluster is checked in tests/unit/test_ray_cluster_info.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.drift import read_report
from test_driver_support import recap_changed
from tests.integration.conftest import AnsibleRunner

BIN = Path(sys.executable).parent
VENV = "/opt/gpufleet/venvs/current"
GROUP = "ray_cluster_lab"
PORT = 6379
TOKEN_FILE = "/etc/gpufleet/ray-auth-token"
# The lab declares the cluster's members, head and network; the suite forms it only here.
ON = json.dumps({"ray_cluster_group": GROUP})

# Run as the service account on the head: a placement group of one CPU on each of two different nodes, and a
# task in each bundle reporting its node's address.
SPREAD = """
import json, sys, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=120)
where = ray.remote(num_cpus=1)(lambda: ray.util.get_node_ip_address())
refs = [where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote()
        for i in range(2)]
print(json.dumps(sorted(ray.get(refs, timeout=120))))
"""
NO_RAY_ON_CPU = "from vllm.platforms import current_platform as p; print(p.device_name, repr(p.ray_device_key))"
UNIT_RSS_KIB = (
    "cg=$(systemctl show -P ControlGroup {unit}); "
    "ps -o rss= -p \"$(paste -sd, /sys/fs/cgroup$cg/cgroup.procs)\" | awk '{{s += $1}} END {{print s}}'"
)
# An instance on Ray (pipeline parallel 2 over the cluster), written on the head by vllm_instance.yml as role
# vllm_service writes one, and a probe its unit runs first in place of vLLM: under the unit's own environment and
# sandbox, a Ray driver joins the cluster and lists the members alive.
ACROSS_INSTANCE = {
    "name": "across",
    "model": "/var/lib/gpufleet/models/tiny-qwen2",
    "port": 8097,
    "pipeline_parallel_size": 2,
    "distributed_executor_backend": "ray",
}
WRITE_ACROSS = json.dumps({"vllm_instance_hosts": f"{GROUP}[0]", "vllm_service_instances": [ACROSS_INSTANCE]})
ACROSS = "vllm@across.service"
PROBE_FILE = "/var/lib/vllm/gpufleet-ray-probe.py"
PROBE = """
import json, ray
ray.init(logging_level="ERROR", log_to_driver=False)
print("ray members alive " + json.dumps(sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])))
"""
# Run the instance's unit once (no restart) and wait for it to end: its journal of that run, and its state.
RUN_ACROSS = (
    "mkdir -p /run/systemd/system/{unit}.d && printf '[Service]\\nRestart=no\\n{exec_start}' "
    "> /run/systemd/system/{unit}.d/once.conf && systemctl daemon-reload && systemctl reset-failed {unit}; "
    "since=$(date '+%Y-%m-%d %H:%M:%S'); systemctl start {unit}; "
    "for _ in $(seq 300); do systemctl is-active -q {unit} || break; sleep 1; done; "
    'journalctl -u {unit} --since "$since" -o cat --no-pager | tail -400; systemctl is-active {unit} || true'
)


def members(inventory: Path) -> dict[str, str]:
    """The lab's Ray group, head first: inventory name -> cluster address."""
    document = yaml.safe_load(inventory.read_text())["all"]["children"]
    hosts = document["gpu_nodes"]["hosts"]
    return {name: hosts[name]["gpufleet_lab_cluster_address"] for name in document[GROUP]["hosts"]}


def playbook(
    inventory: Path, path: str = "playbooks/ray_cluster.yml", *extra_vars: str
) -> subprocess.CompletedProcess[str]:
    """A playbook run on the lab with the cluster declared (and any further extra vars, each a JSON document)."""
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            path,
            "-e",
            ON,
            *[arg for v in extra_vars for arg in ("-e", v)],
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=900,
        check=False,
    )


def drift(inventory: Path, runs: Path) -> tuple[int, object]:
    """`gpufleet drift` of the ray_cluster layer with the cluster declared: (exit code, report)."""
    result = subprocess.run(
        [str(BIN / "gpufleet"), "drift", "-i", str(inventory), "--layers", "ray_cluster", "-e", ON],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
        check=False,
        env={**os.environ, "GPUFLEET_RUNS_DIR": str(runs)},
    )
    reports = sorted(runs.glob("*-drift"))
    assert reports, result.stdout + result.stderr
    return result.returncode, read_report(reports[-1] / "drift")


def cluster_info(
    inventory: Path, node: str, address: str, expect: list[str], timeout: int, token: str = TOKEN_FILE
) -> dict:
    """ray_cluster_info's result on `node`, presenting the cluster's token (or none: token ""), with `failed` from
    ansible's exit status (the tree's result of a failed module carries no `failed` key on ansible-core 2.19)."""
    args = json.dumps(
        {"venv": VENV, "address": address, "members": expect, "timeout": timeout, "auth_token_file": token}
    )
    with tempfile.TemporaryDirectory(prefix="gpufleet-ray-") as tree:
        ran = subprocess.run(
            [
                str(BIN / "ansible"),
                "-i",
                str(inventory),
                node,
                "-m",
                "gpufleet.fleet.ray_cluster_info",
                "-a",
                args,
                "--tree",
                tree,
            ],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            timeout=timeout + 300,
            check=False,
        )
        return {**json.loads((Path(tree) / node).read_text()), "failed": ran.returncode != 0}


def shell(ansible: AnsibleRunner, node: str, command: str) -> str:
    return ansible(node, "ansible.builtin.shell", command)[node]["stdout"]


def remove_cluster(ansible: AnsibleRunner) -> None:
    """The lab as the suite had it: no Ray unit, no Ray state."""
    ansible(
        GROUP,
        "ansible.builtin.shell",
        f"systemctl stop {ACROSS} 2>/dev/null; systemctl reset-failed {ACROSS} 2>/dev/null; "
        f"rm -rf /etc/systemd/system/{ACROSS}.d /run/systemd/system/{ACROSS}.d /etc/vllm/across.env "
        f"/var/lib/gpufleet/vllm/across.* {PROBE_FILE}; "
        "systemctl disable --now ray-head.service ray-worker.service 2>/dev/null; "
        "rm -f /etc/systemd/system/ray-head.service /etc/systemd/system/ray-worker.service; "
        # A worker stopped while the head stops too exits 1 (its drain finds no GCS): the unit ends failed and
        # would leave the host degraded for the tests after this one.
        "systemctl daemon-reload; systemctl reset-failed ray-head.service ray-worker.service 2>/dev/null; "
        f"rm -rf /var/lib/vllm/ray {TOKEN_FILE}",
    )


@pytest.mark.slow
def test_the_lab_cluster_forms_runs_on_both_members_and_recovers_a_lost_worker(
    lab_inventory: Path, ansible: AnsibleRunner, tmp_path: Path
) -> None:
    try:
        form_check_and_break(lab_inventory, ansible, tmp_path)
    finally:
        remove_cluster(ansible)


def form_check_and_break(lab_inventory: Path, ansible: AnsibleRunner, runs: Path) -> None:
    started = time.monotonic()
    nodes = members(lab_inventory)
    (head, head_address), (worker, worker_address) = list(nodes.items())[:2]
    gcs = f"{head_address}:{PORT}"
    everyone = [head_address, worker_address]

    formed = playbook(lab_inventory)
    assert formed.returncode == 0, formed.stdout[-4000:]
    again = playbook(lab_inventory)
    assert again.returncode == 0 and set(recap_changed(again.stdout).values()) == {0}, again.stdout[-4000:]
    converged = time.monotonic()

    listed = {node: cluster_info(lab_inventory, node, gcs, everyone, 0) for node in (head, worker)}
    for result in listed.values():
        assert not result.get("failed"), result
        assert result["alive"] == sorted(everyone) and all(n["cpus"] > 0 for n in result["nodes"] if n["alive"])
    # One lock: the same Ray, Python and vLLM on both members.
    assert listed[head]["versions"] == listed[worker]["versions"]
    assert listed[head]["versions"]["ray"] == "2.60.0" and listed[head]["versions"]["vllm"] == "0.32.0"

    script = base64.b64encode(SPREAD.encode()).decode()
    ran_on = shell(
        ansible,
        head,
        f"echo {script} | base64 -d > /tmp/gpufleet-ray-spread.py && "
        f"runuser -u vllm -- env RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={TOKEN_FILE} "
        f"{VENV}/bin/python /tmp/gpufleet-ray-spread.py {gcs}; "
        "status=$?; rm -f /tmp/gpufleet-ray-spread.py; exit $status",
    )
    assert json.loads(ran_on.splitlines()[-1]) == sorted(everyone)
    # H4: a client that presents no token (any local user, any host of the cluster's networks) is refused.
    stranger = cluster_info(lab_inventory, worker, gcs, everyone, 0, token="")
    assert stranger.get("failed") and "uthentic" in stranger["msg"], stranger
    # The token is the cluster account's alone: not the instances' group's.
    assert shell(ansible, head, f"stat -c '%U %G %a' {TOKEN_FILE}") == "vllm root 400"
    assert shell(ansible, head, f"{VENV}/bin/python -c '{NO_RAY_ON_CPU}'").splitlines()[-1] == "cpu ''"

    # The lab has no memory accounting (MemoryCurrent is [not set]): the resident memory of the unit's processes.
    memory = {
        node: int(shell(ansible, node, UNIT_RSS_KIB.format(unit=f"ray-{kind}.service"))) // 1024
        for node, kind in ((head, "head"), (worker, "worker"))
    }
    # An instance on Ray as the role writes it, on the head: its unit joins the cluster (a probe in vLLM's place
    # lists both members), then vLLM itself, asked to serve the tiny model across them, says it cannot.
    written = playbook(lab_inventory, "tests/integration/vllm_instance.yml", WRITE_ACROSS)
    assert written.returncode == 0, written.stdout[-4000:]
    script = base64.b64encode(PROBE.encode()).decode()
    shell(ansible, head, f"echo {script} | base64 -d > {PROBE_FILE} && chmod 0644 {PROBE_FILE}")
    probe = f"ExecStart=\\nExecStart={VENV}/bin/python {PROBE_FILE}\\n"
    joined = shell(ansible, head, RUN_ACROSS.format(unit=ACROSS, exec_start=probe))
    assert f"ray members alive {json.dumps(sorted(everyone))}" in joined, joined[-3000:]
    refused = shell(ansible, head, RUN_ACROSS.format(unit=ACROSS, exec_start=""))
    assert "current platform cpu does not support ray." in refused, refused[-3000:]
    assert refused.splitlines()[-1] == "inactive", refused[-3000:]
    checked = time.monotonic()

    shell(ansible, worker, "systemctl stop ray-worker.service")
    try:
        lost = cluster_info(lab_inventory, head, gcs, everyone, 30)
        assert lost.get("failed") and lost["missing"] == [worker_address], lost
        assert f"{worker_address} not listed alive" in lost["msg"]
        assert any(n["address"] == worker_address and not n["alive"] for n in lost["nodes"])
        code, report = drift(lab_inventory, runs / "lost")
        assert code == 2
        head_findings = [
            (item.field, item.expected, item.actual) for item in report.nodes[head].layers["ray_cluster"].drift
        ]
        assert head_findings == [(f"member {worker}", "alive", "dead")], head_findings
        assert report.nodes[worker].layers["ray_cluster"].status == "drifted"
        # As the driver layer leaves a member (its workers hold the GPUs of an instance on Ray): stopped, and named
        # in nvidia_driver_stopped_instances. site.yml's last play starts it again through ray_cluster's resume,
        # which waits until the cluster lists it alive.
        stopped = json.dumps({"nvidia_driver_stopped_instances": ["ray-worker.service"]})
        resumed = playbook(lab_inventory, "playbooks/resume.yml", stopped)
        assert resumed.returncode == 0, resumed.stdout[-4000:]
        assert recap_changed(resumed.stdout) == {head: 0, worker: 1}, resumed.stdout[-4000:]
    finally:
        shell(ansible, worker, "systemctl start ray-worker.service")
    back = cluster_info(lab_inventory, head, gcs, everyone, 120)
    assert not back.get("failed"), back
    code, report = drift(lab_inventory, runs / "back")
    assert code == 0 and {report.nodes[n].layers["ray_cluster"].status for n in (head, worker)} == {"ok"}
    detected = time.monotonic()

    # A crash (every process of the unit killed): systemd starts it again and it rejoins.
    restarts = int(shell(ansible, worker, "systemctl show -P NRestarts ray-worker.service"))
    shell(ansible, worker, "systemctl kill --signal=SIGKILL ray-worker.service")
    # The head lists a killed worker alive until its heartbeats time out: the rejoin is asked after systemd has
    # started the worker again (RestartSec).
    shell(
        ansible,
        worker,
        "for _ in $(seq 120); do "
        f'[ "$(systemctl show -P NRestarts ray-worker.service)" -gt {restarts} ] && exit 0; '
        "sleep 1; done; echo 'ray-worker was not restarted'; exit 1",
    )
    rejoined = cluster_info(lab_inventory, head, gcs, everyone, 180)
    assert not rejoined.get("failed"), rejoined
    ended = time.monotonic()
    print(
        f"ray cluster: converge x2 {converged - started:.0f} s, checks {checked - converged:.0f} s, "
        f"stop/detect/rejoin {detected - checked:.0f} s, crash/rejoin {ended - detected:.0f} s; "
        f"resident memory MiB {memory}; vLLM across the cluster: "
        f"{[line for line in refused.splitlines() if 'does not support ray' in line][-1]}"
    )
