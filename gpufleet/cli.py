"""The gpufleet command line: `gpufleet lab|plan|provision|drift|rebuild ...`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpufleet import __version__, exit_codes, run_document
from gpufleet.ansible_options import options_from, passed_through
from gpufleet.collection import collections_dir, missing_collection
from gpufleet.commands import COMMAND_MODULES
from gpufleet.errors import GpufleetError
from gpufleet.locks import CHANGING_COMMANDS, fleet_operation


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on exit 64 (exit_codes.USAGE): 2 is "drift found"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exit_codes.USAGE, f"{self.prog}: error: {message}\n")


def version_text() -> str:
    """gpufleet's version, the ansible-core it runs and the collection its playbooks come from."""
    from ansible.release import __version__ as ansible_version  # a constant: no cost worth deferring further

    collection = collections_dir() / "ansible_collections" / "gpufleet" / "fleet"
    where = f"at {collection}" if not missing_collection() else "NOT FOUND (`gpufleet plan` says how to install it)"
    return f"gpufleet {__version__}\nansible-core {ansible_version}\ncollection gpufleet.fleet {where}"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpufleet",
        description="Provision NVIDIA GPU servers into vLLM inference nodes and keep the fleet identical.",
        epilog=exit_codes.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"gpufleet.commands.{name}").add_parser(subparsers)
    for name in CHANGING_COMMANDS:
        subparsers.choices[name].add_argument(
            "--break-lease",
            action="store_true",
            help="take the nodes although another operation's lease holds them (its controller was killed)",
        )
        subparsers.choices[name].add_argument(
            "--json",
            action="store_true",
            help="print one JSON document (schema gpufleet.run/v1) on stdout at the end; the rest goes to stderr",
        )
    return parser


def run_command(args: argparse.Namespace) -> int:
    with passed_through(options_from(args)):
        if args.command in CHANGING_COMMANDS:
            part = str(args.slice) if getattr(args, "slice", None) else None
            with fleet_operation(args.command, args.inventory, args.break_lease, part):
                return int(args.func(args))
        return int(args.func(args))


def run_reported(args: argparse.Namespace) -> int:
    """A changing command with --json: its usual output on stderr, then the run document on stdout."""
    run_document.reset()
    error = None
    with contextlib.redirect_stdout(sys.stderr):
        try:
            code = run_command(args)
        except GpufleetError as failure:
            error, code = str(failure), failure.exit_code
            print(f"gpufleet: error: {failure}", file=sys.stderr)
    print(json.dumps(run_document.document(args.command, code, error), indent=2, sort_keys=True))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    problem = missing_collection()
    if problem:
        # The commands import the collection's code: without it, only --version answers.
        if list(sys.argv[1:] if argv is None else argv) == ["--version"]:
            print(version_text())
            return exit_codes.OK
        print(f"gpufleet: error: {problem}", file=sys.stderr)
        return exit_codes.FAILED
    args = build_parser().parse_args(argv)
    try:
        if args.command in CHANGING_COMMANDS and args.json:
            return run_reported(args)
        return run_command(args)
    except GpufleetError as error:
        print(f"gpufleet: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("gpufleet: interrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`gpufleet drift --schema | head`): stop quietly, as a shell tool does; stdout is
        # pointed at /dev/null so the interpreter's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
