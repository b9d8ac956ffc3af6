"""`gpufleet plan -i INVENTORY`: every targeted host's stack validated as preflight validates it, grouped by
GPU class (hosts that resolve to the same chain), with every artifact each class would install.

It runs playbooks/preflight.yml itself (check mode, on the controller: stack_validate never connects to a
host), so the plan is the preflight: the same variables, the same templating, the same validator, the same
conflict check between role variables and the stack.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.inventory import target_nodes
from gpufleet.runner import first_error, run_playbook

SCHEMA = "gpufleet.fleet-plan/v1"
VALIDATE_TASK = "Validate gpufleet_stack"
CAPACITY_TASK = "Predict each instance's KV cache"
# playbooks/preflight.yml: each host's model tarballs as mirror sync reads them (gpufleet.fleet.mirror_models).
MODELS_TASK = "Name the model tarballs each host stages"
MODELS_FACT = "gpufleet_preflight_models"


@dataclass
class HostPlan:
    host: str
    ok: bool
    message: str
    result: dict[str, Any]
    capacity: list[dict[str, Any]] = field(default_factory=list)  # one verdict per instance (capacity_check)
    models: dict[str, Any] = field(default_factory=dict)  # {mirror_url, models: [...]} (MODELS_TASK)


@dataclass
class StackClass:
    """Hosts whose stacks resolve to the same chain and artifacts."""

    chain: dict[str, Any]
    stack: dict[str, Any]
    artifacts: list[dict[str, Any]]
    warnings: list[str]
    hosts: list[str] = field(default_factory=list)


def collect(events: list[dict[str, Any]]) -> list[HostPlan]:
    """The stack_validate and capacity_check results and the declared model tarballs of each host, from the
    preflight run's events."""
    plans: dict[str, HostPlan] = {}
    capacity: dict[str, list[dict[str, Any]]] = {}
    models: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind not in ("runner_on_ok", "runner_on_failed"):
            continue
        task, result = str(data.get("task", "")), data.get("res") or {}
        if task.startswith(VALIDATE_TASK):
            plans[data["host"]] = HostPlan(data["host"], kind == "runner_on_ok", str(result.get("msg", "")), result)
        elif task.startswith(CAPACITY_TASK):
            capacity[data["host"]] = list(result.get("capacity") or [])
        elif task.startswith(MODELS_TASK):
            models[data["host"]] = dict((result.get("ansible_facts") or {}).get(MODELS_FACT) or {})
    for host, verdicts in capacity.items():
        if host in plans:
            plans[host].capacity = verdicts
    for host, declared in models.items():
        if host in plans:
            plans[host].models = declared
    return [plans[host] for host in sorted(plans)]


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
    target_nodes(inventory, limit)
    events: list[dict[str, Any]] = []

    def keep(event: dict[str, Any]) -> bool:
        events.append(event)
        return True

    with tempfile.TemporaryDirectory(prefix="gpufleet-plan-") as runs:
        result = run_playbook(
            "preflight.yml",
            inventory,
            limit=limit,
            # The OS release play is the only one that contacts hosts: a plan never does.
            skip_tags="connects",
            check=True,
            quiet=True,
            runs_root=Path(runs),
            envvars=envvars,
            event_handler=keep,
        )
        plans = collect(events)
        # Ansible stopped before any host (a vault password missing): its own words, read before the run's
        # records go with the temporary directory.
        error = "" if plans else first_error(result)
    if error:
        raise UsageError(f"no host of {inventory} was validated: {error}")
    if not plans:
        raise GpufleetError(f"no host of {inventory} was validated (preflight rc {result.rc}, {result.status})")
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


def sha256_note(artifact: dict[str, Any]) -> str:
    """Where the sha256 came from; a placeholder pin is named as one, with where the real value comes from."""
    if artifact["sha256"] == PLACEHOLDER_SHA256:
        return (
            f"{artifact['sha256_source']}: a PLACEHOLDER, not a checksum; the nodes would refuse the file: "
            "`gpufleet mirror sync` fetches it and prints its sha256 to pin"
        )
    return str(artifact["sha256_source"])


def render(plan: dict[str, Any]) -> str:
    lines = [
        f"inventory {plan['inventory']}: "
        + ("COMPATIBLE" if plan["compatible"] else "NOT COMPATIBLE")
        + f", {len(plan['classes'])} GPU class(es), {len(plan['failed'])} host(s) failing"
        + (f", {len(plan['capacity_failed'])} instance(s) that cannot start" if plan["capacity_failed"] else "")
    ]
    for number, item in enumerate(plan["classes"], start=1):
        lines.append("")
        lines.append(f"class {number}: {len(item['hosts'])} host(s): {', '.join(item['hosts'])}")
        lines.extend("  " + line for line in chain_lines(item["stack"], item["chain"]))
        lines.append("  artifacts:")
        for artifact in item["artifacts"]:
            lines.append(f"    {artifact['layer']:<8} {artifact['name']}")
            lines.append(f"             {artifact['url']}")
            lines.append(f"             sha256 {artifact['sha256']}  ({sha256_note(artifact)})")
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
