"""`gpufleet mirror sync|verify|diff`: fill an air-gapped mirror from the upstreams, check it, compare it."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet import exit_codes, mirror_manifest, mirror_sync
from gpufleet.ansible_options import add_ansible_flags
from gpufleet.errors import UsageError

FOUND_EXIT_CODE = exit_codes.FOUND


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mirror",
        help="fill the artifact mirror from NVIDIA, python.org, GitHub and Hugging Face, verified, with a manifest",
        description="The runfiles, CPython and pyenv tarballs and sdists every declared stack installs (as "
        "`gpufleet plan -i` lists them), fetched from their upstreams into the layout the roles read, and each "
        "model declared with hf_repo and hf_revision, fetched with huggingface_hub and packed into its tarball.",
    )
    actions = parser.add_subparsers(dest="mirror_action", metavar="ACTION", required=True)
    sync = actions.add_parser(
        "sync",
        help="download what the inventory's stacks need into DIR",
        description="Resumable, parallel, rate-limited downloads, each checked against the strongest sha256 "
        "available (the plan's pin, else the upstream's published one, else the first download's, recorded as "
        "such); DIR/manifest.json records every file. A second sync downloads nothing. Exit 0 done, 1 some file "
        "failed, 2 the inventory's stacks are not compatible.",
    )
    inventory_arguments(sync)
    sync.add_argument("--jobs", type=positive, default=4, metavar="N", help="downloads at once (default 4)")
    sync.add_argument(
        "--limit-rate",
        type=non_negative,
        default=0,
        metavar="BYTES",
        help="bandwidth limit in bytes per second, across all downloads, the Hub client's too (default: none)",
    )
    sync.add_argument(
        "--upstream-override",
        action="append",
        default=[],
        metavar="KIND=BASEURL",
        help="fetch a kind (driver, toolkit, fabric_manager, cpython, pyenv, sdist) from another base URL that "
        "serves the same paths (an internal copy, a test stand-in), or models from another Hugging Face Hub "
        "endpoint (model=BASEURL; default HF_ENDPOINT, else the Hub); repeatable",
    )
    sync.add_argument(
        "--fabric-manager",
        action="store_true",
        help="also fetch nvidia-fabricmanager of each driver (HGX/NVSwitch fleets), checked against NVIDIA's "
        "redistrib JSON",
    )
    sync.set_defaults(func=run_sync)
    verify = actions.add_parser(
        "verify",
        help="re-hash every file of DIR against its manifest",
        description="Exit 0 every file matches; 2 a file is missing or changed (extra files are listed only).",
    )
    verify.add_argument("mirror", type=Path, metavar="DIR", help="the mirror directory (holds manifest.json)")
    verify.set_defaults(func=run_verify)
    diff = actions.add_parser(
        "diff",
        help="what the inventory's declaration would add to DIR, replace, or no longer need",
        description="Compares what the inventory needs with DIR's manifest (or with another inventory's needs). "
        "Exit 0 nothing differs, 2 something does.",
    )
    diff.add_argument("-i", "--inventory", type=Path, required=True, metavar="INVENTORY", help="the new declaration")
    against = diff.add_mutually_exclusive_group(required=True)
    against.add_argument("--to", type=Path, metavar="DIR", help="a mirror filled by `gpufleet mirror sync`")
    against.add_argument("--from-inventory", type=Path, metavar="INVENTORY", help="the previous declaration")
    diff.add_argument("--limit", help="only these hosts (an Ansible pattern)")
    diff.add_argument("--fabric-manager", action="store_true", help="count fabric manager archives as needed")
    add_ansible_flags(diff)
    diff.set_defaults(func=run_diff)


def inventory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", type=Path, required=True, metavar="INVENTORY")
    parser.add_argument("--to", type=Path, required=True, metavar="DIR", help="the mirror directory to fill")
    parser.add_argument("--limit", help="only these hosts (an Ansible pattern)")
    add_ansible_flags(parser)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"give a number >= 1 (got {text!r})")
    return int(text)


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"give bytes per second, a whole number (got {text!r})")
    return int(text)


def say(line: str) -> None:
    """Progress as it happens, also through a pipe."""
    print(line, flush=True)


def run_sync(args: argparse.Namespace) -> int:
    upstreams = mirror_sync.load_upstreams()
    overrides = mirror_sync.parse_overrides(args.upstream_override, upstreams)
    if args.to.exists() and not args.to.is_dir():
        raise UsageError(f"--to {args.to} is not a directory")
    needs = mirror_sync.needs_of_inventory(args.inventory, args.limit, fabric_manager=args.fabric_manager)
    report = mirror_sync.sync(needs, args.to, upstreams, overrides, args.jobs, args.limit_rate, say)
    say(report.render())
    return exit_codes.OK


def run_verify(args: argparse.Namespace) -> int:
    report = mirror_manifest.verify(args.mirror)
    say(report.render())
    return exit_codes.OK if report.clean else FOUND_EXIT_CODE


def run_diff(args: argparse.Namespace) -> int:
    new = mirror_sync.needs_of_inventory(args.inventory, args.limit, fabric_manager=args.fabric_manager)
    if args.to is not None:
        old = mirror_sync.manifest_files(mirror_manifest.load(args.to))
        against = f"mirror {args.to}"
    else:
        previous = mirror_sync.needs_of_inventory(args.from_inventory, args.limit, fabric_manager=args.fabric_manager)
        old, against = mirror_sync.needs_files(previous), f"inventory {args.from_inventory}"
    report = mirror_sync.diff(old, new, against)
    say(report.render())
    return exit_codes.OK if report.empty else FOUND_EXIT_CODE
