"""`gpufleet upgrade -i INVENTORY`: roll a changed declaration out over the fleet, a batch at a time.

A drift check of the targeted nodes gives each node the layers it must change (those that drifted, and the
layers built on them, as `gpufleet rebuild` plans them); nodes that match the declaration are not touched.
playbooks/upgrade.yml then drains, stops, rebuilds, gates and undrains at most --max-unavailable nodes at a
time, rolls a failed node back to what it served before, and stops once more than --max-fail nodes failed.
Exit codes: 0 every node upgraded or already matching (cordoned nodes skipped), 1 the rollout stopped or
could not start (the message says which node, why, and the state it was left in). With --plan nothing changes:
the rollout is printed batch by batch, exit 0 when no node would change, 2 when some would.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet import exit_codes, run_document
from gpufleet.ansible_options import add_ansible_flags, all_or_nothing, current_options
from gpufleet.drift import parse_layers, run_drift
from gpufleet.drift_rebuild import RebuildPlan, plan_rebuild
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.inventory import inventory_hosts, target_nodes
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import FleetReport
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import summary_table
from gpufleet.runner import format_summary, run_playbook

# The key of the structured outcome each node's gpufleet.fleet.upgrade_result returns (plugins/action/upgrade_result.py).
OUTCOME_KEY = "gpufleet_upgrade"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "upgrade",
        help="roll a changed declaration out over the fleet, a batch at a time (playbooks/upgrade.yml)",
        description="Apply the declaration to every node that differs from it, at most --max-unavailable nodes "
        "out of service at once: drain at the proxy, stop, rebuild the changed layers, health gate and "
        "warm-up, undrain. A node that fails is rolled back and the rollout stops.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument(
        "--max-unavailable",
        default="1",
        help="nodes out of service at once: a number, or a percentage of the nodes (default 1)",
    )
    parser.add_argument(
        "--max-fail",
        type=int,
        default=0,
        help="stop once more than this many nodes failed and were rolled back (default 0)",
    )
    parser.add_argument("--limit", help="only these nodes (ansible --limit pattern)")
    parser.add_argument(
        "--force", action="store_true", help="also upgrade the cordoned nodes named in --limit (they stay cordoned)"
    )
    parser.add_argument("--layers", help="only consider these layers (comma-separated), as gpufleet drift --layers")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print what the rollout would do, batch by batch, and change nothing (exit 2 when some node would change)",
    )
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def parse_max_unavailable(text: str, fleet: int) -> str:
    """'2' or '50%' checked against the fleet's size; GpufleetError with one clear message otherwise."""
    match = re.fullmatch(r"([0-9]+)(%?)", text.strip())
    if not match or int(match.group(1)) < 1:
        raise UsageError(f"--max-unavailable {text}: give a number of nodes (1 or more) or a percentage like 25%")
    count, percent = int(match.group(1)), bool(match.group(2))
    if percent and (count > 100 or count * fleet // 100 < 1):
        raise GpufleetError(
            f"--max-unavailable {text}: of {fleet} nodes that is no node at all (or more than all); "
            "give a larger percentage or a number"
        )
    if not percent and count > fleet:
        raise UsageError(f"--max-unavailable {count} is more than the {fleet} nodes this upgrade targets")
    return f"{count}%" if percent else str(count)


def named_hosts(inventory: Path, limit: str | None) -> list[str]:
    """The hosts --limit names one by one; GpufleetError for a name that is neither a node nor a pattern."""
    if not limit:
        return []
    every = set(inventory_hosts(inventory))
    named = []
    for token in re.split(r"[,:]", limit):
        name = token.strip()
        # Exclusions, intersections and patterns name no node one by one.
        if not name or name[0] in "!&" or any(char in name for char in "*?[]~"):
            continue
        if name in every:
            named.append(name)
        elif not inventory_hosts(inventory, name):
            raise UsageError(f"--limit {limit}: {name} is no node of {inventory} (group gpu_nodes)")
    return named


def node_count(amount: str, fleet: int) -> int:
    """How many nodes '2' or '50%' (of `fleet`, rounded down, as Ansible's serial) is."""
    return int(amount[:-1]) * fleet // 100 if amount.endswith("%") else int(amount)


def unavailable_budget(max_unavailable: str, fleet: int, out_of_service: list[str], work: list[str]) -> str:
    """The batch size left once the nodes already out of service count against --max-unavailable; GpufleetError
    when none is left and some node needs work (no node is touched)."""
    allowed = node_count(max_unavailable, fleet)
    left = allowed - len(out_of_service)
    if left >= allowed:
        return max_unavailable
    if left < 1 and work:
        raise GpufleetError(
            f"{len(out_of_service)} node(s) already out of service ({', '.join(out_of_service)}) count against "
            f"--max-unavailable {max_unavailable}, which then lets no other node out: put them back "
            f"(gpufleet uncordon), or raise --max-unavailable; no node was touched"
        )
    return str(max(left, 1))


def unreachable_nodes(report: FleetReport) -> list[str]:
    """The nodes the drift check before the upgrade could not reach."""
    return sorted(name for name, node in report.nodes.items() if node.status == "unreachable")


def left_out(hosts: list[str], unreachable: list[str], all_or_nothing: bool) -> list[str]:
    """The nodes the upgrade goes on with: an unreachable node is named and left out (issue 37: one node down never
    stops the fleet), unless the operator asked for all or nothing; GpufleetError when none is left."""
    if not unreachable:
        return hosts
    if all_or_nothing:
        raise GpufleetError(
            f"{', '.join(unreachable)} cannot be reached, and the upgrade is all or nothing "
            "(gpufleet_any_errors_fatal): no node was touched; reach them or leave them out with --limit"
        )
    for host in unreachable:
        print(f"upgrade: {host}: the drift check could not reach it: left out, not upgraded")
    reached = [host for host in hosts if host not in unreachable]
    if not reached:
        raise GpufleetError(f"no node could be reached ({', '.join(unreachable)}): no node was touched")
    return reached


def node_plans(report: FleetReport) -> dict[str, RebuildPlan]:
    """Node -> what its upgrade rebuilds: the layers (none: it matches the declaration), and whether its venv is
    built again and which models are staged again, as `gpufleet rebuild` would. Only the nodes the drift check
    reached."""
    plans = {}
    for name, node in report.nodes.items():
        if node.status == "unreachable":
            continue
        plan = plan_rebuild(FleetReport(report.layers, {name: node}))
        if plan.refused:
            raise GpufleetError(f"upgrade: {plan.refused}; no node was touched")
        plans[name] = plan
    return plans


def describe_plan(plan: RebuildPlan | None) -> str:
    if plan is None or not plan.layers:
        return "matches the declaration"
    fresh = (["a new venv"] if plan.fresh_venv else []) + [f"model {name} staged again" for name in plan.fresh_models]
    return f"layers {', '.join(plan.layers)}" + (f" ({'; '.join(fresh)})" if fresh else "")


@dataclass
class Outcomes:
    """ansible-runner event handler: each node's outcome, as gpufleet.fleet.upgrade_result returns it."""

    nodes: dict[str, dict] = field(default_factory=dict)

    def __call__(self, event: dict) -> bool:
        data = event.get("event_data") or {}
        result = data.get("res") or {}
        if event.get("event") == "runner_on_ok" and isinstance(result.get(OUTCOME_KEY), dict):
            outcome = result[OUTCOME_KEY]
            self.nodes[str(outcome["node"])] = outcome
            print(f"upgrade: {describe(outcome)}", flush=True)
        elif event.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            lines = str(result.get("msg") or "").strip().splitlines()
            message = (lines or ["failed"])[0][:400]
            print(f"upgrade: {data.get('host')}: {data.get('task')}: {message}", flush=True)
        return True


def describe(outcome: dict) -> str:
    text = f"{outcome['node']}: {outcome['status']}"
    if outcome.get("layers"):
        text += f" (layers {', '.join(outcome['layers'])}, {outcome.get('seconds', 0)} s)"
    if str(outcome.get("reason", "")).strip():
        text += f" - {str(outcome['reason']).strip()}"
    return text + f"; {str(outcome.get('state', '')).strip()}"


def run(args: argparse.Namespace) -> int:
    layers = parse_layers(args.layers)
    hosts = target_nodes(args.inventory, args.limit)
    named = named_hosts(args.inventory, args.limit)
    max_unavailable = parse_max_unavailable(args.max_unavailable, len(hosts))
    if args.max_fail < 0:
        raise UsageError("--max-fail must be 0 or more")
    limit = ",".join(hosts)
    print(f"upgrade: {len(hosts)} nodes, at most {max_unavailable} out of service at once; drift check first")
    before = run_drift(args.inventory, limit=limit, layers=layers, say=print)
    if before.report is None:
        raise GpufleetError(f"the drift check before the upgrade wrote no report; see {before.run_dir}")
    print(summary_table(before.report))
    unreachable = unreachable_nodes(before.report)
    hosts = left_out(hosts, unreachable, all_or_nothing(current_options()))
    limit = ",".join(hosts)
    plans = node_plans(before.report)
    for host in hosts:
        print(f"upgrade: {host}: {describe_plan(plans.get(host))}")
    layers_of = {host: plans[host].layers if host in plans else [] for host in hosts}
    # Cordoned nodes are out of service already: they count against --max-unavailable (forced ones are upgraded
    # in a batch, counted there).
    forced = named if args.force else []
    cordoned = [name for name, node in before.report.nodes.items() if node.status == "cordoned" and name not in forced]
    work = [host for host in hosts if layers_of[host] and host not in cordoned]
    batch = unavailable_budget(max_unavailable, len(hosts), cordoned, work)
    if batch != max_unavailable:
        print(f"upgrade: {', '.join(cordoned)} out of service already: at most {batch} more at once")
    run_document.add("layers", layers_of)
    if args.plan:
        print(rollout_plan(hosts, work, cordoned, batch))
        run_document.add("plan", {"work": work, "cordoned": cordoned, "batch": batch})
        return exit_codes.FOUND if work else exit_codes.OK
    extravars = {
        "upgrade_max_unavailable": batch,
        "upgrade_max_fail": args.max_fail,
        "upgrade_plan": layers_of,
        # What only a build from scratch repairs (a package outside the lock, damaged weights): the node's venv
        # is built again beside the one in service and the models staged again, as `gpufleet rebuild` does.
        "upgrade_fresh": {
            host: {"venv": plans[host].fresh_venv, "models": plans[host].fresh_models}
            for host in hosts
            if host in plans and (plans[host].fresh_venv or plans[host].fresh_models)
        },
        "upgrade_named": named,
        "upgrade_force": forced,
    }
    outcomes = Outcomes()
    run_document.add("outcomes", outcomes.nodes)
    result = run_playbook(
        "upgrade.yml", args.inventory, limit=limit, extravars=extravars, quiet=True, event_handler=outcomes
    )
    print()
    print(format_summary(result))
    code = report(result.rc, hosts, outcomes.nodes, result.artifacts, result.failures)
    if unreachable:
        raise GpufleetError(
            f"the nodes it reached are upgraded; {', '.join(unreachable)} could not be reached and were not: run "
            "gpufleet upgrade again when they answer"
        )
    return code


def rollout_plan(hosts: list[str], work: list[str], cordoned: list[str], batch: str) -> str:
    """What `upgrade --plan` prints: the batches upgrade.yml's `serial` makes of the targeted nodes, in order, with
    the nodes of each that would change (a batch whose nodes all match passes through), and the nodes left alone."""
    size = max(node_count(batch, len(hosts)), 1)
    lines = [f"upgrade --plan: {len(work)} node(s) would change, at most {size} at once; nothing was changed"]
    batches = [hosts[start : start + size] for start in range(0, len(hosts), size)]
    changing = [[host for host in nodes if host in work] for nodes in batches]
    lines += [f"  batch {number}: {', '.join(nodes)}" for number, nodes in enumerate(filter(None, changing), 1)]
    if cordoned:
        lines.append(f"  skipped, cordoned: {', '.join(cordoned)}")
    unchanged = [host for host in hosts if host not in work and host not in cordoned]
    if unchanged:
        lines.append(f"  unchanged, matching the declaration: {', '.join(unchanged)}")
    return "\n".join(lines)


def report(
    rc: int, hosts: list[str], outcomes: dict[str, dict], artifacts: Path, failures: list[str] | None = None
) -> int:
    """Every node's outcome; a GpufleetError naming the nodes that stopped the rollout."""
    for host in hosts:
        if host not in outcomes:
            print(
                f"upgrade: {host}: not started, or its state is unknown: the rollout stopped before it, or it "
                "could not be reached (it may be drained; the next `gpufleet upgrade` reads its journal and "
                "finishes or rolls it back)"
            )
    stopped = [describe(o) for o in outcomes.values() if o["status"] in ("not_upgraded", "rolled_back", "failed")]
    if stopped:
        raise GpufleetError("the rollout stopped: " + " | ".join(stopped))
    if rc != 0:
        first = f": {failures[0]}" if failures else ""
        raise GpufleetError(
            f"the rollout stopped before it touched a node or when a node could not be reached "
            f"(ansible rc {rc}){first}; its output is in {artifacts}"
        )
    return 0
