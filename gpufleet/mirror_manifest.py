"""The mirror's manifest (DIR/manifest.json): every file `gpufleet mirror sync` placed, where it came from, its size,
sha256, where that sha256 came from and when it was fetched; and `verify`, which hashes the mirror against it.

Only the directories sync fills are the manifest's (runfiles, CPython, pyenv, sdists, and the model tarballs it
packs from Hugging Face revisions): wheels/ belongs to `gpufleet wheelhouse build`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpufleet.digests import sha256_file
from gpufleet.errors import GpufleetError, UsageError

SCHEMA = "gpufleet.mirror-manifest/v1"
MANIFEST_NAME = "manifest.json"
PARTIAL_SUFFIX = ".partial"
# What a sync writes under (stack_artifacts.MIRROR_DIRS of the runfiles, CPython, pyenv and sdists), scanned for
# extra files. Model tarballs go where their url says, so only their manifest entries are verified.
SYNCED_DIRS = ("nvidia", "python", "pyenv", "sdists")
TRUST_ON_FIRST_DOWNLOAD = "trust-on-first-download"


@dataclass(frozen=True)
class Entry:
    """One file of the mirror, as the manifest records it."""

    path: str
    url: str
    size: int
    sha256: str
    checksum_source: str
    fetched_at: str


@dataclass
class Manifest:
    entries: dict[str, Entry] = field(default_factory=dict)

    def record(self, entry: Entry) -> None:
        self.entries[entry.path] = entry

    def document(self) -> dict[str, Any]:
        files = {path: {k: v for k, v in asdict(e).items() if k != "path"} for path, e in sorted(self.entries.items())}
        return {"schema": SCHEMA, "files": files}


def now_utc() -> str:
    """The fetched-at stamp: UTC, ISO 8601, to the second."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).replace(microsecond=0).isoformat()


def load(mirror: Path) -> Manifest:
    """The manifest of a mirror directory; an empty one where none was written yet."""
    path = mirror / MANIFEST_NAME
    if not path.exists():
        return Manifest()
    try:
        document = json.loads(path.read_text())
        files = document["files"]
        if document.get("schema") != SCHEMA:
            raise KeyError("schema")
        return Manifest({name: Entry(path=name, **values) for name, values in files.items()})
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(
            f"{path} is not a gpufleet mirror manifest ({SCHEMA}): {error}; move it away and run "
            "`gpufleet mirror sync` again, which hashes what is there"
        ) from None


def save(mirror: Path, manifest: Manifest) -> None:
    """Writes the manifest atomically: a reader sees the old one or the new one, never half of one."""
    write_atomically(mirror / MANIFEST_NAME, (json.dumps(manifest.document(), indent=2) + "\n").encode())


def write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """The rename itself reaches the disk only once the directory is synced."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@dataclass
class VerifyReport:
    mirror: Path
    ok: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # path, manifest's sha256, the file's
    extra: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.missing and not self.changed

    def render(self) -> str:
        lines = [f"mirror {self.mirror}: {len(self.ok)} file(s) match the manifest"]
        lines += [f"MISSING {path}: in the manifest, not on disk (run `gpufleet mirror sync`)" for path in self.missing]
        lines += [
            f"CHANGED {path}: manifest sha256 {recorded}, on disk {actual} (run `gpufleet mirror sync`, which "
            "fetches it again; find out who changed it first)"
            for path, recorded, actual in self.changed
        ]
        lines += [f"extra {path}: not in the manifest (not placed by mirror sync)" for path in self.extra]
        lines.append("verified: clean" if self.clean else "verified: NOT CLEAN")
        return "\n".join(lines)


def verify(mirror: Path) -> VerifyReport:
    """Re-hashes every file the manifest lists; names what is missing, changed, or there without being listed."""
    if not (mirror / MANIFEST_NAME).is_file():
        raise UsageError(
            f"{mirror} has no {MANIFEST_NAME}: fill it with `gpufleet mirror sync -i INVENTORY --to {mirror}`"
        )
    manifest = load(mirror)
    report = VerifyReport(mirror)
    for path, entry in sorted(manifest.entries.items()):
        target = mirror / path
        if not target.is_file():
            report.missing.append(path)
            continue
        actual = sha256_file(target)
        if actual == entry.sha256:
            report.ok.append(path)
        else:
            report.changed.append((path, entry.sha256, actual))
    for directory in SYNCED_DIRS:
        root = mirror / directory
        if not root.is_dir():
            continue
        for file in sorted(p for p in root.rglob("*") if p.is_file()):
            relative = file.relative_to(mirror).as_posix()
            if relative not in manifest.entries and not relative.endswith(PARTIAL_SUFFIX):
                report.extra.append(relative)
    return report


def require_directory(mirror: Path) -> None:
    if not mirror.is_dir():
        raise GpufleetError(f"mirror directory {mirror} does not exist")
