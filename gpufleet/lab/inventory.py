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


def instance_cores(position: int, cores: int) -> list[int]:
    """The cores of a host's two instances (main, greedy): each host a pair of the controller's cores, pairs taken
    in turn and swapped on every other round, so that on a 2-core controller the main instance that a rolling
    upgrade starts again on one host does not share its core with the next host's, serving meanwhile."""
    pairs = cores // 2
    if pairs == 0:
        return [0, 0]
    first = 2 * (position % pairs)
    pair = [first, first + 1]
    return pair[::-1] if (position // pairs) % 2 else pair


def host_vars(config: LabConfig, host: InventoryHost, cores: list[int]) -> dict[str, Any]:
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
        # The cores its instances' OpenMP threads are bound to (group_vars/all/serve.yml).
        "gpufleet_lab_cores": cores,
        **({"gpufleet_lab_cluster_address": host.cluster_address} if host.cluster_address else {}),
    }


def render(config: LabConfig, hosts: Sequence[InventoryHost], cores: int | None = None) -> str:
    """YAML text for the hosts, in the given order; `cores`: the controller's (default: os.cpu_count())."""
    count = cores or os.cpu_count() or 1
    entries = {host.name: host_vars(config, host, instance_cores(i, count)) for i, host in enumerate(hosts)}
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
