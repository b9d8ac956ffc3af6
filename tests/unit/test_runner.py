"""The playbook runner's summary and the provision command's input checks."""

from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.runner import PlaybookResult, format_summary, host_counters


def test_host_counters_pivot_ansible_stats_per_host() -> None:
    stats = {"ok": {"lab-1": 12, "lab-2": 11}, "changed": {"lab-1": 3}, "failures": {"lab-2": 1}, "unreachable": {}}
    counters = host_counters(stats)
    assert counters["lab-1"] == {
        "ok": 12,
        "changed": 3,
        "failures": 0,
        "unreachable": 0,
        "skipped": 0,
        "rescued": 0,
        "ignored": 0,
    }
    assert counters["lab-2"]["failures"] == 1 and counters["lab-2"]["changed"] == 0


def test_host_counters_of_a_run_that_never_started() -> None:
    assert host_counters(None) == {}


def test_summary_lists_every_host_and_the_failed_ones() -> None:
    result = PlaybookResult(
        rc=2,
        status="failed",
        artifacts=Path("/tmp/run"),
        hosts=host_counters({"ok": {"lab-1": 5, "lab-2": 4}, "changed": {"lab-1": 2}, "unreachable": {"lab-2": 1}}),
    )
    text = format_summary(result)
    assert "lab-1" in text and "lab-2" in text and "run failed (rc 2)" in text
    assert result.failed_hosts == ["lab-2"]
    assert result.changed == 2


def test_provision_refuses_a_missing_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["provision", "-i", str(tmp_path / "nowhere.yml")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "nowhere.yml does not exist" in err and "gpufleet lab up" in err
