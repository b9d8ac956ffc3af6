"""`gpufleet prune -i INVENTORY`: remove cached artifacts the nodes no longer need (playbooks/prune.yml)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.ansible_options import add_ansible_flags
from gpufleet.inventory import target_nodes
from gpufleet.runner import format_summary, require_hosts, run_playbook


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    text = (
        "remove cached artifacts the nodes no longer use, keeping rollback records and the newest few "
        "(playbooks/prune.yml)"
    )
    parser = subparsers.add_parser("prune", help=text, description=text)
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--limit", help="only these hosts or groups (ansible --limit)")
    parser.add_argument("--check", action="store_true", help="say what would be removed without removing it")
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target_nodes(args.inventory, args.limit)
    result = run_playbook("prune.yml", args.inventory, limit=args.limit, check=args.check, diff=args.check)
    require_hosts(result, args.inventory, args.limit)
    print()
    print(format_summary(result))
    return 0 if result.rc == 0 else 1
