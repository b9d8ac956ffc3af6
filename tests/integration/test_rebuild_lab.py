"""`gpufleet rebuild` on the lab: a node that matches its declared state is left alone (nothing runs), `--full`
builds every layer of it again (a new venv, the runfiles reinstalled with --reinstall) and ends clean, and a
--limit that names more than one node is refused before anything runs. The rebuild of a tampered node is
the last step of test_drift_lab.py, which needs its tampers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_drift_support import (
    BIN,
    LAYERS,
    PROJECT_ROOT,
    assert_unchanged,
    converge,
    fill_mirror,
    gpufleet,
    last_report,
    manifest,
)
from test_driver_support import sh

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def fleet(lab_inventory: Path, lab_hosts: dict[str, dict]) -> tuple[Path, str, str]:
    first, second = sorted(lab_hosts)[:2]
    fill_mirror(lab_inventory)
    converge(lab_inventory, f"{first},{second}")
    return lab_inventory, first, second


def test_a_clean_node_is_left_alone(fleet: tuple[Path, str, str], tmp_path: Path) -> None:
    inventory, node, _ = fleet
    before = manifest(inventory, node)
    result = gpufleet(tmp_path, "rebuild", "-i", str(inventory), "--limit", node, "--layers", LAYERS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rebuild: every layer matches the declared state; nothing to rebuild" in result.stdout
    assert_unchanged(before, manifest(inventory, node), node)
    assert [path.name.endswith("-drift") for path in tmp_path.iterdir()] == [True], "one drift check, no playbook"


def test_full_rebuild_builds_every_layer_again_and_ends_clean(fleet: tuple[Path, str, str], tmp_path: Path) -> None:
    inventory, node, other = fleet
    other_before = manifest(inventory, other)
    # The venv in service (its inode: a new venv is a new directory) and the installers' logs (rewritten by
    # every install).
    state = ("stat -c %i $(readlink -f /opt/gpufleet/venvs/current); "
             "stat -c %Y /var/log/nvidia-installer.log /var/log/cuda-installer.log")
    rc, before = sh(inventory, node, state)
    assert rc == 0, before

    result = gpufleet(tmp_path, "rebuild", "-i", str(inventory), "--limit", node, "--layers", LAYERS,
                      "--full", "--reinstall", "driver,toolkit")

    assert result.returncode == 0, result.stdout[-8000:] + result.stderr
    assert "rebuild: layers base, driver, toolkit, python, venv, kernels, model (full rebuild; a new venv)" in result.stdout
    rc, after = sh(inventory, node, state)
    assert rc == 0, after
    venv_before, *logs_before = before.split()
    venv_after, *logs_after = after.split()
    assert venv_after != venv_before, "the venv was built again"
    assert all(new > old for old, new in zip(logs_before, logs_after, strict=True)), (
        f"the driver and toolkit installers ran again: log times {logs_before} -> {logs_after}")
    report = last_report(tmp_path)
    assert list(report.nodes) == [node]
    assert {item.status for item in report.nodes[node].layers.values()} == {"ok"}
    assert_unchanged(other_before, manifest(inventory, other), other)
    # The driver's reinstall stopped the instances and no serve layer ran (--layers leaves it out): the run's
    # last play started them again, health-gated, so the node serves through its proxy.
    serving = sh(inventory, node, "systemctl is-active vllm@main vllm@greedy; "
                                  "curl -sk -o /dev/null -w '%{http_code}\\n' https://127.0.0.1/health")[1]
    assert serving.split() == ["active", "active", "200"], serving


def test_more_than_one_node_is_refused_before_anything_runs(fleet: tuple[Path, str, str], tmp_path: Path) -> None:
    inventory, first, second = fleet
    result = gpufleet(tmp_path, "rebuild", "-i", str(inventory), "--limit", f"{first},{second}")
    assert result.returncode == 1
    assert result.stderr.strip() == (f"gpufleet: error: --limit {first},{second} matches 2 nodes ({first}, {second}): "
                                     "rebuild takes one node; name one, or pass --allow-many to rebuild all of them")
    assert not any(tmp_path.iterdir())


def test_the_playbook_itself_refuses_a_play_of_two_nodes(fleet: tuple[Path, str, str]) -> None:
    inventory, first, second = fleet
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", f"{first},{second}",
         str(PROJECT_ROOT / "playbooks" / "rebuild.yml"), "-e", json.dumps({"rebuild_layers": ["base"]})],
        capture_output=True, text=True, cwd=PROJECT_ROOT, check=False, timeout=300)
    assert result.returncode != 0
    assert "this play would rebuild 2 nodes" in result.stdout and "rebuild takes one node" in result.stdout
    # any_errors_fatal: no later play (stopping instances, rebuilding layers) started on either node.
    assert "PLAY [Rebuild — stop" not in result.stdout and "PLAY [Prepare every GPU node" not in result.stdout
