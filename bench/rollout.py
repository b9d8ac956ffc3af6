"""Rolling upgrades of the lab fleet under load (issues 13, 28): with at most one node out of service at once,
`gpufleet upgrade` of a driver change (a newer driver on every node: installed, rebooted into, the instances
started again, health-gated) and the change taken back (the lab's driver again, a downgrade), while a bounded
client loop sends completions through the lab's load balancer (gpufleet/lab/balancer.py: HAProxy following each
node's /health, as a production fleet's front door does), so the figures are what a fleet's clients see. Then a
venv rollout: a package outside the lock on every node, which only a new venv drops, so `gpufleet upgrade` builds
each node's venv again beside the one in service (no reboot) and switches the instances to it.

Usage: .venv/bin/python bench/rollout.py [--hosts b-1,b-2,b-3,b-4] [--requests-per-second 2]
       (GPUFLEET_LAB_INVENTORY and friends name the lab; its nodes must be converged with site.yml)

Each host's instances are first moved to a core of the host's own (own_core; not measured) and put back at the end.
Prints per rollout: its wall time against the sum of the per-node upgrade times, and the requests answered (200)
and failed (anything else), with the node HAProxy sent each answered one to. The driver change is a host_vars file
per node beside the lab inventory, removed at the end. Requests go to the lab's balancer only (on the lab's own
link), and the loop ends with the rollout.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from gpufleet.lab import balancer
from gpufleet.lab.config import load_config

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
LAB_VARS = PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all"
DRIVER_RUNFILE = re.compile(r"^NVIDIA-Linux-x86_64-([0-9.]+)\.run$")
# `gpufleet upgrade`'s line per node.
CLI_NODE_LINE = re.compile(r"^upgrade: (\S+): upgraded \(layers [^)]*, ([0-9.]+) s\)", re.M)


class Client(threading.Thread):
    """Sends one small completion at a time through the balancer until stopped; counts the answers by the node
    that gave them (HAProxy's server name, from its log) or by the failure."""

    def __init__(self, balancer_url: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = balancer_url, 1.0 / rate
        self.key = (CACHE / "lab-secrets" / "proxy-api-key").read_text().strip()
        serve = yaml.safe_load((LAB_VARS / "serve.yml").read_text())
        self.model = str(serve["vllm_service_instances"][0]["served_model_name"])
        self.counts: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()

    def send(self) -> str:
        body = json.dumps({"model": self.model, "prompt": "A GPU fleet is", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return str(answer.status)
        except urllib.error.HTTPError as error:
            return str(error.code)
        except (urllib.error.URLError, OSError) as error:
            return f"error {type(error).__name__}"

    def run(self) -> None:
        while not self.stop.is_set():
            self.counts[self.send()] += 1
            self.stop.wait(self.interval)


def answered_by(log: Path, offset: int) -> collections.Counter[str]:
    """Completions HAProxy logged since `offset`, by the node that answered (`nodes/NAME` in its httplog)."""
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    return collections.Counter(re.findall(r" nodes/(\S+) .* 200 .*\"POST /v1/completions", text))


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


def measured(
    name: str, rollout: Rollout, node_line: re.Pattern[str], balancer_url: str, log: Path, rate: float
) -> None:
    client = Client(balancer_url, rate)
    offset = log.stat().st_size
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
    answers = client.counts
    failed = {status: n for status, n in answers.items() if status != "200"}
    print(
        f"{name}: {len(per_node)} nodes, max 1 unavailable: wall {wall:.0f} s; per-node upgrade times "
        + ", ".join(f"{node} {seconds:.0f} s" for node, seconds in sorted(per_node.items()))
        + f" (sum {sum(per_node.values()):.0f} s; the rest is the drift check, preflight and the rollout's checks)"
    )
    print(
        f"{name}: requests through the balancer {sum(answers.values())}: answered {answers.get('200', 0)}, "
        f"failed {sum(failed.values())} {failed}"
    )
    print(
        "  answered by: " + ", ".join(f"{node} x{n}" for node, n in sorted(answered_by(log, offset).items())),
        flush=True,
    )


def upgrade_cli(inventory: Path, hosts: list[str], runs: Path, layers: str = "driver") -> Rollout:
    command = [str(BIN / "gpufleet"), "upgrade", "-i", str(inventory), "--limit", ",".join(hosts)]
    return lambda: run(command + ["--max-unavailable", "1", "--layers", layers], runs)


# A distribution nobody declared in the venv in service, as a `pip install` by hand leaves it.
HANDMADE = (
    "site=$(ls -d /opt/gpufleet/venvs/current/lib/python3*/site-packages) && "
    "mkdir -p $site/gpufleet_bench_handmade-1.0.dist-info && "
    "printf 'Metadata-Version: 2.1\\nName: gpufleet-bench-handmade\\nVersion: 1.0\\n' "
    "> $site/gpufleet_bench_handmade-1.0.dist-info/METADATA && : > $site/gpufleet_bench_handmade-1.0.dist-info/RECORD"
)


def plant_handmade_package(inventory: Path, hosts: list[str]) -> None:
    subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), ",".join(hosts), "-m", "ansible.builtin.shell", "-a", HANDMADE],
        cwd=PROJECT_ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg")),
        capture_output=True,
        text=True,
        check=True,
    )


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


def own_core(hosts: list[str]) -> dict[str, dict]:
    """Per host, the lab's instances with their OpenMP threads on a core of the host's own (host i: core i modulo
    the controller's cores). The lab binds every host's main instance to core 0 and greedy to core 1; on 2 cores
    an engine bound to the core of another host's serving engine took minutes to initialise (lab-1's greedy after
    its driver reboot, beside lab-2's main answering the bench: 5 minutes between its first log lines), which
    measures the lab's shared cores, not the rollout."""
    instances = yaml.safe_load((LAB_VARS / "serve.yml").read_text())["vllm_service_instances"]
    cores = os.cpu_count() or 1
    return {
        host: {
            "vllm_service_instances": [
                {**item, "env": {**item["env"], "VLLM_CPU_OMP_THREADS_BIND": str(position % cores)}}
                for item in instances
            ]
        }
        for position, host in enumerate(hosts)
    }


def with_host_vars(directory: Path, values: dict[str, dict], body: Callable[[], None]) -> None:
    """Runs `body` with a host_vars file per host holding its values, removed afterwards."""
    written = [directory / f"{host}.yml" for host in values]
    try:
        for host, path in zip(values, written):
            path.write_text(yaml.safe_dump(values[host]))
        body()
    finally:
        for path in written:
            path.unlink(missing_ok=True)


def serve_layers(inventory: Path, hosts: list[str], runs: Path, why: str) -> None:
    """Converges the serving layers of the hosts (not measured), e.g. to move the instances to their cores."""
    rc, output = run(
        [str(BIN / "gpufleet"), "provision", "-i", str(inventory), "--limit", ",".join(hosts), "--tags", "serve,proxy"],
        runs,
    )
    if rc != 0:
        sys.exit(f"bench: {why}: the serve layer failed ({rc}):\n{output[-8000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", help="lab nodes, comma-separated (default: every node of the inventory)")
    parser.add_argument("--requests-per-second", type=float, default=2.0)
    args = parser.parse_args()
    inventory = Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or PROJECT_ROOT / "inventories" / "lab" / "hosts.yml")
    nodes = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    hosts = args.hosts.split(",") if args.hosts else sorted(nodes)
    front = balancer.status(load_config())
    if not front.running:
        sys.exit("bench: the lab's balancer does not run: `gpufleet lab up` starts it")
    log = load_config().lab_dir / "balancer" / "haproxy.log"
    runs = Path(os.environ.get("GPUFLEET_RUNS_DIR") or "/var/lib/gpufleet/runs")
    rate = args.requests_per_second
    host_vars = inventory.parent / "host_vars"
    created = not host_vars.exists()
    host_vars.mkdir(exist_ok=True)
    stack = yaml.safe_load((LAB_VARS / "stack.yml").read_text())["gpufleet_stack"]
    cores = own_core(hosts)

    def each(values: dict) -> dict[str, dict]:
        return {host: {**cores[host], **values} for host in hosts}

    try:
        with_host_vars(host_vars, cores, lambda: serve_layers(inventory, hosts, runs, "each host on its own core"))
        newest = newest_standin_driver()
        newer = {"gpufleet_stack": {**stack, "driver": newest}}
        with_host_vars(
            host_vars,
            each(newer),
            lambda: measured(
                f"driver {stack['driver']} -> {newest}",
                upgrade_cli(inventory, hosts, runs),
                CLI_NODE_LINE,
                front.url,
                log,
                rate,
            ),
        )
        # Back to the lab's declaration: a downgrade, which the driver role does only when allowed.
        with_host_vars(
            host_vars,
            each({"nvidia_driver_allow_downgrade": True}),
            lambda: measured(
                f"driver {newest} -> {stack['driver']} (taken back)",
                upgrade_cli(inventory, hosts, runs),
                CLI_NODE_LINE,
                front.url,
                log,
                rate,
            ),
        )
        plant_handmade_package(inventory, hosts)
        with_host_vars(
            host_vars,
            cores,
            lambda: measured(
                "venv built again beside the one in service",
                upgrade_cli(inventory, hosts, runs, layers="venv,kernels"),
                CLI_NODE_LINE,
                front.url,
                log,
                rate,
            ),
        )
    finally:
        # The lab's own binding again.
        serve_layers(inventory, hosts, runs, "the lab's cores again")
        if created and not any(host_vars.iterdir()):
            host_vars.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
