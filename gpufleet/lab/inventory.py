"""The Ansible inventory of the lab: group gpu_nodes, one entry per host, written atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from gpufleet.lab.config import LabConfig

HEADER = "# Written by `gpufleet lab up`; rewritten on every run, do not edit.\n"
RAY_CLUSTER_GROUP = "ray_cluster_lab"


class InventoryHost(NamedTuple):
    """One lab host's entry: where it is, its mirror, its OS and the Python its root file system carries."""

    name: str
    address: str
    mirror_url: str
    os: str
    python: str
    # Its address on the lab's cluster link (hosts 1 and 2), or "" for a host outside the Ray cluster.
    cluster_address: str = ""


def host_vars(config: LabConfig, host: InventoryHost) -> dict[str, str]:
    return {
        "ansible_host": host.address,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(config.private_key),
        # Host keys are checked against the lab's own known_hosts file, never disabled.
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={config.known_hosts} -o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null"
        ),
        "ansible_python_interpreter": host.python,
        "gpufleet_mirror_url": host.mirror_url,
        # Which lab image the host was made from (`gpufleet lab up --os`); Ansible's facts say the same.
        "gpufleet_lab_os": host.os,
        **({"gpufleet_lab_cluster_address": host.cluster_address} if host.cluster_address else {}),
    }


def render(config: LabConfig, hosts: Sequence[InventoryHost]) -> str:
    """YAML text for the hosts, in the given order."""
    entries = {host.name: host_vars(config, host) for host in hosts}
    children: dict[str, Any] = {"gpu_nodes": {"hosts": entries}}
    cluster = [host.name for host in hosts if host.cluster_address]
    if cluster:
        # One group per Ray cluster; its group_vars (inventories/lab/group_vars/ray_cluster_lab.yml) name the head.
        children[RAY_CLUSTER_GROUP] = {"hosts": {name: None for name in cluster}}
    document = {"all": {"children": children}}
    return HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1000)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, path)
