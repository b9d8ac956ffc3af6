"""`gpufleet plan -i INVENTORY`: every targeted host's stack validated as preflight validates it, grouped by
GPU class (hosts that resolve to the same chain), with every artifact each class would install.

The plan is playbooks/preflight.yml's checks without a playbook run (issue 37): gpufleet.plan_worker reads each
host's variables through Ansible's own inventory, vault and templating, and calls the functions preflight's action
plugins call (the stack and its conflicts with role variables, every role's values, each instance's capacity),
once per distinct declaration. No host is contacted; 1,000 hosts take seconds (bench/scale_plan.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.ansible_options import current_options, settings_environment
from gpufleet.collection import collections_dir
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.inventory import target_nodes
from gpufleet.runner import run_environment, with_hint
from gpufleet.upstreams import Upstream, load_upstreams, upstream_of

SCHEMA = "gpufleet.fleet-plan/v1"


@dataclass
class HostPlan:
    host: str
    ok: bool
    message: str
    result: dict[str, Any]
    capacity: list[dict[str, Any]] = field(default_factory=list)  # one verdict per instance (capacity_check)
    models: dict[str, Any] = field(default_factory=dict)  # {mirror_url, models: [...]} (preflight's fact)


@dataclass
class StackClass:
    """Hosts whose stacks resolve to the same chain and artifacts."""

    chain: dict[str, Any]
    stack: dict[str, Any]
    artifacts: list[dict[str, Any]]
    warnings: list[str]
    hosts: list[str] = field(default_factory=list)


def capacity_failures(plan: HostPlan) -> list[dict[str, Any]]:
    return [verdict for verdict in plan.capacity if verdict["status"] in ("does_not_fit", "refused")]


def without_urls(value: Any) -> Any:
    """The chain and artifacts less their mirror URLs: hosts may reach one mirror by different addresses."""
    if isinstance(value, dict):
        return {key: without_urls(item) for key, item in value.items() if key != "url"}
    if isinstance(value, list):
        return [without_urls(item) for item in value]
    return value


def classes(plans: list[HostPlan]) -> list[StackClass]:
    """Hosts grouped by what they install (the first host's mirror URLs are the ones shown)."""
    grouped: dict[str, StackClass] = {}
    for plan in plans:
        if not plan.ok:
            continue
        chain = plan.result["chain"]
        key = json.dumps(without_urls([chain, plan.result["artifacts"]]), sort_keys=True)
        if key not in grouped:
            grouped[key] = StackClass(
                chain, plan.result["stack"], plan.result["artifacts"], list(plan.result.get("warnings") or [])
            )
        grouped[key].hosts.append(plan.host)
    return list(grouped.values())


def plan_inventory(inventory: Path, limit: str | None = None, envvars: dict[str, str] | None = None) -> list[HostPlan]:
    """Each targeted host's preflight, from gpufleet.plan_worker run with the environment a playbook run gets."""
    target_nodes(inventory, limit)
    options = current_options()
    environment = run_environment(dict(os.environ))
    with tempfile.TemporaryDirectory(prefix="gpufleet-plan-") as directory:
        # The operator's inline -e values, as the runner gives them to ansible-playbook: a file of variables after
        # the operator's own @FILEs, so they win.
        inline = Path(directory) / "extravars"
        inline.write_text(json.dumps(options.inline_vars))
        request = {
            "inventory": str(inventory.absolute()),  # not resolve(): group_vars sit beside a linked file
            "limit": limit or "",
            "var_files": [*options.var_files, str(inline)],
            "vault_password_files": list(options.vault_password_files),
            "vault_password": options.vault_password,
        }
        completed = subprocess.run(
            [sys.executable, "-m", "gpufleet.plan_worker"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            check=False,
            env={
                **environment,
                **settings_environment(environment, Path.cwd(), collections_dir()),
                "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
                **(envvars or {}),
            },
        )
    if completed.returncode != 0:
        raise GpufleetError(f"the plan of {inventory} failed: {completed.stderr.strip()[-2000:]}")
    answer = json.loads(completed.stdout)
    if "error" in answer:
        raise UsageError(f"no host of {inventory} was validated: {with_hint(answer['error'])}")
    shared = answer["shared"]
    plans = [
        HostPlan(
            item["host"],
            item["ok"],
            item["message"],
            shared[item["result"]],
            capacity=shared[item["capacity"]] if item["capacity"] is not None else [],
            models=shared[item["models"]] if item["models"] is not None else {},
        )
        for item in answer["hosts"]
    ]
    if not plans:
        raise GpufleetError(f"no host of {inventory} was validated")
    return plans


def capacity_groups(plans: list[HostPlan]) -> list[dict[str, Any]]:
    """Hosts whose instances get the same verdicts, with those verdicts (one group per distinct declaration)."""
    grouped: dict[str, dict[str, Any]] = {}
    for plan in plans:
        if not plan.capacity:
            continue
        key = json.dumps(plan.capacity, sort_keys=True)
        grouped.setdefault(key, {"hosts": [], "instances": plan.capacity})["hosts"].append(plan.host)
    return list(grouped.values())


def document(inventory: Path, plans: list[HostPlan]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "inventory": str(inventory),
        "compatible": all(plan.ok and not capacity_failures(plan) for plan in plans),
        "capacity": capacity_groups(plans),
        "classes": [
            {
                "hosts": item.hosts,
                "stack": item.stack,
                "chain": item.chain,
                "artifacts": item.artifacts,
                "warnings": item.warnings,
            }
            for item in classes(plans)
        ],
        "failed": [
            {
                "host": plan.host,
                "message": plan.message,
                "errors": plan.result.get("errors", []),
                "conflicts": plan.result.get("conflicts", []),
            }
            for plan in plans
            if not plan.ok
        ],
        "capacity_failed": [
            {"host": plan.host, "instance": verdict["instance"], "message": verdict["message"]}
            for plan in plans
            for verdict in capacity_failures(plan)
        ],
    }


# What the example inventory pins for files nobody can know in advance (a driver runfile, pyenv's archive).
PLACEHOLDER_SHA256 = "0" * 64


def sha256_note(artifact: dict[str, Any], upstreams: list[Upstream]) -> str:
    """Where the sha256 came from; a placeholder pin is named as one, with where the real value comes from, and a
    pin of a file whose upstream publishes no checksum (a driver runfile) as trust on first download."""
    if artifact["sha256"] == PLACEHOLDER_SHA256:
        return (
            f"{artifact['sha256_source']}: a PLACEHOLDER, not a checksum; the nodes would refuse the file: "
            "`gpufleet mirror sync` fetches it and prints its sha256 to pin"
        )
    upstream = upstream_of(str(artifact["name"]), upstreams)
    if (
        upstream is not None
        and upstream.checksum_kind == "none"
        and str(artifact["sha256_source"]).startswith("inventory")
    ):
        return (
            f"{artifact['sha256_source']}: trust on first download, its upstream publishes no sha256 to check it "
            "against; compare it with a copy from elsewhere"
        )
    return str(artifact["sha256_source"])


def render(plan: dict[str, Any]) -> str:
    lines = [
        f"inventory {plan['inventory']}: "
        + ("COMPATIBLE" if plan["compatible"] else "NOT COMPATIBLE")
        + f", {len(plan['classes'])} GPU class(es), {len(plan['failed'])} host(s) failing"
        + (f", {len(plan['capacity_failed'])} instance(s) that cannot start" if plan["capacity_failed"] else "")
    ]
    upstreams = load_upstreams()
    for number, item in enumerate(plan["classes"], start=1):
        lines.append("")
        lines.append(f"class {number}: {len(item['hosts'])} host(s): {', '.join(item['hosts'])}")
        lines.extend("  " + line for line in chain_lines(item["stack"], item["chain"]))
        lines.append("  artifacts:")
        for artifact in item["artifacts"]:
            lines.append(f"    {artifact['layer']:<8} {artifact['name']}")
            lines.append(f"             {artifact['url']}")
            lines.append(f"             sha256 {artifact['sha256']}  ({sha256_note(artifact, upstreams)})")
        lines.extend(f"  warning: {warning}" for warning in item["warnings"])
    for group in plan["capacity"]:
        lines.append("")
        lines.append(f"capacity, {len(group['hosts'])} host(s): {', '.join(group['hosts'])}")
        for verdict in group["instances"]:
            mark = {"fits": "fits", "does_not_fit": "DOES NOT FIT", "refused": "REFUSED"}.get(
                verdict["status"], "not checked"
            )
            lines.append(f"  {verdict['instance']} ({verdict['model']}): {mark}")
            lines.append(f"    {verdict['message']}")
    for failed in plan["failed"]:
        lines.append("")
        lines.append(f"host {failed['host']}: {failed['message']}")
    return "\n".join(lines)


def chain_lines(stack: dict[str, Any], chain: dict[str, Any]) -> list[str]:
    gpus = stack["gpu"] if stack["gpu"] else ["none declared"]
    venv = chain["venv"]
    toolkits = [item["version"] for item in chain["toolkits"]]
    lines = [
        f"gpu        {', '.join(gpus)}",
        f"driver     {stack['driver'] or '-'}",
        f"cuda       {', '.join(toolkits) or '-'}"
        + (f" (active {chain['toolkit']['version']})" if len(toolkits) > 1 else ""),
        f"python     {chain['python']['version']} (declared {stack['python']})",
        f"torch      {stack['torch']}+{stack['torch_variant']}",
        f"vllm       {stack['vllm_package']} {stack['vllm'] or '-'}",
        f"flash-attn {stack['flash_attn'] or '-'}",
        f"venv       {venv['id']}: {' '.join(venv['requirements'])} for {venv['platform']}"
        + (f" from {venv['torch_index_url']}" if venv.get("torch_index_url") else ""),
    ]
    return lines
