"""The playbook runner's summary and the provision command's input checks."""

import os
from pathlib import Path

import pytest

from gpufleet import exit_codes
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
        # ansible-runner's stats name unreachable hosts `dark`.
        hosts=host_counters({"ok": {"lab-1": 5, "lab-2": 4}, "changed": {"lab-1": 2}, "dark": {"lab-2": 1}}),
    )
    text = format_summary(result)
    assert "lab-1" in text and "lab-2" in text and "run failed (rc 2)" in text
    assert result.failed_hosts == ["lab-2"]
    assert result.changed == 2


def test_provision_refuses_a_missing_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["provision", "-i", str(tmp_path / "nowhere.yml")])
    err = capsys.readouterr().err
    assert rc == exit_codes.USAGE
    assert "nowhere.yml does not exist" in err and "gpufleet lab up" in err


def test_a_run_keeps_no_operator_secret_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-runner writes its whole environment into artifacts/<ident>/command: only the allow-list goes there
    (issue 29, M11). A real run of preflight.yml, which fails on the controller (no stack declared)."""
    from gpufleet.runner import run_playbook

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("gpu_nodes:\n  hosts:\n    node-1:\n      ansible_connection: local\n")
    monkeypatch.setenv("HF_TOKEN", "hf_operator_marker_0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_operator_marker_0123456789")
    monkeypatch.setenv("ANSIBLE_TIMEOUT", "31")
    monkeypatch.setenv("GPUFLEET_RUN_ENVIRONMENT", "EXTRA_ALLOWED")
    monkeypatch.setenv("EXTRA_ALLOWED", "allowed_marker")
    result = run_playbook("preflight.yml", inventory, quiet=True, runs_root=tmp_path / "runs")
    assert result.rc != 0, "no stack declared: preflight fails, after the run was recorded"
    records = [path.read_text(errors="replace") for path in (tmp_path / "runs").rglob("*") if path.is_file()]
    command = next(text for text in records if '"env"' in text and '"command"' in text)
    assert "ANSIBLE_TIMEOUT" in command and "allowed_marker" in command
    assert not any("operator_marker" in text for text in records)
    assert os.environ["HF_TOKEN"] == "hf_operator_marker_0123456789", "the CLI's own environment is given back"


def test_runs_beyond_the_kept_number_are_removed_oldest_first(tmp_path: Path) -> None:
    from gpufleet.runner import prune_runs

    names = ["20261201T000000-1-site", "20261202T000000-2-drift", "20261203T000000-3-site", "notes"]
    for name in names:
        (tmp_path / name).mkdir()
    removed = prune_runs(tmp_path, 2)
    assert [path.name for path in removed] == ["20261201T000000-1-site"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(names[1:])


BROKEN_INVENTORIES = [
    (
        "gpu_nodes:\n  hosts:\n    node-1: {ansible_connection: local\n",
        [],
        "does not parse: ",
    ),
    ("others:\n  hosts:\n    node-1:\n", [], "has no group gpu_nodes (its groups: others): put the GPU nodes in"),
    ("gpu_nodes:\n  hosts:\n    node-1:\n", ["--limit", "node-9"], "--limit node-9 matches no node of"),
]
# Every command that runs a playbook, with what it needs besides -i.
COMMANDS = [
    ["provision"],
    ["prune"],
    ["drift"],
    ["plan"],
    ["rebuild", "--limit", "node-1"],
    ["upgrade"],
    ["cordon", "--limit", "node-1"],
    ["uncordon", "--limit", "node-1"],
    ["doctor", "--limit", "node-1"],
]


@pytest.mark.parametrize(("inventory_text", "arguments", "said"), BROKEN_INVENTORIES)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command[0])
def test_an_inventory_no_command_can_use_is_a_usage_error_before_any_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    inventory_text: str,
    arguments: list[str],
    said: str,
    command: list[str],
) -> None:
    """An inventory that does not parse, no gpu_nodes, a --limit that matches nothing: provision and prune
    printed an empty table, "run successful (rc 0)" and exited 0; plan and doctor blamed the wrong thing (issue
    30). Now each command says it in one line and exits 64 before any playbook runs."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(inventory_text)
    monkeypatch.setenv("GPUFLEET_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("GPUFLEET_LOCK_DIR", str(tmp_path / "locks"))
    limit = arguments or (command[1:] if "--limit" in command else [])
    code = main([command[0], "-i", str(inventory), *limit])
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert code == exit_codes.USAGE and line.startswith("gpufleet: error: ") and said in line, captured.err
    assert "successful" not in captured.out
    assert not (tmp_path / "runs").exists(), "no playbook ran"


def test_a_mistyped_flag_is_a_usage_error_not_drift_found(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own exit was 2, the code of "drift found" (issue 30)."""
    with pytest.raises(SystemExit) as exited:
        main(["drift", "--inventry", "hosts.yml"])
    assert exited.value.code == exit_codes.USAGE != exit_codes.FOUND
    assert "unrecognized arguments: --inventry" in capsys.readouterr().err


def test_an_unknown_tag_is_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("gpu_nodes:\n  hosts:\n    node-1:\n")
    assert main(["provision", "-i", str(inventory), "--tags", "bsae,driver"]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert "--tags bsae,driver: no layer bsae; the layers are base, driver" in err
    assert main(["provision", "-i", str(inventory), "--skip-tags", "modle"]) == exit_codes.USAGE
    assert "--skip-tags modle: no layer modle" in capsys.readouterr().err
