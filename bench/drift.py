"""Times a drift run (`gpufleet drift`) for 1, 2 and 4 nodes, against the naive way on the same nodes in the
same run: `ansible-playbook --check` of the layers' own playbooks.

Usage: .venv/bin/python bench/drift.py -i INVENTORY [--layers base,...,model] [--nodes 1,2,4] [--rounds 1]

The nodes are the first N of the inventory's gpu_nodes; counts above what the inventory has are skipped
and said so. Both ways only read. The figures depend on the nodes' state (a missing venv is quick to find
missing), so run it on converged nodes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from gpufleet.drift import LAYERS, parse_layers, run_drift  # noqa: E402
from gpufleet.inventory import inventory_hosts  # noqa: E402

# The playbook that provisions each layer (gpu_health has none: the driver's covers it).
LAYER_PLAYBOOKS = {
    "base": "base",
    "driver": "driver",
    "toolkit": "toolkit",
    "python": "python",
    "venv": "venv",
    "kernels": "kernels",
    "model": "model",
    "serve": "serve",
}
DEFAULT_LAYERS = "base,driver,gpu_health,toolkit,python,venv,kernels,model"


def time_drift(inventory: Path, hosts: list[str], layers: list[str]) -> tuple[float, int]:
    started = time.monotonic()
    run = run_drift(inventory, limit=",".join(hosts), layers=layers, say=lambda line: None)
    return time.monotonic() - started, run.exit_code


def time_check_mode(inventory: Path, hosts: list[str], layers: list[str]) -> tuple[float, int]:
    """`ansible-playbook --check` of every layer's playbook, in one run (one process, as an operator would)."""
    names = [LAYER_PLAYBOOKS[layer] for layer in layers if layer in LAYER_PLAYBOOKS]
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as directory:
        book = Path(directory) / "check.yml"
        book.write_text(
            "".join(
                f"- name: {name}\n  ansible.builtin.import_playbook: {PROJECT_ROOT}/playbooks/{name}.yml\n"
                for name in names
            )
        )
        started = time.monotonic()
        result = subprocess.run(
            [
                str(Path(sys.executable).with_name("ansible-playbook")),
                "-i",
                str(inventory),
                "--check",
                "--limit",
                ",".join(hosts),
                str(book),
            ],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            env=dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg")),
            check=False,
        )
    return time.monotonic() - started, result.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", type=Path, default=PROJECT_ROOT / "inventories" / "lab" / "hosts.yml")
    parser.add_argument("--layers", default=DEFAULT_LAYERS, help=f"layers to compare (of {', '.join(LAYERS)})")
    parser.add_argument("--nodes", default="1,2,4", help="node counts to time")
    parser.add_argument("--rounds", type=int, default=1, help="runs per figure; the best is kept")
    args = parser.parse_args()
    layers = parse_layers(args.layers) or list(LAYERS)
    available = inventory_hosts(args.inventory)
    rows = []
    for count in (int(item) for item in args.nodes.split(",")):
        if count > len(available):
            print(f"bench: {count} nodes skipped, the inventory has {len(available)}")
            continue
        hosts = available[:count]
        drift = min((time_drift(args.inventory, hosts, layers) for _ in range(args.rounds)), key=lambda item: item[0])
        check = min(
            (time_check_mode(args.inventory, hosts, layers) for _ in range(args.rounds)), key=lambda item: item[0]
        )
        rows.append((count, drift, check))
    print(f"drift run vs ansible-playbook --check of the layer playbooks; layers: {', '.join(layers)}")
    print(f"{'nodes':>5}  {'gpufleet drift':>15}  {'--check playbooks':>18}  {'ratio':>6}")
    for count, (drift, drift_rc), (check, check_rc) in rows:
        print(
            f"{count:>5}  {drift:>13.1f} s  {check:>16.1f} s  {check / drift:>5.1f}x"
            f"   (drift exit {drift_rc}, --check exit {check_rc})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
