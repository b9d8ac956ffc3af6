"""`gpufleet demo`: the main job on the built-in lab — boot the lab fleet and provision it."""

from __future__ import annotations

import argparse

from gpufleet import PROJECT_ROOT
from gpufleet.cli import main as gpufleet_main
from gpufleet.runner import format_summary, run_playbook

LAB_INVENTORY = PROJECT_ROOT / "inventories" / "lab" / "hosts.yml"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="boot the lab fleet and provision it with playbooks/site.yml")
    parser.add_argument("--hosts", type=int, default=2, help="number of lab hosts (default 2)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rc = gpufleet_main(["lab", "up", "--hosts", str(args.hosts)])
    if rc != 0:
        return rc
    result = run_playbook("site.yml", LAB_INVENTORY)
    print()
    print(format_summary(result))
    print()
    print(f"The lab is running: `gpufleet lab status` lists its hosts; inventory {LAB_INVENTORY}.")
    print("End it with `gpufleet lab down`.")
    return 0 if result.rc == 0 else 1
