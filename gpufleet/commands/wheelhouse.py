"""`gpufleet wheelhouse build`: resolve the stack on the controller, lock it with hashes, fill the mirror."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet import wheelhouse
from gpufleet.errors import GpufleetError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "wheelhouse",
        help="resolve, lock (with sha256) and mirror the wheels of the inference venv",
        description="Nodes never resolve versions: this resolves each stack for the nodes' platform and "
        "Python, writes its lock and fills the mirror the inference_venv role installs from.",
    )
    actions = parser.add_subparsers(dest="wheelhouse_action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help="lock the stack(s) and fill the mirror",
        description="Lock every stack the inventory (or --stack FILE) declares, "
        "download what the cache lacks, publish the wheels on the mirror.",
    )
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "-i",
        "--inventory",
        type=Path,
        metavar="INVENTORY",
        help=f"inventory whose hosts declare {wheelhouse.STACK_VARIABLE} (one lock per distinct stack)",
    )
    source.add_argument(
        "--stack",
        type=Path,
        metavar="FILE",
        help=f"YAML file with the stack (top level or under {wheelhouse.STACK_VARIABLE})",
    )
    build.add_argument(
        "--lock",
        type=Path,
        metavar="PATH",
        help="where the lock goes (default: <inventory dir>/locks/<stack id>.lock); one stack only",
    )
    build.add_argument(
        "--upgrade",
        action="store_true",
        help="resolve again even when the lock was made from the same stack declaration",
    )
    target = build.add_mutually_exclusive_group()
    target.add_argument(
        "--mirror-dir",
        type=Path,
        metavar="DIR",
        help="mirror root to fill (default: the lab mirror, ${GPUFLEET_CACHE}/mirror)",
    )
    target.add_argument(
        "--no-mirror", action="store_true", help="only lock and cache; the inventory names an internal index instead"
    )
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    if args.inventory is not None:
        specs = wheelhouse.stacks_from_inventory(args.inventory)
        base_dir = args.inventory if args.inventory.is_dir() else args.inventory.parent
    else:
        specs = [wheelhouse.load_stack_file(args.stack)]
        base_dir = args.stack.parent
    if args.lock is not None and len(specs) > 1:
        raise GpufleetError(
            f"--lock names one file but the inventory declares {len(specs)} stacks "
            f"({', '.join(s.id for s in specs)}); leave --lock out"
        )
    mirror_dir = None if args.no_mirror else (args.mirror_dir or _lab_mirror_dir())
    for spec in specs:
        lock_path = args.lock or wheelhouse.default_lock_path(base_dir, spec)
        print(wheelhouse.build(spec, lock_path, mirror_dir, upgrade=args.upgrade, say=say).render(), flush=True)
    return 0


def say(line: str) -> None:
    """Progress as it happens, also through a pipe."""
    print(line, flush=True)


def _lab_mirror_dir() -> Path:
    from gpufleet.lab.mirror import mirror_dir

    return mirror_dir()
