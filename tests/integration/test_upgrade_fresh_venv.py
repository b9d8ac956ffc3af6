"""A venv built again from scratch is built beside the one in service (issue 28, review M7 and M12).

`gpufleet upgrade` of a node whose venv holds a package outside the lock builds the lock's venv again (the venv
layer leaves extras alone, so only a new venv drops it) beside the one in service, switches to it once it is whole,
and keeps the old one as previous for a rollback; before, the upgrade dropped the drift plan's "new venv", kept the
tampered venv and reported the node upgraded. A build from scratch that fails (`gpufleet rebuild --full`) leaves
the node on the venv it had; before, the rebuild deleted the venv in service first and left the node without one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_drift_support import gpufleet, run_playbooks
from test_driver_support import play
from test_rollout import RUNNING, THROUGH_PROXY, state

pytestmark = pytest.mark.lab

VENVS = "/opt/gpufleet/venvs"
LINKS = f"readlink {VENVS}/current; readlink {VENVS}/previous || true"
# A distribution nobody declared, as `pip install` by hand would leave it: what importlib.metadata and pip list see.
HANDMADE = "gpufleet_handmade-1.0.dist-info"
PLANT = (
    f"site=$(ls -d {VENVS}/current/lib/python3*/site-packages) && mkdir -p $site/{HANDMADE} && "
    f"printf 'Metadata-Version: 2.1\\nName: gpufleet-handmade\\nVersion: 1.0\\n' > $site/{HANDMADE}/METADATA && "
    f"printf 'pip\\n' > $site/{HANDMADE}/INSTALLER && : > $site/{HANDMADE}/RECORD"
)
HAS_HANDMADE = f"ls -d {VENVS}/current/lib/python3*/site-packages/{HANDMADE} 2>/dev/null | wc -l"
WHOLE = "{venv}/bin/python -c 'import vllm, torch; print(\"whole\")'"


def links(inventory: Path, node: str) -> tuple[str, str]:
    current, previous, *_ = state(inventory, node, LINKS).splitlines() + [""]
    return current.strip(), previous.strip()


@pytest.mark.slow
def test_a_venv_with_a_package_outside_the_lock_is_built_again_beside_the_one_in_service(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    in_service, _ = links(lab_inventory, node)
    state(lab_inventory, node, PLANT)
    assert state(lab_inventory, node, HAS_HANDMADE).strip() == "1"

    result = gpufleet(
        tmp_path, "upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "venv,kernels", timeout=2400
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert re.search(rf"upgrade: {node}: layers venv, kernels \(a new venv\)", output), output[-6000:]
    assert re.search(rf"upgrade: {node}: upgraded \(layers venv, kernels, [0-9.]+ s\)", output), output[-6000:]

    # A new venv of the same lock beside the old one, which is kept whole as previous for a rollback.
    current, previous = links(lab_inventory, node)
    base = re.sub(r"\.rebuilt-[0-9]{8}T[0-9]{6}$", "", in_service)
    assert re.fullmatch(re.escape(base) + r"\.rebuilt-[0-9]{8}T[0-9]{6}", current), (in_service, current)
    assert current != in_service and previous == in_service
    assert state(lab_inventory, node, HAS_HANDMADE).strip() == "0", "the package outside the lock is gone"
    assert state(lab_inventory, node, WHOLE.format(venv=previous)).strip() == "whole"
    # Serving from the new venv, and drift, which names the venv after its lock, finds nothing out of place.
    assert state(lab_inventory, node, RUNNING).splitlines()[:2] == ["active", "active"]
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
    drift = gpufleet(tmp_path, "drift", "-i", str(lab_inventory), "--limit", node, "--layers", "venv,kernels")
    assert drift.returncode == 0, drift.stdout[-4000:] + drift.stderr


@pytest.mark.slow
def test_a_fresh_venv_that_fails_to_build_leaves_the_node_on_the_venv_it_had(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    if state(lab_inventory, node, RUNNING).splitlines()[:2] != ["active", "active"]:
        run_playbooks(lab_inventory, node, ["serve", "proxy"])
    in_service, previous = links(lab_inventory, node)
    # pip refuses an option it does not know: the new venv's install fails after the venv directory exists.
    (host_vars / f"{node}.yml").write_text(
        yaml.safe_dump({"inference_venv_pip_extra_args": ["--gpufleet-no-such-option"]})
    )
    result = gpufleet(
        tmp_path, "rebuild", "-i", str(lab_inventory), "--limit", node, "--layers", "venv", "--full", timeout=2400
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-6000:]
    assert re.search(r"installing the lock into \S+\.rebuilt-[0-9T]+ failed: pip exited 2", output), output[-6000:]
    # Said as the node's state, with the command that starts it again.
    assert f"{node}: NOT SERVING vllm@greedy.service, vllm@main.service" in output, output[-6000:]
    # The venv in service and the previous one are as they were, and the one in service is whole.
    assert links(lab_inventory, node) == (in_service, previous)
    assert state(lab_inventory, node, WHOLE.format(venv=in_service)).strip() == "whole"

    (host_vars / f"{node}.yml").unlink()
    # The rebuild stopped the instances for the new venv; the next run starts them again on the venv they had.
    result = gpufleet(tmp_path, "rebuild", "-i", str(lab_inventory), "--limit", node, timeout=2400)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert links(lab_inventory, node)[0] == in_service
    assert state(lab_inventory, node, RUNNING).splitlines()[:2] == ["active", "active"]
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]


@pytest.mark.slow
def test_an_upgrade_whose_layers_still_differ_after_applying_rolls_the_node_back(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    """The per-node drift check before the node takes traffic again: playbooks/upgrade.yml run without the drift
    plan's "new venv" (as the upgrade ran before M7's fix) leaves the package outside the lock, and the node is
    rolled back, naming it, instead of reported upgraded."""
    node = sorted(lab_hosts)[0]
    in_service, previous = links(lab_inventory, node)
    state(lab_inventory, node, PLANT)
    try:
        run = play(lab_inventory, node, "upgrade.yml", extra={"upgrade_plan": {node: ["venv", "kernels"]}})
        output = run.output
        assert run.rc != 0, output[-6000:]
        assert "still differs from the declaration: layer venv (venv " in output, output[-6000:]
        assert "package gpufleet-handmade is 1.0, declared absent (not in the lock)" in output, output[-6000:]
        assert "rolled_back" in output, output[-6000:]
        assert links(lab_inventory, node) == (in_service, previous)
        assert state(lab_inventory, node, RUNNING).splitlines()[:2] == ["active", "active"]
        assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
    finally:
        state(lab_inventory, node, f"rm -rf {VENVS}/current/lib/python3*/site-packages/{HANDMADE}")


def test_a_node_without_a_venv_does_not_stop_the_fleets_upgrade(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    """Review M12: the upgrade's check of every node before any is touched ran vllm_service's preflight, which
    refuses a venv that does not exist, with any_errors_fatal: one node whose venv build was killed stopped every
    node's upgrade. Here the second node has no venv in service and the whole lab is upgraded (layer proxy)."""
    first, second = sorted(lab_hosts)[:2]
    state(lab_inventory, second, f"mv {VENVS}/current {VENVS}/current.aside")
    try:
        result = gpufleet(tmp_path, "upgrade", "-i", str(lab_inventory), "--layers", "proxy")
    finally:
        state(lab_inventory, second, f"mv {VENVS}/current.aside {VENVS}/current")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "does not exist on" not in output, output[-6000:]
    assert f"upgrade: {first}: unchanged" in output and f"upgrade: {second}: unchanged" in output, output[-6000:]
