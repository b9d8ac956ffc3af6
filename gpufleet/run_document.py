"""`--json` of the commands that change nodes (CHANGING_COMMANDS): one JSON document on stdout when the command
ends, whatever its outcome, with every playbook run it made (per-host counters, failures, where its records are)
and what the command adds (upgrade: each node's outcome, or the plan). Its human output goes to stderr then.

Schema gpufleet.run/v1: {schema, command, exit_code, error (null or the one line), runs: [{playbook, rc, status,
changed, failed_hosts, hosts: {host: {ok, changed, failures, unreachable, skipped, rescued, ignored}}, failures,
artifacts}], and the command's own keys}. Keys may be added within version 1.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "gpufleet.run/v1"

_runs: list[dict[str, Any]] = []
_extra: dict[str, Any] = {}


def reset() -> None:
    _runs.clear()
    _extra.clear()


def record_run(run: dict[str, Any]) -> None:
    """A playbook run the command made (runner.run_playbook records each)."""
    _runs.append(run)


def add(key: str, value: Any) -> None:
    """A key of the command's own (upgrade's outcomes, its plan)."""
    _extra[key] = value


def document(command: str, exit_code: int, error: str | None) -> dict[str, Any]:
    return {"schema": SCHEMA, "command": command, "exit_code": exit_code, "error": error, "runs": list(_runs), **_extra}
