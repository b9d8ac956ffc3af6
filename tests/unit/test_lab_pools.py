"""Machine-wide claims: two labs never get the same address pool, nor one prefix two lab directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.lab import pools
from gpufleet.lab.config import LabConfig


def lab(tmp_path: Path, prefix: str, directory: str) -> LabConfig:
    return LabConfig(
        cache_dir=tmp_path / "cache",
        lab_dir=tmp_path / directory,
        prefix=prefix,
        inventory_path=tmp_path / directory / "hosts.yml",
    )


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    return tmp_path / "registry"


def test_two_labs_get_different_pools_before_any_network_exists(tmp_path: Path, registry: Path) -> None:
    first = pools.claim_pool(lab(tmp_path, "zza", "a"), None, [], registry)
    second = pools.claim_pool(lab(tmp_path, "zzb", "b"), None, [], registry)
    assert first != second


def test_a_lab_keeps_its_pool(tmp_path: Path, registry: Path) -> None:
    config = lab(tmp_path, "zza", "a")
    first = pools.claim_pool(config, None, [], registry)
    assert pools.claim_pool(config, first, [], registry) == first
    assert (config.state_file).is_file()


def test_a_prefix_belongs_to_one_lab_directory(tmp_path: Path, registry: Path) -> None:
    pools.claim_pool(lab(tmp_path, "zza", "a"), None, [], registry)
    intruder = lab(tmp_path, "zza", "elsewhere")
    with pytest.raises(GpufleetError, match="belongs to the running lab in"):
        pools.claim_pool(intruder, None, [], registry)
    with pytest.raises(GpufleetError, match="use another --prefix"):
        pools.check_owner(intruder, registry)


def test_claims_of_labs_that_went_down_are_stale(tmp_path: Path, registry: Path) -> None:
    old = lab(tmp_path, "zza", "a")
    pool = pools.claim_pool(old, None, [], registry)
    old.state_file.unlink()  # what `lab down` does
    newcomer = lab(tmp_path, "zza", "b")
    pools.check_owner(newcomer, registry)
    assert pools.claim_pool(newcomer, None, [], registry) == pool


def test_release_drops_only_the_own_claim(tmp_path: Path, registry: Path) -> None:
    owner = lab(tmp_path, "zza", "a")
    pools.claim_pool(owner, None, [], registry)
    pools.release(lab(tmp_path, "zza", "other"), registry)
    assert [claim.prefix for claim in pools.read_claims(registry)] == ["zza"]
    pools.release(owner, registry)
    assert pools.read_claims(registry) == []


def test_unreadable_claims_are_ignored(tmp_path: Path, registry: Path) -> None:
    registry.mkdir()
    (registry / "broken.json").write_text("{not json")
    assert pools.read_claims(registry) == []
