"""The shipped Prometheus alert rules: valid for Prometheus, each alert tested on synthetic series with promtool."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from gpufleet import PROJECT_ROOT
from monitoring_support import DASHBOARD, MONITORING, dashboard_panels, debian_tool

ALERT_RULES = MONITORING / "prometheus-alerts.yml"
ALERT_TESTS = Path(__file__).parent / "monitoring" / "prometheus-alerts.test.yml"
SCHEDULE_UNITS = MONITORING / "systemd"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(debian_tool("prometheus", "promtool")), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(ALERT_RULES), cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_fires_and_resolves_as_its_test_expects() -> None:
    result = promtool("test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_test_case() -> None:
    rules = yaml.safe_load(ALERT_RULES.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    firing = {
        case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    assert alerts - firing == set(), "alerts without a test case in which they fire"
    assert len(alerts) >= 12


def test_every_alert_says_what_to_do() -> None:
    rules = yaml.safe_load(ALERT_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_drift_schedule_units_pass_systemd_verify(tmp_path: Path) -> None:
    """The controller's timer and service as shipped, with ExecStart's gpufleet where this checkout has it."""
    gpufleet = Path(sys.executable).parent / "gpufleet"
    units = []
    for shipped in sorted(SCHEDULE_UNITS.glob("gpufleet-drift.*")):
        unit = tmp_path / shipped.name
        unit.write_text(shipped.read_text().replace("/usr/local/bin/gpufleet", str(gpufleet)))
        units.append(str(unit))
    assert [Path(unit).suffix for unit in units] == [".service", ".timer"]
    result = subprocess.run(
        ["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


DCGM_COUNTERS = MONITORING / "dcgm-exporter-counters.csv"
DCGM_FIELD = re.compile(r"\bDCGM_FI_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_dcgm_field_read_is_one_the_shipped_counters_file_exports() -> None:
    exported = {
        line.split(",")[0].strip()
        for line in DCGM_COUNTERS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    read = set(DCGM_FIELD.findall(ALERT_RULES.read_text())) | set(DCGM_FIELD.findall(DASHBOARD.read_text()))
    assert read, "the rules and the dashboard read no GPU counter"
    assert read - exported == set(), "fields the exporter would not export with data/monitoring's counters file"


def test_every_dashboard_query_is_valid_promql() -> None:
    """Grafana's variables replaced by values Prometheus accepts; promtool parses each query as a rule would."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"gpufleet_dashboard:query_{index}", "expr": query}
                    for index, (_title, query) in enumerate(dashboard_panels())
                ],
            }
        ]
    }
    assert len(rules["groups"][0]["rules"]) >= 20
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as rule_file:
        yaml.safe_dump(rules, rule_file)
        rule_file.flush()
        result = promtool("check", "rules", rule_file.name, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
