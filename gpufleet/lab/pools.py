"""Machine-wide claims of lab prefixes and address pools, so labs started at the same time never collide.

Every lab records {lab_dir, pool} under /run/gpufleet/labs/<prefix>.json while it exists. A claim is live
while the lab's state file still names that prefix (`lab down` deletes it); stale claims are ignored.
Choosing a pool and recording it happen under one machine-wide lock.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.lab import state
from gpufleet.lab.addressing import choose_pool, networks_in_use
from gpufleet.lab.config import LabConfig

REGISTRY_DIR = Path("/run/gpufleet/labs")


@dataclass(frozen=True)
class Claim:
    prefix: str
    lab_dir: str
    pool: str

    def is_live(self) -> bool:
        saved = state.load(Path(self.lab_dir) / "state.json")
        return saved.get("prefix") == self.prefix and saved.get("pool") == self.pool


@contextmanager
def _registry_lock(registry: Path) -> Iterator[None]:
    registry.mkdir(parents=True, exist_ok=True)
    with (registry / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def read_claims(registry: Path) -> list[Claim]:
    claims = []
    for path in sorted(registry.glob("*.json")) if registry.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            claims.append(Claim(path.stem, str(data["lab_dir"]), str(data["pool"])))
        except (ValueError, KeyError, OSError):
            continue
    return claims


def _foreign_owner(config: LabConfig, claims: list[Claim]) -> Claim | None:
    """A live claim of our prefix by another lab directory (its hosts would share our names)."""
    for claim in claims:
        if claim.prefix == config.prefix and claim.lab_dir != str(config.lab_dir) and claim.is_live():
            return claim
    return None


def _refuse_foreign(config: LabConfig, claims: list[Claim]) -> None:
    owner = _foreign_owner(config, claims)
    if owner is not None:
        raise GpufleetError(
            f"lab prefix {config.prefix!r} belongs to the running lab in {owner.lab_dir}; "
            "use another --prefix (or GPUFLEET_LAB_PREFIX) for this lab directory"
        )


def claim_pool(
    config: LabConfig, preferred: str | None, ignore_interfaces: list[str], registry: Path = REGISTRY_DIR
) -> str:
    """Chooses a free pool for this lab, records it machine-wide and in the lab's state; returns it."""
    with _registry_lock(registry):
        claims = read_claims(registry)
        _refuse_foreign(config, claims)
        used = networks_in_use(ignore_interfaces=ignore_interfaces)
        used += [ipaddress.IPv4Network(c.pool) for c in claims if c.prefix != config.prefix and c.is_live()]
        pool = choose_pool(used, preferred=preferred)
        state.save(config.state_file, {"pool": pool, "prefix": config.prefix})
        record = {"lab_dir": str(config.lab_dir), "pool": pool}
        (registry / f"{config.prefix}.json").write_text(json.dumps(record) + "\n")
        return pool


def check_owner(config: LabConfig, registry: Path = REGISTRY_DIR) -> None:
    """Raises if another lab directory owns this prefix (tearing down would hit its hosts)."""
    with _registry_lock(registry):
        _refuse_foreign(config, read_claims(registry))


def release(config: LabConfig, registry: Path = REGISTRY_DIR) -> None:
    """Drops this lab's claim (after its state file is gone)."""
    with _registry_lock(registry):
        path = registry / f"{config.prefix}.json"
        claims = [c for c in read_claims(registry) if c.prefix == config.prefix]
        if claims and claims[0].lab_dir == str(config.lab_dir):
            path.unlink(missing_ok=True)
