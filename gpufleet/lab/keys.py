"""SSH keys of the lab: the controller's client key pair and each host's pre-generated host key."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpufleet.errors import GpufleetError


def generate_key(path: Path, comment: str) -> None:
    """An ed25519 key pair at `path` (and `path`.pub), created only if it does not exist yet."""
    if path.is_file() and path.with_suffix(".pub").is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    result = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise GpufleetError(f"ssh-keygen failed for {path}: {result.stderr.strip()}")


def public_key(path: Path) -> str:
    return path.with_suffix(".pub").read_text().strip()


def known_hosts_line(names: list[str], host_public_key: str) -> str:
    """A known_hosts entry: the host's names/addresses, then its key type and key (comment dropped)."""
    key_type, key_data = host_public_key.split()[:2]
    return f"{','.join(names)} {key_type} {key_data}"


def write_known_hosts(path: Path, entries: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{entry}\n" for entry in entries))
    tmp.replace(path)
