"""The fleet drift report as one self-contained HTML page (`gpufleet drift --html FILE`): the run, its
summary counts, a table of nodes by layers with one colour per status and a legend, then what is wrong with
each node that is not ok. Inline CSS only: no JavaScript, nothing fetched from elsewhere. Every value taken
from the report is HTML-escaped."""

from __future__ import annotations

from html import escape

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import (
    LAYER_STATUSES,
    DriftItem,
    FleetReport,
    LayerResult,
    NodeResult,
    format_value,
)

# One background colour per status, each exact and distinct, so a screenshot of the page can be checked
# pixel by pixel (tests/unit/test_report_html.py counts them).
COLOURS = {
    "ok": "#2e9e44",
    "drifted": "#e0452b",
    "not_declared": "#dcdcdc",
    "unreachable": "#4a4a4a",
    "error": "#7b2d8e",
    "cordoned": "#2f6fd6",
}
TEXT_COLOURS = {
    "ok": "#ffffff",
    "drifted": "#ffffff",
    "not_declared": "#333333",
    "unreachable": "#ffffff",
    "error": "#ffffff",
    "cordoned": "#ffffff",
}
LABELS = {
    "ok": "ok",
    "drifted": "drifted",
    "not_declared": "not declared",
    "unreachable": "unreachable",
    "error": "error",
    "cordoned": "cordoned",
}
MEANINGS = {
    "ok": "every check matches",
    "drifted": "a declared value differs",
    "not_declared": "the inventory does not declare the layer",
    "unreachable": "the node was not reached",
    "error": "the layer could not be compared",
    "cordoned": "taken out of service by an operator",
}

BASE_CSS = """
body { font-family: sans-serif; margin: 24px; color: #222222; background: #ffffff; }
h1 { font-size: 22px; margin: 0 0 8px 0; }
h2 { font-size: 17px; margin: 24px 0 6px 0; }
h3 { font-size: 15px; margin: 12px 0 4px 0; }
table.fleet { border-collapse: collapse; margin: 16px 0; }
table.fleet th, table.fleet td { border: 2px solid #ffffff; padding: 10px 16px; text-align: left; }
table.fleet thead th { background: #f2f2f2; }
table.fleet tbody th { background: #f2f2f2; font-weight: normal; font-family: monospace; }
td.status-none { background: #ffffff; }
ul.summary, ul.legend { list-style: none; padding: 0; margin: 8px 0; }
ul.summary li, ul.legend li { display: inline-block; margin: 0 16px 4px 0; }
span.swatch { display: inline-block; width: 14px; height: 14px; vertical-align: middle; margin-right: 4px; }
code, pre { font-family: monospace; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
span.expected { color: #1a5e2a; }
span.actual { color: #a3281a; font-weight: bold; }
"""


def _e(value: object) -> str:
    """Any value from the report, as text: quotes escaped too, so it is safe in an attribute as well."""
    return escape(value if isinstance(value, str) else format_value(value), quote=True)


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def stylesheet() -> str:
    rules = [
        f"td.status-{status}, span.status-{status} {{ background: {COLOURS[status]}; color: {TEXT_COLOURS[status]}; }}"
        for status in LAYER_STATUSES
    ]
    return BASE_CSS + "\n".join(rules) + "\n"


def to_html(report: FleetReport) -> str:
    title = f"gpufleet drift report {report.run_id or 'unnamed'}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{_e(title)}</title>",
        f"<style>{stylesheet()}</style>",
        "</head>",
        "<body>",
        _heading(report),
        _table(report),
        _legend(),
    ]
    numbered = sorted(report.nodes.items())
    parts += [_node_section(index, node) for index, (_, node) in enumerate(numbered) if node.status != "ok"]
    parts += [_not_declared(report), "</body>", "</html>"]
    return "\n".join(part for part in parts if part) + "\n"


def _heading(report: FleetReport) -> str:
    summary = report.summary()
    counts = [f"<li>{_nodes(summary['nodes'])}</li>"]
    counts += [
        f'<li class="count-{status}">{summary[status]} {LABELS[status]}</li>'
        for status in ("ok", "drifted", "unreachable", "error", "cordoned")
        if status != "cordoned" or summary["cordoned"]
    ]
    counts.append(f'<li class="exit-code">exit code {summary["exit_code"]}</li>')
    lines = [
        "<h1>gpufleet drift report</h1>",
        f'<p class="run">Run <code>{_e(report.run_id or "unnamed")}</code>, {_e(report.started)} to '
        f"{_e(report.finished)} ({report.duration_seconds:.1f} s), playbook <code>{_e(report.playbook)}</code></p>",
        '<ul class="summary">' + "".join(counts) + "</ul>",
    ]
    if report.not_compared():
        lines.append(
            f'<p class="not-compared">Not compared: {_e(", ".join(report.not_compared()))}: what drift '
            f"this run found is not all there is.</p>"
        )
    return "\n".join(lines)


def _table(report: FleetReport) -> str:
    header = "<tr><th>node</th>" + "".join(f"<th>{_e(layer)}</th>" for layer in report.layers) + "</tr>"
    rows = []
    for index, (name, node) in enumerate(sorted(report.nodes.items())):
        cells = [_cell(index, node, layer) for layer in report.layers]
        rows.append(f'<tr class="node node-{node.status}"><th scope="row">{_e(name)}</th>' + "".join(cells) + "</tr>")
    return '<table class="fleet">\n<thead>' + header + "</thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>\n</table>"


def _cell(index: int, node: NodeResult, layer: str) -> str:
    result = node.layers.get(layer)
    if result is None:
        return '<td class="status-none"></td>'
    label = LABELS[result.status]
    if node.status != "ok" and result.status not in ("ok", "not_declared"):
        label = f'<a href="#node-{index}" style="color: inherit">{label}</a>'
    return f'<td class="status-{result.status}" title="{_e(result.summary())}">{label}</td>'


def _legend() -> str:
    items = [
        f'<li><span class="swatch status-{status}"></span>{LABELS[status]}: {MEANINGS[status]}</li>'
        for status in LAYER_STATUSES
    ]
    return '<ul class="legend">' + "".join(items) + "</ul>"


def _node_section(index: int, node: NodeResult) -> str:
    lines = [
        f'<section class="node" id="node-{index}">',
        f'<h2><code>{_e(node.name)}</code>: <span class="status-{node.status}">&nbsp;{LABELS[node.status]}&nbsp;'
        "</span></h2>",
    ]
    if node.status == "unreachable":
        reasons = sorted({result.summary() for result in node.layers.values() if result.status == "unreachable"})
        lines.append(f'<p class="unreachable">Not reached: {_e(node.message or "; ".join(reasons))}</p>')
    else:
        lines += [_layer_block(layer, result) for layer, result in node.layers.items()]
    lines.append("</section>")
    return "\n".join(line for line in lines if line)


def _layer_block(layer: str, result: LayerResult) -> str:
    if result.status == "drifted":
        items = "\n".join(_drift_item(item) for item in result.drift)
        return f'<h3>{_e(layer)}: drifted</h3>\n<ul class="drift">\n{items}\n</ul>'
    if result.status == "cordoned":
        return f'<p class="cordoned">Cordoned: {_e(result.summary())}</p>'
    if result.status in ("error", "unreachable"):
        return f'<p class="{result.status}">{_e(layer)}: {result.status}: {_e(result.summary())}</p>'
    return ""


def _drift_item(item: DriftItem) -> str:
    text = (
        f'<li><code>{_e(item.check)}: {_e(item.field)}</code>: <span class="expected">{_e(item.expected)}'
        f'</span> &rarr; <span class="actual">{_e(item.actual)}</span>'
    )
    if item.detail:
        text += f"\n<pre>{_e(item.detail)}</pre>"
    return text + "</li>"


def _not_declared(report: FleetReport) -> str:
    lines = sorted(
        {
            f"{layer}: {result.message}"
            for node in report.nodes.values()
            for layer, result in node.layers.items()
            if result.status == "not_declared"
        }
    )
    if not lines:
        return ""
    return (
        '<h2>Not declared</h2>\n<ul class="not-declared">\n'
        + "\n".join(f"<li>{_e(line)}</li>" for line in lines)
        + "\n</ul>"
    )
