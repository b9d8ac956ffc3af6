"""The record of the installed driver, what a failed upgrade's rollback reinstalls, never names another driver
(issue 28, review L12). A run killed between a driver install and its record left the record naming the driver
before; no later run wrote it again (the driver layer had nothing to change) and drift did not look, so the next
rollback would have "restored" the wrong driver. Now drift names a record that differs, and the driver layer
writes it again whenever the declared driver is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_drift_support import gpufleet
from test_rollout import state

pytestmark = pytest.mark.lab

RECORD = "/var/lib/gpufleet/nvidia-driver.json"


@pytest.mark.slow
def test_a_record_that_names_another_driver_is_found_by_drift_and_written_again(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    record = json.loads(state(lab_inventory, node, f"cat {RECORD}"))
    stale = {**record, "version": "570.124.06"}
    # What a kill right after the installer ran leaves: the record of the driver installed before.
    state(lab_inventory, node, f"printf '%s' '{json.dumps(stale)}' > {RECORD}")
    try:
        drift = gpufleet(tmp_path, "drift", "-i", str(lab_inventory), "--limit", node, "--layers", "driver")
        assert drift.returncode == 2, drift.stdout[-4000:] + drift.stderr
        assert f"file {RECORD}" in drift.stdout, drift.stdout[-4000:]

        run = gpufleet(tmp_path, "provision", "-i", str(lab_inventory), "--limit", node, "--tags", "driver")
        assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
        assert json.loads(state(lab_inventory, node, f"cat {RECORD}")) == record
        assert state(lab_inventory, node, f"stat -c %a {RECORD}").strip() == "600"
        drift = gpufleet(tmp_path, "drift", "-i", str(lab_inventory), "--limit", node, "--layers", "driver")
        assert drift.returncode == 0, drift.stdout[-4000:] + drift.stderr
    finally:
        state(lab_inventory, node, f"printf '%s' '{json.dumps(record, indent=4, sort_keys=True)}' > {RECORD}")
