"""Builds real, installable pure-Python wheels for tests, offline (a wheel is a zip with metadata)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(
    directory: Path, name: str, version: str, module_body: str = "VALUE = 1\n", requires: tuple[str, ...] = ()
) -> Path:
    """A py3-none-any wheel of project `name` holding one module named after it, depending on `requires`."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {requirement}\n" for requirement in requires
    )
    files = {
        f"{dist}.py": module_body.encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpufleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = [f"{path},{_record_hash(data)},{len(data)}" for path, data in files.items()]
    record_lines.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
