"""`gpufleet cordon|uncordon -i INVENTORY --limit NODES [--reason TEXT]`: take nodes out of service until the
operator puts them back. The cordon lives on the node (role inference_proxy's cordon file): its proxy answers 503,
upgrades and rebuilds skip it unless forced, drift reports show it as cordoned with its reason, and no other
gpufleet command removes it. Exit 0 done (or already so), 1 a node could not be reached, 64 no such node.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.ansible_options import add_ansible_flags
from gpufleet.errors import GpufleetError
from gpufleet.inventory import target_nodes
from gpufleet.runner import run_playbook


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    for action, text in (
        ("cordon", "take nodes out of service until `gpufleet uncordon` (playbooks/cordon.yml)"),
        ("uncordon", "put cordoned nodes back into service (playbooks/cordon.yml)"),
    ):
        parser = subparsers.add_parser(action, help=text, description=text)
        parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
        parser.add_argument(
            "--limit", required=True, metavar="NODES", help="the nodes (hosts or groups of gpu_nodes, ansible --limit)"
        )
        if action == "cordon":
            parser.add_argument(
                "--reason", default="cordoned by the operator", help="why (shown by drift reports and upgrades)"
            )
        add_ansible_flags(parser)
        parser.set_defaults(func=run, action=action)


def run(args: argparse.Namespace) -> int:
    nodes = target_nodes(args.inventory, args.limit)
    extravars = {"cordon_action": args.action, "cordon_reason": getattr(args, "reason", "")}
    result = run_playbook("cordon.yml", args.inventory, limit=",".join(nodes), extravars=extravars, quiet=True)
    done = "cordoned" if args.action == "cordon" else "uncordoned"
    for node in nodes:
        if node in result.hosts and not (result.hosts[node]["failures"] or result.hosts[node]["unreachable"]):
            already = "" if result.hosts[node]["changed"] else " (it already was)"
            print(f"{node}: {done}{already}" + (f": {args.reason}" if args.action == "cordon" else ""))
    failed = [node for node in nodes if node not in result.hosts or node in result.failed_hosts]
    if result.rc != 0 or failed:
        why = f": {result.failures[0]}" if result.failures else ""
        raise GpufleetError(
            f"{args.action} {', '.join(failed) or args.limit} failed (ansible rc {result.rc}){why}; its output is "
            f"in {result.artifacts}"
        )
    return 0
