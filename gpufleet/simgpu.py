"""The simulated GPU of the lab (lab/simgpu): build its libnvidia-ml.so.1, install it onto a lab host.

A test fixture and a lab artifact: production code paths never call this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpufleet import PROJECT_ROOT
from gpufleet.errors import GpufleetError

SIMGPU_DIR = PROJECT_ROOT / "lab" / "simgpu"
SOURCE_DIR = SIMGPU_DIR / "src"
DEFAULT_DESCRIPTION = SIMGPU_DIR / "h200.json"
NVIDIA_SMI = SIMGPU_DIR / "nvidia-smi"
SIMGPUCTL = SIMGPU_DIR / "simgpuctl"
INSTALL_PLAYBOOK = SIMGPU_DIR / "install.yml"
LIBRARY_NAME = "libnvidia-ml.so.1"
DESCRIPTION_ENV = "GPUFLEET_SIMGPU_CONFIG"
HOST_DESCRIPTION_PATH = "/etc/gpufleet-simgpu/gpus.json"

# Part of the cache key: changing a flag rebuilds. Only NVML entry points are exported (visibility).
COMPILE_FLAGS = (
    "-std=c11",
    "-D_GNU_SOURCE",
    "-O2",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    f"-Wl,-soname,{LIBRARY_NAME}",
    "-Wl,--no-undefined",
)
LINK_LIBRARIES = ("-lm", "-pthread")


def cache_root() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


def source_files() -> list[Path]:
    """The C sources and headers of the library, in a stable order."""
    return sorted(path for path in SOURCE_DIR.iterdir() if path.suffix in (".c", ".h"))


def sources_digest() -> str:
    """sha256 over the sources' names and contents and the compile flags: the cache key."""
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update("\0".join(COMPILE_FLAGS + LINK_LIBRARIES).encode())
    return digest.hexdigest()


def library_path() -> Path:
    """Where the library for the current sources lives (or will, once built)."""
    return cache_root() / "simgpu" / sources_digest() / LIBRARY_NAME


def build_library() -> Path:
    """Compiles the library with gcc unless the cache has it already; returns its path."""
    target = library_path()
    if target.is_file():
        return target
    compiler = shutil.which("gcc")
    if compiler is None:
        raise GpufleetError("gcc not found: the simulated GPU library is built from C. Fix: apt-get install gcc")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: parallel test runs never load a half-written library.
    handle, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(handle)
    command = [compiler, *COMPILE_FLAGS, "-o", partial, *map(str, source_files()), *LINK_LIBRARIES]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        os.unlink(partial)
        raise GpufleetError(
            f"building the simulated GPU library failed (gcc exit {result.returncode}):\n{result.stderr.strip()}"
        )
    os.chmod(partial, 0o755)
    os.replace(partial, target)
    return target


class SimulatedMachine:
    """One simulated machine: its description file, switched with the real simgpuctl."""

    def __init__(self, description: Path, library: Path) -> None:
        self.description = description
        self.library = library

    def ctl(self, *arguments: str) -> None:
        """Runs `simgpuctl --description FILE ARGUMENTS...`; raises GpufleetError with its message if it fails."""
        command = [sys.executable, str(SIMGPUCTL), "--description", str(self.description), *arguments]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise GpufleetError(f"simgpuctl {' '.join(arguments)} failed: {result.stderr.strip()}")

    def read(self) -> dict[str, Any]:
        return json.loads(self.description.read_text())

    def write(self, description: dict[str, Any]) -> None:
        self.description.write_text(json.dumps(description, indent=2))


def install_on_hosts(
    inventory: Path, limit: str, description: Path | None = None, extra_vars: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Copies the library, nvidia-smi, simgpuctl and a description onto hosts over Ansible (SSH).

    Runs lab/simgpu/install.yml against `limit` in `inventory`. `extra_vars` may move the files (see the
    simgpu_*_dir variables of the playbook). Raises GpufleetError if the playbook fails.
    """
    variables = {
        "simgpu_library_src": str(build_library()),
        "simgpu_description_src": str(description or DEFAULT_DESCRIPTION),
        **(extra_vars or {}),
    }
    playbook_binary = Path(sys.executable).parent / "ansible-playbook"
    command = [
        str(playbook_binary),
        "-i",
        str(inventory),
        "--limit",
        limit,
        str(INSTALL_PLAYBOOK),
        "-e",
        json.dumps(variables),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT)
    if result.returncode != 0:
        raise GpufleetError(
            f"installing the simulated GPU on {limit} failed (ansible-playbook exit "
            f"{result.returncode}):\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
        )
    return result
