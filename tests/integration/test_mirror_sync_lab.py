"""`gpufleet mirror sync` for the lab inventory, against the lab's upstream (issue 35).

The lab's builders stage their files in the lab's upstream and the lab mirror that every lab host provisions from
is filled from there by mirror sync (gpufleet/lab/upstream.py): the manifest of the lab mirror says so. Then the
command itself, for the lab inventory, against the lab's upstream served at NVIDIA's, python.org's and GitHub's
paths: it fills an empty mirror with the same bytes as the lab's, a second sync asks the upstream nothing, an
interrupted download resumes with a Range request, a tampered upstream file is refused with the mirror's file
kept, and `mirror verify` finds a file changed on disk. No lab host is contacted: plan's resolution is the
controller's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BIN

from gpufleet import PROJECT_ROOT, mirror_manifest
from gpufleet.digests import sha256_file
from gpufleet.lab import mirror
from gpufleet.lab.upstream import UpstreamStandIn, upstream_dir

# What the lab inventory's stack installs from the mirror, and the path each has at its upstream.
UPSTREAM_PATHS = {
    "nvidia/NVIDIA-Linux-x86_64-580.95.05.run": "/driver/Linux-x86_64/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run",
    "nvidia/cuda_12.8.1_570.124.06_linux.run": "/toolkit/12.8.1/local_installers/cuda_12.8.1_570.124.06_linux.run",
    "nvidia/cuda_13.0.2_580.95.05_linux.run": "/toolkit/13.0.2/local_installers/cuda_13.0.2_580.95.05_linux.run",
    "pyenv/pyenv-2.6.30.tar.gz": "/pyenv/v2.6.30.tar.gz",
    "python/Python-3.11.2.tgz": "/cpython/3.11.2/Python-3.11.2.tgz",
}


def mirror_sync(inventory: Path, to: Path, stand_in: UpstreamStandIn) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "gpufleet"), "mirror", "sync", "-i", str(inventory), "--to", str(to)]
    for kind, base in stand_in.overrides().items():
        command += ["--upstream-override", f"{kind}={base}"]
    return subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300, check=False)


@pytest.fixture()
def stand_in() -> Iterator[UpstreamStandIn]:
    server = UpstreamStandIn(upstream_dir())
    yield server
    server.close()


def test_the_lab_mirror_that_the_lab_provisions_from_was_filled_by_mirror_sync() -> None:
    lab_mirror = mirror.mirror_dir()
    entries = mirror_manifest.load(lab_mirror).entries
    for path, upstream_path in UPSTREAM_PATHS.items():
        entry = entries[path]
        assert entry.url.startswith("http://127.0.0.1:") and entry.url.endswith(upstream_path), entry
        assert entry.sha256 == sha256_file(lab_mirror / path), path
    assert entries["python/Python-3.11.2.tgz"].checksum_source.startswith("knowledge base (data/compat/cpython.csv")
    assert entries["nvidia/NVIDIA-Linux-x86_64-580.95.05.run"].checksum_source == "inventory (gpufleet_artifact_sha256)"


def test_a_sync_of_the_lab_inventory_fills_an_empty_mirror_and_a_second_asks_nothing(
    lab_inventory: Path, stand_in: UpstreamStandIn, tmp_path: Path
) -> None:
    to = tmp_path / "mirror"
    first = mirror_sync(lab_inventory, to, stand_in)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert f"{len(UPSTREAM_PATHS)} downloaded" in first.stdout, first.stdout[-3000:]
    assert {path for path, _ in stand_in.requests} == set(UPSTREAM_PATHS.values())
    for path in UPSTREAM_PATHS:
        assert sha256_file(to / path) == sha256_file(mirror.mirror_dir() / path), path
    asked = len(stand_in.requests)

    second = mirror_sync(lab_inventory, to, stand_in)

    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert len(stand_in.requests) == asked
    assert f"nothing downloaded: {len(UPSTREAM_PATHS)} of {len(UPSTREAM_PATHS)} already present" in second.stdout


def test_an_interrupted_sync_resumes_and_a_tampered_upstream_file_is_refused(
    lab_inventory: Path, tmp_path: Path
) -> None:
    staged = tmp_path / "upstream"
    shutil.copytree(upstream_dir(), staged)
    to = tmp_path / "mirror"
    cpython = "python/Python-3.11.2.tgz"
    data = (staged / cpython).read_bytes()
    (to / "python").mkdir(parents=True)
    (to / f"{cpython}{mirror_manifest.PARTIAL_SUFFIX}").write_bytes(data[: len(data) // 2])
    server = UpstreamStandIn(staged)
    try:
        resumed = mirror_sync(lab_inventory, to, server)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
        assert (UPSTREAM_PATHS[cpython], f"bytes={len(data) // 2}-") in server.requests
        assert (to / cpython).read_bytes() == data

        driver = "nvidia/NVIDIA-Linux-x86_64-580.95.05.run"
        good = (to / driver).read_bytes()
        pinned = json.loads((staged / "nvidia" / "sha256.json").read_text())[driver.split("/")[1]]
        (to / driver).write_bytes(good + b"changed on disk")
        with (staged / driver).open("ab") as upstream_file:
            upstream_file.write(b"tampered upstream")

        verify = subprocess.run(
            [str(BIN / "gpufleet"), "mirror", "verify", str(to)], capture_output=True, text=True, check=False
        )
        assert verify.returncode == 2 and driver in verify.stdout, verify.stdout[-2000:]
        (to / driver).unlink()  # the mirror lost it: the tampered upstream must not fill the gap
        refused = mirror_sync(lab_inventory, to, server)
    finally:
        server.close()
    output = refused.stdout + refused.stderr
    assert refused.returncode == 1, output[-3000:]
    assert f"{driver}: the download from" in output and pinned in output, output[-3000:]
    assert sha256_file(staged / driver) in output
    assert not (to / driver).exists() and not (to / f"{driver}{mirror_manifest.PARTIAL_SUFFIX}").exists()
    # The files that were good stay, and the manifest still vouches for them.
    assert mirror_manifest.load(to).entries[cpython].sha256 == sha256_file(to / cpython)
