"""A rolling upgrade of the lab fleet under load: `gpufleet upgrade --max-unavailable 1` of a vLLM option
change (every instance restarts, health-gated and warmed up), then of the change taken back, while a bounded
client loop sends completions through every node's TLS proxy in turn.

Usage: .venv/bin/python bench/rollout.py [--hosts h4-1,h4-2,h4-3] [--requests-per-second 2]
       (GPUFLEET_LAB_INVENTORY and friends name the lab; its nodes must be converged with site.yml)

Prints per rollout: its wall time against the sum of the per-node upgrade times, and the requests answered
(200), refused by a drained node (503 with Retry-After) and failed otherwise. The change is a host_vars file
per node beside the lab inventory, removed at the end. Requests go to the lab nodes' own addresses only.
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
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
GPUFLEET = Path(sys.executable).with_name("gpufleet")
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
SERVE_VARS = PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all" / "serve.yml"
NODE_LINE = re.compile(r"^upgrade: (\S+): upgraded \(layers [^,]+(?:, [^,]+)*, ([0-9.]+) s\)", re.M)


class Client(threading.Thread):
    """Sends one small completion at a time, to each node in turn, until stopped; counts the answers."""

    def __init__(self, addresses: dict[str, str], rate: float) -> None:
        super().__init__(daemon=True)
        self.addresses, self.interval = addresses, 1.0 / rate
        self.context = ssl.create_default_context(cafile=str(CACHE / "lab-tls" / "ca.crt"))
        self.key = (CACHE / "lab-secrets" / "proxy-api-key").read_text().strip()
        self.model = str(yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"][0]["served_model_name"])
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


def rollout(inventory: Path, hosts: list[str], runs: Path) -> tuple[float, dict[str, float], str]:
    started = time.monotonic()
    result = subprocess.run(
        [str(GPUFLEET), "upgrade", "-i", str(inventory), "--limit", ",".join(hosts), "--max-unavailable", "1"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, GPUFLEET_RUNS_DIR=str(runs)),
        check=False,
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"bench: the upgrade failed ({result.returncode}):\n{result.stdout[-6000:]}{result.stderr[-3000:]}")
    return wall, {node: float(seconds) for node, seconds in NODE_LINE.findall(result.stdout)}, result.stdout


def measured(name: str, inventory: Path, hosts: list[str], addresses: dict[str, str], rate: float, runs: Path) -> None:
    client = Client(addresses, rate)
    client.start()
    try:
        wall, per_node, _ = rollout(inventory, hosts, runs)
    finally:
        client.stop.set()
        client.join()
    answers = collections.Counter(status for (_, status) in client.counts.elements())
    print(
        f"{name}: {len(hosts)} nodes, max 1 unavailable: wall {wall:.0f} s; per-node upgrade times "
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
            + ", ".join(f"{status} x{n}" for (host, status), n in sorted(client.counts.items()) if host == node)
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", help="lab nodes, comma-separated (default: every node of the inventory)")
    parser.add_argument("--requests-per-second", type=float, default=2.0)
    args = parser.parse_args()
    inventory = Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or PROJECT_ROOT / "inventories" / "lab" / "hosts.yml")
    nodes = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    hosts = args.hosts.split(",") if args.hosts else sorted(nodes)
    addresses = {host: str(nodes[host]["ansible_host"]) for host in hosts}
    runs = Path(os.environ.get("GPUFLEET_RUNS_DIR") or "/var/lib/gpufleet/runs")
    host_vars = inventory.parent / "host_vars"
    created = not host_vars.exists()
    host_vars.mkdir(exist_ok=True)
    defaults = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instance_defaults"]
    written = [host_vars / f"{host}.yml" for host in hosts]
    try:
        for path in written:
            path.write_text(yaml.safe_dump({"vllm_service_instance_defaults": {**defaults, "max_num_seqs": 8}}))
        measured("vLLM option change", inventory, hosts, addresses, args.requests_per_second, runs)
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    try:
        measured("change taken back", inventory, hosts, addresses, args.requests_per_second, runs)
    finally:
        if created:
            host_vars.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
