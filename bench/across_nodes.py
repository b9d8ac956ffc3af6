"""One model across two lab hosts against the same model on one (issue 31): the lab's tiny model served tensor
parallel 2 over the first two lab nodes with vLLM's multiprocessing backend (`nodes`, the leader behind its proxy,
the other headless), next to the lab's `main` instance of the same model on the leader alone (tensor parallel 1).

Usage: .venv/bin/python bench/across_nodes.py [--requests 8] [--max-tokens 64]
       (GPUFLEET_LAB_INVENTORY names the lab; its first two nodes must be converged with site.yml)

Prints the time from the serve and proxy run's start until the group answered, then for each instance the
completion tokens per second of --requests sequential completions (ignore_eos, so each is --max-tokens long),
sent alternately to the two through the leader's proxy, and the resident memory of each member's unit (the sum of
its processes' VmRSS). The instance is a host_vars file per member, removed at the end, and the serve layer prunes
it again. Requests go to the lab's hosts only.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
SERVE_VARS = PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all" / "serve.yml"
WIDE = {
    "name": "wide",
    "model": "/var/lib/gpufleet/models/tiny-qwen2",
    "served_model_name": "tiny-wide",
    "port": 8002,
    "tensor_parallel_size": 2,
    "distributed_executor_backend": "mp",
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1"},
}
# The resident memory of a unit's processes, in KiB.
UNIT_RSS = (
    "for pid in $(cat /sys/fs/cgroup$(systemctl show -P ControlGroup vllm@{name})/cgroup.procs); do "
    "awk '/^VmRSS/ {{print $2}}' /proc/$pid/status; done | awk '{{s += $1}} END {{print s}}'"
)


def playbooks(inventory: Path, hosts: list[str]) -> None:
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", ",".join(hosts)]
    command += [str(PROJECT_ROOT / "playbooks" / name) for name in ("serve.yml", "proxy.yml")]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), PATH=f"{BIN}:{os.environ['PATH']}")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, check=False)
    if result.returncode != 0:
        sys.exit(f"bench: serve and proxy failed:\n{(result.stdout + result.stderr)[-4000:]}")


def shell(inventory: Path, host: str, script: str) -> str:
    command = [str(BIN / "ansible"), "-i", str(inventory), host, "-m", "ansible.builtin.shell", "-a", script, "-o"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"))
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, check=False)
    # -o: "host | CHANGED | rc=0 | (stdout) TEXT"
    return result.stdout.rsplit("(stdout) ", 1)[-1].strip()


def completion(address: str, path: str, key: str, model: str, max_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds) of one completion through the host's proxy."""
    body = {"model": model, "prompt": "one model on two hosts", "max_tokens": max_tokens, "ignore_eos": True}
    request = urllib.request.Request(
        f"https://{address}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    context = ssl.create_default_context(cafile=str(CACHE / "lab-tls" / "ca.crt"))
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300, context=context) as response:
        answer = json.loads(response.read())
    return int(answer["usage"]["completion_tokens"]), time.monotonic() - started


def wait_served(address: str, key: str, within: float = 900) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            completion(address, "/instances/wide/v1/completions", key, "tiny-wide", 1)
            return
        except OSError as error:
            if time.monotonic() > deadline:
                sys.exit(f"bench: the group did not serve within {within} s: {error}")
            time.sleep(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    inventory = Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or PROJECT_ROOT / "inventories" / "lab" / "hosts.yml")
    nodes = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    leader, member = sorted(nodes)[:2]
    address = nodes[leader]["ansible_host"]
    key = (CACHE / "lab-secrets" / "proxy-api-key").read_text().strip()
    instances = yaml.safe_load(SERVE_VARS.read_text())["vllm_service_instances"]
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    written = [host_vars / f"{host}.yml" for host in (leader, member)]
    try:
        for path in written:
            declared = [*instances, {**WIDE, "nodes": [leader, member]}]
            path.write_text(yaml.safe_dump({"vllm_service_instances": declared}))
        started = time.monotonic()
        playbooks(inventory, [leader, member])
        wait_served(address, key)
        print(f"across {leader},{member}: serving {time.monotonic() - started:.0f} s after the serve run began")
        paths = {
            "wide (TP2, 2 hosts)": ("/instances/wide/v1/completions", "tiny-wide"),
            "main (TP1, 1 host)": ("/instances/main/v1/completions", str(instances[0]["served_model_name"])),
        }
        tokens = dict.fromkeys(paths, 0)
        seconds = dict.fromkeys(paths, 0.0)
        for _ in range(args.requests):
            for name, (url_path, model) in paths.items():
                count, took = completion(address, url_path, key, model, args.max_tokens)
                tokens[name] += count
                seconds[name] += took
        for name in paths:
            rate = tokens[name] / seconds[name]
            print(f"{name}: {rate:.1f} completion tokens/s ({tokens[name]} tokens in {seconds[name]:.1f} s)")
        for host in (leader, member):
            rss = int(shell(inventory, host, UNIT_RSS.format(name="wide")) or 0)
            print(f"vllm@wide on {host}: {rss / 1024 / 1024:.2f} GiB resident")
        rss = int(shell(inventory, leader, UNIT_RSS.format(name="main")) or 0)
        print(f"vllm@main on {leader}: {rss / 1024 / 1024:.2f} GiB resident")
    finally:
        for path in written:
            path.unlink(missing_ok=True)
        playbooks(inventory, [leader, member])
    return 0


if __name__ == "__main__":
    sys.exit(main())
