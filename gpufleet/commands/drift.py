"""`gpufleet drift -i INVENTORY`: compare every node's layers with the declared state, read-only.

Exit codes: 0 every node compared and no drift; 2 drift found, every node compared; 3 drift found and some
node or layer could not be compared (unreachable, or an error); 1 no drift found but not every node or layer
was compared, or the run failed (no report). `--since RUN` lists what changed since a stored run; without -i it compares two stored runs.
`--html FILE` writes the report as one HTML page (gpufleet/report_html.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from gpufleet.drift import (
    LAYERS,
    failure_reason,
    find_report,
    parse_layers,
    prune_artifacts,
    read_report,
    run_drift,
    stored_runs,
)
from gpufleet.ansible_options import add_ansible_flags
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.inventory import target_nodes
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import (
    JSON_SCHEMA,
    FleetReport,
    compare_reports,
)
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import (
    REPORT_FILES,
    summary_table,
    write_atomically,
)
from gpufleet.report_html import to_html


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "drift",
        help="report which nodes and layers differ from the declared state (read-only)",
        description="Compare each node's layers (" + ", ".join(LAYERS) + ")\nwith what the inventory declares, "
        "without changing anything.\n\nExit status:\n"
        "  0  every node compared, no drift\n"
        "  2  drift found, every node compared\n"
        "  3  drift found, and some node or layer could not be compared (unreachable or an error)\n"
        "  1  no drift found but not everything was compared, or the run failed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-i", "--inventory", type=Path, help="inventory file or directory")
    parser.add_argument("--limit", help="only these hosts or groups (ansible --limit)")
    parser.add_argument("--layers", help="only these layers, comma-separated, e.g. toolkit,venv")
    parser.add_argument("--out", type=Path, help="also copy the report files (JSON, Markdown, JUnit, Prometheus) here")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write the report as one self-contained HTML page (nodes by layers, a colour "
        "per status, what drifted): of this run with -i, else of the stored run --against "
        "names; FILE's directory must exist",
    )
    parser.add_argument(
        "--since", metavar="RUN", help="list what changed since a stored run (its id, last, previous, or a path)"
    )
    parser.add_argument(
        "--against",
        metavar="RUN",
        default="last",
        help="without -i: the newer stored run --since compares with (default: last)",
    )
    parser.add_argument(
        "--keep-artifacts",
        type=int,
        default=20,
        metavar="N",
        help="keep ansible-runner's events of the newest N runs only (reports are always kept; default 20)",
    )
    parser.add_argument("--runs", action="store_true", help="list the stored drift runs and exit")
    parser.add_argument("--schema", action="store_true", help="print the JSON Schema of report.json and exit")
    parser.add_argument(
        "--query",
        metavar="JMESPATH",
        help="print what a JMESPath expression selects from report.json (of this run with -i, "
        "else of the stored run --against names); each node also carries its name as "
        "`node`, e.g. every node whose venv drifted: "
        "\"nodes.* | [?layers.venv.status=='drifted'].node\"",
    )
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.schema:
        print(json.dumps(JSON_SCHEMA, indent=2))
        return 0
    if args.runs:
        return list_runs()
    if args.html:
        check_page_path(args.html)
    if args.inventory is None:
        return stored(args)
    return check(args)


def stored(args: argparse.Namespace) -> int:
    """Without -i: a query of a stored run, the changes between two, and/or the page of the --against run."""
    if not (args.query or args.since or args.html):
        raise UsageError(
            "give -i INVENTORY to run a drift check, or --since RUN to compare stored runs, or "
            "--html FILE for the page of a stored run"
        )
    status = 0
    if args.query:
        status = print_query(args.query, find_report(args.against)[1])
    elif args.since:
        status = compare_stored(args.since, args.against)
    if args.html:
        name, report = find_report(args.against)
        write_page(args.html, report)
        print(f"page of {name} ({report.run_id}) written to {args.html}")
    return status


def check(args: argparse.Namespace) -> int:
    if args.keep_artifacts < 0:
        raise UsageError(f"--keep-artifacts {args.keep_artifacts}: give a number of runs, 0 or more")
    layers = parse_layers(args.layers)
    hosts = target_nodes(args.inventory, args.limit)
    baseline = find_report(args.since)[1] if args.since else None
    print(f"drift: {len(hosts)} node(s), layers {', '.join(layers or LAYERS)}")
    result = run_drift(args.inventory, limit=args.limit, layers=layers, say=print)
    if result.report is None:
        print(failure_reason(result))
        raise GpufleetError(
            f"the drift run {result.run_id} wrote no report (ansible {result.ansible_status}, "
            f"rc {result.ansible_rc}); its output is in {result.run_dir}"
        )
    print()
    print(summary_table(result.report))
    print(f"run {result.run_id}: report in {result.report_dir}")
    prune_artifacts(args.keep_artifacts)
    if args.out:
        copy_report(result.report_dir, args.out)
        print(f"report copied to {args.out}")
    if args.html:
        write_page(args.html, result.report)
        print(f"page written to {args.html}")
    if baseline is not None:
        print_changes(args.since, baseline, result.run_id, result.report)
    if args.query:
        print_query(args.query, result.report)
    return result.exit_code


def print_query(expression: str, report: FleetReport) -> int:
    """Prints the JSON that a JMESPath expression selects from report.json's document."""
    import jmespath
    from jmespath.exceptions import JMESPathError

    document = report.to_dict()
    for name, node in document["nodes"].items():
        node["node"] = name
    try:
        selected = jmespath.search(expression, document)
    except JMESPathError as error:
        raise UsageError(
            f"--query {expression!r} is not a JMESPath expression that applies to the report: "
            f"{error}; the report's fields are in `gpufleet drift --schema`"
        ) from None
    print(json.dumps(selected, indent=2, sort_keys=True))
    return 0


def copy_report(source: Path, destination: Path) -> None:
    """Each file is copied beside its name and renamed over it, so that a reader of DIR (node_exporter's textfile
    collector reading drift.prom on a schedule) sees the previous run's file or this run's, never half of one."""
    try:
        destination.mkdir(parents=True, exist_ok=True)
        for name in REPORT_FILES.values():
            partial = destination / f".{name}.partial"
            shutil.copy2(source / name, partial)
            partial.replace(destination / name)
    except OSError as error:
        raise GpufleetError(f"cannot copy the report to {destination}: {error.strerror}") from None


def check_page_path(path: Path) -> None:
    """Refuses a --html FILE that cannot be written, before anything runs."""
    directory = path.parent
    if path.is_dir():
        raise UsageError(f"--html {path}: is a directory; give the page's file name, e.g. {path / 'drift.html'}")
    if not directory.is_dir():
        raise UsageError(f"--html {path}: the directory {directory} does not exist; create it or give another path")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise GpufleetError(f"--html {path}: the directory {directory} cannot be written (permission denied)")


def write_page(path: Path, report: FleetReport) -> None:
    """The report's HTML page, written whole or not at all (a temporary file renamed over FILE)."""
    check_page_path(path)
    try:
        write_atomically(path, to_html(report))
    except OSError as error:
        raise GpufleetError(f"--html {path}: cannot write the page: {error.strerror or error}") from None


def print_changes(old_name: str, old: FleetReport, new_name: str, new: FleetReport) -> None:
    changes = compare_reports(old, new)
    print(f"\nchanges since {old_name} ({old.run_id}) in {new_name}: {len(changes) or 'none'}")
    for change in changes:
        print(f"  {change.describe()}")


def compare_stored(since: str, against: str) -> int:
    older_name, older = find_report(since)
    newer_name, newer = find_report(against)
    print_changes(older_name, older, newer_name, newer)
    return 0


def list_runs() -> int:
    runs = stored_runs()
    if not runs:
        print("no drift run is stored yet")
        return 0
    for path in runs:
        report = read_report(path / "drift")
        summary = report.summary()
        print(
            f"{path.name}  {report.started}  {summary['nodes']} nodes: {summary['ok']} ok, "
            f"{summary['drifted']} drifted, {summary['unreachable']} unreachable, {summary['error']} error"
        )
    return 0
