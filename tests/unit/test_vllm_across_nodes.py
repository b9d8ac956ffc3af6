"""An instance across nodes (its `nodes`, vLLM's multiprocessing backend): the drop-in and environment each member
renders from one declaration, by Ansible from role vllm_service's templates, and the proxy fronting the leader only."""

from __future__ import annotations

import re

import pytest
from test_ray_cluster_info import VLLM_ROLE, exec_start, render

DROPIN = VLLM_ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.d" / "gpufleet.conf.j2"
ENV = VLLM_ROLE / "templates" / "etc" / "vllm" / "instance.env.j2"
# Two members on the cluster link of the lab, 10.254.0.1 leading: the render runs on localhost, as one of them.
MEMBER = "{{vllm_service_cluster_address: {address}, vllm_service_cluster_ifname: cluster0, ansible_connection: local}}"
WIDE = {
    "name": "wide",
    "model": "/var/lib/gpufleet/models/tiny-qwen2",
    "port": 8002,
    "gpus": [0],
    "tensor_parallel_size": 2,
    "distributed_executor_backend": "mp",
}


def rendered(template: object, rank: int, launcher: str = "cli") -> str:
    """The template as the member of this rank renders it."""
    other = "lab-2" if rank == 0 else "lab-1"
    nodes = ["localhost", other] if rank == 0 else [other, "localhost"]
    inventory = (
        "all:\n  hosts:\n"
        f"    localhost: {MEMBER.format(address=f'10.254.0.{rank + 1}')}\n"
        f"    {other}: {MEMBER.format(address=f'10.254.0.{2 - rank}')}\n"
    )
    return render(
        template,
        VLLM_ROLE,
        inventory,
        vllm_service_instances=[{**WIDE, "nodes": nodes}],
        vllm_service_instance="{{ __vllm_service_instances[0] }}",
        vllm_service_launcher=launcher,
        vllm_service_api_key="k" * 32,
        ansible_facts={"memtotal_mb": 24000},
    )


def test_the_leader_serves_and_the_other_member_runs_headless_meeting_on_the_leaders_address() -> None:
    leader, member = (exec_start(rendered(DROPIN, rank)) for rank in (0, 1))
    pairs = dict(zip(leader, leader[1:]))
    assert leader[:3] == ["/opt/gpufleet/venvs/current/bin/vllm", "serve", WIDE["model"]]
    assert (pairs["--nnodes"], pairs["--node-rank"], pairs["--master-addr"], pairs["--master-port"]) == (
        "2",
        "0",
        "10.254.0.1",
        "29500",
    )
    assert pairs["--distributed-executor-backend"] == "mp" and "--headless" not in leader
    pairs = dict(zip(member, member[1:]))
    assert (pairs["--node-rank"], pairs["--master-addr"], member[-1]) == ("1", "10.254.0.1", "--headless")


@pytest.mark.parametrize("launcher", ["cli", "module"])
def test_a_headless_member_runs_the_roles_launcher_of_vllms_serve_command(launcher: str) -> None:
    argv = exec_start(rendered(DROPIN, 1, launcher=launcher))
    assert argv[:4] == [
        "/opt/gpufleet/venvs/current/bin/python",
        "/usr/local/lib/gpufleet-vllm-headless-member.py",
        "--model",
        WIDE["model"],
    ]
    assert argv[-1] == "--headless"


def test_members_reach_each_other_on_the_cluster_network_only() -> None:
    unit = rendered(DROPIN, 1).splitlines()
    assert [line for line in unit if line.startswith("IPAddressAllow=")] == ["IPAddressAllow=10.254.0.1 10.254.0.2"]
    env = dict(
        re.match(r'([A-Z_]+)="(.*)"$', line).groups()  # type: ignore[union-attr]
        for line in rendered(ENV, 1).splitlines()
        if re.match(r"[A-Z_]+=", line)
    )
    assert (env["VLLM_HOST_IP"], env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == (
        "10.254.0.2",
        "cluster0",
        "cluster0",
    )
