"""One lab host: its root file system copy, its per-host files, its supervisor, and probing it over SSH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpufleet import PROJECT_ROOT
from gpufleet.errors import GpufleetError
from gpufleet.lab import keys
from gpufleet.lab.addressing import HostAddress
from gpufleet.lab.config import LabConfig
from gpufleet.lab.network import netns_path
from gpufleet.lab.procs import PidRecord, is_alive, read_pid_file
from gpufleet.lab.releases import OsRelease
from gpufleet.lab.rootfs import extract, tree_mkdir, tree_read, tree_write
from gpufleet.lab.supervisor import host_paths

SSH_CONNECT_TIMEOUT = 3
# How long a new supervisor may take to record itself (its interpreter starting on a loaded controller).
SUPERVISOR_START_SECONDS = 30


@dataclass(frozen=True)
class Host:
    """A lab host as the controller sees it: name, index and the /30 linking it to the controller."""

    name: str
    index: int
    address: HostAddress
    host_dir: Path

    @property
    def rootfs(self) -> Path:
        return self.host_dir / "rootfs"

    @property
    def marker(self) -> Path:
        return self.host_dir / "host.json"

    def file(self, key: str) -> Path:
        return host_paths(self.host_dir)[key]

    def supervisor(self) -> PidRecord | None:
        return read_pid_file(self.file("supervisor_pid"))

    def nspawn(self) -> PidRecord | None:
        return read_pid_file(self.file("nspawn_pid"))

    def running(self) -> bool:
        return is_alive(self.supervisor()) and is_alive(self.nspawn())


@dataclass(frozen=True)
class Probe:
    """What a host answered over SSH (or why it did not)."""

    reachable: bool
    state: str = ""
    boot_id: str = ""
    boot_age_seconds: int = 0
    detail: str = ""


def host_key_path(config: LabConfig, name: str) -> Path:
    return config.lab_dir / "ssh" / "hosts" / name / "ssh_host_ed25519_key"


def rootfs_ready(host: Host, image_hash: str) -> bool:
    """True if the host's copy is complete and was extracted from the current image."""
    try:
        return json.loads(host.marker.read_text()).get("image") == image_hash and host.rootfs.is_dir()
    except (FileNotFoundError, ValueError):
        return False


def recorded_os(host: Host) -> str | None:
    """The OS name the host's marker records (None for a missing host or one made before releases existed)."""
    try:
        value = json.loads(host.marker.read_text()).get("os")
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, str) else None


def create_rootfs(host: Host, image: Path, image_hash: str, release: OsRelease) -> None:
    """Fresh copy of the image for the host; the marker is written last, so a crash leaves no half copy in use."""
    remove_host_dir(host.host_dir)
    host.host_dir.mkdir(parents=True)
    extract(image, host.rootfs)
    host.marker.write_text(json.dumps({"image": image_hash, "name": host.name, "os": release.name}) + "\n")


def remove_host_dir(host_dir: Path) -> None:
    """Deletes a host directory, staying on this file system so nothing mounted below it is touched."""
    if host_dir.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(host_dir)], check=True)


def sources_list(mirror_url: str, suite: str) -> str:
    """apt sources pointing at the lab mirror's pass-through of Debian's archive (hosts have no internet)."""
    return (
        f"deb {mirror_url}/debian {suite} main\n"
        f"deb {mirror_url}/debian {suite}-updates main\n"
        f"deb {mirror_url}/debian-security {suite}-security main\n"
    )


def configure_rootfs(host: Host, config: LabConfig, mirror_url: str, release: OsRelease) -> None:
    """Writes the per-host identity: hostname, machine id, SSH keys, apt sources of the host's release."""
    root = host.rootfs
    tree_write(root, "etc/hostname", f"{host.name}\n")
    tree_write(root, "etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n::1\tlocalhost ip6-localhost\n")
    if not tree_read(root, "etc/machine-id").strip():
        tree_write(root, "etc/machine-id", f"{uuid.uuid4().hex}\n", 0o444)
    tree_mkdir(root, "root/.ssh", 0o700)
    tree_write(root, "root/.ssh/authorized_keys", keys.public_key(config.private_key) + "\n", 0o600)
    host_key = host_key_path(config, host.name)
    tree_write(root, "etc/ssh/ssh_host_ed25519_key", host_key.read_text(), 0o600)
    tree_write(root, "etc/ssh/ssh_host_ed25519_key.pub", host_key.with_suffix(".pub").read_text())
    # Only the pre-generated key: the client verifies it against the lab known_hosts file.
    tree_write(root, "etc/ssh/sshd_config.d/gpufleet-lab.conf", "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    tree_write(root, "etc/apt/sources.list", sources_list(mirror_url, release.suite))


def start_supervisor(host: Host) -> None:
    """Starts the host's supervisor detached (own session), so it outlives this command."""
    for key in ("supervisor_pid", "nspawn_pid"):
        host.file(key).unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "gpufleet.lab.supervisor",
        "--name",
        host.name,
        "--host-dir",
        str(host.host_dir),
        "--netns",
        netns_path(host.name),
    ]
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    with host.file("supervisor_log").open("ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd=str(PROJECT_ROOT),
            env=env,
        )
    wait_for_pid_file(process, host.file("supervisor_pid"), SUPERVISOR_START_SECONDS)


def wait_for_pid_file(process: subprocess.Popen[bytes], path: Path, timeout: float) -> None:
    """Returns once the started process has recorded itself in `path`, or has exited (wait_ready then says so
    with its log). Without it, a readiness check on a busy controller ran before the supervisor's interpreter
    had written its pid file and reported a host that was booting as stopped."""
    deadline = time.monotonic() + timeout
    while read_pid_file(path) is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def ssh_command(config: LabConfig, address: str, remote: str) -> list[str]:
    """An ssh invocation that verifies the host key against the lab known_hosts file."""
    return [
        "ssh",
        "-i",
        str(config.private_key),
        "-o",
        f"UserKnownHostsFile={config.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"ConnectTimeout={SSH_CONNECT_TIMEOUT}",
        "-o",
        "LogLevel=ERROR",
        f"root@{address}",
        remote,
    ]


PROBE_SCRIPT = "systemctl is-system-running; cat /proc/sys/kernel/random/boot_id; ps -o etimes= -p 1"


def probe(config: LabConfig, host: Host, timeout: float = 15) -> Probe:
    """Asks the host for its systemd state, boot id and time since boot."""
    command = ssh_command(config, str(host.address.host), PROBE_SCRIPT)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Probe(False, detail="ssh timed out")
    lines = result.stdout.split()
    if result.returncode == 255 or len(lines) < 3:
        # ssh's last line says why (refused, no route, host key ...): enough for a one-line status.
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        return Probe(False, detail=said[-1][:200] if said else f"ssh exited {result.returncode}")
    return Probe(True, state=lines[0], boot_id=lines[1], boot_age_seconds=int(lines[2]))


def failed_units(config: LabConfig, host: Host) -> str:
    """The failed units of a degraded host with the last journal lines of each: the reason, in one text."""
    script = (
        "for unit in $(systemctl --failed --plain --no-legend | cut -d' ' -f1); do "
        'echo "$unit:"; journalctl -b -u "$unit" --no-pager -o cat | tail -n 4; done'
    )
    command = ssh_command(config, str(host.address.host), script)
    result = subprocess.run(command, capture_output=True, text=True, timeout=15, check=False)
    return result.stdout.strip() or "unknown"


def console_tail(host: Host, lines: int = 25) -> str:
    parts = []
    for key in ("supervisor_log", "console_log"):
        path = host.file(key)
        if path.is_file():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path}:\n" + "\n".join(text))
    return "\n".join(parts) or "(no log written)"


def wait_ready(config: LabConfig, host: Host, timeout: float) -> Probe:
    """Waits until sshd answers and systemd finished booting; raises with the console tail if not."""
    deadline = time.monotonic() + timeout
    last = Probe(False, detail="not probed yet")
    while time.monotonic() < deadline:
        if not is_alive(host.supervisor()) and not is_alive(host.nspawn()):
            raise GpufleetError(f"lab host {host.name} stopped while booting:\n{console_tail(host)}")
        last = probe(config, host)
        if last.reachable and last.state in ("running", "degraded"):
            return last
        time.sleep(1)
    state = last.state if last.reachable else f"ssh: {last.detail or 'no answer'}"
    raise GpufleetError(
        f"lab host {host.name} ({host.address.host}) was not ready after {timeout:.0f}s (last: {state}); "
        f"see the console log below or raise --timeout:\n{console_tail(host)}"
    )
