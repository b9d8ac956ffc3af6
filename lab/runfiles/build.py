#!/usr/bin/env python3
"""Build the lab's stand-ins for NVIDIA's runfiles with Debian's makeself and publish them in the lab mirror.

NVIDIA's installers cannot be downloaded here, so the lab serves self-extracting archives that take the same
flags, write the same logs and records, and install the simulated GPU of lab/simgpu (driver) or a toolkit
tree that answers `nvcc --version` (toolkit). Every one is marked LAB-STANDIN: in its makeself label, in a
LAB-STANDIN file inside, and in its logs; they are published under lab-standin/ in the mirror.

    python lab/runfiles/build.py [--publish] [--json]

Builds are keyed by content under ${GPUFLEET_CACHE:-/var/cache/gpufleet}/lab-runfiles/<sha256 of inputs>/ and
are byte-for-byte reproducible (fixed tar metadata and packaging date), so a rebuild gives the same sha256.
--publish stages them in the lab's upstream with nvidia/sha256.json, which the lab inventory reads as its pins, and
fills the lab mirror from there with mirror sync (gpufleet/lab/upstream.py).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from gpufleet import compat, simgpu  # noqa: E402
from gpufleet.digests import sha256_file  # noqa: E402
from gpufleet.errors import GpufleetError  # noqa: E402

# Runfile names and their directory on the mirror, as the roles resolve them from a stack.
ARTIFACTS = compat.load_plugin_util("stack_artifacts")
MIRROR_SUBDIR = ARTIFACTS.MIRROR_DIRS["runfile"]
SUMS_JSON = "sha256.json"

# Driver versions of the lab and the CUDA driver API version each reports (nvidia-smi "CUDA Version",
# NVML nvmlSystemGetCudaDriverVersion): R570 runs CUDA 12.8, R580 runs CUDA 13.0 (NVIDIA CUDA Toolkit release
# notes, table of toolkit and minimum driver versions: 12.8 GA ships 570.86.10, 13.0 GA ships 580.65.06).
# 580.159.04 is the real H200 machine's driver (tests/fixtures/h200-real: NVML reports CUDA driver 13000), a
# newer R580 than the lab stack's, the newest here: driver upgrades move to it (test_rollout, bench/rollout.py).
DRIVERS = {"570.124.06": 12080, "580.95.05": 13000, "580.159.04": 13000}
# Toolkit versions of the lab and the driver NVIDIA bundles with each (the runfile's name),
# from ../shared/data/compat/cuda_driver.csv.
TOOLKITS = {"12.8.1": "570.124.06", "13.0.2": "580.95.05"}

MARKER_TEXT = (
    "LAB-STANDIN\n"
    "This archive is a gpufleet lab artifact, not NVIDIA software. It stands in for {what} in the lab fleet:\n"
    "same name pattern, same flags, same logs and records, but it builds and loads no kernel module and\n"
    "installs only the simulated GPU of lab/simgpu or a toolkit tree that compiles nothing.\n"
)
# NVIDIA's fabric manager archive for each lab driver (nvidia-fabricmanager must be exactly the driver's version):
# the redist's layout, top directory fabricmanager-linux-x86_64-<version>-archive/ (as the Yocto recipe
# meta-nvidia/recipes-graphics/nvidia/nvidia-fabricmanager_580.105.08.bb of Phala-Network/meta-dstack-cloud
# installs it). Each entry: path in the archive -> (source in fabricmanager/, mode).
FABRIC_MANAGER_FILES = {
    "bin/nvidia-fabricmanager-start.sh": ("nvidia-fabricmanager-start.sh", 0o755),
    "bin/nvswitch-audit": ("nvswitch-audit", 0o755),
    "etc/fabricmanager.cfg": ("fabricmanager.cfg", 0o644),
    "etc/fabricmanager_multinode.cfg": ("fabricmanager_multinode.cfg", 0o644),
    "share/nvidia/nvswitch/dgxh100_hgxh100_topology": ("dgxh100_hgxh100_topology", 0o644),
    "systemd/nvidia-fabricmanager.service": ("nvidia-fabricmanager.service", 0o644),
}


@dataclass(frozen=True)
class Runfile:
    """One built stand-in: its file name, path and sha256."""

    name: str
    path: Path
    sha256: str
    built: bool = False


def cache_root() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


def makeself_header(workdir: Path) -> Path:
    """Debian's makeself header, changed so unknown options go to the installer, as NVIDIA's runfiles do.

    The stock header rejects any option it does not know; NVIDIA's runfiles hand them to nvidia-installer
    or cuda-installer, which is what `sh NVIDIA-Linux-x86_64-X.run --silent --dkms` relies on.
    """
    stock = Path("/usr/share/makeself/makeself-header.sh")
    if not stock.is_file():
        raise GpufleetError("makeself is not installed: apt-get install makeself")
    text = stock.read_text()
    rejecting = '    -*)\n\techo Unrecognized flag : "\\$1" >&2\n\tMS_Help\n\texit 1\n\t;;\n'
    if rejecting not in text:
        raise GpufleetError(f"{stock} changed: cannot find where it rejects unknown flags")
    header = workdir / "makeself-header.sh"
    header.write_text(text.replace(rejecting, "    -*)\n\tbreak ;;\n"))
    return header


def run_makeself(content: Path, output: Path, label: str, startup: str, header: Path) -> None:
    """Packs content into a self-extracting archive, reproducibly."""
    tar_extra = "--mtime=@0 --owner=0 --group=0 --numeric-owner --sort=name"
    command = [
        "makeself",
        "--quiet",
        "--nox11",
        "--gzip",
        "--header",
        str(header),
        "--tar-extra",
        tar_extra,
        "--packaging-date",
        "LAB-STANDIN",
        str(content),
        str(output),
        label,
        startup,
    ]
    # gzip -n keeps the timestamp out of the compressed stream.
    env = dict(os.environ, GZIP="-n")
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise GpufleetError(f"makeself failed for {output.name}: {result.stderr.strip() or result.stdout.strip()}")


def inputs_digest(kind: str, version: str, extra: list[Path]) -> str:
    """The cache key: every source file of the stand-in, the makeself header and the version."""
    digest = hashlib.sha256(f"{kind}\0{version}\0".encode())
    sources = sorted((HERE / kind).iterdir()) + [HERE / "build.py", Path("/usr/share/makeself/makeself-header.sh")]
    for path in sources + extra:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _build(kind: str, version: str, name: str, label: str, extra: list[Path], fill) -> Runfile:
    target = cache_root() / "lab-runfiles" / inputs_digest(kind, version, extra) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    # makeself records its command line, paths included, in the archive: build in a fixed place (under a
    # lock) so that the same inputs give the same bytes.
    built = False
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            built = True
            work = target.parent / "build"
            shutil.rmtree(work, ignore_errors=True)
            content = work / "content"
            (content / "payload").mkdir(parents=True)
            startup = fill(content)
            partial = work / name
            run_makeself(content, partial, label, startup, makeself_header(work))
            os.replace(partial, target)
            shutil.rmtree(work)
    return Runfile(name, target, sha256_file(target), built)


def build_driver(version: str, cuda_driver_version: int) -> Runfile:
    """NVIDIA-Linux-x86_64-<version>.run: installs the simulated NVML library and nvidia-smi."""
    library = simgpu.build_library()
    name = ARTIFACTS.driver_runfile_name(version)

    def fill(content: Path) -> str:
        payload = content / "payload"
        shutil.copy(HERE / "driver" / "nvidia-installer", content / "nvidia-installer")
        (content / "VERSION").write_text(version + "\n")
        (content / "CUDA_DRIVER_VERSION").write_text(f"{cuda_driver_version}\n")
        (content / "LAB-STANDIN").write_text(MARKER_TEXT.format(what=f"NVIDIA's driver installer {name}"))
        shutil.copy(library, payload / "libnvidia-ml.so.1")
        shutil.copy(simgpu.NVIDIA_SMI, payload / "nvidia-smi")
        shutil.copy(simgpu.SIMGPUCTL, payload / "gpufleet-simgpuctl")
        shutil.copy(simgpu.DEFAULT_DESCRIPTION, payload / "h200.json")
        for part in ("nvidia-persistenced", "gpufleet-lab-kmod", "gpufleet-lab-kmod.service", "dkms.conf"):
            shutil.copy(HERE / "driver" / part, payload / part)
        return "./nvidia-installer"

    extra = [library, simgpu.NVIDIA_SMI, simgpu.SIMGPUCTL, simgpu.DEFAULT_DESCRIPTION]
    label = f"LAB-STANDIN NVIDIA driver {version} (gpufleet lab artifact, not NVIDIA software)"
    return _build("driver", f"{version}/{cuda_driver_version}", name, label, extra, fill)


def build_toolkit(version: str, bundled_driver: str) -> Runfile:
    """cuda_<version>_<driver>_linux.run: installs a toolkit tree with version.json and nvcc."""
    name = f"cuda_{version}_{bundled_driver}_linux.run"
    major, minor = version.split(".")[:2]
    release = f"{major}.{minor}"

    def fill(content: Path) -> str:
        payload = content / "payload"
        shutil.copy(HERE / "toolkit" / "cuda-installer", content / "cuda-installer")
        (content / "VERSION").write_text(version + "\n")
        (content / "LAB-STANDIN").write_text(MARKER_TEXT.format(what=f"NVIDIA's CUDA toolkit installer {name}"))
        nvcc = (HERE / "toolkit" / "nvcc.in").read_text().replace("@RELEASE@", release).replace("@VERSION@", version)
        (payload / "nvcc").write_text(nvcc)
        (payload / "nvcc").chmod(0o755)
        shutil.copy(HERE / "toolkit" / "cuda-uninstaller", payload / "cuda-uninstaller")
        shutil.copy(HERE / "toolkit" / "cuda_runtime_api.h", payload / "cuda_runtime_api.h")
        version_json = {
            "cuda": {"name": "CUDA SDK (LAB-STANDIN)", "version": version},
            "cuda_cudart": {"name": "CUDA Runtime (LAB-STANDIN)", "version": version},
        }
        (payload / "version.json").write_text(json.dumps(version_json, indent=3) + "\n")
        cudart = 1000 * int(major) + 10 * int(minor)
        compile_cudart(HERE / "toolkit" / "cudart.c", payload / "libcudart.so", cudart, major)
        return "./cuda-installer"

    label = f"LAB-STANDIN CUDA {version} (gpufleet lab artifact, not NVIDIA software)"
    return _build("toolkit", f"{version}/{bundled_driver}", name, label, [], fill)


def compile_cudart(source: Path, output: Path, runtime_version: int, major: str) -> None:
    compile_library(
        source,
        output,
        ["-fvisibility=hidden", f"-DLAB_CUDART_VERSION={runtime_version}", f"-Wl,-soname,libcudart.so.{major}"],
    )


def compile_library(source: Path, output: Path, flags: list[str]) -> None:
    """A shared library of the lab's stand-ins, built from C without a build id (reproducible)."""
    compiler = shutil.which("gcc")
    if compiler is None:
        raise GpufleetError(f"gcc not found: the lab's {output.name} is built from C. Fix: apt-get install gcc")
    command = [compiler, "-O2", "-fPIC", "-shared", *flags, "-Wl,--build-id=none", "-o", str(output), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpufleetError(f"building the lab {output.name} failed: {result.stderr.strip()}")


def build_fabric_manager(version: str) -> Runfile:
    """fabricmanager-linux-x86_64-<version>-archive.tar.xz: nv-fabricmanager of that version and its files."""
    name = ARTIFACTS.fabric_manager_archive_name(version)
    top = name[: -len(".tar.xz")]
    target = cache_root() / "lab-runfiles" / inputs_digest("fabricmanager", version, []) / name
    built = not target.is_file()
    if built:
        target.parent.mkdir(parents=True, exist_ok=True)
        source = HERE / "fabricmanager"
        members = {
            "bin/nv-fabricmanager": (
                (source / "nv-fabricmanager.in").read_text().replace("@VERSION@", version).encode(),
                0o755,
            ),
            "LICENSE": (MARKER_TEXT.format(what=f"NVIDIA's fabric manager archive {name}").encode(), 0o644),
        }
        members.update(
            {path: ((source / file).read_bytes(), mode) for path, (file, mode) in FABRIC_MANAGER_FILES.items()}
        )
        with tempfile.TemporaryDirectory() as scratch:
            library = Path(scratch) / "libnvfm.so.1"
            compile_library(
                source / "libnvfm.c", library, [f'-DLAB_FM_VERSION="{version}"', "-Wl,-soname,libnvfm.so.1"]
            )
            members["lib/libnvfm.so.1"] = (library.read_bytes(), 0o644)
        partial = target.with_name(name + ".part")
        partial.write_bytes(lzma.compress(reproducible_tar(top, members), format=lzma.FORMAT_XZ))
        os.replace(partial, target)
    return Runfile(name, target, sha256_file(target), built)


def reproducible_tar(top: str, members: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar of members under top/, with fixed metadata and order, so the same inputs give the same bytes."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT) as archive:
        directories = sorted(
            {"/".join(path.split("/")[:depth]) for path in members for depth in range(1, path.count("/") + 1)}
        )
        for path in [""] + directories:
            info = tarfile.TarInfo(f"{top}/{path}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            archive.addfile(info)
        for path, (data, mode) in sorted(members.items()):
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size, info.mode, info.mtime = len(data), mode, 0
            archive.addfile(info, io.BytesIO(data))
    return stream.getvalue()


def build_all() -> list[Runfile]:
    """Every stand-in the lab inventory names."""
    if shutil.which("makeself") is None:
        raise GpufleetError("makeself is not installed: apt-get install makeself")
    runfiles = [build_driver(version, cuda) for version, cuda in DRIVERS.items()]
    runfiles += [build_toolkit(version, driver) for version, driver in TOOLKITS.items()]
    runfiles += [build_fabric_manager(version) for version in DRIVERS]
    return runfiles


def publish(runfiles: list[Runfile], say: Callable[[str], None] = print) -> Path:
    """Stages the stand-ins with sha256.json (the lab inventory's pins) and SHA256SUMS in the lab's upstream under
    nvidia/, then fills the lab mirror from it with mirror sync (gpufleet.lab.upstream)."""
    from gpufleet.lab import mirror, upstream

    for runfile in runfiles:
        upstream.stage(runfile.path, f"{MIRROR_SUBDIR}/{runfile.name}")
    with tempfile.TemporaryDirectory() as scratch:
        sums = Path(scratch) / SUMS_JSON
        sums.write_text(json.dumps({r.name: r.sha256 for r in runfiles}, indent=2, sort_keys=True) + "\n")
        upstream.stage(sums, f"{MIRROR_SUBDIR}/{SUMS_JSON}")
        plain = Path(scratch) / "SHA256SUMS"
        plain.write_text("".join(f"{r.sha256}  {r.name}\n" for r in runfiles))
        upstream.stage(plain, f"{MIRROR_SUBDIR}/SHA256SUMS")
    upstream.fill_mirror(say=say)
    return mirror.mirror_dir() / MIRROR_SUBDIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--publish",
        action="store_true",
        help="stage them in the lab's upstream and fill the lab mirror from it (nvidia/)",
    )
    parser.add_argument("--json", action="store_true", help="print name, path and sha256 of each as JSON")
    args = parser.parse_args(argv)
    try:
        runfiles = build_all()
        # --json keeps stdout one document: the sync's lines go to stderr then.
        say = (lambda line: print(line, file=sys.stderr)) if args.json else print
        where = publish(runfiles, say) if args.publish else None
    except GpufleetError as error:
        print(f"lab/runfiles/build.py: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"name": r.name, "path": str(r.path), "sha256": r.sha256} for r in runfiles], indent=2))
    else:
        for runfile in runfiles:
            print(f"{runfile.sha256}  {runfile.name}{'  (built)' if runfile.built else ''}")
        if where:
            print(f"published in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
