"""The lab's front door: HAProxy (Debian's package) in front of every host's TLS proxy, as a production fleet
has a load balancer that follows each node's /health. A node that drains (its proxy answers 503) or goes down
leaves the rotation after three failed checks (about three seconds), and meanwhile a request it refused or dropped
is sent to another node, so clients see what a real fleet's clients see during a rolling upgrade
(bench/rollout.py sends its requests here).

It listens on plain HTTP on the first host's gateway address (the controller's side of the lab link: each lab's
own, no other machine reaches it) and speaks TLS to the hosts without checking their certificates: the lab's CA is
made after the hosts (playbooks/lab_mirror.yml), and this hop is the lab's own link.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.lab.config import LabConfig
from gpufleet.lab.procs import is_alive, pids_with_argument, read_pid_file, stop_processes, write_pid_file

BALANCER_PORT = 8443


@dataclass(frozen=True)
class Backend:
    name: str
    address: str


@dataclass(frozen=True)
class BalancerStatus:
    running: bool
    url: str


def _run_dir(config: LabConfig) -> Path:
    return config.lab_dir / "balancer"


def _pid_file(config: LabConfig) -> Path:
    return _run_dir(config) / "haproxy.pid.json"


def _config_file(config: LabConfig) -> Path:
    return _run_dir(config) / "haproxy.cfg"


def url(address: str) -> str:
    return f"http://{address}:{BALANCER_PORT}"


def render(address: str, backends: Sequence[Backend]) -> str:
    """haproxy.cfg: health checks of GET /health every second (out after three failures, back after two passes:
    HAProxy's own defaults; a check waits up to 3 s), a request that got 503 or no answer retried on another node,
    the request body buffered so it can be. Out after one failure and a check timing out with the interval, one
    slow /health of the serving node (its host busy with the other's upgrade) took both out at once: clients got
    HAProxy's own 503 (bench/rollout.py on two lab hosts)."""
    servers = "\n".join(
        f"    server {backend.name} {backend.address}:443 check ssl verify none" for backend in backends
    )
    return f"""# Written by gpufleet lab (gpufleet/lab/balancer.py): the lab's load balancer.
global
    log stdout format raw local0 info
    maxconn 512

defaults
    mode http
    log global
    option httplog
    timeout connect 3s
    timeout client 120s
    timeout server 120s
    timeout check 3s
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response response-timeout 503
    option http-buffer-request

frontend inference
    bind {address}:{BALANCER_PORT}
    default_backend nodes

backend nodes
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server inter 1s fall 3 rise 2
{servers}
"""


def status(config: LabConfig) -> BalancerStatus:
    try:
        info = json.loads((_run_dir(config) / "balancer.json").read_text())
    except (FileNotFoundError, ValueError):
        return BalancerStatus(False, "")
    return BalancerStatus(is_alive(read_pid_file(_pid_file(config))), str(info.get("url", "")))


def ensure_running(config: LabConfig, address: str, backends: Sequence[Backend]) -> str:
    """Starts HAProxy for these hosts, or restarts it when the hosts changed; returns what it did."""
    text = render(address, backends)
    current = status(config)
    path = _config_file(config)
    if current.running and path.is_file() and path.read_text() == text:
        return "running"
    action = "restarted" if current.running else "started"
    stop(config)
    _run_dir(config).mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    checked = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    if checked.returncode != 0:
        alerts = [line for line in (checked.stdout + checked.stderr).splitlines() if "ALERT" in line]
        raise GpufleetError(f"the lab balancer's configuration {path} is refused: {' '.join(alerts[:2])}")
    with (_run_dir(config) / "haproxy.log").open("ab") as log:
        # -db: in the foreground of its own session, so its pid is the one recorded.
        process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    write_pid_file(_pid_file(config), process.pid)
    if not _wait_listening(address):
        stop(config)
        raise GpufleetError(f"the lab balancer did not start; see {_run_dir(config) / 'haproxy.log'}")
    (_run_dir(config) / "balancer.json").write_text(json.dumps({"url": url(address)}) + "\n")
    return action


def _wait_listening(address: str, attempts: int = 50) -> bool:
    for _ in range(attempts):
        try:
            urllib.request.urlopen(f"{url(address)}/health", timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True  # it answers (503 while no host passed its check yet)
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    return False


def stop(config: LabConfig) -> list[str]:
    """Stops the recorded HAProxy (and one a crashed run started); verifies it is gone."""
    records = [record for record in [read_pid_file(_pid_file(config))] if is_alive(record)]
    records += [orphan for orphan in pids_with_argument({str(_config_file(config))}) if orphan not in records]
    survivors = stop_processes(records, grace=10)
    if survivors:
        raise GpufleetError(f"the lab balancer (pid {survivors[0].pid}) did not exit; stop it by hand")
    (_run_dir(config) / "balancer.json").unlink(missing_ok=True)
    return [f"balancer pid {record.pid}" for record in records]
