"""The fleet drift report written for people and machines: JSON, Markdown, JUnit XML (CI systems), a
Prometheus textfile (node_exporter's textfile collector) and a summary table for the terminal."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from xml.etree import ElementTree

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import (
    LAYER_STATUSES,
    FleetReport,
    LayerResult,
    format_value,
)

REPORT_FILES = {"json": "report.json", "markdown": "report.md", "junit": "junit.xml", "prometheus": "drift.prom"}
# Short cells for the tables: a drifted layer must stand out.
CELLS = {
    "ok": "ok",
    "drifted": "DRIFT",
    "not_declared": "-",
    "unreachable": "UNREACHABLE",
    "error": "ERROR",
    "cordoned": "CORDONED",
}
MARKDOWN_CELLS = {
    "ok": "ok",
    "drifted": "**drifted**",
    "not_declared": "not declared",
    "unreachable": "**unreachable**",
    "error": "**error**",
    "cordoned": "**cordoned**",
}


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def to_json(report: FleetReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"


# ---- Markdown ------------------------------------------------------------------------------------------


def _md(text: str) -> str:
    """A value inside a Markdown table cell: code, with pipes and newlines neutralised."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return f"`{text}`" if text else ""


def to_markdown(report: FleetReport) -> str:
    summary = report.summary()
    lines = [
        "# gpufleet drift report",
        "",
        f"Run `{report.run_id or 'unnamed'}`, {report.started} to {report.finished} ({report.duration_seconds:.1f} s): "
        f"{_nodes(summary['nodes'])}, {summary['ok']} ok, {summary['drifted']} drifted, "
        f"{summary['unreachable']} unreachable, {summary['error']} error (exit code {summary['exit_code']}).",
        "",
        "| node | " + " | ".join(report.layers) + " |",
        "|---|" + "---|" * len(report.layers),
    ]
    for name, node in sorted(report.nodes.items()):
        cells = [MARKDOWN_CELLS[node.layers[layer].status] if layer in node.layers else "" for layer in report.layers]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, node in sorted(report.nodes.items()):
        if node.status == "ok":
            continue
        lines += ["", f"## {name}: {node.status}", ""]
        if node.status == "unreachable":
            lines.append(f"Not reached: {node.message}")
            continue
        lines += ["| layer | what | expected | actual |", "|---|---|---|---|"]
        for layer, result in node.layers.items():
            lines += _markdown_rows(layer, result)
        details = [(layer, item) for layer, result in node.layers.items() for item in result.drift if item.detail]
        for layer, item in details:
            lines += [
                "",
                f"{layer}, {item.check} ({item.field}):",
                "",
                "```diff" if item.detail.startswith("---") else "```",
                item.detail,
                "```",
            ]
    not_declared = sorted(
        {
            f"{layer}: {result.message}"
            for node in report.nodes.values()
            for layer, result in node.layers.items()
            if result.status == "not_declared"
        }
    )
    if not_declared:
        lines += ["", "## Not declared", ""] + [f"- {line}" for line in not_declared]
    return "\n".join(lines) + "\n"


def _markdown_rows(layer: str, result: LayerResult) -> list[str]:
    if result.status == "drifted":
        return [
            f"| {layer} | {_md(item.check + ': ' + item.field)} | {_md(format_value(item.expected))} | "
            f"{_md(format_value(item.actual))} |"
            for item in result.drift
        ]
    if result.status in ("error", "unreachable", "cordoned"):
        return [f"| {layer} | {result.status} | | {_md(result.summary())} |"]
    return []


# ---- JUnit XML -------------------------------------------------------------------------------------------


def to_junit(report: FleetReport) -> str:
    """One test suite per node, one test case per layer: drifted is a failure, error and unreachable are
    errors, not_declared is skipped."""
    suites = ElementTree.Element("testsuites", name="gpufleet drift", time=f"{report.duration_seconds:.1f}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for name, node in sorted(report.nodes.items()):
        counts = {
            "tests": len(node.layers),
            "failures": sum(r.status == "drifted" for r in node.layers.values()),
            "errors": sum(r.status in ("error", "unreachable") for r in node.layers.values()),
            "skipped": sum(r.status in ("not_declared", "cordoned") for r in node.layers.values()),
        }
        attributes = {"name": name, "timestamp": report.started, **{key: str(value) for key, value in counts.items()}}
        suite = ElementTree.SubElement(suites, "testsuite", attributes)
        for layer, result in node.layers.items():
            _junit_case(suite, name, layer, result)
        for key in totals:
            totals[key] += counts[key]
    for key, value in totals.items():
        suites.set(key, str(value))
    ElementTree.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(suites, encoding="unicode") + "\n"


def _junit_case(suite: ElementTree.Element, node: str, layer: str, result: LayerResult) -> None:
    case = ElementTree.SubElement(suite, "testcase", classname=f"drift.{node}", name=layer)
    if result.status == "drifted":
        failure = ElementTree.SubElement(
            case, "failure", type="drift", message=f"{len(result.drift)} value(s) differ from the declared state"
        )
        failure.text = "\n".join(item.describe() + (f"\n{item.detail}" if item.detail else "") for item in result.drift)
    elif result.status in ("error", "unreachable"):
        error = ElementTree.SubElement(case, "error", type=result.status, message=result.summary()[:500])
        error.text = result.summary()
    elif result.status in ("not_declared", "cordoned"):
        ElementTree.SubElement(case, "skipped", message=result.message or result.status)


# ---- Prometheus textfile ---------------------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


PROMETHEUS_HELP = [
    (
        "gpufleet_drift_layer",
        "1 when the layer of the node differs from the declared state, 0 when it matches; "
        "absent for layers that were not compared (see gpufleet_drift_layer_status).",
    ),
    (
        "gpufleet_drift_layer_status",
        "1 for the status of the layer in the last drift run (ok, drifted, "
        "not_declared, unreachable, error, cordoned), 0 for the others.",
    ),
    ("gpufleet_drift_layer_items", "Number of declared values that differ in the layer."),
    ("gpufleet_drift_node_up", "1 when the drift run reached the node, 0 when it was unreachable."),
    ("gpufleet_drift_last_run_timestamp_seconds", "When the last drift run finished (Unix time)."),
    ("gpufleet_drift_run_duration_seconds", "How long the last drift run took."),
    (
        "gpufleet_drift_exit_code",
        "Exit code of the last drift run: 0 no drift, 2 drift, 3 drift and not every node "
        "compared, 1 no drift found but not every node compared.",
    ),
]


def to_prometheus(report: FleetReport, finished_epoch: float) -> str:
    samples: dict[str, list[str]] = {name: [] for name, _help in PROMETHEUS_HELP}
    for name, node in sorted(report.nodes.items()):
        node_label = f'node="{_label(name)}"'
        samples["gpufleet_drift_node_up"].append(
            f"gpufleet_drift_node_up{{{node_label}}} {int(node.status != 'unreachable')}"
        )
        for layer, result in node.layers.items():
            labels = f'{node_label},layer="{_label(layer)}"'
            if result.status in ("ok", "drifted"):
                samples["gpufleet_drift_layer"].append(
                    f"gpufleet_drift_layer{{{labels}}} {int(result.status == 'drifted')}"
                )
            samples["gpufleet_drift_layer_items"].append(f"gpufleet_drift_layer_items{{{labels}}} {len(result.drift)}")
            for status in LAYER_STATUSES:
                samples["gpufleet_drift_layer_status"].append(
                    f'gpufleet_drift_layer_status{{{labels},status="{status}"}} {int(result.status == status)}'
                )
    samples["gpufleet_drift_last_run_timestamp_seconds"].append(
        f"gpufleet_drift_last_run_timestamp_seconds {finished_epoch:.0f}"
    )
    samples["gpufleet_drift_run_duration_seconds"].append(
        f"gpufleet_drift_run_duration_seconds {report.duration_seconds:.1f}"
    )
    samples["gpufleet_drift_exit_code"].append(f"gpufleet_drift_exit_code {report.exit_code}")
    lines = []
    for name, help_text in PROMETHEUS_HELP:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"] + samples[name]
    return "\n".join(lines) + "\n"


# ---- terminal ----------------------------------------------------------------------------------------------


def summary_table(report: FleetReport) -> str:
    """Nodes by layers, then one line per differing value, per layer not compared, per unreachable node."""
    rows = [["node"] + report.layers]
    for name, node in sorted(report.nodes.items()):
        rows.append(
            [name] + [CELLS[node.layers[layer].status] if layer in node.layers else "" for layer in report.layers]
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    for name, node in sorted(report.nodes.items()):
        if node.status == "unreachable":
            lines.append(f"{name}: unreachable: {node.message}")
            continue
        for layer, result in node.layers.items():
            if result.status == "drifted":
                lines += [f"{name} {layer}: {item.describe()}" for item in result.drift]
            elif result.status == "error":
                lines.append(f"{name} {layer}: error: {result.summary()}")
            elif result.status == "cordoned":
                lines.append(f"{name}: cordoned: {result.summary()}")
    summary = report.summary()
    lines.append(
        f"{_nodes(summary['nodes'])}: {summary['ok']} ok, {summary['drifted']} drifted, "
        f"{summary['unreachable']} unreachable, {summary['error']} error"
        + (f", {summary['cordoned']} cordoned" if summary["cordoned"] else "")
    )
    if report.not_compared():
        lines.append(
            f"not compared: {', '.join(report.not_compared())}: what drift this run found is not all "
            f"there is (exit {summary['exit_code']})"
        )
    return "\n".join(lines)


# ---- files --------------------------------------------------------------------------------------------------


def write_atomically(path: Path, text: str) -> None:
    """node_exporter may read the textfile at any moment: it must never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def write_all(report: FleetReport, directory: Path, finished_epoch: float) -> dict[str, Path]:
    """Writes every format into `directory`; returns format -> path."""
    texts = {
        "json": to_json(report),
        "markdown": to_markdown(report),
        "junit": to_junit(report),
        "prometheus": to_prometheus(report, finished_epoch),
    }
    written = {}
    for kind, text in texts.items():
        path = directory / REPORT_FILES[kind]
        write_atomically(path, text)
        written[kind] = path
    return written
