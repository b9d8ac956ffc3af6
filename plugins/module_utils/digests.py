# -*- coding: utf-8 -*-
"""The sha256 of a file or stream, read in blocks: runfiles, archives, wheels and models run to gigabytes.

Standard library only, Python 3.8+ (hashlib.file_digest is 3.11): shipped to hosts inside modules.
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

BLOCK = 1 << 20


def sha256_stream(stream: IO[bytes]) -> Any:
    """The hashlib sha256 object of a binary stream's remaining bytes (hexdigest, or digest for pip's RECORD form)."""
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(BLOCK), b""):
        digest.update(block)
    return digest


def sha256_file(path: str) -> str:
    """The sha256 of a file's bytes, lowercase hex as pins write it."""
    with open(path, "rb") as handle:
        return sha256_stream(handle).hexdigest()
