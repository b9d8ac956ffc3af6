#!/usr/bin/env python3
"""Make a wheelhouse and its gpufleet lock on a machine that cannot reach an index.

The GPU machine has torch of its CUDA variant installed but no index to download its wheel from, and
calls to it carry 64 MiB. This writes, into OUT:
  - the carried wheels of WHEELS, as they are;
  - a wheel of every distribution installed in this interpreter's environment that those wheels need
    (their Requires-Dist followed transitively with the extras asked for, markers evaluated here), repacked
    from the files its RECORD lists with their modes (bin/ files as the wheel's scripts): the same files pip
    installed from the index's wheel, the same version and tags;
  - a lock (`# gpufleet lock: STACK_ID`, one `name==version --hash=sha256:` entry per wheel), written by
    the pip_lock module's own writer, so the inference_venv role installs OUT with --require-hashes.
Requirements found in neither place (optional kernels left out of the carried set) are listed, not fatal.

  usage: python3 scripts/wheelhouse-from-installed.py WHEELS OUT STACK_ID PYTHON_VERSION
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import shutil
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "collections"))
from ansible_collections.gpufleet.fleet.plugins.module_utils import pip_lock  # noqa: E402  (stdlib only)

# Written by pip at install time; a wheel does not carry them.
INSTALL_ONLY = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def requirements(metadata_text: str, extras: frozenset[str] = frozenset()) -> list[Requirement]:
    """The Requires-Dist entries that apply here, for the distribution's base and the extras asked of it."""
    found = []
    for line in Parser().parsestr(metadata_text).get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in {"", *extras}):
            found.append(requirement)
    return found


def wheel_metadata(path: Path) -> tuple[str, str, str]:
    """(name, version, METADATA text) of a wheel file."""
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = archive.read(member).decode()
    message = Parser().parsestr(text)
    return message["Name"], message["Version"], text


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def wheel_tag(dist: importlib.metadata.Distribution) -> str:
    """The compressed tag set (py-abi-platform) of the WHEEL file pip kept in the dist-info."""
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    if not tags:
        raise SystemExit(f"{dist.metadata['Name']}: no Tag in its WHEEL file; it was not installed from a wheel")
    parts = [sorted({tag.split("-")[i] for tag in tags}) for i in range(3)]
    return "-".join(".".join(part) for part in parts)


def source_script(dist: importlib.metadata.Distribution, member: importlib.metadata.PackagePath) -> Path | None:
    """The bin/ file a RECORD entry outside site-packages names, unless an entry point makes it."""
    path = Path(str(dist.locate_file(member))).resolve()
    console = {entry.name for entry in dist.entry_points if entry.group in ("console_scripts", "gui_scripts")}
    if path.parent.name != "bin" or path.name in console or not path.is_file():
        return None
    return path


def repack(dist: importlib.metadata.Distribution, out: Path) -> Path:
    """A wheel of the installed distribution's files (scripts are made again by pip from entry_points.txt)."""
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    target = out / f"{name}-{dist.version}-{wheel_tag(dist)}.whl"
    site = Path(str(dist.locate_file("")))
    records = []
    scripts: list[Path] = []
    dist_info = ""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        for member in sorted(dist.files or [], key=str):
            relative = str(member)
            top = member.parts[0]
            if "__pycache__" in member.parts or relative.endswith(".pyc"):
                continue
            if top == "..":
                # Installed outside site-packages: a script in the environment's bin/ (ninja's own binary is one)
                # goes back under .data/scripts; pip writes entry points' scripts again itself.
                script = source_script(dist, member)
                if script is not None:
                    scripts.append(script)
                continue
            if top.endswith(".dist-info"):
                dist_info = top
                if member.name in INSTALL_ONLY:
                    continue
            source = site / relative
            if not source.is_file():
                continue
            data = source.read_bytes()
            # Mode bits travel in the zip entry (pip keeps the executable bit: triton's ptxas needs it).
            entry = zipfile.ZipInfo.from_file(source, relative)
            archive.writestr(entry, data)
            records.append(record_line(relative, data))
        data_dir = dist_info.removesuffix(".dist-info") + ".data"
        for script in scripts:
            relative = f"{data_dir}/scripts/{script.name}"
            data = script.read_bytes()
            archive.writestr(zipfile.ZipInfo.from_file(script, relative), data)
            records.append(record_line(relative, data))
        records.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return target


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(wheels: Path, out: Path, stack_id: str, python_version: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    installed = {pip_lock.canonical_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    files: dict[str, Path] = {}
    carried_metadata: dict[str, str] = {}
    pending: list[Requirement] = []
    for carried in sorted(wheels.glob("*.whl")):
        name, _, text = wheel_metadata(carried)
        key = pip_lock.canonical_name(name)
        files[key] = Path(shutil.copy2(carried, out / carried.name))
        carried_metadata[key] = text
        pending.append(Requirement(name))
    missing: set[str] = set()
    followed: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement = pending.pop()
        key = pip_lock.canonical_name(requirement.name)
        extras = frozenset(requirement.extras)
        if (key, extras) in followed or key in missing:
            continue
        followed.add((key, extras))
        if key in carried_metadata:
            pending.extend(requirements(carried_metadata[key], extras))
            continue
        dist = installed.get(key)
        if dist is None:
            missing.add(key)
            continue
        if key not in files:
            files[key] = repack(dist, out)
            print(f"repacked {files[key].name} ({files[key].stat().st_size / 1e6:.1f} MB)", flush=True)
        pending.extend(requirements(dist.read_text("METADATA") or "", extras))
    entries = []
    for path in files.values():
        name, version, _ = wheel_metadata(path)
        entries.append(pip_lock.LockEntry(name, version, (sha256(path),), path.name))
    header = {"stack": stack_id, "python": python_version, "source": "carried wheels and this machine's installed ones"}
    (out / f"{stack_id}.lock").write_text(pip_lock.format_lock(header, entries))
    print(
        f"lock: {len(entries)} wheels; required but in neither place (left out): {', '.join(sorted(missing)) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
