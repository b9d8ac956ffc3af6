"""The lab hosts' Debian 12 root file system: built once with mmdebstrap, cached as a tar keyed by its recipe."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from gpufleet.errors import GpufleetError

DEBIAN_ARCHIVE = "http://deb.debian.org/debian"

PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "iproute2", "sudo",
    "ca-certificates", "curl", "gnupg", "procps", "kmod", "less", "iputils-ping", "netbase",
)

# Shell run by mmdebstrap inside the finished tree ("$1" is its root). Host keys and the machine id
# must be unique per host, so the image carries none; `gpufleet lab up` writes them per host.
CUSTOMIZE_HOOKS = (
    'rm -f "$1"/etc/ssh/ssh_host_*',
    ': > "$1"/etc/machine-id',
    'rm -f "$1"/var/lib/dbus/machine-id',
    'mkdir -p -m 700 "$1"/root/.ssh',
)


def recipe() -> dict:
    """Everything that determines the image; its hash names the cached tar."""
    return {
        "suite": "bookworm",
        "variant": "minbase",
        "architecture": "amd64",
        "mirror": DEBIAN_ARCHIVE,
        "packages": sorted(PACKAGES),
        "customize_hooks": list(CUSTOMIZE_HOOKS),
    }


def recipe_hash(data: dict | None = None) -> str:
    encoded = json.dumps(data if data is not None else recipe(), sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()


def cached_tar(cache_dir: Path) -> Path:
    return cache_dir / f"{recipe_hash()}.tar"


def mmdebstrap_command(target: Path) -> list[str]:
    data = recipe()
    command = [
        "mmdebstrap",
        f"--variant={data['variant']}",
        f"--architectures={data['architecture']}",
        f"--include={','.join(data['packages'])}",
        "--quiet",
    ]
    command += [f"--customize-hook={hook}" for hook in data["customize_hooks"]]
    return command + [data["suite"], str(target), data["mirror"]]


def ensure_rootfs(cache_dir: Path) -> tuple[Path, bool]:
    """The cached root file system tar, building it first if absent. Returns (path, built_now)."""
    target = cached_tar(cache_dir)
    if target.is_file():
        return target, False
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename, so an interrupted build never leaves a truncated cache entry.
    partial = target.with_name(f".{target.stem}.{os.getpid()}.partial.tar")
    print(f"lab: building the Debian 12 root file system (once; cached as {target.name})", file=sys.stderr)
    result = subprocess.run(mmdebstrap_command(partial), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise GpufleetError(f"mmdebstrap failed to build the lab root file system:\n{tail}")
    os.replace(partial, target)
    return target, True


def extract(tar_path: Path, destination: Path) -> None:
    """Unpacks the image into an empty directory, keeping owners, modes and extended attributes."""
    destination.mkdir(parents=True, exist_ok=False)
    command = ["tar", "--extract", "--numeric-owner", "--preserve-permissions", "--xattrs",
               "--xattrs-include=*", "-C", str(destination), "-f", str(tar_path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpufleetError(f"extracting {tar_path} into {destination} failed: {result.stderr.strip()}")
