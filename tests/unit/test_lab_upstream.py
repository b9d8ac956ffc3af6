"""The lab's upstream (gpufleet/lab/upstream.py): staged files served at their upstream's paths, with Range, and
the lab mirror filled from it. The sync of the lab inventory against it runs in
tests/integration/test_mirror_sync_lab.py."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from gpufleet.lab import upstream
from gpufleet.lab.config import load_config
from gpufleet.upstreams import load_upstreams

STAGED = {
    "nvidia/NVIDIA-Linux-x86_64-580.95.05.run": "/driver/Linux-x86_64/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run",
    "nvidia/cuda_13.0.2_580.95.05_linux.run": "/toolkit/13.0.2/local_installers/cuda_13.0.2_580.95.05_linux.run",
    "python/Python-3.11.2.tgz": "/cpython/3.11.2/Python-3.11.2.tgz",
    "pyenv/pyenv-2.6.30.tar.gz": "/pyenv/v2.6.30.tar.gz",
}
NOT_SERVED = ["nvidia/sha256.json", "sdists/gpufleet_kernel_demo-0.1.0.tar.gz"]


@pytest.fixture()
def staged(tmp_path: Path) -> Path:
    root = tmp_path / "lab-upstream"
    for number, name in enumerate([*STAGED, *NOT_SERVED]):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(f"{name} {number}\n".encode() * 100)
    return root


def test_each_staged_file_is_served_at_its_upstreams_path(staged: Path) -> None:
    table = upstream.routes(staged, load_upstreams())
    assert {path: str(file.relative_to(staged)) for path, file in table.items()} == {v: k for k, v in STAGED.items()}


def test_the_stand_in_answers_a_range_request_with_the_rest_of_the_file(staged: Path) -> None:
    server = upstream.UpstreamStandIn(staged)
    try:
        data = (staged / "python/Python-3.11.2.tgz").read_bytes()
        request = urllib.request.Request(
            f"{server.base}/cpython/3.11.2/Python-3.11.2.tgz", headers={"Range": "bytes=10-"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 206 and response.read() == data[10:]
        assert server.overrides()["driver"] == f"{server.base}/driver"
    finally:
        server.close()


def test_without_a_lab_inventory_every_staged_file_is_published_as_it_is(
    staged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_CACHE", str(staged.parent))
    monkeypatch.setenv("GPUFLEET_LAB_INVENTORY", str(tmp_path / "no-lab" / "hosts.yml"))
    lines: list[str] = []

    assert upstream.fill_mirror(load_config(), lines.append) is None

    for name in [*STAGED, *NOT_SERVED]:
        assert (staged.parent / "mirror" / name).read_bytes() == (staged / name).read_bytes()
    assert len(lines) == len(STAGED) + len(NOT_SERVED)
    again: list[str] = []
    upstream.fill_mirror(load_config(), again.append)
    assert again == []
