"""What `gpufleet upgrade` leaves when it cannot finish, and one operation at a time (issue 28): a snapshot that
cannot be written (a full file system) changes nothing and the node keeps serving; while an upgrade runs, a second
operation is refused naming it, from the same controller (its inventory lock) and from another (the node's lease);
a controller killed while the layers rename an instance leaves the node drained with its journal at `applying` (or
`gating`) and its lease held; the next run says so and, with --break-lease, rolls the node back from the snapshot on
the node (the removed instance's files and directory put back, the added one removed), then renames it: the node
serves the new declaration, nothing is left stopped, and the instance that did not change was never restarted.
A controller killed while the snapshot is taken (make test-slow) leaves the node serving, untouched.
Review H1/M1: renaming an instance failed the upgrade and then its rollback, leaving the node drained with every
instance stopped, and an added instance was stopped again after a successful upgrade. Declaration changes are
host_vars files beside the lab inventory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def upgrade_killed_once(
    inventory: Path, node: str, layers: str, tmp_path: Path, ready: Callable[[], bool], within: int
) -> Iterator[None]:
    """Runs `gpufleet upgrade` of the node as an operator would, waits (at most `within` seconds) until `ready()`
    says it is in the step to kill it in, lets the body act while it still runs, then SIGKILLs the controller's
    whole run: ansible-playbook runs in a terminal of its own (the runner's pexpect)."""
    command = [str(BIN / "gpufleet"), "upgrade", "-i", str(inventory), "--limit", node, "--layers", layers]
    with (tmp_path / "killed.log").open("w") as log:
        upgrade = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=dict(os.environ, GPUFLEET_RUNS_DIR=str(tmp_path)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline and upgrade.poll() is None and not ready():
                time.sleep(1)
            assert upgrade.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
            yield
        finally:
            os.killpg(upgrade.pid, signal.SIGKILL)
            upgrade.wait()
            subprocess.run(["pkill", "-KILL", "-f", "ansible-playbook.*upgrade.yml"], check=False)


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


def declare_renamed(host_vars: Path, node: str, name: str) -> None:
    """The lab's instances with greedy called `name`."""
    instances = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
    renamed = [{**item, "name": name} if item["name"] == "greedy" else item for item in instances]
    (host_vars / f"{node}.yml").write_text(yaml.safe_dump({"vllm_service_instances": renamed}))


@pytest.mark.slow
def test_a_controller_killed_while_an_instance_is_renamed_is_finished_by_the_next_run(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    main_started = state(lab_inventory, node, "systemctl show -p ActiveEnterTimestamp vllm@main")
    instances = (
        "ls -d /etc/systemd/system/vllm@*.service.d; systemctl is-active vllm@main vllm@greedy vllm@chat || true"
    )
    declare_renamed(host_vars, node, "chat")

    def half_renamed() -> bool:
        """greedy removed and chat starting: killed mid-apply."""
        return phase(lab_inventory, node) == "applying" and "vllm@greedy" not in state(lab_inventory, node, instances)

    with upgrade_killed_once(lab_inventory, node, "serve,proxy", tmp_path, half_renamed, within=300):
        # A second operation meanwhile, from another controller (a lock directory of its own): refused by the
        # node's lease, naming the upgrade. (The same controller's lock: tests/unit/test_fleet_lock.py.)
        other = {"GPUFLEET_LOCK_DIR": str(tmp_path / "other-controller")}
        second = gpufleet(
            tmp_path, "cordon", "-i", str(lab_inventory), "--limit", node, "--reason", "second", env=other
        )
        said = second.stdout + second.stderr
        assert second.returncode != 0 and f"{node} is held by `gpufleet upgrade`" in said, said
    # Killed mid-upgrade: applying its layers, or gating them if the cordon above took long enough.
    killed_in = phase(lab_inventory, node)
    assert killed_in in ("applying", "gating")
    assert state(lab_inventory, node, THROUGH_PROXY).split()[-1] == "drained"

    # The killed controller's lease is still on the node: named, and broken only when asked.
    upgrade_again = ["upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve,proxy"]
    result = gpufleet(tmp_path, *upgrade_again)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"{node} is held by `gpufleet upgrade`" in output, output[-6000:]
    assert "--break-lease" in output, output[-6000:]
    result = gpufleet(tmp_path, *upgrade_again, "--break-lease")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"upgrade: {node}: upgraded" in output and f"left in phase {killed_in}" in output, output[-6000:]
    assert "rolled back to what it served before (vllm@greedy.service, vllm@main.service)" in output, output[-6000:]
    assert phase(lab_inventory, node) == "done"

    # Renamed, and back: each time the node serves the new declaration with nothing left stopped.
    for current, old in (("chat", "greedy"), ("greedy", "chat")):
        if current == "greedy":
            declare_renamed(host_vars, node, "greedy")
            result = gpufleet(tmp_path, *upgrade_again)
            assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
        units = state(lab_inventory, node, instances).split()
        assert f"/etc/systemd/system/vllm@{old}.service.d" not in units, units
        active = dict(zip(["main", "greedy", "chat"], units[-3:]))
        assert (active["main"], active[current], active[old]) == ("active", "active", "inactive"), units
        assert state(lab_inventory, node, f"systemctl is-enabled vllm@{current}").split() == ["enabled"]
        # The removed instance's cache went with it (its user is gone; a new instance of that name starts clean).
        caches = state(lab_inventory, node, "ls /var/cache/vllm /var/cache/private/vllm").split()
        assert old not in caches and current in caches, caches
        assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
    # main did not change: neither the rename, nor the rollback, nor the rename back restarted it.
    assert state(lab_inventory, node, "systemctl show -p ActiveEnterTimestamp vllm@main") == main_started


def test_a_controller_killed_while_the_snapshot_is_taken_leaves_the_node_serving(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    """The kill matrix's snapshot phase, its case in make test (the applying and rollback phases, with an instance
    renamed, are in make test-slow: 349 s and more): the controller is killed while the layers' roles write the
    new snapshot, before anything changes. The node keeps serving its old declaration, undrained and with nothing
    restarted; the snapshot in place is still the last whole one (the new one becomes it by one rename); the next
    run (--break-lease) takes a whole snapshot and upgrades, leaving that one snapshot and nothing of the killed."""
    node = sorted(lab_hosts)[0]
    serving, running = state(lab_inventory, node, SERVING), state(lab_inventory, node, RUNNING)
    in_place = f"readlink {UPGRADE_DIR}/snapshot || true"
    kept_before = state(lab_inventory, node, in_place)
    declare_main_option(host_vars, node, 8)
    with upgrade_killed_once(
        lab_inventory, node, "serve", tmp_path, lambda: phase(lab_inventory, node) == "snapshot", within=300
    ):
        pass  # killed as soon as the snapshot has begun
    assert phase(lab_inventory, node) == "snapshot"
    assert state(lab_inventory, node, SERVING) == serving
    assert state(lab_inventory, node, RUNNING) == running
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
    assert state(lab_inventory, node, in_place) == kept_before

    upgrade = ["upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve"]
    result = gpufleet(tmp_path, *upgrade, "--break-lease")
    output = result.stdout + result.stderr
    assert result.returncode == 0 and f"upgrade: {node}: upgraded" in output, output[-6000:]
    assert phase(lab_inventory, node) == "done"
    snapshots = state(lab_inventory, node, f"ls -d {UPGRADE_DIR}/snapshot-*").split()
    assert len(snapshots) == 1 and state(lab_inventory, node, in_place).strip() == snapshots[0], snapshots
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]

    # Back to the lab's declaration.
    (host_vars / f"{node}.yml").unlink()
    result = gpufleet(tmp_path, *upgrade)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


@pytest.mark.slow
def test_a_controller_killed_during_a_rollback_is_finished_by_the_next_run(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    """The kill matrix's rollback phase (make test-slow): an upgrade whose instances never pass their health gate
    is being rolled back when the controller is killed; the node is left drained with its journal at
    `rolling_back`; the next run (the declaration taken back, --break-lease) rolls it back first and leaves it
    serving with nothing stopped."""
    node = sorted(lab_hosts)[0]
    serving = state(lab_inventory, node, SERVING)
    defaults = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instance_defaults"]
    (host_vars / f"{node}.yml").write_text(
        yaml.safe_dump(
            {
                "vllm_service_instance_defaults": {**defaults, "extra_args": ["--gpufleet-no-such-option"]},
                "vllm_service_health_timeout": 45,
                "vllm_service_restart_sec": 60,
            }
        )
    )
    with upgrade_killed_once(
        lab_inventory, node, "serve", tmp_path, lambda: phase(lab_inventory, node) == "rolling_back", within=600
    ):
        pass  # killed as soon as the rollback has begun
    assert phase(lab_inventory, node) == "rolling_back"
    assert state(lab_inventory, node, THROUGH_PROXY).split()[-1] == "drained"

    (host_vars / f"{node}.yml").unlink()
    result = gpufleet(
        tmp_path, "upgrade", "-i", str(lab_inventory), "--limit", node, "--layers", "serve", "--break-lease"
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "left in phase rolling_back" in output, output[-6000:]
    assert phase(lab_inventory, node) == "done"
    assert state(lab_inventory, node, SERVING) == serving
    assert state(lab_inventory, node, RUNNING).splitlines()[:2] == ["active", "active"]
    assert state(lab_inventory, node, THROUGH_PROXY).split() == ["200", "not-drained"]
