"""`gpufleet plan -i` against generated inventories shaped like inventories/example (two GPU classes, the example's
group_vars) of N hosts each, printing wall time and the controller's CPU per host (issue 37's scale figures).

Usage: .venv/bin/python bench/scale_plan.py [--hosts 100,1000] [--rounds 1]

plan contacts no host, so the names need not resolve and no lab is needed. CPU is the plan process's and its
children's (ansible-playbook and its forked workers), from the kernel's accounting of the finished children.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = PROJECT_ROOT / "inventories" / "example"


def generated_inventory(root: Path, hosts: int) -> Path:
    """The example's group_vars with HOSTS hosts split between its h100 and h200 classes."""
    inventory = root / f"fleet-{hosts}"
    shutil.copytree(EXAMPLE / "group_vars", inventory / "group_vars")
    # The example's models are described beside it ({{ inventory_dir }}/../example-models).
    models = root / "example-models"
    if not models.exists():
        models.symlink_to(EXAMPLE.parent / "example-models")
    h100 = hosts - hosts // 2
    lines = [
        "all:",
        "  children:",
        "    gpu_nodes:",
        "      children:",
        "        h100:",
        "          hosts:",
        f"            h100-[00001:{h100:05d}].infer.example.internal:",
    ]
    if hosts // 2:
        lines += [
            "        h200:",
            "          hosts:",
            f"            h200-[00001:{hosts // 2:05d}].infer.example.internal:",
        ]
    (inventory / "hosts.yml").write_text("\n".join(lines) + "\n")
    return inventory


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_plan(inventory: Path) -> tuple[float, float]:
    """Wall seconds and controller CPU seconds of one `gpufleet plan -i INVENTORY --json`."""
    env = dict(os.environ, ANSIBLE_VAULT_PASSWORD_FILE=str(EXAMPLE / "example-vault-password"))
    cpu, started = children_cpu(), time.perf_counter()
    result = subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), "plan", "-i", str(inventory), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall, used = time.perf_counter() - started, children_cpu() - cpu
    if result.returncode != 0:
        sys.exit(f"plan of {inventory} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return wall, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="100,1000", help="comma-separated inventory sizes")
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    sizes = [int(size) for size in options.hosts.split(",")]
    print(f"{'hosts':>6}{'wall s':>10}{'CPU s':>10}{'CPU ms/host':>13}")
    with tempfile.TemporaryDirectory(prefix="gpufleet-scale-") as directory:
        for size in sizes:
            inventory = generated_inventory(Path(directory), size)
            for _ in range(options.rounds):
                wall, cpu = timed_plan(inventory)
                print(f"{size:>6}{wall:>10.1f}{cpu:>10.1f}{cpu / size * 1000:>13.1f}", flush=True)


if __name__ == "__main__":
    main()
