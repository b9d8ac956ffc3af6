#!/usr/bin/env python3
"""Stage the Python layer's source artifacts in the lab's upstream, each checked against the inventory's pin, and
fill the lab mirror from there with mirror sync (gpufleet/lab/upstream.py).

    python lab/builders/python_stack.py [--check] [--only pyenv|cpython|kernel ...] [--pyenv-checkout DIR]

- pyenv: a release tarball made with `git archive` from a pyenv checkout (default $PYENV_ROOT, else
  ~/.pyenv) at a pinned commit; pyenv is neither on PyPI nor in Debian bookworm.
- CPython: Debian's python3.11_3.11.2.orig.tar.gz from the archive pool, which is byte-identical to
  python.org's Python-3.11.2.tgz (python.org is not reachable from the lab machines).
- kernel: the test kernel package (tests/fixtures/kernel_pkg) as a deterministic sdist, the lab's stand-in
  for flash-attn.

The pins (file name and sha256) are resolved from the lab inventory's stack as the roles resolve them
(inventories/lab/group_vars/all/{stack,lab}.yml): an artifact whose bytes differ from its pin is refused,
never staged. `--check` builds what can be built locally and compares, without downloading or publishing anything.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpufleet import compat  # noqa: E402
from gpufleet.digests import sha256_file  # noqa: E402
from gpufleet.errors import GpufleetError  # noqa: E402

LAB_VARS = REPO / "inventories" / "lab" / "group_vars" / "all"
PYENV_DEFAULTS = REPO / "roles" / "pyenv_python" / "defaults" / "main.yml"
KERNEL_SOURCE = REPO / "tests" / "fixtures" / "kernel_pkg"

# The pyenv release the lab ships: the commit of the checkout this machine kind carries (v2.6.30).
PYENV_COMMIT = "f6a5b409e9fd1ad78aa4350ddc1fc5fc3d0fa666"
DEBIAN_POOL_URL = "http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz"
DOWNLOAD_TIMEOUT_SECONDS = 120


class BuildError(Exception):
    """An artifact could not be made or does not match its pin; the message says which and why."""


@dataclass(frozen=True)
class Pin:
    """Where an artifact goes on the mirror (path below the mirror root) and the sha256 it must have."""

    mirror_path: str
    sha256: str


def mirror_path_of(url: str) -> str:
    """'{{ gpufleet_mirror_url }}/python/Python-3.11.2.tgz' -> 'python/Python-3.11.2.tgz'."""
    marker = "}}/"
    if marker not in url:
        raise BuildError(f"{url!r} does not start with '{{{{ gpufleet_mirror_url }}}}/': not a lab mirror URL")
    return url.split(marker, 1)[1]


def load_pins() -> dict[str, Pin]:
    """Where the lab's stack puts pyenv, its CPython release and the kernel sdist on the mirror, and their pins:
    resolved from the lab inventory as the roles resolve them (stack_artifacts)."""
    stack_vars = yaml.safe_load((LAB_VARS / "stack.yml").read_text())
    lab_vars = yaml.safe_load((LAB_VARS / "lab.yml").read_text())
    pyenv_version = yaml.safe_load(PYENV_DEFAULTS.read_text())["pyenv_python_pyenv_version"]
    stack = compat.stack_spec().normalize_stack(stack_vars["gpufleet_stack"])
    artifacts = compat.load_plugin_util("stack_artifacts")
    files = artifacts.ArtifactResolver("file:///mirror", lab_vars["gpufleet_lab_pins"])
    pyenv = artifacts.pyenv(pyenv_version, files)
    cpython = artifacts.python(stack, compat.load_knowledge_base(), files)
    kernel = lab_vars["flash_attn_packages"][0]
    return {
        "pyenv": Pin(pyenv["url"].removeprefix("file:///mirror/"), pyenv["sha256"]),
        "cpython": Pin(cpython["url"].removeprefix("file:///mirror/"), cpython["sha256"]),
        "kernel": Pin(mirror_path_of(kernel["url"]), kernel["sha256"]),
    }


def make_pyenv_tarball(checkout: Path, prefix: str, destination: Path) -> None:
    """`git archive` of the pinned commit, gzip without name or time stamp so the bytes are reproducible."""
    if not (checkout / ".git").exists():
        raise BuildError(f"{checkout} is not a pyenv git checkout; pass --pyenv-checkout DIR")
    archive = subprocess.run(
        ["git", "-C", str(checkout), "archive", "--format=tar", f"--prefix={prefix}/", PYENV_COMMIT],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise BuildError(
            f"git archive of pyenv commit {PYENV_COMMIT} in {checkout} failed: "
            f"{archive.stderr.decode(errors='replace').strip()}"
        )
    compressed = subprocess.run(["gzip", "-n", "-9"], input=archive.stdout, capture_output=True, check=True)
    destination.write_bytes(compressed.stdout)


def make_kernel_sdist(source: Path, prefix: str, destination: Path) -> None:
    """A tar.gz of the source tree with fixed order, owners, modes and times: same files, same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in source.rglob("*") if p.is_file() and _is_source_file(p, source)):
            info = tarfile.TarInfo(f"{prefix}/{path.relative_to(source).as_posix()}")
            data = path.read_bytes()
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    with destination.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as zipped:
        zipped.write(buffer.getvalue())


def _is_source_file(path: Path, root: Path) -> bool:
    """Leaves out what a local build leaves behind (build/, *.egg-info, __pycache__)."""
    parts = path.relative_to(root).parts
    return not any(p in ("build", "dist", "__pycache__") or p.endswith(".egg-info") for p in parts)


def download(url: str, destination: Path) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "gpufleet-lab-builder"})
    try:
        with (
            urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response,
            destination.open("wb") as handle,
        ):
            while block := response.read(1 << 20):
                handle.write(block)
    except OSError as error:
        raise BuildError(f"downloading {url} failed: {error}") from error


def check_pin(name: str, path: Path, pin: Pin) -> None:
    actual = sha256_file(path)
    if actual != pin.sha256:
        raise BuildError(
            f"{name}: {path.name} has sha256 {actual}, but the lab inventory pins {pin.sha256} "
            f"(inventories/lab/group_vars/all); nothing was published"
        )


def staged_matches(staging: Path, pin: Pin) -> bool:
    target = staging / pin.mirror_path
    return target.is_file() and sha256_file(target) == pin.sha256


def build_one(name: str, pin: Pin, workdir: Path, pyenv_checkout: Path, offline: bool) -> Path | None:
    """Makes (or downloads) one artifact into workdir; None when it cannot be made offline."""
    filename = PurePosixPath(pin.mirror_path).name
    target = workdir / filename
    if name == "pyenv":
        make_pyenv_tarball(pyenv_checkout, filename.removesuffix(".tar.gz"), target)
    elif name == "kernel":
        make_kernel_sdist(KERNEL_SOURCE, filename.removesuffix(".tar.gz"), target)
    elif offline:
        return None
    else:
        download(DEBIAN_POOL_URL, target)
    return target


def run(only: list[str], check: bool, pyenv_checkout: Path) -> int:
    pins = load_pins()
    staging = None
    if not check:
        from gpufleet.lab import upstream  # imported here: --check must work without a lab configuration

        staging = upstream.upstream_dir()
    with tempfile.TemporaryDirectory(prefix="gpufleet-python-builder-") as tmp:
        for name in only:
            pin = pins[name]
            if staging is not None and staged_matches(staging, pin):
                print(f"{name}: {pin.mirror_path} already in the lab's upstream (sha256 {pin.sha256[:12]})")
                continue
            artifact = build_one(name, pin, Path(tmp), pyenv_checkout, offline=check)
            if artifact is None:
                print(f"{name}: skipped in --check (it is downloaded, not built)")
                continue
            check_pin(name, artifact, pin)
            if check:
                print(f"{name}: {artifact.name} matches its pin (sha256 {pin.sha256[:12]})")
                continue
            upstream.stage(artifact, pin.mirror_path)
            print(f"{name}: staged {pin.mirror_path} in the lab's upstream (sha256 {pin.sha256[:12]})")
    if not check:
        upstream.fill_mirror()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["pyenv", "cpython", "kernel"],
        default=["pyenv", "cpython", "kernel"],
        help="which artifacts to make",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="build locally and compare with the pins; publish nothing, download nothing",
    )
    parser.add_argument(
        "--pyenv-checkout",
        type=Path,
        default=Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv"),
        help="pyenv git checkout to archive (default: $PYENV_ROOT or ~/.pyenv)",
    )
    args = parser.parse_args(argv)
    try:
        return run(args.only, args.check, args.pyenv_checkout)
    except (BuildError, GpufleetError) as error:  # GpufleetError: the mirror sync that fills the lab mirror
        print(f"python_stack builder: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
