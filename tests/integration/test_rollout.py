"""`gpufleet upgrade` and `gpufleet cordon` on the lab (issue 13): a rollout whose first node fails its health
gate after a driver upgrade stops there, with that node rolled back to what it served before (its driver
reinstalled and rebooted into) and serving again, and the next node untouched; a proxy change that nginx
accepts but that breaks the way to the instances is rolled back (the site of before, nginx reloaded) while the
instances keep running; a cordoned node is skipped by the rollout, refused when named without --force, and
still cordoned afterwards; an instance out of service before an upgrade is out of service after it. The
declaration change of each test is a host_vars file beside the lab inventory, removed after.

The suite's shared lab has two nodes: the failing node is the first, and the second is the "untouched" one of
the issue's three-node case; on a lab of three or more the rollout takes three nodes, two of them untouched.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from test_drift_support import gpufleet
from test_driver_support import boot_id, publish_standins, sh

pytestmark = pytest.mark.lab

LAB_VARS = Path(__file__).resolve().parents[2] / "inventories" / "lab" / "group_vars" / "all"
SERVE_VARS = LAB_VARS / "serve.yml"
DRIVER = (
    "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u; "
    'python3 -c \'import json; print(json.load(open("/var/lib/gpufleet/nvidia-driver.json"))["version"])\''
)
# What one node serves: the venv and model links, the unit configuration, which instances run, and since when.
SERVING = (
    "readlink /opt/gpufleet/venvs/current /var/lib/gpufleet/models/*; "
    "sha256sum /etc/systemd/system/vllm@.service /etc/systemd/system/vllm@*.service.d/gpufleet.conf "
    "/etc/vllm/*.env /var/lib/gpufleet/vllm/*.started"
)
RUNNING = "systemctl is-active vllm@main vllm@greedy; systemctl show -p ActiveEnterTimestamp vllm@main vllm@greedy"
THROUGH_PROXY = (
    "curl -sk -o /dev/null -w '%{http_code}\\n' https://127.0.0.1/health; "
    "test -e /etc/gpufleet/drain && echo drained || echo not-drained"
)

# The header the gate's probe sends; nginx honours it for GET /health from the node itself only.
GATE_PROBE = "curl -sk -o /dev/null -w '%{{http_code}}\\n' -H 'X-Gpufleet-Gate: 1' https://{address}{path}"


@pytest.fixture()
def nodes(lab_inventory: Path, lab_hosts: dict[str, dict]) -> tuple[Path, str, str]:
    first, second = sorted(lab_hosts)[:2]
    return lab_inventory, first, second


def state(inventory: Path, node: str, script: str) -> str:
    rc, text = sh(inventory, node, script)
    assert rc == 0, text[-2000:]
    return text


def test_a_node_that_fails_its_gate_is_rolled_back_and_the_rollout_stops(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    # The first node fails; the next ones (one on the suite's lab, two on a lab of three or more: the issue's
    # three-node rollout) must be left untouched.
    inventory, (failing, *others) = lab_inventory, sorted(lab_hosts)[:3]
    before = {node: state(inventory, node, SERVING) for node in (failing, *others)}
    # What the rollback must give back: the converged lab serves both instances on each node.
    assert state(inventory, failing, RUNNING).splitlines()[:2] == ["active", "active"]
    others_running = {node: state(inventory, node, RUNNING) for node in others}
    stack = yaml.safe_load((LAB_VARS / "stack.yml").read_text())["gpufleet_stack"]
    assert state(inventory, failing, DRIVER).split() == [stack["driver"]] * 2
    booted = boot_id(inventory, failing)
    # The driver the failing node is upgraded to: the newest of the lab's stand-ins (lab/runfiles/build.py).
    newer_driver = max(
        (
            name.removeprefix("NVIDIA-Linux-x86_64-").removesuffix(".run")
            for name in publish_standins()
            if name.startswith("NVIDIA-Linux-x86_64-")
        ),
        key=lambda version: tuple(int(part) for part in version.split(".")),
    )
    assert newer_driver != stack["driver"]
    # The change: a newer driver (installed, and rebooted into), and an option vLLM refuses, so each instance
    # exits at start and never passes /health; a short gate so the test does not wait the lab's ten minutes, and a
    # restart delay longer than the gate, so the rollback finds the instance in its crash loop's auto-restart
    # (service_facts calls that "stopped").
    defaults = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instance_defaults"]
    (host_vars / f"{failing}.yml").write_text(
        yaml.safe_dump(
            {
                "gpufleet_stack": {**stack, "driver": newer_driver},
                "vllm_service_instance_defaults": {**defaults, "extra_args": ["--gpufleet-no-such-option"]},
                "vllm_service_health_timeout": 45,
                "vllm_service_restart_sec": 60,
            }
        )
    )
    for other in others:
        (host_vars / f"{other}.yml").write_text(
            yaml.safe_dump({"vllm_service_instance_defaults": {**defaults, "max_num_seqs": 8}})
        )

    result = gpufleet(
        tmp_path,
        "upgrade",
        "-i",
        str(inventory),
        "--limit",
        ",".join([failing, *others]),
        "--max-unavailable",
        "1",
        "--layers",
        "driver,serve,proxy",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-6000:]
    assert re.search(rf"upgrade: {failing}: layers driver, serve, proxy", output), output[-6000:]
    assert re.search(
        rf"upgrade: {failing}: rolled_back \(layers driver, serve, proxy, [0-9.]+ s\) - .*health did not answer 2xx",
        output,
    ), output[-6000:]
    # Why, in vLLM's own words: the last error line of the instance's journal.
    assert "last error: api_server.py: error: unrecognized arguments: --gpufleet-no-such-option" in output, output[
        -6000:
    ]
    assert re.search(
        rf"rolled back to what it served before \(vllm@\S+, vllm@\S+ on driver {stack['driver']}\), serving", output
    ), output[-6000:]
    for other in others:
        assert f"upgrade: {other}: not started" in output
    assert f"gpufleet: error: the rollout stopped: {failing}: rolled_back" in output

    # The failed node runs its driver of before (NVML through nvidia-smi, and the role's record): the rollback
    # reinstalled it and rebooted, or NVML would report the newer module still loaded.
    assert boot_id(inventory, failing) != booted
    assert state(inventory, failing, DRIVER).split() == [stack["driver"]] * 2
    # It serves what it served before, through its proxy, undrained.
    assert state(inventory, failing, SERVING) == before[failing]
    assert state(inventory, failing, RUNNING).splitlines()[:2] == ["active", "active"]
    # Started by the rollback from the restored configuration, not by the failed one's crash loop restarting
    # it (a stop and a start set systemd's count of automatic restarts to 0).
    assert state(inventory, failing, "systemctl show -p NRestarts --value vllm@main vllm@greedy").split() == ["0", "0"]
    assert state(inventory, failing, THROUGH_PROXY).split() == ["200", "not-drained"]
    # The next nodes were never touched: same state, their instances not restarted.
    for other in others:
        assert state(inventory, other, SERVING) == before[other]
        assert state(inventory, other, RUNNING) == others_running[other]


@pytest.mark.slow
@pytest.mark.parametrize("cordoned", [False, True], ids=["in-service", "cordoned-and-forced"])
def test_a_proxy_change_that_breaks_the_way_to_the_instances_is_rolled_back(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path, cordoned: bool
) -> None:
    """Also on a cordoned node that the upgrade is forced onto (review L13): its gate expected the cordon's 503,
    which nginx answers before any backend, so a broken site passed; now the gate's probe must get 200 too."""
    inventory, node = lab_inventory, sorted(lab_hosts)[0]
    site = "sha256sum /etc/nginx/conf.d/gpufleet-inference.conf"
    site_before = state(inventory, node, site)
    running_before = state(inventory, node, RUNNING)
    # A port typo: nginx accepts the site (nothing checks that 8099 listens), and the node's /health, the first
    # route's instance through the proxy, answers 502.
    instances = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
    backends = [{**item, "port": 8099} if item["name"] == "main" else item for item in instances]
    (host_vars / f"{node}.yml").write_text(yaml.safe_dump({"inference_proxy_backends": backends}))
    upgrade = ["upgrade", "-i", str(inventory), "--limit", node, "--layers", "proxy"]
    if cordoned:
        result = gpufleet(tmp_path, "cordon", "-i", str(inventory), "--limit", node, "--reason", "forced upgrade")
        assert result.returncode == 0, result.stdout + result.stderr
        upgrade.append("--force")
    try:
        result = gpufleet(tmp_path, *upgrade)
    finally:
        in_service = gpufleet(tmp_path, "uncordon", "-i", str(inventory), "--limit", node) if cordoned else None
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-6000:]
    assert re.search(rf"upgrade: {node}: rolled_back \(layers proxy, [0-9.]+ s\) - .*Status code was 502", output), (
        output[-6000:]
    )
    assert in_service is None or in_service.returncode == 0, in_service.stdout + in_service.stderr

    # nginx serves the site of before again, and the instances, which a proxy change does not stop, never stopped.
    assert state(inventory, node, site) == site_before
    assert state(inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
    assert state(inventory, node, RUNNING) == running_before


def test_a_cordoned_node_is_skipped_refused_when_named_and_stays_cordoned(
    nodes: tuple[Path, str, str], lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    inventory, node, cordoned = nodes
    result = gpufleet(tmp_path, "cordon", "-i", str(inventory), "--limit", cordoned, "--reason", "rollout test")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        site = state(inventory, cordoned, "sha256sum /etc/nginx/conf.d/gpufleet-inference.conf")
        # A change of the cordoned node's proxy only; the other node matches its declaration.
        (host_vars / f"{cordoned}.yml").write_text(yaml.safe_dump({"inference_proxy_drain_retry_after": 31}))

        # The whole fleet: the cordoned node is not named, so it is skipped, not refused.
        result = gpufleet(tmp_path, "upgrade", "-i", str(inventory), "--layers", "proxy")
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-6000:]
        assert f"{cordoned}: cordoned: rollout test" in output
        assert re.search(rf"upgrade: {cordoned}: skipped - cordoned: rollout test; cordoned, not touched", output), (
            output
        )
        assert f"upgrade: {node}: unchanged" in output

        result = gpufleet(tmp_path, "upgrade", "-i", str(inventory), "--limit", cordoned, "--layers", "proxy")
        output = result.stdout + result.stderr
        assert result.returncode == 1, output[-6000:]
        assert f"{cordoned} is cordoned (rollout test, since" in output and "only when forced" in output

        assert state(inventory, cordoned, "sha256sum /etc/nginx/conf.d/gpufleet-inference.conf") == site
        cordon = json.loads(state(inventory, cordoned, "cat /etc/gpufleet/cordon"))
        assert cordon["reason"] == "rollout test"
        assert state(inventory, cordoned, THROUGH_PROXY).split() == ["503", "not-drained"]
        # The gate's probe (an upgrade forced onto a cordoned node) reaches the instance: /health, from the node.
        assert state(inventory, cordoned, GATE_PROBE.format(address="127.0.0.1", path="/health")).split() == ["200"]
        # Anything else with its header is still refused: another path from the node, /health from elsewhere.
        assert state(inventory, cordoned, GATE_PROBE.format(address="127.0.0.1", path="/v1/models")).split() == ["503"]
        address = lab_hosts[cordoned]["ansible_host"]
        from_elsewhere = subprocess.run(
            shlex.split(GATE_PROBE.format(address=address, path="/health")),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert from_elsewhere.stdout.split() == ["503"], from_elsewhere.stderr
    finally:
        result = gpufleet(tmp_path, "uncordon", "-i", str(inventory), "--limit", cordoned)
    assert result.returncode == 0, result.stdout + result.stderr
    assert state(inventory, cordoned, THROUGH_PROXY).split() == ["200", "not-drained"]


@pytest.mark.slow
def test_an_instance_out_of_service_before_an_upgrade_stays_so(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    state(lab_inventory, node, "systemctl stop vllm@greedy")
    try:
        # The stopped instance is the serve layer's drift, so the upgrade rebuilds serve on the node; that layer
        # starts every declared instance, and the upgrade must take greedy out of service again.
        result = gpufleet(tmp_path, "upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve")
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-6000:]
        assert re.search(rf"upgrade: {node}: upgraded \(layers serve, [0-9.]+ s\)", output), output[-6000:]
        assert state(lab_inventory, node, "systemctl is-active vllm@main vllm@greedy || true").split() == [
            "active",
            "inactive",
        ]
        assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
    finally:
        # Its configuration is what it was: starting it is enough, /health tells when it serves.
        port = next(
            item["port"]
            for item in yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
            if item["name"] == "greedy"
        )
        state(
            lab_inventory,
            node,
            f"systemctl start vllm@greedy && for i in $(seq 200); do "
            f"curl -sf -o /dev/null http://127.0.0.1:{port}/health && exit 0; sleep 3; done; exit 1",
        )
    assert state(lab_inventory, node, RUNNING).splitlines()[:2] == ["active", "active"]
