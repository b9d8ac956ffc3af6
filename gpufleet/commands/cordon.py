"""`gpufleet cordon|uncordon -i INVENTORY NODE [--reason TEXT]`: take a node out of service until the operator
puts it back. The cordon lives on the node (role inference_proxy's cordon file): its proxy answers 503, upgrades
and rebuilds skip it unless forced, drift reports show it as cordoned with its reason, and no other gpufleet
command removes it. Exit 0 done (or already so), 1 the node could not be reached or is unknown.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.drift import inventory_hosts
from gpufleet.errors import GpufleetError
from gpufleet.runner import run_playbook


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    for action, text in (
        ("cordon", "take a node out of service until `gpufleet uncordon` (playbooks/cordon.yml)"),
        ("uncordon", "put a cordoned node back into service (playbooks/cordon.yml)"),
    ):
        parser = subparsers.add_parser(action, help=text, description=text)
        parser.add_argument("node", help="the node (one inventory host of group gpu_nodes)")
        parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
        if action == "cordon":
            parser.add_argument(
                "--reason", default="cordoned by the operator", help="why (shown by drift reports and upgrades)"
            )
        parser.set_defaults(func=run, action=action)


def run(args: argparse.Namespace) -> int:
    if args.node not in inventory_hosts(args.inventory):
        raise GpufleetError(f"{args.node} is no node of {args.inventory} (group gpu_nodes)")
    extravars = {"cordon_action": args.action, "cordon_reason": getattr(args, "reason", "")}
    result = run_playbook("cordon.yml", args.inventory, limit=args.node, extravars=extravars, quiet=True)
    if result.rc != 0 or args.node not in result.hosts:
        why = f": {result.failures[0]}" if result.failures else ""
        raise GpufleetError(
            f"{args.action} {args.node} failed (ansible rc {result.rc}){why}; its output is in {result.artifacts}"
        )
    done = "cordoned" if args.action == "cordon" else "uncordoned"
    already = "" if result.hosts[args.node]["changed"] else " (it already was)"
    print(f"{args.node}: {done}{already}" + (f": {args.reason}" if args.action == "cordon" else ""))
    return 0
