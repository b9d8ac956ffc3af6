"""A plain provision whose new venv fails its health gate puts back the venv the node served from (issue 12,
item 2). On lab-1, serving from venv V: a venv B that fails at start (a copy of V whose interpreter start-up
exits) is switched in as the venv layer does it (current -> B, previous -> V). `playbooks/serve.yml` then
fails, saying it rolled back; V is in service again, every instance serves from V's files (their memory maps),
and the start records are those of before, so the next run restarts nothing. About 3 minutes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_driver_support import play, sh

VENVS = "/opt/gpufleet/venvs"
STATE = "/var/lib/gpufleet/vllm"
BROKEN = f"{VENVS}/gpufleet-test-broken-venv"
UNIT = "/etc/systemd/system/vllm@.service"
# Short enough for the failing start, long enough for vLLM's CPU build to start again on the restored venv. The
# template unit's start limit interval follows it: the fixture puts the suite's unit back afterwards.
HEALTH = {"vllm_service_health_timeout": 150}


def link(inventory: Path, node: str, path: str) -> str:
    rc, text = sh(inventory, node, f"readlink {path} || true")
    assert rc == 0, text
    return text.strip()


def records(inventory: Path, node: str) -> str:
    rc, text = sh(inventory, node, f"grep -H . {STATE}/*.started {STATE}/*.venv")
    assert rc == 0, text
    return text


def active_instances(inventory: Path, node: str) -> list[str]:
    rc, text = sh(inventory, node, "systemctl list-units --plain --no-legend --state=active 'vllm@*.service'")
    names = sorted(re.findall(r"vllm@(\S+)\.service", text))
    assert rc == 0 and names, f"{node} serves nothing: {text}"
    return names


@pytest.fixture()
def broken_venv_in_service(
    lab_inventory: Path, lab_hosts: dict[str, dict]
) -> Iterator[tuple[str, list[str], str, str]]:
    node = sorted(lab_hosts)[0]
    served = link(lab_inventory, node, f"{VENVS}/current")
    previous = link(lab_inventory, node, f"{VENVS}/previous")
    instances = active_instances(lab_inventory, node)
    for instance in instances:
        rc, record = sh(lab_inventory, node, f"cat {STATE}/{instance}.venv")
        assert rc == 0 and record.strip() == served, f"the serve layer recorded no venv for vllm@{instance}: {record}"
    # Hard links: a copy in a second, whose interpreter start-up exits (a .pth line runs at every start).
    rc, text = sh(
        lab_inventory,
        node,
        f"set -e; cp -al {served} {BROKEN}; site=$(ls -d {BROKEN}/lib/python3*/site-packages);"
        f" echo 'import os; os._exit(3)' > $site/gpufleet-test-broken.pth;"
        f" ln -sfn {served} {VENVS}/previous; ln -sfn {BROKEN} {VENVS}/current;"
        f" cp -p {UNIT} {UNIT}.gpufleet-test",
    )
    assert rc == 0, text
    yield node, instances, served, records(lab_inventory, node)
    restore_previous = f"ln -sfn {previous} {VENVS}/previous" if previous else f"rm -f {VENVS}/previous"
    sh(
        lab_inventory,
        node,
        f"ln -sfn {served} {VENVS}/current; {restore_previous}; rm -rf {BROKEN};"
        f" mv {UNIT}.gpufleet-test {UNIT}; systemctl daemon-reload",
    )


# make test-slow: make test keeps the rollout's failed gate rolled back (test_rollout.py) as the representative case.
@pytest.mark.slow
def test_a_venv_that_fails_its_health_gate_is_rolled_back(
    lab_inventory: Path, broken_venv_in_service: tuple[str, list[str], str, str]
) -> None:
    node, instances, served, started_before = broken_venv_in_service
    failed = play(lab_inventory, node, "serve.yml", extra=HEALTH)
    assert failed.rc != 0, failed.describe()
    said = " ".join(failed.output.split())
    assert re.search(rf"vllm@\S+ on {node} did not become ready", said), failed.describe()
    # The health wait stopped when the crash loop hit systemd's start limit, not at its 150 s timeout.
    assert re.search(r"will not: vllm@\S+\.service is failed, systemd stopped restarting it", said), failed.describe()
    assert f"ROLLED BACK: the venv in service is {served} again" in said, failed.describe()
    assert link(lab_inventory, node, f"{VENVS}/current") == served
    assert link(lab_inventory, node, f"{VENVS}/previous") == BROKEN

    assert active_instances(lab_inventory, node) == instances
    for instance in instances:
        rc, maps = sh(lab_inventory, node, f"cat /proc/$(systemctl show -P MainPID vllm@{instance}.service)/maps")
        assert rc == 0 and served in maps and BROKEN not in maps, f"vllm@{instance} does not run from the restored venv"

    # The start records still say what each instance was last healthy with (the restored venv and the suite's
    # unit, which the fixture puts back): the next serve run restarts nothing.
    assert records(lab_inventory, node) == started_before
