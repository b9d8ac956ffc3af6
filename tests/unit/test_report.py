"""The fleet drift report: building it from a run's results, its JSON (against its JSON Schema), Markdown,
JUnit XML, Prometheus textfile and terminal table, and the comparison of two runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest

from gpufleet.drift import read_report

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import (
    JSON_SCHEMA,
    FleetReport,
    ReportBuilder,
    ReportError,
    compare_reports,
)
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import (
    REPORT_FILES,
    summary_table,
    to_json,
    to_junit,
    to_markdown,
    to_prometheus,
    write_all,
)

LAYERS = ["base", "toolkit", "venv", "serve"]
LINK_DRIFT = {
    "check": "link /usr/local/cuda",
    "field": "target",
    "expected": "/usr/local/cuda-13.0",
    "actual": "/usr/local/cuda-12.8",
    "detail": "",
}
SYSCTL_DRIFT = {
    "check": "file /etc/sysctl.d/90-gpufleet.conf",
    "field": "content",
    "expected": "sha256:aaaa",
    "actual": "sha256:bbbb",
    "detail": "--- a (declared)\n+++ a (host)\n-vm.swappiness = 1\n+vm.swappiness = 60",
}


def payload(layer: str, status: str, drift: list | None = None, message: str = "", checked: int = 3) -> dict:
    return {
        "layer": layer,
        "status": status,
        "drift": drift or [],
        "errors": [],
        "checked": checked,
        "notes": [],
        "message": message,
    }


def fleet() -> FleetReport:
    """lab-1 drifted on two layers, lab-2 clean, lab-3 unreachable, lab-4 failed before its layers."""
    builder = ReportBuilder()
    for host in ("lab-1", "lab-2", "lab-3", "lab-4"):
        builder.record_plan(host, LAYERS)
    builder.record_layer("lab-1", payload("base", "drifted", [SYSCTL_DRIFT]))
    builder.record_layer("lab-1", payload("toolkit", "drifted", [LINK_DRIFT]))
    builder.record_layer("lab-1", payload("venv", "ok"))
    builder.record_layer("lab-1", payload("serve", "not_declared", message="vllm_service_instances is empty"))
    for layer in LAYERS[:3]:
        builder.record_layer("lab-2", payload(layer, "ok"))
    builder.record_layer("lab-2", payload("serve", "not_declared", message="vllm_service_instances is empty"))
    builder.record_unreachable("lab-3", "Failed to connect to the host via ssh: Connection refused")
    builder.record_failure("lab-4", "Read the facts: /usr/bin/python3.11 not found")
    builder.record_layer("lab-4", payload("base", "error", message="base: preflight refused the inventory"))
    return builder.build(run_id="20251129T120000-1-drift")


def test_every_node_gets_every_layer_and_a_status() -> None:
    report = fleet()
    assert report.layers == LAYERS
    assert {name: node.status for name, node in report.nodes.items()} == {
        "lab-1": "drifted",
        "lab-2": "ok",
        "lab-3": "unreachable",
        "lab-4": "error",
    }
    assert [result.status for result in report.nodes["lab-3"].layers.values()] == ["unreachable"] * 4
    assert report.nodes["lab-3"].message.startswith("Failed to connect")
    lab4 = report.nodes["lab-4"].layers
    assert lab4["base"].message == "base: preflight refused the inventory"
    assert lab4["venv"].status == "error"
    assert lab4["venv"].message == "no result: Read the facts: /usr/bin/python3.11 not found"
    assert report.summary() == {
        "nodes": 4,
        "ok": 1,
        "drifted": 1,
        "unreachable": 1,
        "error": 1,
        "cordoned": 0,
        "exit_code": 3,
    }


@pytest.mark.parametrize(
    ("nodes", "exit_code"),
    [
        (["lab-2"], 0),  # no drift
        (["lab-2", "lab-3"], 1),  # a node could not be compared: no claim of "no drift"
        (["lab-2", "lab-4"], 1),
        (["lab-1", "lab-2"], 2),  # drift, every node compared
        (["lab-1", "lab-3"], 3),  # drift, and a node unreachable: the drift found is not all there is
        (["lab-1", "lab-4"], 3),
        ([], 1),  # nothing compared at all
    ],
)
def test_exit_codes(nodes: list[str], exit_code: int) -> None:
    report = fleet()
    report.nodes = {name: report.nodes[name] for name in nodes}
    assert report.exit_code == exit_code


def test_json_follows_its_schema_and_reads_back(tmp_path: Path) -> None:
    report = fleet()
    document = json.loads(to_json(report))
    jsonschema.validate(document, JSON_SCHEMA)
    assert document["schema"] == "gpufleet-drift-report" and document["version"] == 1
    assert document["nodes"]["lab-1"]["layers"]["toolkit"]["drift"] == [LINK_DRIFT]
    path = tmp_path / "report.json"
    path.write_text(to_json(report))
    again = read_report(tmp_path)
    assert again.to_dict() == report.to_dict()


def test_a_report_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    with pytest.raises(ReportError, match="does not exist"):
        read_report(path)
    path.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(ReportError, match="not a gpufleet-drift-report document"):
        read_report(path)
    path.write_text(json.dumps({"schema": "gpufleet-drift-report", "version": 7}))
    with pytest.raises(ReportError, match="report version 7 is not supported"):
        read_report(path)
    path.write_text("{not json")
    with pytest.raises(ReportError, match="is not a drift report"):
        read_report(path)


def test_a_report_that_departs_from_its_schema_is_refused_naming_where(tmp_path: Path) -> None:
    """Review (ecosystem, section 4): the report's JSON Schema was written but only the tests used it; a report with
    a node status no gpufleet writes was read as if it were one."""
    document = json.loads(to_json(fleet()))
    document["nodes"]["lab-1"]["status"] = "fine"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(document))
    with pytest.raises(
        ReportError, match=r"does not follow the drift report's schema at nodes/lab-1/status: 'fine' is not one of"
    ):
        read_report(path)


def test_markdown_tables_details_and_not_declared() -> None:
    text = to_markdown(fleet())
    assert "| node | base | toolkit | venv | serve |" in text
    assert "| lab-1 | **drifted** | **drifted** | ok | not declared |" in text
    assert "| lab-3 | **unreachable** | **unreachable** | **unreachable** | **unreachable** |" in text
    assert "| toolkit | `link /usr/local/cuda: target` | `/usr/local/cuda-13.0` | `/usr/local/cuda-12.8` |" in text
    assert "```diff\n--- a (declared)\n+++ a (host)\n-vm.swappiness = 1\n+vm.swappiness = 60\n```" in text
    assert "## lab-2" not in text, "a clean node has no section"
    assert "- serve: vllm_service_instances is empty" in text


def test_junit_counts_failures_errors_and_skips() -> None:
    root = ElementTree.fromstring(to_junit(fleet()))
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("16", "2", "8", "2")
    lab1 = root.find("testsuite[@name='lab-1']")
    toolkit = lab1.find("testcase[@name='toolkit']")
    assert toolkit.get("classname") == "drift.lab-1"
    assert toolkit.find("failure").text == "link /usr/local/cuda: target: /usr/local/cuda-13.0 -> /usr/local/cuda-12.8"
    assert lab1.find("testcase[@name='serve']/skipped").get("message") == "vllm_service_instances is empty"
    assert lab1.find("testcase[@name='venv']").find("*") is None
    unreachable = root.find("testsuite[@name='lab-3']/testcase[@name='base']/error")
    assert unreachable.get("type") == "unreachable"


SAMPLE = re.compile(r'^[a-z_]+(\{[a-z_]+="(?:[^"\\]|\\.)*"(,[a-z_]+="(?:[^"\\]|\\.)*")*\})? -?[0-9.]+$')


def test_prometheus_textfile() -> None:
    text = to_prometheus(fleet(), 1764417600.0)
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert all(SAMPLE.match(line) for line in samples), [line for line in samples if not SAMPLE.match(line)]
    assert 'gpufleet_drift_layer{node="lab-1",layer="toolkit"} 1' in samples
    assert 'gpufleet_drift_layer{node="lab-1",layer="venv"} 0' in samples
    # Layers not compared carry no 0/1 drift value, only their status.
    assert not any(line.startswith('gpufleet_drift_layer{node="lab-3"') for line in samples)
    assert 'gpufleet_drift_layer_status{node="lab-3",layer="base",status="unreachable"} 1' in samples
    assert 'gpufleet_drift_node_up{node="lab-3"} 0' in samples
    assert 'gpufleet_drift_layer_items{node="lab-1",layer="base"} 1' in samples
    assert "gpufleet_drift_exit_code 3" in samples
    assert "gpufleet_drift_last_run_timestamp_seconds 1764417600" in samples
    for name in ("gpufleet_drift_layer", "gpufleet_drift_layer_status", "gpufleet_drift_node_up"):
        assert f"# TYPE {name} gauge" in text


def test_prometheus_labels_are_escaped() -> None:
    builder = ReportBuilder()
    builder.record_layer('odd"node\\x', payload("base", "ok"))
    text = to_prometheus(builder.build(), 0)
    assert 'gpufleet_drift_layer{node="odd\\"node\\\\x",layer="base"} 0' in text


def test_terminal_table() -> None:
    lines = summary_table(fleet()).splitlines()
    assert re.split(r"\s+", lines[0]) == ["node", "base", "toolkit", "venv", "serve"]
    assert re.split(r"\s+", lines[1]) == ["lab-1", "DRIFT", "DRIFT", "ok", "-"]
    assert re.split(r"\s+", lines[3]) == ["lab-3"] + ["UNREACHABLE"] * 4
    assert "lab-1 toolkit: link /usr/local/cuda: target: /usr/local/cuda-13.0 -> /usr/local/cuda-12.8" in lines
    assert lines[-2] == "4 nodes: 1 ok, 1 drifted, 1 unreachable, 1 error"
    assert lines[-1] == (
        "not compared: lab-3 (unreachable), lab-4 (error): what drift this run found is not all there is (exit 3)"
    )


def test_write_all_writes_every_format(tmp_path: Path) -> None:
    written = write_all(fleet(), tmp_path / "out", 0)
    assert {path.name for path in written.values()} == set(REPORT_FILES.values())
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == sorted(REPORT_FILES.values())


def test_changes_between_two_runs() -> None:
    before, after = fleet(), fleet()
    after.nodes["lab-1"].layers["toolkit"].drift[0].actual = "/usr/local/cuda-12.4"
    after.nodes["lab-1"].layers["base"].status = "ok"
    after.nodes["lab-1"].layers["base"].drift = []
    after.nodes["lab-2"].layers["venv"] = after.nodes["lab-1"].layers["toolkit"]
    del after.nodes["lab-4"]
    changes = [change.describe() for change in compare_reports(before, after)]
    assert changes == [
        "lab-1 base: drifted -> ok",
        "lab-1 base: back to declared: file /etc/sysctl.d/90-gpufleet.conf: content (sha256:aaaa)",
        "lab-1 toolkit: link /usr/local/cuda: target now /usr/local/cuda-12.4 (was /usr/local/cuda-12.8)",
        "lab-2 venv: ok -> drifted",
        "lab-2 venv: new drift: link /usr/local/cuda: target: /usr/local/cuda-13.0 -> /usr/local/cuda-12.4",
        "lab-4: not in the newer run",
    ]
    assert compare_reports(fleet(), fleet()) == []


def test_a_cordoned_node_is_cordoned_not_drifted_and_keeps_the_fleet_clean() -> None:
    builder = ReportBuilder()
    for node in ("lab-1", "lab-2"):
        builder.record_plan(node, ["serve", "proxy"])
        builder.record_layer(node, {"layer": "serve", "status": "ok", "checked": 3})
    # lab-2's proxy answers 503 while cordoned; a layer of it drifted too.
    builder.record_layer("lab-1", {"layer": "proxy", "status": "ok", "checked": 5})
    builder.record_layer(
        "lab-2", {"layer": "cordon", "status": "cordoned", "message": "fan noise (since 2026-12-01T12:00:00Z)"}
    )
    builder.record_layer(
        "lab-2",
        {
            "layer": "proxy",
            "status": "drifted",
            "checked": 5,
            "drift": [
                {
                    "check": "file /etc/nginx/conf.d/gpufleet-inference.conf",
                    "field": "sha256",
                    "expected": "a",
                    "actual": "b",
                }
            ],
        },
    )
    report = builder.build()
    assert report.nodes["lab-2"].status == "cordoned"
    assert report.summary() == {
        "nodes": 2,
        "ok": 1,
        "drifted": 0,
        "unreachable": 0,
        "error": 0,
        "cordoned": 1,
        "exit_code": 0,
    }
    assert FleetReport.from_dict(json.loads(json.dumps(report.to_dict()))).nodes["lab-2"].status == "cordoned"
    table = summary_table(report)
    assert "lab-2: cordoned: fan noise (since 2026-12-01T12:00:00Z)" in table
    assert "2 nodes: 1 ok, 0 drifted, 0 unreachable, 0 error, 1 cordoned" in table
