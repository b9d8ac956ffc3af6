"""The stack declared once, on the lab: every tag site.yml lists works alone and validates first, a role
variable set against the stack stops the run before any host changes, and verify.yml fails on a node whose
(simulated) driver cannot run the stack's CUDA."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_driver_support import PlayRun, play, sh

from gpufleet import PROJECT_ROOT, layers

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
SIMGPUCTL = "/usr/local/sbin/gpufleet-simgpuctl"
DESCRIPTION = "/etc/gpufleet-simgpu/gpus.json"
VALIDATE = "TASK [Validate gpufleet_stack"


@pytest.fixture(scope="module")
def host(lab_hosts: dict[str, dict]) -> str:
    return sorted(lab_hosts)[0]


def listed_tags(inventory: Path) -> list[str]:
    result = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "--list-tags",
            str(PROJECT_ROOT / "playbooks" / "site.yml"),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=120,
        check=True,
    )
    tags: set[str] = set()
    for found in re.findall(r"TASK TAGS: \[([^\]]*)\]", result.stdout):
        tags.update(tag.strip() for tag in found.split(",") if tag.strip())
    # `connects` marks preflight's release check, the one play that contacts hosts, for `gpufleet plan` to skip: not
    # a layer, and gpufleet's own --tags/--skip-tags refuse it.
    return sorted(tags - {"always", "connects"})


def test_the_listed_tags_are_the_layers(lab_inventory: Path) -> None:
    assert listed_tags(lab_inventory) == sorted(layers.rebuildable())


# make test runs the driver's and serve's tags (a layer under the stack and the top one); the others are make
# test-slow, each a --check run of site.yml (about 20 s) proving the same ordering.
REPRESENTATIVE_TAGS = {"driver", "serve"}


@pytest.mark.parametrize(
    "tag",
    [
        pytest.param(tag, marks=() if tag in REPRESENTATIVE_TAGS else pytest.mark.slow)
        for tag in sorted(layers.rebuildable())
    ],
)
def test_each_listed_tag_alone_validates_first_then_runs_its_layer(lab_inventory: Path, host: str, tag: str) -> None:
    run = play(lab_inventory, host, "site.yml", "--check", "--tags", tag)
    assert run.rc == 0, run.output[-4000:]
    assert run.output.index(VALIDATE) < run.output.index("PLAY [", run.output.index(VALIDATE)), "preflight first"
    assert run.recap.get("changed") == 0, f"a converged node in check mode: {run.recap} {run.changed_tasks()}"
    # The layer's own tasks ran, not only the roles' argument checks.
    role_tasks = [
        line
        for line in run.output.splitlines()
        if line.startswith("TASK [")
        and "Validating arguments" not in line
        and not line.startswith(VALIDATE)
        and "Gathering Facts" not in line
        and "Show the sourced facts" not in line
    ]
    assert role_tasks, f"--tags {tag} ran no task of its layer"


def test_a_role_variable_against_the_stack_stops_the_run_before_any_host_changes(
    lab_inventory: Path, host: str
) -> None:
    rc, before = sh(
        lab_inventory, host, "stat -c %Y /usr/bin/nvidia-installer 2>/dev/null; cat /proc/sys/kernel/random/boot_id"
    )
    run = play(lab_inventory, host, "site.yml", "--tags", "driver", extra={"nvidia_driver_version": "570.124.06"})
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert (
        "nvidia_driver_version = 570.124.06 (set in the inventory source or extra vars) contradicts the stack's "
        "driver 580.95.05 (gpufleet_stack in inventories/lab/group_vars/all/stack.yml)" in text
    )
    assert "PLAY [Install the NVIDIA driver from its runfile]" not in run.output
    assert (
        sh(
            lab_inventory, host, "stat -c %Y /usr/bin/nvidia-installer 2>/dev/null; cat /proc/sys/kernel/random/boot_id"
        )[1]
        == before
    )


def verify(inventory: Path, host: str) -> PlayRun:
    # -v: the check's own message is printed for a passing node too.
    return play(inventory, host, "verify.yml", "-v")


def test_verify_proves_a_converged_node_runs_its_stack(lab_inventory: Path, host: str) -> None:
    run = verify(lab_inventory, host)
    assert run.rc == 0, run.output[-4000:]
    assert run.recap.get("changed") == 0 and "the node's stack is consistent" in run.output, run.output[-3000:]


def test_verify_fails_when_the_loaded_driver_cannot_run_the_stacks_cuda(lab_inventory: Path, host: str) -> None:
    # The simulated driver now reports R570 (CUDA 12.8), as a node rebooted into an old driver would.
    rc, text = sh(
        lab_inventory,
        host,
        f"cp -a {DESCRIPTION} {DESCRIPTION}.saved && {SIMGPUCTL} driver-version 570.124.06 --cuda 12080",
    )
    assert rc == 0, text
    try:
        run = verify(lab_inventory, host)
    finally:
        rc, text = sh(lab_inventory, host, f"mv {DESCRIPTION}.saved {DESCRIPTION}")
        assert rc == 0, text
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert "[driver -> cuda] the stack's CUDA toolkit needs CUDA 13.0.2, which needs driver >= " in text
    assert "the host runs driver 570.124.06 but the stack declares 580.95.05" in text
    assert verify(lab_inventory, host).rc == 0, "the declared driver is back"


def test_gpufleet_plan_of_the_lab_inventory(lab_inventory: Path) -> None:
    result = subprocess.run(
        [str(BIN / "gpufleet"), "plan", "-i", str(lab_inventory), "--json"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=300,
        check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg")),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (lab,) = json.loads(result.stdout)["classes"]
    assert [item["name"] for item in lab["artifacts"]] == [
        "NVIDIA-Linux-x86_64-580.95.05.run",
        "cuda_12.8.1_570.124.06_linux.run",
        "cuda_13.0.2_580.95.05_linux.run",
        "pyenv-2.6.30.tar.gz",
        "Python-3.11.2.tgz",
    ]
