"""A read-only `gpufleet drift` (or a no-op `gpufleet provision --check`) against generated inventories of N hosts
whose entries all point at the lab's few real hosts (each connection real), printing wall time and the
controller's CPU per host (issue 37's scale figures; bench/scale_plan.py does `plan -i`, which contacts no host).

Usage: .venv/bin/python bench/scale_fleet.py [--command drift|provision] [--hosts 10,50] [--forks 16]

Needs a converged lab (`gpufleet lab up`, then `gpufleet provision -i inventories/lab/hosts.yml`). Every generated
host is an alias of a lab host (its address, key and interpreter), so N aliases make N real SSH connections and N
full sets of checks on two containers: the lab hosts' CPUs, not the controller, bound the wall time of large N.
CPU is the gpufleet process's children's (ansible-playbook, its forks and their ssh clients), from the kernel's
accounting of the finished children.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAB = PROJECT_ROOT / "inventories" / "lab"
# What makes an alias the same machine as its lab host.
CONNECTION_KEYS = (
    "ansible_host",
    "ansible_user",
    "ansible_ssh_private_key_file",
    "ansible_ssh_common_args",
    "ansible_python_interpreter",
    "gpufleet_mirror_url",
    "gpufleet_lab_os",
)


def aliases(root: Path, count: int) -> Path:
    """An inventory of COUNT hosts, alias i of lab host i mod the lab's size, beside the lab's group_vars."""
    lab_hosts = yaml.safe_load((LAB / "hosts.yml").read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    names = sorted(lab_hosts)
    inventory = root / f"aliases-{count}"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(LAB / "group_vars")
    (inventory / "locks").symlink_to(LAB / "locks")
    hosts = {}
    for number in range(count):
        name = names[number % len(names)]
        real = lab_hosts[name]
        hosts[f"alias-{number:05d}"] = {
            **{key: real[key] for key in CONNECTION_KEYS if key in real},
            # The lab's proxy certificates are issued per host name: an alias serves its lab host's.
            "inference_proxy_tls_cert_src": f"{{{{ gpufleet_lab_tls_dir }}}}/{name}.crt",
            "inference_proxy_tls_key_src": f"{{{{ gpufleet_lab_tls_dir }}}}/{name}.key",
        }
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    return inventory / "hosts.yml"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], environment: dict[str, str]) -> tuple[float, float, int]:
    cpu, started = children_cpu(), time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    wall, used = time.perf_counter() - started, children_cpu() - cpu
    if result.returncode not in (0, 2):  # drift's 2 is "drift found": still a full run
        sys.exit(
            f"{' '.join(command)} failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
        )
    return wall, used, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", choices=("drift", "provision"), default="drift")
    parser.add_argument("--hosts", default="10,50", help="comma-separated inventory sizes")
    parser.add_argument("--forks", type=int, default=16)
    options = parser.parse_args()
    print(f"{options.command}, forks {options.forks}")
    print(f"{'hosts':>6}{'wall s':>10}{'CPU s':>10}{'CPU ms/host':>13}{'exit':>6}")
    gpufleet = str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet")
    with tempfile.TemporaryDirectory(prefix="gpufleet-scale-") as directory:
        root = Path(directory)
        environment = dict(os.environ, GPUFLEET_RUNS_DIR=str(root / "runs"), GPUFLEET_LOCK_DIR=str(root / "locks"))
        for size in (int(item) for item in options.hosts.split(",")):
            inventory = aliases(root, size)
            if options.command == "drift":
                command = [gpufleet, "drift", "-i", str(inventory), "--out", str(root / f"drift-{size}")]
            else:
                command = [gpufleet, "provision", "-i", str(inventory), "--check"]
            wall, cpu, code = timed([*command, "--forks", str(options.forks)], environment)
            print(f"{size:>6}{wall:>10.1f}{cpu:>10.1f}{cpu / size * 1000:>13.1f}{code:>6}", flush=True)


if __name__ == "__main__":
    main()
