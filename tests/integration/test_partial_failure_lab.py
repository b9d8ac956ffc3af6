"""Partial failure is local (issue 37): one node that cannot be reached is reported and left out of `gpufleet
provision`, and every other node converges. Before, preflight's release check (any_errors_fatal) and every layer
playbook (whose templated any_errors_fatal Ansible read as true) stopped the whole fleet for one node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_drift_support import gpufleet


def host_row(output: str, host: str) -> dict[str, int]:
    """The provision summary's row of HOST: ok, changed, failed, unreachable, skipped."""
    match = re.search(rf"^{re.escape(host)}\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", output, re.MULTILINE)
    assert match, output[-4000:]
    return dict(zip(("ok", "changed", "failed", "unreachable", "skipped"), map(int, match.groups())))


@pytest.mark.slow
def test_an_unreachable_node_is_left_out_and_the_others_converge(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    reachable, unreachable = sorted(lab_hosts)[:2]
    # Nothing listens on the discard port: ssh to it fails at once, as to a node that is down.
    (host_vars / f"{unreachable}.yml").write_text("ansible_port: 9\n")

    result = gpufleet(tmp_path, "provision", "-i", str(lab_inventory))

    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert host_row(output, unreachable)["unreachable"] >= 1
    converged = host_row(output, reachable)
    assert (converged["failed"], converged["unreachable"]) == (0, 0), output[-4000:]
    # The node went through every layer to the last (the proxy's), not only preflight.
    assert converged["ok"] > 100, converged
    assert f"{reachable}: Put nginx with TLS and API keys in front of every node's vLLM:" in output, output[-6000:]


@pytest.mark.slow
def test_an_unreachable_node_is_left_out_of_an_upgrade_and_the_others_are_upgraded(
    lab_inventory: Path, lab_hosts: dict[str, dict], host_vars: Path, tmp_path: Path
) -> None:
    """The upgrade refused every node when its drift check could not reach one."""
    reachable, unreachable = sorted(lab_hosts)[:2]
    (host_vars / f"{unreachable}.yml").write_text("ansible_port: 9\n")

    result = gpufleet(tmp_path, "upgrade", "-i", str(lab_inventory))

    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert f"upgrade: {unreachable}: the drift check could not reach it: left out, not upgraded" in output
    # The converged node went through the rollout: its outcome recorded, nothing to change.
    assert f"upgrade: {reachable}: unchanged" in output, output[-4000:]
    assert f"{unreachable} could not be reached and were not: run gpufleet upgrade again" in output

    all_or_nothing = gpufleet(tmp_path, "upgrade", "-i", str(lab_inventory), "-e", "gpufleet_any_errors_fatal=true")
    output = all_or_nothing.stdout + all_or_nothing.stderr
    assert all_or_nothing.returncode == 1, output[-4000:]
    assert f"{unreachable} cannot be reached, and the upgrade is all or nothing" in output
