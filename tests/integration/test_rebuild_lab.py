"""`gpufleet rebuild` on the lab: a node that matches its declared state is left alone (nothing runs), and a
--limit that names more than one node is refused before anything runs. The rebuild of a tampered node (with
--full and --reinstall: every layer built again) is the last step of test_drift_lab.py, which needs its
tampers."""

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
    manifest,
)

from gpufleet import exit_codes

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


def test_more_than_one_node_is_refused_before_anything_runs(fleet: tuple[Path, str, str], tmp_path: Path) -> None:
    inventory, first, second = fleet
    result = gpufleet(tmp_path, "rebuild", "-i", str(inventory), "--limit", f"{first},{second}")
    assert result.returncode == exit_codes.USAGE
    assert result.stderr.strip() == (
        f"gpufleet: error: --limit {first},{second} matches 2 nodes ({first}, {second}): "
        "rebuild takes one node; name one, or pass --allow-many to rebuild all of them"
    )
    assert not any(tmp_path.iterdir())


def test_the_playbook_itself_refuses_a_play_of_two_nodes(fleet: tuple[Path, str, str]) -> None:
    inventory, first, second = fleet
    result = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "--limit",
            f"{first},{second}",
            str(PROJECT_ROOT / "playbooks" / "rebuild.yml"),
            "-e",
            json.dumps({"rebuild_layers": ["base"]}),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        check=False,
        timeout=300,
    )
    assert result.returncode != 0
    assert "this play would rebuild 2 nodes" in result.stdout and "rebuild takes one node" in result.stdout
    # any_errors_fatal: no later play (stopping instances, rebuilding layers) started on either node.
    assert "PLAY [Rebuild — stop" not in result.stdout and "PLAY [Prepare every GPU node" not in result.stdout
