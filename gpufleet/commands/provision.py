"""`gpufleet provision -i INVENTORY`: run playbooks/site.yml and summarise per host."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet import layers, run_document, slicing
from gpufleet.ansible_options import add_ansible_flags
from gpufleet.errors import UsageError
from gpufleet.inventory import target_nodes
from gpufleet.progress import add_verbose_flag, progress_options
from gpufleet.runner import format_summary, require_hosts, run_playbook


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    text = "provision the nodes of an inventory: every layer, or those --tags names (playbooks/site.yml)"
    parser = subparsers.add_parser("provision", help=text, description=text)
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--limit", help="only these hosts or groups (ansible --limit)")
    parser.add_argument(
        "--slice",
        type=slice_argument,
        metavar="K/N",
        help="only the K-th of N slices of the targeted nodes (every N-th by name), for N processes or controllers "
        "side by side; `gpufleet report` joins their --json documents",
    )
    parser.add_argument("-t", "--tags", help="only these layers, e.g. base,driver")
    parser.add_argument("--skip-tags", help="all layers but these, e.g. model")
    parser.add_argument("--check", action="store_true", help="report what would change without changing it")
    parser.add_argument("--diff", action="store_true", help="show the differences in changed files (implies -v)")
    add_verbose_flag(parser)
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def check_tags(flag: str, tags: str | None) -> None:
    """An unknown tag would run the preflight alone and "succeed"."""
    known = layers.rebuildable()
    unknown = [tag for tag in (tags or "").split(",") if tag.strip() and tag.strip() not in known]
    if unknown:
        raise UsageError(f"{flag} {tags}: no layer {', '.join(unknown)}; the layers are {', '.join(known)}")


def slice_argument(text: str) -> slicing.Slice:
    try:
        return slicing.parse(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    check_tags("--tags", args.tags)
    check_tags("--skip-tags", args.skip_tags)
    nodes = target_nodes(args.inventory, args.limit)
    limit = args.limit
    if args.slice:
        chosen = args.slice.of(nodes)
        limit = ",".join(chosen)
        run_document.add("slice", {"index": args.slice.index, "count": args.slice.count, "hosts": chosen})
        print(f"slice {args.slice}: {len(chosen)} of {len(nodes)} node(s)")
    result = run_playbook(
        "site.yml",
        args.inventory,
        limit=limit,
        tags=args.tags,
        skip_tags=args.skip_tags,
        check=args.check,
        diff=args.diff,
        **progress_options(args.verbose or args.diff),
    )
    require_hosts(result, args.inventory, limit)
    print()
    print(format_summary(result))
    return 0 if result.rc == 0 else 1
