"""`gpufleet report SLICE.json ...`: one report from the --json documents of a run's slices (`gpufleet provision
--slice K/N --json`, one per process or controller, gpufleet.slicing): every node's counters, the slices missing,
one exit code. Exit 0 when every slice is there and every slice succeeded, else the worst slice's code (1 for a
missing slice).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpufleet import exit_codes, run_document
from gpufleet.errors import UsageError
from gpufleet.runner import STAT_KEYS, host_table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    text = "one report from the --json documents of a run's slices (gpufleet provision --slice K/N --json)"
    parser = subparsers.add_parser("report", help=text, description=text)
    parser.add_argument("documents", nargs="+", type=Path, metavar="SLICE.json", help="one document per slice")
    parser.add_argument("--json", action="store_true", help="print the combined document (schema gpufleet.run/v1)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    combined = combine([read(path) for path in args.documents])
    print(json.dumps(combined, indent=2, sort_keys=True) if args.json else render(combined))
    return int(combined["exit_code"])


def read(path: Path) -> dict[str, Any]:
    """A slice's document; UsageError naming the file and what it should be."""
    fix = f"write it with `gpufleet provision --slice K/N --json > {path}`"
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: not a readable JSON document ({error}); {fix}") from None
    if not isinstance(document, dict) or document.get("schema") != run_document.SCHEMA or "slice" not in document:
        raise UsageError(f"{path}: not the --json document of a slice ({run_document.SCHEMA} with a slice); {fix}")
    return document


def combine(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The slices as one run: their runs, each node's counters summed over them, the slices missing."""
    counts = sorted({int(document["slice"]["count"]) for document in documents})
    commands = sorted({str(document["command"]) for document in documents})
    if len(counts) > 1 or len(commands) > 1:
        raise UsageError(
            f"the documents are not the slices of one run (slice counts {counts}, commands {commands}): give the "
            "documents of one run's slices"
        )
    indexes = [int(document["slice"]["index"]) for document in documents]
    repeated = sorted({index for index in indexes if indexes.count(index) > 1})
    if repeated:
        raise UsageError(f"slice {repeated[0]}/{counts[0]} is given twice: give each slice's document once")
    missing = sorted(set(range(1, counts[0] + 1)) - set(indexes))
    hosts: dict[str, dict[str, int]] = {}
    for document in documents:
        # A failed slice's give-back of its leases (lease.yml) is bookkeeping: its nodes are counted once.
        for playbook_run in (item for item in document["runs"] if item["playbook"] != "lease.yml"):
            for host, counters in playbook_run["hosts"].items():
                summed = hosts.setdefault(host, dict.fromkeys(STAT_KEYS, 0))
                for key in STAT_KEYS:
                    summed[key] += int(counters.get(key, 0))
    codes = [int(document["exit_code"]) for document in documents]
    exit_code = max(codes + [exit_codes.FAILED if missing else exit_codes.OK])
    return {
        "schema": run_document.SCHEMA,
        "command": commands[0],
        "exit_code": exit_code,
        "error": f"slice(s) {', '.join(f'{index}/{counts[0]}' for index in missing)} missing" if missing else None,
        "slices": [
            {**document["slice"], "exit_code": document["exit_code"], "error": document["error"]}
            for document in sorted(documents, key=lambda item: int(item["slice"]["index"]))
        ],
        "missing_slices": missing,
        "hosts": dict(sorted(hosts.items())),
        "runs": [playbook_run for document in documents for playbook_run in document["runs"]],
    }


def render(combined: dict[str, Any]) -> str:
    count = len(combined["slices"]) + len(combined["missing_slices"])
    lines = [f"gpufleet {combined['command']} in {count} slice(s):"]
    for item in combined["slices"]:
        outcome = (
            "ok" if item["exit_code"] == exit_codes.OK else f"exit {item['exit_code']}: {item['error'] or 'failed'}"
        )
        lines.append(f"  slice {item['index']}/{item['count']}: {len(item['hosts'])} node(s), {outcome}")
    lines.extend(f"  slice {index}/{count}: MISSING (no document given)" for index in combined["missing_slices"])
    lines.extend(host_table(combined["hosts"]))
    verdict = "every slice done" if combined["exit_code"] == exit_codes.OK else combined["error"] or "a slice failed"
    lines.append(f"{verdict} (exit {combined['exit_code']})")
    return "\n".join(lines)
