"""The fleet drift report as one self-contained HTML page (`gpufleet drift --html FILE`): the run, its
summary counts, a table of nodes by layers with one colour per status and a legend, then what is wrong with
each node that is not ok. Inline CSS only: no JavaScript, nothing fetched from elsewhere. One jinja2 template
with autoescape: every value taken from the report is HTML-escaped by default."""

from __future__ import annotations

from jinja2 import Environment

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import (
    LAYER_STATUSES,
    FleetReport,
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


def stylesheet() -> str:
    rules = [
        f"td.status-{status}, span.status-{status} {{ background: {COLOURS[status]}; color: {TEXT_COLOURS[status]}; }}"
        for status in LAYER_STATUSES
    ]
    return BASE_CSS + "\n".join(rules) + "\n"


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>gpufleet drift report {{ report.run_id or "unnamed" }}</title>
<style>{{ stylesheet }}</style>
</head>
<body>
<h1>gpufleet drift report</h1>
<p class="run">Run <code>{{ report.run_id or "unnamed" }}</code>, {{ report.started }} to {{ report.finished }} {#-#}
 ({{ "%.1f" | format(report.duration_seconds) }} s), playbook <code>{{ report.playbook }}</code></p>
<ul class="summary"><li>{{ summary.nodes }} node{{ "" if summary.nodes == 1 else "s" }}</li>
{%- for status in ["ok", "drifted", "unreachable", "error", "cordoned"] if status != "cordoned" or summary.cordoned -%}
<li class="count-{{ status }}">{{ summary[status] }} {{ labels[status] }}</li>
{%- endfor -%}
<li class="exit-code">exit code {{ summary.exit_code }}</li></ul>
{% if report.not_compared() %}
<p class="not-compared">Not compared: {{ report.not_compared() | join(", ") }}: what drift this run found is {#-#}
 not all there is.</p>
{% endif %}
<table class="fleet">
<thead><tr><th>node</th>{% for layer in report.layers %}<th>{{ layer }}</th>{% endfor %}</tr></thead>
<tbody>
{% for name, node in nodes %}
<tr class="node node-{{ node.status }}"><th scope="row">{{ name }}</th>
{%- for layer in report.layers %}{% set result = node.layers.get(layer) %}
{%- if result is none %}<td class="status-none"></td>
{%- else %}<td class="status-{{ result.status }}" title="{{ result.summary() }}">
{%- if node.status != "ok" and result.status not in ["ok", "not_declared"] -%}
<a href="#node-{{ index_of[name] }}" style="color: inherit">{{ labels[result.status] }}</a>
{%- else %}{{ labels[result.status] }}{% endif %}</td>
{%- endif %}{% endfor %}</tr>
{% endfor %}
</tbody>
</table>
<ul class="legend">
{%- for status in statuses -%}
<li><span class="swatch status-{{ status }}"></span>{{ labels[status] }}: {{ meanings[status] }}</li>
{%- endfor -%}
</ul>
{% for name, node in nodes if node.status != "ok" %}
<section class="node" id="node-{{ index_of[name] }}">
<h2><code>{{ node.name }}</code>: <span class="status-{{ node.status }}">&nbsp;{{ labels[node.status] }}&nbsp;</span></h2>
{% if node.status == "unreachable" %}
<p class="unreachable">Not reached: {{ node.message or (node.layers.values() | selectattr("status", "equalto", "unreachable")
  | map(attribute="summary") | map("call") | unique | sort | join("; ")) }}</p>
{% else %}{% for layer, result in node.layers.items() %}
{% if result.status == "drifted" %}
<h3>{{ layer }}: drifted</h3>
<ul class="drift">
{% for item in result.drift %}
<li><code>{{ item.check }}: {{ item.field }}</code>: <span class="expected">{{ item.expected | text }}</span> {#-#}
 &rarr; <span class="actual">{{ item.actual | text }}</span>{% if item.detail %}
<pre>{{ item.detail }}</pre>{% endif %}</li>
{% endfor %}
</ul>
{% elif result.status == "cordoned" %}
<p class="cordoned">Cordoned: {{ result.summary() }}</p>
{% elif result.status in ["error", "unreachable"] %}
<p class="{{ result.status }}">{{ layer }}: {{ result.status }}: {{ result.summary() }}</p>
{% endif %}{% endfor %}{% endif %}
</section>
{% endfor %}
{% if not_declared %}
<h2>Not declared</h2>
<ul class="not-declared">
{% for line in not_declared %}<li>{{ line }}</li>
{% endfor %}</ul>
{% endif %}
</body>
</html>
"""

_ENVIRONMENT = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
_ENVIRONMENT.filters["text"] = lambda value: value if isinstance(value, str) else format_value(value)
_ENVIRONMENT.filters["call"] = lambda method: method()


def to_html(report: FleetReport) -> str:
    nodes = sorted(report.nodes.items())
    not_declared = sorted(
        {
            f"{layer}: {result.message}"
            for node in report.nodes.values()
            for layer, result in node.layers.items()
            if result.status == "not_declared"
        }
    )
    return _ENVIRONMENT.from_string(PAGE).render(
        report=report,
        summary=report.summary(),
        nodes=nodes,
        index_of={name: index for index, (name, _) in enumerate(nodes)},
        not_declared=not_declared,
        stylesheet=stylesheet(),
        statuses=LAYER_STATUSES,
        labels=LABELS,
        meanings=MEANINGS,
    )
