"""Module ray_cluster_info and role ray_cluster's unit: the node table of a real Ray 2.60.0 cluster (fixtures
captured from the lab's two members, tests/fixtures/ray), the probe run with a Python that has no Ray, and the
ray-head/ray-worker units rendered by Ansible from the role's template, hardened as vllm@ is."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.modules import ray_cluster_info
from gpufleet import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "ray"
ROLE = PROJECT_ROOT / "roles" / "ray_cluster"
UNIT = ROLE / "templates" / "etc" / "systemd" / "system" / "ray.service.j2"
VLLM_ROLE = PROJECT_ROOT / "roles" / "vllm_service"


def table(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())["nodes"]


def test_both_nodes_are_listed_alive_with_their_cpus_and_an_absent_member_is_named() -> None:
    nodes = ray_cluster_info.parse_nodes(table("node-table-two-nodes.json"))
    assert sorted(node["cpus"] for node in nodes) == [1.0, 2.0]
    assert all(node["alive"] and node["memory"] > 0 and len(node["node_id"]) == 56 for node in nodes)
    assert ray_cluster_info.missing_members(["192.0.2.2"], nodes) == []
    assert ray_cluster_info.missing_members(["192.0.2.2", "10.254.0.2"], nodes) == ["10.254.0.2"]


def test_a_stopped_node_stays_in_the_table_as_dead() -> None:
    nodes = ray_cluster_info.parse_nodes(table("node-table-one-stopped.json"))
    # The alive node first; the GCS keeps the dead one, with no resources left to offer.
    assert [(node["alive"], node["cpus"]) for node in nodes] == [(True, 2.0), (False, 0.0)]
    assert ray_cluster_info.alive_addresses(nodes) == ["192.0.2.2"]
    assert ray_cluster_info.alive_addresses([node for node in nodes if not node["alive"]]) == []


def test_the_probe_without_ray_says_why() -> None:
    # The controller's venv has no Ray: the real probe fails on its import and the module quotes it.
    result, error = ray_cluster_info.run_probe(str(Path(sys.executable).parent.parent), "127.0.0.1:6379")
    assert result is None and "No module named 'ray'" in error
    result, error = ray_cluster_info.run_probe("/nonexistent-venv", "127.0.0.1:6379")
    assert result is None and "/nonexistent-venv/bin/python does not exist" in error


def render(template: Path, role: Path, inventory: str = "", **extra: object) -> str:
    """The template rendered by `ansible -m template` on localhost with the role's defaults and vars (extra
    vars win) and an inventory (YAML text) when given."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-render-") as tree:
        variables = Path(tree) / "extra.json"
        variables.write_text(json.dumps(extra))
        out = Path(tree) / "out"
        # The role's defaults and vars as the inventory's all:vars, so that host variables override them as
        # they do in a play (extra vars would override the inventory's).
        document = yaml.safe_load(inventory or "all: {hosts: {localhost: {}}}")
        document["all"]["vars"] = {
            **yaml.safe_load((role / "defaults" / "main.yml").read_text()),
            **yaml.safe_load((role / "vars" / "main.yml").read_text()),
        }
        hosts = Path(tree) / "hosts.yml"
        hosts.write_text(yaml.safe_dump(document))
        command = [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-i",
            str(hosts),
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-m",
            "template",
            "-a",
            f"src={template} dest={out} mode=0600",
            "-e",
            f"@{variables}",
        ]
        result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, check=False)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return out.read_text()


# A two-node cluster, each member's address in the inventory.
INVENTORY = """
all:
  children:
    ray_cluster_lab:
      hosts:
        localhost: {ray_cluster_node_address: 10.254.0.1, ansible_connection: local}
        node-2: {ray_cluster_node_address: 10.254.0.2}
"""
CLUSTER = {
    "inventory": INVENTORY,
    "ray_cluster_group": "ray_cluster_lab",
    "ray_cluster_head": "localhost",
    "__ray_cluster_venv_path": "/opt/gpufleet/venvs/v-1234",
}


def exec_start(unit: str) -> list[str]:
    line = [line for line in unit.splitlines() if line.startswith("ExecStart=")][-1]  # after a reset ExecStart=
    return re.findall(r'"([^"]*)"', line)


def test_the_head_unit_starts_a_blocking_head_on_its_cluster_address_from_the_venvs_real_directory() -> None:
    unit = render(UNIT, ROLE, **CLUSTER)
    argv = exec_start(unit)
    assert argv[:4] == ["/opt/gpufleet/venvs/v-1234/bin/ray", "start", "--block", "--disable-usage-stats"]
    assert {"--head", "--port=6379", "--node-ip-address=10.254.0.1", "--include-dashboard=false"} <= set(argv)
    assert not [arg for arg in argv if arg.startswith("--address")]
    lines = unit.splitlines()
    assert "Restart=always" in lines and "User=vllm" in lines
    assert "IPAddressDeny=any" in lines and "IPAddressAllow=localhost 10.254.0.1/32 10.254.0.2/32" in lines


def test_a_worker_unit_joins_the_heads_gcs_and_honours_the_declared_networks() -> None:
    worker = {
        **CLUSTER,
        "ray_cluster_head": "node-2",
        "ray_cluster_networks": ["10.254.0.0/30"],
        "ray_cluster_num_gpus": 8,
    }
    unit = render(UNIT, ROLE, **worker)
    argv = exec_start(unit)
    assert "--address=10.254.0.2:6379" in argv and "--head" not in argv and "--num-gpus=8" in argv
    assert "IPAddressAllow=localhost 10.254.0.0/30" in unit.splitlines()


SANDBOX = re.compile(
    r"^(NoNewPrivileges|CapabilityBoundingSet|AmbientCapabilities|ProtectSystem|ProtectHome|PrivateTmp|"
    r"PrivateDevices|DevicePolicy|DeviceAllow|Protect[A-Za-z]+|Restrict[A-Za-z]+|LockPersonality|"
    r"RemoveIPC|KeyringMode|PrivateUsers|SystemCall[A-Za-z]+|UMask)="
)


def test_the_ray_units_are_sandboxed_exactly_as_vllm_instances() -> None:
    ray_unit = render(UNIT, ROLE, **CLUSTER).splitlines()
    vllm_unit = VLLM_ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2"
    vllm = render(vllm_unit, VLLM_ROLE).splitlines()
    assert [line for line in ray_unit if SANDBOX.match(line)] == [line for line in vllm if SANDBOX.match(line)]
    # Only the account differs: the cluster's, which its workers and an instance on Ray run as; each other instance
    # runs as a user of its own.
    assert "User=vllm" in ray_unit and "Group=vllm" in ray_unit
    assert "DynamicUser=yes" in vllm and "User=vllm-%i" in vllm


def test_a_ray_instance_on_a_gpu_cluster_renders_pipeline_stages_over_the_cluster() -> None:
    # What the lab cannot run (vLLM's CPU platform has no Ray device key): two 8-GPU nodes, tensor parallel
    # inside each, pipeline parallel across them, the instance started on the head.
    big = {
        "name": "big",
        "model": "/var/lib/gpufleet/models/llama-405b",
        "port": 8000,
        "gpus": list(range(8)),
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
    }
    dropin = VLLM_ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.d" / "gpufleet.conf.j2"
    # How the head joins its cluster, as role ray_cluster's client entry point says (tests/unit/
    # test_vllm_service_devices.py checks the environment it gives).
    client = {
        "address": "10.0.0.1:6379",
        "node_address": "10.0.0.1",
        "allowed": ["localhost", "10.0.0.0/24"],
        "user": "vllm",
        "group": "vllm",
        "home": "/var/lib/vllm",
    }
    unit = render(
        dropin,
        VLLM_ROLE,
        vllm_service_instances=[big],
        vllm_service_instance="{{ __vllm_service_instances[0] }}",
        ansible_facts={"memtotal_mb": 2_000_000},
        ray_cluster_client={**client, "socket_ifname": ""},
    )
    argv = exec_start(unit)
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--tensor-parallel-size"] == "8" and pairs["--pipeline-parallel-size"] == "2"
    assert pairs["--distributed-executor-backend"] == "ray"
    assert "IPAddressAllow=localhost 10.0.0.0/24" in unit.splitlines()
    # Without the key nothing changes for the single-node instances.
    single = {
        key: value
        for key, value in big.items()
        if key not in ("pipeline_parallel_size", "distributed_executor_backend")
    }
    unit = render(
        dropin,
        VLLM_ROLE,
        vllm_service_instances=[single],
        vllm_service_instance="{{ __vllm_service_instances[0] }}",
        ansible_facts={"memtotal_mb": 2_000_000},
    )
    assert "--distributed-executor-backend" not in exec_start(unit)


def test_the_probe_presents_the_clusters_token_only_when_given_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # H4: the cluster requires Ray's token; the probe reads it from the token file, and an operator's own
    # RAY_AUTH_* settings never leak into it.
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text('#!/bin/sh\necho "{\\"mode\\": \\"$RAY_AUTH_MODE\\", \\"path\\": \\"$RAY_AUTH_TOKEN_PATH\\"}"\n')
    python.chmod(0o755)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/home/operator/.ray/auth_token")
    with_token, _ = ray_cluster_info.run_probe(str(tmp_path), "10.254.0.1:6379", "/etc/gpufleet/ray-auth-token")
    without, _ = ray_cluster_info.run_probe(str(tmp_path), "10.254.0.1:6379")
    assert with_token == {"mode": "token", "path": "/etc/gpufleet/ray-auth-token"}
    assert without == {"mode": "", "path": ""}
