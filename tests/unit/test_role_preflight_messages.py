"""A role's preflight names the input that is missing, also when it runs outside the role's main entry point.

The drift layers load the roles' preflights with include_role tasks_from, which skips argument_specs: there,
a required input that is not declared must give the preflight's own message, not an undefined-variable
error. Run for real by ansible-playbook against this machine (connection local, nothing written).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: true
  gather_subset: ["!all"]
  tasks:
    - ansible.builtin.include_role:
        name: "{{ role_under_test }}"
        tasks_from: "{{ tasks_under_test }}"
"""


def _run_preflight(
    tmp_path: Path, role: str, extra: dict[str, object], tasks: str = "preflight.yml", inventory: str = ""
) -> subprocess.CompletedProcess[str]:
    """The role's tasks on localhost, in check mode; `inventory` (YAML) gives it other hosts beside."""
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    hosts = "localhost,"
    if inventory:
        hosts = str(tmp_path / "hosts.yml")
        Path(hosts).write_text(inventory)
    variables = {
        "role_under_test": role,
        "tasks_under_test": tasks,
        "ansible_python_interpreter": str(REPO / ".venv/bin/python"),
        **extra,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [
        str(REPO / ".venv/bin/ansible-playbook"),
        "-i",
        hosts,
        "--limit",
        "localhost",
        "--check",
        str(book),
        "-e",
        json.dumps(variables),
    ]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize(
    ("role", "extra", "message"),
    [
        # The roles derive their inputs from gpufleet_stack: without one, the lookup says what to declare.
        (
            "nvidia_driver",
            {"nvidia_driver_version": "580.95.05"},
            "no gpufleet_stack is declared for this host: declare one per GPU class in the inventory's group_vars",
        ),
        (
            "pyenv_python",
            {},
            "no gpufleet_stack is declared for this host: declare one per GPU class in the inventory's group_vars",
        ),
        # With a stack but no sha256 for a file the knowledge base cannot know, the fix is named.
        (
            "nvidia_driver",
            {
                "gpufleet_stack": {
                    "gpu": "H200",
                    "driver": "580.95.05",
                    "cuda": "13.0.2",
                    "python": "3.12",
                    "torch": "2.11.0",
                    "torch_variant": "cu130",
                    "vllm": "0.26.0",
                },
                "gpufleet_mirror_url": "https://mirror.invalid",
            },
            "no sha256 is known for NVIDIA-Linux-x86_64-580.95.05.run: add it to gpufleet_artifact_sha256",
        ),
    ],
)
def test_missing_required_input_is_named(tmp_path: Path, role: str, extra: dict[str, object], message: str) -> None:
    result = _run_preflight(tmp_path, role, extra)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert message in output
    assert "is undefined" not in output


def test_an_instance_on_ray_outside_a_cluster_is_refused_by_name(tmp_path: Path) -> None:
    # role vllm_service's preflight asks ray_cluster's client entry point how an instance on Ray joins its
    # cluster; on a node that heads none, the refusal says what to declare.
    result = _run_preflight(tmp_path, "ray_cluster", {}, tasks="client.yml")
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert "localhost declares an instance on Ray (distributed_executor_backend: ray) but is not the head" in output
    assert "ray_cluster_group unset, head unset" in output


ACROSS = {
    "name": "wide",
    "model": "/var/lib/gpufleet/models/tiny",
    "port": 8002,
    "tensor_parallel_size": 2,
    "distributed_executor_backend": "mp",
}


@pytest.mark.parametrize(
    ("instance", "extra"),
    [
        # localhost declares no cluster address: the other member cannot meet it.
        ({**ACROSS, "nodes": ["localhost", "lab-2"]}, {}),
        # Not among the instance's nodes.
        ({**ACROSS, "nodes": ["lab-1", "lab-2"]}, {"vllm_service_cluster_address": "10.254.0.1"}),
        # Multi-node needs vLLM's multiprocessing backend.
        ({**ACROSS, "nodes": ["localhost"], "distributed_executor_backend": None}, {}),
        # 3 nodes cannot share tensor_parallel_size 2.
        ({**ACROSS, "nodes": ["localhost", "a", "b"]}, {"vllm_service_cluster_address": "10.254.0.1"}),
    ],
)
def test_an_instance_across_nodes_that_cannot_meet_is_refused_before_the_node_changes(
    tmp_path: Path, instance: dict[str, object], extra: dict[str, object]
) -> None:
    variables = {"vllm_service_instances": [instance], "vllm_service_api_key": "k" * 32, **extra}
    result = _run_preflight(tmp_path, "vllm_service", variables)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert "vllm@wide across" in output and "declare it on each of these inventory hosts" in output, output[-3000:]


def test_a_rendezvous_port_that_another_instance_listens_on_is_refused(tmp_path: Path) -> None:
    members = (
        "all:\n  hosts:\n"
        "    localhost: {ansible_connection: local, vllm_service_cluster_address: 10.254.0.1}\n"
        "    lab-2: {vllm_service_cluster_address: 10.254.0.2}\n"
    )
    instances = [
        {**ACROSS, "nodes": ["localhost", "lab-2"], "rendezvous_port": 8000},
        {"name": "main", "model": "/var/lib/gpufleet/models/tiny", "port": 8000},
    ]
    variables = {"vllm_service_instances": instances, "vllm_service_api_key": "k" * 32}
    result = _run_preflight(tmp_path, "vllm_service", variables, inventory=members)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert "the rendezvous_port of each across nodes: 8002, 8000, 8000) must be unique" in output, output[-3000:]
