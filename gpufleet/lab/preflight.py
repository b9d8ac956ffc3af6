"""Checks before `gpufleet lab up`: root, tools, and a host count this machine can carry."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpufleet.errors import GpufleetError

GIB = 1024**3
# Later work runs a CPU vLLM on every host: give each about 2.5 GiB, keep 2 GiB for the controller.
MEMORY_PER_HOST = int(2.5 * GIB)
CONTROLLER_RESERVE = 2 * GIB
HARD_CAP = 8

# Tool -> Debian package that provides it.
REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "tar": "tar",
    "haproxy": "haproxy",
}
BUILD_TOOLS = {"mmdebstrap": "mmdebstrap"}


def memory_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise GpufleetError("cannot read MemTotal from /proc/meminfo")


def max_hosts(total_memory: int) -> int:
    """How many lab hosts fit: 2.5 GiB each after the controller's reserve, never more than HARD_CAP."""
    return max(0, min(HARD_CAP, (total_memory - CONTROLLER_RESERVE) // MEMORY_PER_HOST))


def validate_host_count(count: int, limit: int) -> int:
    if count < 1:
        raise GpufleetError(f"--hosts must be at least 1 (got {count})")
    if count > limit:
        raise GpufleetError(
            f"--hosts {count} is more than this machine can run: at most {limit} "
            f"(about {MEMORY_PER_HOST / GIB:g} GiB of memory per host, cap {HARD_CAP})"
        )
    return count


def require_root(euid: int | None = None) -> None:
    if (os.geteuid() if euid is None else euid) != 0:
        raise GpufleetError("the lab needs root (network namespaces, systemd-nspawn): run it with sudo or as root")


def missing_tools(tools: dict[str, str]) -> dict[str, str]:
    return {tool: package for tool, package in tools.items() if shutil.which(tool) is None}


def require_tools(tools: dict[str, str]) -> None:
    missing = missing_tools(tools)
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        raise GpufleetError(
            f"missing tools: {', '.join(sorted(missing))}; install them with `apt-get install {packages}` "
            "(or scripts/install-deps.sh)"
        )
