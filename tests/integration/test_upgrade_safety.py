"""What `gpufleet upgrade` leaves when it cannot finish, and one operation at a time (issue 28): a snapshot that
cannot be written (a full file system) changes nothing and the node keeps serving; while an upgrade runs, a second
operation is refused naming it, from the same controller (its inventory lock) and from another (the node's lease);
a controller killed while the layers apply leaves the node drained with its journal at `applying` and its lease
held, the next run says so and, with --break-lease, rolls the node back from the snapshot on the node, then
upgrades it. The declaration change is one instance's option (max_num_seqs of main), in host_vars."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_drift_support import BIN, PROJECT_ROOT, gpufleet
from test_rollout import RUNNING, SERVE_VARS, SERVING, THROUGH_PROXY, state

pytestmark = pytest.mark.lab

UPGRADE_DIR = "/var/lib/gpufleet/upgrade"
PHASE = f"cat {UPGRADE_DIR}/journal.json 2>/dev/null || echo '{{}}'"


def declare_main_option(host_vars: Path, node: str, max_num_seqs: int) -> None:
    instances = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
    changed = [{**item, "max_num_seqs": max_num_seqs} if item["name"] == "main" else item for item in instances]
    (host_vars / f"{node}.yml").write_text(yaml.safe_dump({"vllm_service_instances": changed}))


def phase(inventory: Path, node: str) -> str:
    return str(json.loads(state(inventory, node, PHASE)).get("phase", ""))


def test_a_snapshot_that_cannot_be_written_changes_nothing(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    declare_main_option(host_vars, node, 8)
    serving, running = state(lab_inventory, node, SERVING), state(lab_inventory, node, RUNNING)
    # A full file system where the snapshot goes: a 64 KiB tmpfs over the upgrade's directory, filled.
    state(
        lab_inventory,
        node,
        f"mkdir -p {UPGRADE_DIR} && mount -t tmpfs -o size=64k,mode=0700 tmpfs {UPGRADE_DIR} "
        f"&& (dd if=/dev/zero of={UPGRADE_DIR}/fill bs=4k 2>/dev/null; true)",
    )
    try:
        result = gpufleet(tmp_path, "upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve")
    finally:
        state(lab_inventory, node, f"umount {UPGRADE_DIR}")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-6000:]
    assert f"upgrade: {node}: not_upgraded" in output and "the snapshot could not be written" in output, output[-6000:]
    assert "serving the old declaration, not touched" in output, output[-6000:]
    # Nothing changed: the same configuration, the instances not restarted, the node never drained.
    assert state(lab_inventory, node, SERVING) == serving
    assert state(lab_inventory, node, RUNNING) == running
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]


def test_a_controller_killed_while_the_layers_apply_is_finished_by_the_next_run(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    dropin = "cat /etc/systemd/system/vllm@main.service.d/gpufleet.conf"
    dropin_before = state(lab_inventory, node, dropin)
    declare_main_option(host_vars, node, 8)
    command = [str(BIN / "gpufleet"), "upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve"]
    with (tmp_path / "killed.log").open("w") as log:
        upgrade = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=dict(os.environ, GPUFLEET_RUNS_DIR=str(tmp_path)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # Killed once the node is drained and its new drop-in written: half-changed, mid-apply.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and upgrade.poll() is None:
            if phase(lab_inventory, node) == "applying" and state(lab_inventory, node, dropin) != dropin_before:
                break
            time.sleep(1)
        assert upgrade.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
        # A second operation meanwhile: refused by the inventory's lock on this controller, and by the node's lease
        # from another (a lock directory of its own stands for another controller).
        for lock_dir, holder in ((None, "is held by `gpufleet upgrade`"), (tmp_path / "other", "lab")):
            env = {"GPUFLEET_LOCK_DIR": str(lock_dir)} if lock_dir else {}
            second = gpufleet(tmp_path, "cordon", "-i", str(lab_inventory), node, "--reason", "second", env=env)
            assert second.returncode != 0, second.stdout + second.stderr
            assert holder in second.stdout + second.stderr and "gpufleet upgrade" in second.stdout + second.stderr
        os.killpg(upgrade.pid, signal.SIGKILL)
        upgrade.wait()
        # ansible-playbook runs in a terminal of its own (the runner's pexpect): the controller's whole run goes.
        subprocess.run(["pkill", "-KILL", "-f", "ansible-playbook.*upgrade.yml"], check=False)
    assert phase(lab_inventory, node) == "applying"
    assert state(lab_inventory, node, THROUGH_PROXY).split()[-1] == "drained"

    # The killed controller's lease is still on the node: named, and broken only when asked.
    upgrade_again = ["upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve"]
    result = gpufleet(tmp_path, *upgrade_again)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"{node} is held by `gpufleet upgrade`" in output, output[-6000:]
    assert "--break-lease" in output, output[-6000:]
    result = gpufleet(tmp_path, *upgrade_again, "--break-lease")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"upgrade: {node}: upgraded" in output and "left in phase applying" in output, output[-6000:]
    assert "rolled back to what it served before" in output, output[-6000:]
    assert phase(lab_inventory, node) == "done"
    assert '"--max-num-seqs" "8"' in state(lab_inventory, node, dropin)
    assert state(lab_inventory, node, RUNNING).splitlines()[:2] == ["active", "active"]
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]

    # Back to the lab's declaration, through an upgrade too.
    (host_vars / f"{node}.yml").unlink()
    result = gpufleet(tmp_path, "upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve")
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert state(lab_inventory, node, dropin) == dropin_before
