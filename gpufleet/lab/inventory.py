"""The Ansible inventory of the lab: group gpu_nodes, one entry per host, written atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from gpufleet.lab.config import LabConfig

HEADER = "# Written by `gpufleet lab up`; rewritten on every run, do not edit.\n"
PYTHON_INTERPRETER = "/usr/bin/python3.11"


def host_vars(config: LabConfig, address: str, mirror_url: str) -> dict[str, str]:
    return {
        "ansible_host": address,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(config.private_key),
        # Host keys are checked against the lab's own known_hosts file, never disabled.
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={config.known_hosts} -o StrictHostKeyChecking=yes "
            "-o GlobalKnownHostsFile=/dev/null"
        ),
        "ansible_python_interpreter": PYTHON_INTERPRETER,
        "gpufleet_mirror_url": mirror_url,
    }


def render(config: LabConfig, hosts: Sequence[tuple[str, str, str]]) -> str:
    """YAML text for (name, address, mirror_url) triples, hosts in the given order."""
    entries = {name: host_vars(config, address, url) for name, address, url in hosts}
    document = {"all": {"children": {"gpu_nodes": {"hosts": entries}}}}
    return HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1000)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, path)
