"""`gpufleet provision -i INVENTORY`: run playbooks/site.yml and summarise per host."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet import layers
from gpufleet.errors import GpufleetError
from gpufleet.progress import add_verbose_flag, progress_options
from gpufleet.runner import format_summary, require_hosts, run_playbook


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("provision", help="provision the nodes of an inventory (playbooks/site.yml)")
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--limit", help="only these hosts or groups (ansible --limit)")
    parser.add_argument("--tags", help="only these layers, e.g. base,driver")
    parser.add_argument("--check", action="store_true", help="report what would change without changing it")
    parser.add_argument("--diff", action="store_true", help="show the differences in changed files (implies -v)")
    add_verbose_flag(parser)
    parser.set_defaults(func=run)


def check_tags(tags: str | None) -> None:
    """An unknown tag would run the preflight alone and "succeed"."""
    known = layers.rebuildable()
    unknown = [tag for tag in (tags or "").split(",") if tag.strip() and tag.strip() not in known]
    if unknown:
        raise GpufleetError(f"--tags {tags}: no layer {', '.join(unknown)}; the layers are {', '.join(known)}")


def run(args: argparse.Namespace) -> int:
    check_tags(args.tags)
    result = run_playbook(
        "site.yml",
        args.inventory,
        limit=args.limit,
        tags=args.tags,
        check=args.check,
        diff=args.diff,
        **progress_options(args.verbose or args.diff),
    )
    require_hosts(result, args.inventory, args.limit)
    print()
    print(format_summary(result))
    return 0 if result.rc == 0 else 1
