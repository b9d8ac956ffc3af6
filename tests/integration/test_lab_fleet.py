"""The lab fleet for real: SSH + Ansible, systemd, reboots, apt through the mirror, mirror files, down/up cycles.

Runs against the shared lab that scripts/run-tests.sh starts (`gpufleet lab up --hosts 2`) and leaves it up;
the down/up cycle uses a second, separate lab (own prefix, state directory and inventory).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import BIN, AnsibleRunner, run_ansible
from test_drift_support import run_playbooks
from gpufleet import PROJECT_ROOT
from gpufleet.lab import balancer, mirror
from gpufleet.lab.config import load_config
from gpufleet.lab.releases import RELEASES

pytestmark = pytest.mark.lab


def gpufleet(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpufleet"), *args], capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT, check=False
    )


def test_ansible_ping_on_every_host(lab_inventory: Path, lab_hosts: dict[str, dict]) -> None:
    result = subprocess.run(
        [str(BIN / "ansible"), "-i", str(lab_inventory), "gpu_nodes", "-m", "ping"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name in lab_hosts:
        assert re.search(rf"^{name} \| SUCCESS", result.stdout, re.MULTILINE), result.stdout


def test_systemd_is_running_on_every_host(ansible: AnsibleRunner, lab_hosts: dict[str, dict]) -> None:
    results = ansible("gpu_nodes", "command", "systemctl is-system-running")
    assert {host: r["stdout"] for host, r in results.items()} == {host: "running" for host in lab_hosts}


def test_no_host_sees_another_hosts_processes_in_its_cgroups(
    ansible: AnsibleRunner, lab_hosts: dict[str, dict]
) -> None:
    """Each host's nspawn runs in a cgroup of its own (gpufleet/lab/cgroups.py). While every nspawn shared one, the
    hosts' systemd managers shared one tree of unit cgroups: another host's processes show in a cgroup.procs as pid 0
    (outside this host's PID namespace), on every host in init.scope, journald and sshd, and a stop of vllm@main on
    Debian 13 waited for another host's vllm@main ("Processes still around after final SIGKILL")."""
    results = ansible("gpu_nodes", "ansible.builtin.shell", "grep -rlx 0 /sys/fs/cgroup --include=cgroup.procs || true")
    assert {host: r["stdout"] for host, r in results.items()} == {host: "" for host in lab_hosts}


def test_lab_status_reports_every_host_up(lab_hosts: dict[str, dict]) -> None:
    result = gpufleet("lab", "status")
    assert result.returncode == 0, result.stdout + result.stderr
    for name, host_vars in lab_hosts.items():
        assert re.search(rf"^{name}\s+{re.escape(host_vars['ansible_host'])}\s+up\s+running", result.stdout, re.M)
    assert re.search(r"^mirror .*: healthy$", result.stdout, re.M)


def test_reboot_gives_a_new_boot_id_and_the_host_comes_back(ansible: AnsibleRunner, lab_hosts: dict[str, dict]) -> None:
    host = list(lab_hosts)[-1]
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    before = ansible(host, "command", boot_id)[host]["stdout"]
    rebooted = ansible(host, "ansible.builtin.reboot", "reboot_timeout=180")[host]
    assert rebooted["rebooted"] is True
    after = ansible(host, "command", boot_id)[host]["stdout"]
    assert re.fullmatch(r"[0-9a-f-]{36}", after) and after != before
    state = ansible(host, "command", "systemctl is-system-running --wait")[host]["stdout"]
    assert state == "running"


def test_apt_installs_through_the_mirror(ansible: AnsibleRunner, lab_hosts: dict[str, dict]) -> None:
    host = list(lab_hosts)[0]
    suite = RELEASES[lab_hosts[host]["gpufleet_lab_os"]].suite
    sources = ansible(host, "command", "cat /etc/apt/sources.list")[host]["stdout"]
    assert f"deb {lab_hosts[host]['gpufleet_mirror_url']}/debian {suite} main" in sources
    script = (
        "apt-get purge -y -q jq >/dev/null; apt-get update -q && apt-get install -y -q jq && "
        "dpkg-query -W -f '${Version}' jq && echo && jq --version"
    )
    *_, version, shown = ansible(host, "shell", script, timeout=900)[host]["stdout"].splitlines()
    # jq-1.6 from bookworm's 1.6-2.1, jq-1.7.1 from trixie's: the release's package, installed and running.
    assert shown == f"jq-{version.rsplit('-', 1)[0]}", (version, shown)


def test_mirror_serves_a_published_file_to_every_host(
    ansible: AnsibleRunner, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    source = tmp_path / "artifact.bin"
    source.write_bytes(os.urandom(256 * 1024))
    url_path = mirror.publish(source, f"_tests/{uuid.uuid4().hex}/artifact.bin")
    try:
        results = ansible(
            "gpu_nodes", "shell", f"curl -fsS {{{{ gpufleet_mirror_url }}}}{url_path} | sha256sum | cut -d' ' -f1"
        )
        expected = hashlib.sha256(source.read_bytes()).hexdigest()
        assert {host: r["stdout"] for host, r in results.items()} == {host: expected for host in lab_hosts}
    finally:
        published = mirror.mirror_dir() / url_path.lstrip("/")
        published.unlink()
        published.parent.rmdir()


class SeparateLab:
    """A second lab with its own prefix, state directory and inventory, so the shared lab stays up."""

    prefix = "itest"

    def __init__(self, root: Path) -> None:
        self.lab_dir = root / "lab"
        self.inventory = root / "hosts.yml"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        options = ["--lab-dir", str(self.lab_dir), "--prefix", self.prefix, "--inventory", str(self.inventory)]
        return gpufleet("lab", *options, *args)

    def traces(self) -> list[str]:
        """Everything of this lab still on the machine: namespaces, veths, processes, locks, directories."""
        found = [
            f"netns {n}"
            for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
            if n.startswith(f"{self.prefix}-")
        ]
        links = json.loads(subprocess.run(["ip", "-json", "link"], capture_output=True, text=True, check=True).stdout)
        found += [f"veth {link['ifname']}" for link in links if link["ifname"].startswith(f"ve-{self.prefix}-")]
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(self.lab_dir) in cmdline:
                found.append(f"process {pid}: {cmdline.replace(chr(0), ' ')[:120]}")
        hosts_dir = self.lab_dir / "hosts"
        if hosts_dir.is_dir() and any(hosts_dir.iterdir()):
            found.append(f"host directories {sorted(p.name for p in hosts_dir.iterdir())}")
        if (self.lab_dir / "lab.lock").exists():
            found.append("lab.lock")
        return found


@pytest.fixture
def separate_lab(tmp_path: Path) -> SeparateLab:
    lab = SeparateLab(tmp_path)
    yield lab
    lab.run("down")


def test_down_and_up_cycles_repair_and_leave_nothing(separate_lab: SeparateLab) -> None:
    up = separate_lab.run("up", "--hosts", "1")
    assert up.returncode == 0, up.stderr
    assert "created itest-1" in up.stdout
    run_ansible(separate_lab.inventory, "gpu_nodes", "ping")

    again = separate_lab.run("up", "--hosts", "1")
    assert again.returncode == 0 and "already healthy: itest-1" in again.stdout

    # A crash of the supervisor (nspawn lives on, unsupervised) is repaired by the next `lab up`.
    record = json.loads((separate_lab.lab_dir / "hosts/itest-1/supervisor.pid").read_text())
    os.kill(record["pid"], signal.SIGKILL)
    repaired = separate_lab.run("up", "--hosts", "2")
    assert repaired.returncode == 0, repaired.stderr
    assert "repaired itest-1 (supervisor not running" in repaired.stdout
    assert "created itest-2" in repaired.stdout
    assert run_ansible(separate_lab.inventory, "gpu_nodes", "ping").keys() == {"itest-1", "itest-2"}

    shrunk = separate_lab.run("up", "--hosts", "1")
    assert shrunk.returncode == 0 and "removed itest-2" in shrunk.stdout

    down = separate_lab.run("down")
    assert down.returncode == 0, down.stderr
    assert separate_lab.traces() == []
    assert not separate_lab.inventory.exists()
    status = separate_lab.run("status")
    assert status.returncode == 1 and "no hosts" in status.stdout

    twice = separate_lab.run("down")
    assert twice.returncode == 0, twice.stderr
    assert separate_lab.traces() == []


def test_the_balancer_takes_a_drained_host_out_and_clients_see_no_failure(
    ansible: AnsibleRunner, lab_inventory: Path, lab_hosts: dict[str, dict]
) -> None:
    """The lab's front door (gpufleet/lab/balancer.py) follows each host's /health: a drained host (its proxy answers
    503) leaves the rotation within its check interval, and every completion through the balancer is answered."""
    # Both hosts serve (in the suite an earlier test may have left instances stopped: the serve layer starts them).
    health = ansible(
        "gpu_nodes", "ansible.builtin.shell", "curl -sk -o /dev/null -w '%{http_code}' https://127.0.0.1/health || true"
    )
    idle = sorted(host for host, result in health.items() if result["stdout"] != "200")
    if idle:
        run_playbooks(lab_inventory, ",".join(idle), ["serve", "proxy"])
    front = balancer.status(load_config())
    assert front.running, "the lab's balancer does not run (gpufleet lab up starts it)"
    log = load_config().lab_dir / "balancer" / "haproxy.log"
    cache = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
    key = (cache / "lab-secrets" / "proxy-api-key").read_text().strip()

    def complete() -> int:
        request = urllib.request.Request(
            f"{front.url}/v1/completions",
            data=json.dumps({"model": "tiny", "prompt": "A fleet", "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(answer.status)

    drained, other = sorted(lab_hosts)[:2]
    # The drain file inference_proxy's drain entry point writes (its directory exists once a node was drained).
    drain = json.dumps({"reason": "balancer test", "since": "now"})
    ansible(drained, "ansible.builtin.file", "path=/etc/gpufleet state=directory mode=0755")
    ansible(drained, "ansible.builtin.copy", f"content='{drain}' dest=/etc/gpufleet/drain mode=0644")
    try:
        time.sleep(5)  # three failed checks (inter 1s, fall 3) take it out
        offset = log.stat().st_size
        assert [complete() for _ in range(6)] == [200] * 6
        # HAProxy writes a request's log line once the stream ends, a moment after the client has its answer: the
        # last line may still be on its way (a CI run read 5 of 6).
        deadline = time.monotonic() + 10
        while True:
            with log.open("rb") as handle:
                handle.seek(offset)
                answered = re.findall(r" nodes/(\S+) .* 200 .*\"POST /v1/completions", handle.read().decode())
            if len(answered) >= 6 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answered == [other] * 6, answered
    finally:
        ansible(drained, "ansible.builtin.file", "path=/etc/gpufleet/drain state=absent")
    time.sleep(3)  # two passed checks (rise 2) put it back
    assert [complete() for _ in range(2)] == [200, 200]
