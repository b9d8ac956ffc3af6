"""The one sha256-of-a-file helper (plugins/module_utils/digests.py) and the callers that read it."""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import tarfile
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import digests, drift_stack


@pytest.mark.parametrize("size", [0, 1, digests.BLOCK - 1, digests.BLOCK, 2 * digests.BLOCK + 17])
def test_sha256_file_reads_every_block(tmp_path: Path, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert digests.sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


def test_sha256_stream_of_a_tar_member() -> None:
    payload = b"Fabric Manager version is : 580.95.05\n" * 50000
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        info = tarfile.TarInfo("fabricmanager/bin/nv-fabricmanager")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    buffer.seek(0)
    with tarfile.open(fileobj=buffer, mode="r:xz") as tar:
        stream = tar.extractfile("fabricmanager/bin/nv-fabricmanager")
        assert stream is not None
        assert digests.sha256_stream(stream).hexdigest() == hashlib.sha256(payload).hexdigest()


def test_record_digest_agrees_with_what_pip_wrote() -> None:
    """drift's venv check compares with RECORD: pip's own lines for an installed distribution must match."""
    distribution = importlib.metadata.distribution("pytest")
    hashed = [item for item in distribution.files or [] if item.hash and item.hash.mode == "sha256"]
    assert len(hashed) > 10
    for item in hashed:
        assert drift_stack.record_digest(str(item.locate())) == item.hash.value, item
