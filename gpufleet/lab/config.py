"""Where the lab keeps its state and caches, and the names it gives to what it creates."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet import PROJECT_ROOT
from gpufleet.errors import GpufleetError

DEFAULT_CACHE_DIR = "/var/cache/gpufleet"
DEFAULT_LAB_DIR = "/var/lib/gpufleet/lab"
DEFAULT_PREFIX = "lab"
DEFAULT_INVENTORY = PROJECT_ROOT / "inventories" / "lab" / "hosts.yml"
MIRROR_PORT = 8780

# Interface names are limited to 15 characters: "ve-" + prefix + "-" + up to 2 digits must fit.
_PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass(frozen=True)
class LabConfig:
    """Every path and name one lab uses; two labs with different prefix and lab_dir can coexist."""

    cache_dir: Path
    lab_dir: Path
    prefix: str
    inventory_path: Path

    @property
    def rootfs_cache_dir(self) -> Path:
        return self.cache_dir / "rootfs"

    @property
    def mirror_dir(self) -> Path:
        return self.cache_dir / "mirror"

    @property
    def apt_cache_dir(self) -> Path:
        return self.cache_dir / "apt"

    @property
    def hosts_dir(self) -> Path:
        return self.lab_dir / "hosts"

    @property
    def state_file(self) -> Path:
        return self.lab_dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.lab_dir / "lab.lock"

    @property
    def private_key(self) -> Path:
        return self.lab_dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.lab_dir / "ssh" / "known_hosts"

    @property
    def mirror_run_dir(self) -> Path:
        return self.lab_dir / "mirror"

    def host_name(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def host_index(self, name: str) -> int | None:
        """The index of a host name of this lab ("lab-3" -> 3), or None for a foreign name."""
        match = re.fullmatch(rf"{re.escape(self.prefix)}-([1-9][0-9]?)", name)
        return int(match.group(1)) if match else None

    def veth_name(self, index: int) -> str:
        return f"ve-{self.prefix}-{index}"

    def host_dir(self, name: str) -> Path:
        return self.hosts_dir / name


def validate_prefix(prefix: str) -> str:
    """Returns the prefix, or raises if it cannot name hosts, namespaces and interfaces."""
    if not _PREFIX_PATTERN.match(prefix):
        raise GpufleetError(
            f"lab prefix {prefix!r} is invalid: use 1-8 lowercase letters or digits, starting with a letter"
        )
    return prefix


def load_config(lab_dir: str | None = None, prefix: str | None = None, inventory: str | None = None) -> LabConfig:
    """The lab configuration from explicit values, else GPUFLEET_* environment variables, else defaults."""
    return LabConfig(
        cache_dir=Path(os.environ.get("GPUFLEET_CACHE") or DEFAULT_CACHE_DIR),
        lab_dir=Path(lab_dir or os.environ.get("GPUFLEET_LAB_DIR") or DEFAULT_LAB_DIR),
        prefix=validate_prefix(prefix or os.environ.get("GPUFLEET_LAB_PREFIX") or DEFAULT_PREFIX),
        inventory_path=Path(inventory or os.environ.get("GPUFLEET_LAB_INVENTORY") or DEFAULT_INVENTORY),
    )
