"""File digests as the inventory pins them: sha256, lowercase hex.

Standard library only: the lab builders import it from the repository without installing gpufleet.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (runfiles, wheels and models run to gigabytes)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
