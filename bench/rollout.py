"""Rolling upgrades of the lab fleet under load (issue 13): with at most one node out of service at once,
`gpufleet upgrade` of a driver change (a newer driver on every node: installed, rebooted into, the instances
started again, health-gated), the change taken back (the lab's driver again, a downgrade), and a venv change run
through playbooks/upgrade.yml directly (every node's venv built again from the wheelhouse, the instances
restarted on it), while a bounded client loop sends completions through every node's TLS proxy in turn.

Usage: .venv/bin/python bench/rollout.py [--hosts b-1,b-2,b-3,b-4] [--changes driver,venv] [--requests-per-second 2]
       (GPUFLEET_LAB_INVENTORY and friends name the lab; its nodes must be converged with site.yml)

Prints per rollout: its wall time against the sum of the per-node upgrade times, and the requests answered
(200), refused by a drained node (503 with Retry-After) and failed otherwise, per node. The driver change is a
host_vars file per node beside the lab inventory, removed at the end. Requests go to the lab nodes' own
addresses only, and the loop ends with the rollout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
LAB_VARS = PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all"
DRIVER_RUNFILE = re.compile(r"^NVIDIA-Linux-x86_64-([0-9.]+)\.run$")
# `gpufleet upgrade`'s line per node, and playbooks/upgrade.yml's report (run directly).
CLI_NODE_LINE = re.compile(r"^upgrade: (\S+): upgraded \(layers [^)]*, ([0-9.]+) s\)", re.M)
# In the report a node's outcome may follow the previous node's ';' with no space between.
PLAYBOOK_NODE_LINE = re.compile(r"([\w.-]+): upgraded \(([0-9.]+) s\)")


class Client(threading.Thread):
    """Sends one small completion at a time, to each node in turn, until stopped; counts the answers."""

    def __init__(self, addresses: dict[str, str], rate: float) -> None:
        super().__init__(daemon=True)
        self.addresses, self.interval = addresses, 1.0 / rate
        self.context = ssl.create_default_context(cafile=str(CACHE / "lab-tls" / "ca.crt"))
        self.key = (CACHE / "lab-secrets" / "proxy-api-key").read_text().strip()
        serve = yaml.safe_load((LAB_VARS / "serve.yml").read_text())
        self.model = str(serve["vllm_service_instances"][0]["served_model_name"])
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.stop = threading.Event()

    def send(self, address: str) -> str:
        body = json.dumps({"model": self.model, "prompt": "A GPU fleet is", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"https://{address}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60, context=self.context) as answer:
                return str(answer.status)
        except urllib.error.HTTPError as error:
            return "503 drained" if error.code == 503 and error.headers.get("Retry-After") else str(error.code)
        except (urllib.error.URLError, OSError) as error:
            return f"error {type(error).__name__}"

    def run(self) -> None:
        while not self.stop.is_set():
            for node, address in self.addresses.items():
                self.counts[(node, self.send(address))] += 1
                self.stop.wait(self.interval)


Rollout = Callable[[], tuple[int, str]]


def run(command: list[str], runs: Path) -> tuple[int, str]:
    result = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, GPUFLEET_RUNS_DIR=str(runs), ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg")),
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def measured(name: str, rollout: Rollout, node_line: re.Pattern[str], addresses: dict[str, str], rate: float) -> None:
    client = Client(addresses, rate)
    client.start()
    started = time.monotonic()
    try:
        rc, output = rollout()
    finally:
        wall = time.monotonic() - started
        client.stop.set()
        client.join()
    if rc != 0:
        sys.exit(f"bench: {name}: the upgrade failed ({rc}):\n{output[-8000:]}")
    per_node = {node: float(seconds) for node, seconds in node_line.findall(output)}
    answers = collections.Counter(status for (_, status) in client.counts.elements())
    print(
        f"{name}: {len(addresses)} nodes, max 1 unavailable: wall {wall:.0f} s; per-node upgrade times "
        + ", ".join(f"{node} {seconds:.0f} s" for node, seconds in sorted(per_node.items()))
        + f" (sum {sum(per_node.values()):.0f} s; the rest is the drift check, preflight and the rollout's checks)"
    )
    print(
        f"{name}: requests {sum(answers.values())}: answered {answers.get('200', 0)}, refused by a drained node "
        f"(503 + Retry-After) {answers.get('503 drained', 0)}, failed otherwise "
        f"{sum(n for status, n in answers.items() if status not in ('200', '503 drained'))} "
        f"{dict((s, n) for s, n in answers.items() if s not in ('200', '503 drained'))}"
    )
    for node in sorted(addresses):
        print(
            f"  {node}: "
            + ", ".join(f"{status} x{n}" for (host, status), n in sorted(client.counts.items()) if host == node),
            flush=True,
        )


def upgrade_cli(inventory: Path, hosts: list[str], runs: Path) -> Rollout:
    command = [str(BIN / "gpufleet"), "upgrade", "-i", str(inventory), "--limit", ",".join(hosts)]
    return lambda: run(command + ["--max-unavailable", "1", "--layers", "driver"], runs)


def upgrade_playbook(inventory: Path, hosts: list[str], runs: Path, extra: dict) -> Rollout:
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", ",".join(hosts)]
    command += [
        str(PROJECT_ROOT / "playbooks" / "upgrade.yml"),
        "-e",
        json.dumps({"upgrade_max_unavailable": 1, **extra}),
    ]
    return lambda: run(command, runs)


def newest_standin_driver() -> str:
    """Publishes the lab's stand-in runfiles (lab/runfiles/build.py, which names the lab's drivers) and returns the
    newest driver among them, the one the driver rollout moves to."""
    built = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "lab" / "runfiles" / "build.py"), "--publish", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = [item["name"] for item in json.loads(built.stdout.split("published in")[0])]
    versions = [match.group(1) for match in map(DRIVER_RUNFILE.match, names) if match]
    return max(versions, key=lambda version: tuple(int(part) for part in version.split(".")))


def with_host_vars(directory: Path, hosts: list[str], values: dict, body: Callable[[], None]) -> None:
    written = [directory / f"{host}.yml" for host in hosts]
    try:
        for path in written:
            path.write_text(yaml.safe_dump(values))
        body()
    finally:
        for path in written:
            path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", help="lab nodes, comma-separated (default: every node of the inventory)")
    parser.add_argument("--changes", default="driver,venv", help="rollouts to run: driver, venv (default both)")
    parser.add_argument("--requests-per-second", type=float, default=2.0)
    args = parser.parse_args()
    inventory = Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or PROJECT_ROOT / "inventories" / "lab" / "hosts.yml")
    nodes = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    hosts = args.hosts.split(",") if args.hosts else sorted(nodes)
    addresses = {host: str(nodes[host]["ansible_host"]) for host in hosts}
    runs = Path(os.environ.get("GPUFLEET_RUNS_DIR") or "/var/lib/gpufleet/runs")
    rate = args.requests_per_second
    host_vars = inventory.parent / "host_vars"
    created = not host_vars.exists()
    host_vars.mkdir(exist_ok=True)
    stack = yaml.safe_load((LAB_VARS / "stack.yml").read_text())["gpufleet_stack"]
    changes = args.changes.split(",")
    try:
        if "driver" in changes:
            newest = newest_standin_driver()
            newer = {"gpufleet_stack": {**stack, "driver": newest}}
            with_host_vars(
                host_vars,
                hosts,
                newer,
                lambda: measured(
                    f"driver {stack['driver']} -> {newest}",
                    upgrade_cli(inventory, hosts, runs),
                    CLI_NODE_LINE,
                    addresses,
                    rate,
                ),
            )
            # Back to the lab's declaration: a downgrade, which the driver role does only when allowed.
            with_host_vars(
                host_vars,
                hosts,
                {"nvidia_driver_allow_downgrade": True},
                lambda: measured(
                    f"driver {newest} -> {stack['driver']} (taken back)",
                    upgrade_cli(inventory, hosts, runs),
                    CLI_NODE_LINE,
                    addresses,
                    rate,
                ),
            )
        if "venv" in changes:
            # The lab's wheelhouse holds one vLLM, so the venv change is the venv built again from it (what
            # `gpufleet rebuild --full` does to one node), rolled out through the playbook's own variables.
            extra = {"upgrade_layers": ["venv"], "upgrade_extra_vars": {"rebuild_fresh_venv": True}}
            measured(
                "venv built again from the wheelhouse",
                upgrade_playbook(inventory, hosts, runs, extra),
                PLAYBOOK_NODE_LINE,
                addresses,
                rate,
            )
    finally:
        if created and not any(host_vars.iterdir()):
            host_vars.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
