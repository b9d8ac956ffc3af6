"""`gpufleet rebuild -i INVENTORY --limit NODE`: take one node back to the declared state.

A drift check of the node picks the layers to rebuild (those that drifted or could not be compared, and
the layers built on them; every declared layer with --full), playbooks/rebuild.yml rebuilds them with
every cache reused, and a final drift check of the node must come out clean. Exit codes as `gpufleet
drift`: 0 clean, 2 still drifted, 1 the rebuild failed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.ansible_options import add_ansible_flags
from gpufleet.drift import parse_layers, run_drift
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.inventory import target_nodes
from gpufleet.drift_rebuild import REINSTALLABLE, plan_rebuild
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import summary_table
from gpufleet.progress import add_verbose_flag, progress_options
from gpufleet.runner import format_summary, run_playbook


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rebuild",
        help="take one node back to the declared state (playbooks/rebuild.yml)",
        description="Rebuild the layers of one node that drifted from the declared state, reusing every cache, "
        "and end with a clean drift report of that node. Other nodes are never touched.",
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--limit", required=True, help="the node to rebuild (ansible --limit; one node)")
    parser.add_argument(
        "--full", action="store_true", help="rebuild every declared layer, with a new venv, instead of the drifted ones"
    )
    parser.add_argument(
        "--reinstall", default="", help="also uninstall and install again these runfiles: " + ",".join(REINSTALLABLE)
    )
    parser.add_argument("--layers", help="only consider these layers (comma-separated), as gpufleet drift --layers")
    parser.add_argument("--allow-many", action="store_true", help="accept a --limit that matches several nodes")
    parser.add_argument("--force", action="store_true", help="rebuild a cordoned node too (it stays cordoned)")
    add_verbose_flag(parser)
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def parse_reinstall(text: str) -> list[str]:
    wanted = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in wanted if item not in REINSTALLABLE]
    if unknown:
        raise UsageError(f"--reinstall {', '.join(unknown)}: only {', '.join(REINSTALLABLE)} can be reinstalled")
    return wanted


def rebuilt_nodes(inventory: Path, limit: str, allow_many: bool) -> list[str]:
    hosts = target_nodes(inventory, limit)
    if len(hosts) > 1 and not allow_many:
        raise UsageError(
            f"--limit {limit} matches {len(hosts)} nodes ({', '.join(hosts)}): rebuild takes one "
            "node; name one, or pass --allow-many to rebuild all of them"
        )
    return hosts


def run(args: argparse.Namespace) -> int:
    reinstall = parse_reinstall(args.reinstall)
    layers = parse_layers(args.layers)
    hosts = rebuilt_nodes(args.inventory, args.limit, args.allow_many)
    # The explicit host list, not the pattern: the playbooks then cannot reach any other node.
    limit = ",".join(hosts)
    print(f"rebuild: {', '.join(hosts)}: drift check first")
    before = run_drift(args.inventory, limit=limit, layers=layers, say=print)
    if before.report is None:
        raise GpufleetError(f"the drift check before the rebuild wrote no report; see {before.run_dir}")
    print(summary_table(before.report))
    plan = plan_rebuild(before.report, full=args.full, reinstall=reinstall)
    if plan.refused:
        raise GpufleetError(plan.refused)
    if not plan.layers and plan.unrebuildable:
        print(f"rebuild: {', '.join(plan.unrebuildable)} drifted, but no playbook rebuilds it yet; nothing was changed")
        return 2
    if not plan.layers:
        print("rebuild: every layer matches the declared state; nothing to rebuild")
        return 0
    print(f"rebuild: layers {', '.join(plan.layers)}" + (f" ({plan.reason})" if plan.reason else ""))
    result = run_playbook(
        "rebuild.yml",
        args.inventory,
        limit=limit,
        extravars={**plan.extravars(len(hosts) > 1), "rebuild_force": args.force},
        **progress_options(args.verbose),
    )
    print()
    print(format_summary(result))
    if result.rc != 0:
        raise GpufleetError(
            f"the rebuild of {limit} failed (ansible rc {result.rc}); its output is in {result.artifacts}"
        )
    print(f"rebuild: drift check of {limit} after the rebuild")
    after = run_drift(args.inventory, limit=limit, layers=layers, say=print)
    if after.report is None:
        raise GpufleetError(f"the drift check after the rebuild wrote no report; see {after.run_dir}")
    print(summary_table(after.report))
    print(f"run {after.run_id}: report in {after.report_dir}")
    return after.exit_code
