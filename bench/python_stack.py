#!/usr/bin/env python3
"""First host vs second host for the Python layer's three steps, then a no-op rerun, as figures.

    .venv/bin/python bench/python_stack.py [--reset] [--hosts lab-1 lab-2]

The inventory is $GPUFLEET_LAB_INVENTORY (as for `gpufleet lab`), else inventories/lab/hosts.yml.

Needs the lab (`gpufleet lab up`) and a filled mirror (lab/builders/python_stack.py, then
`gpufleet wheelhouse build -i inventories/lab/hosts.yml`). Each step (python, venv, kernels) runs on the
first host alone, then on the second; the second reuses what the first left in the controller caches
(the shared CPython build, the kernel wheel of its key). Finally all three steps run again on both hosts,
which must change nothing.

--reset first removes, on the hosts, the CPython 3.11.2 build, the venvs and the kernel cache, and on the
controller the shared CPython builds and kernel wheels, so the first host starts from nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVENTORY = Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or REPO / "inventories" / "lab" / "hosts.yml")
STEPS = (("python", "playbooks/python.yml"), ("venv", "playbooks/venv.yml"), ("kernels", "playbooks/kernels.yml"))
NODE_PATHS = ("/opt/pyenv/versions/3.11.2", "/opt/gpufleet/venvs", "/var/cache/gpufleet/kernels")
_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


@dataclass
class Run:
    seconds: float
    changed: dict[str, int]
    output: str


def cache_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


def ansible(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(
        [str(Path(sys.executable).parent / tool), "-i", str(INVENTORY), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )


def run_playbooks(playbooks: list[str], limit: str) -> Run:
    started = time.monotonic()
    process = ansible("ansible-playbook", *playbooks, "--limit", limit)
    seconds = time.monotonic() - started
    if process.returncode != 0:
        sys.exit(f"bench: {' '.join(playbooks)} on {limit} failed:\n{process.stdout[-4000:]}{process.stderr[-2000:]}")
    changed = {m.group(1): int(m.group(3)) for m in _RECAP.finditer(process.stdout)}
    return Run(seconds, changed, process.stdout)


def reset(hosts: list[str]) -> None:
    for path in NODE_PATHS:
        process = ansible("ansible", ",".join(hosts), "-m", "ansible.builtin.file", "-a", f"path={path} state=absent")
        if process.returncode != 0:
            sys.exit(f"bench: removing {path} failed: {process.stdout[-2000:]}")
    for shared in (cache_dir() / "python-builds", cache_dir() / "kernels" / "gpufleet-kernel-demo"):
        for entry in sorted(shared.glob("3.11.2-*")) if shared.name == "python-builds" else [shared]:
            subprocess.run(["rm", "-rf", "--", str(entry)], check=True)


def task_statuses(output: str, fragment: str) -> set[str]:
    """The results (ok, changed, skipping) of the tasks whose name contains the fragment."""
    statuses: set[str] = set()
    for block in output.split("\nTASK [")[1:]:
        if fragment in block.split("]", 1)[0]:
            statuses.update(re.findall(r"^(ok|changed|skipping|fatal): \[", block, re.MULTILINE))
    return statuses


def provenance(step: str, run: Run) -> str:
    """What the step did on that host, read from its task results."""
    if step == "python":
        if "changed" in task_statuses(run.output, "Compile CPython on this node, the builder of its key"):
            return "compiled here (builder)"
        if "changed" in task_statuses(run.output, "Unpack the shared build"):
            return "unpacked the shared build"
        if "changed" in task_statuses(run.output, "Build CPython here when it is still missing"):
            return "compiled here"
        return "already the requested build"
    if step == "kernels":
        if "changed" in task_statuses(run.output, "Build without build isolation"):
            return "built here (builder)"
        if "changed" in task_statuses(run.output, "Install into the venv, no build here"):
            return "cached wheel installed, no build"
        return "already installed"
    if "changed" in task_statuses(run.output, "Install the lock with --require-hashes"):
        return "installed from the wheelhouse"
    return "already installed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", nargs=2, default=["lab-1", "lab-2"], metavar=("FIRST", "SECOND"))
    parser.add_argument("--reset", action="store_true", help="start from hosts and caches without the Python layer")
    args = parser.parse_args()
    if not INVENTORY.exists():
        sys.exit("bench: the lab is not up; run `gpufleet lab up` first")
    first, second = args.hosts
    if args.reset:
        reset([first, second])

    rows = []
    for step, playbook in STEPS:
        on_first = run_playbooks([playbook], first)
        on_second = run_playbooks([playbook], second)
        rows.append((step, on_first, on_second))
    rerun = run_playbooks([playbook for _, playbook in STEPS], f"{first},{second}")

    print(f"Python layer, first host ({first}) vs second host ({second}); seconds of ansible-playbook per step")
    print(f"  {'step':<9}{'first host':>12}  {'':<30}{'second host':>12}  ")
    for step, on_first, on_second in rows:
        print(
            f"  {step:<9}{on_first.seconds:>11.1f}s  {provenance(step, on_first):<30}"
            f"{on_second.seconds:>11.1f}s  {provenance(step, on_second)}"
        )
    total_changed = sum(rerun.changed.values())
    print(
        f"  no-op rerun of all three steps on both hosts: {rerun.seconds:.1f}s, changed={total_changed} "
        f"({', '.join(f'{h}: {c}' for h, c in sorted(rerun.changed.items()))})"
    )
    return 0 if total_changed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
