"""The lab artifact mirror: where to put files for lab hosts, and the detached server that serves them.

Other code publishes artifacts with `publish(path)` and hands hosts the URL `gpufleet_mirror_url + path`
(the inventory sets `gpufleet_mirror_url` per host).
"""

from __future__ import annotations

import json
import time
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpufleet import PROJECT_ROOT
from gpufleet.errors import GpufleetError
from gpufleet.lab.addressing import HostAddress
from gpufleet.lab.config import MIRROR_PORT, LabConfig, load_config
from gpufleet.lab.mirror_server import HEALTH_PATH, PASS_THROUGH_ROOTS, SERVED_PATH
from gpufleet.lab.procs import is_alive, pids_with_argument, read_pid_file, stop_processes, write_pid_file


def mirror_dir(config: LabConfig | None = None) -> Path:
    """The directory the mirror serves (created if missing): ${GPUFLEET_CACHE}/mirror."""
    path = (config or load_config()).mirror_dir
    path.mkdir(parents=True, exist_ok=True)
    return path


def publish(source: Path | str, name: str | None = None, config: LabConfig | None = None) -> str:
    """Copies a file into the mirror (atomically) and returns its URL path, e.g. "/runfiles/x.run".

    `name` is the relative path inside the mirror (default: the file's name). A host fetches it from
    its `gpufleet_mirror_url` followed by the returned path.
    """
    source = Path(source)
    relative = PurePosixPath(name or source.name)
    place(source, mirror_dir(config), str(relative))
    return f"/{relative}"


def place(source: Path, root: Path, name: str) -> Path:
    """Copies a file to ROOT/NAME in one rename, readable by all; NAME is relative and outside the mirror's
    pass-through roots."""
    if not source.is_file():
        raise GpufleetError(f"cannot publish {source}: not a file")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or relative.parts[0] in PASS_THROUGH_ROOTS:
        raise GpufleetError(f"cannot publish as {name!r}: use a relative path outside {PASS_THROUGH_ROOTS}")
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    shutil.copyfile(source, partial)
    os.chmod(partial, 0o644)
    os.replace(partial, target)
    return target


def host_mirror_url(address: HostAddress, port: int = MIRROR_PORT) -> str:
    """The mirror's base URL as a host reaches it: the controller's end of that host's link."""
    return f"http://{address.gateway}:{port}"


@dataclass(frozen=True)
class MirrorStatus:
    running: bool
    addresses: tuple[str, ...]
    port: int
    healthy: bool


def _pid_file(config: LabConfig) -> Path:
    return config.mirror_run_dir / "mirror.pid"


def _info_file(config: LabConfig) -> Path:
    return config.mirror_run_dir / "mirror.json"


def status(config: LabConfig) -> MirrorStatus:
    """Whether the recorded mirror process runs, and whether it answers on its first address."""
    try:
        info = json.loads(_info_file(config).read_text())
    except (FileNotFoundError, ValueError):
        info = {"addresses": [], "port": MIRROR_PORT}
    addresses = tuple(info.get("addresses", []))
    port = int(info.get("port", MIRROR_PORT))
    running = is_alive(read_pid_file(_pid_file(config)))
    healthy = running and bool(addresses) and health_check(addresses[0], port)
    return MirrorStatus(running, addresses, port, healthy)


def served_bytes(config: LabConfig | None = None) -> dict[str, int]:
    """Bytes of each mirror file the running mirror has sent since it started, by URL path."""
    current = status(config or load_config())
    if not current.healthy:
        raise GpufleetError("the lab mirror is not running: `gpufleet lab up` starts it")
    url = f"http://{current.addresses[0]}:{current.port}{SERVED_PATH}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return {str(path): int(count) for path, count in json.loads(response.read()).items()}


def health_check(address: str, port: int, timeout: float = 3) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}{HEALTH_PATH}", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def ensure_running(config: LabConfig, addresses: list[str], port: int = MIRROR_PORT) -> str:
    """Starts the mirror on exactly these addresses; restarts it if it serves others. Returns what it did."""
    current = status(config)
    if current.healthy and set(current.addresses) == set(addresses) and current.port == port:
        return "running"
    action = "restarted" if current.running else "started"
    stop(config)
    start(config, addresses, port)
    return action


def start(config: LabConfig, addresses: list[str], port: int) -> None:
    config.mirror_run_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "gpufleet.lab.mirror_server",
        "--root",
        str(mirror_dir(config)),
        "--apt-cache",
        str(config.apt_cache_dir),
        "--port",
        str(port),
        "--pid-file",
        str(_pid_file(config)),
    ]
    for address in addresses:
        command += ["--bind", address]
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    with (config.mirror_run_dir / "mirror.log").open("ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd=str(PROJECT_ROOT),
            env=env,
        )
    write_pid_file(_pid_file(config), process.pid)
    if not _wait_healthy(addresses[0], port):
        stop(config)
        raise GpufleetError(f"the lab mirror did not start; see {config.mirror_run_dir / 'mirror.log'}")
    _info_file(config).write_text(json.dumps({"addresses": addresses, "port": port}) + "\n")


def _wait_healthy(address: str, port: int, attempts: int = 50) -> bool:
    for _ in range(attempts):
        if health_check(address, port, timeout=1):
            return True
        time.sleep(0.2)
    return False


def stop(config: LabConfig) -> list[str]:
    """Stops the recorded mirror process (and any orphan of a crashed run); verifies they are gone."""
    records = [record for record in [read_pid_file(_pid_file(config))] if is_alive(record)]
    orphans = pids_with_argument({str(_pid_file(config))})
    records += [orphan for orphan in orphans if orphan not in records]
    survivors = stop_processes(records, grace=10)
    if survivors:
        raise GpufleetError(f"the lab mirror (pid {survivors[0].pid}) did not exit; stop it by hand")
    stopped = [f"mirror pid {record.pid}" for record in records]
    _pid_file(config).unlink(missing_ok=True)
    _info_file(config).unlink(missing_ok=True)
    return stopped
