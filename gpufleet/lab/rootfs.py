"""The lab hosts' root file systems, one per OS release: built once with mmdebstrap, cached as a tar keyed by
its recipe."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

from gpufleet.errors import GpufleetError
from gpufleet.lab.releases import OsRelease

DEBIAN_ARCHIVE = "http://deb.debian.org/debian"

PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "iproute2",
    "sudo",
    "ca-certificates",
    "curl",
    "gnupg",
    "procps",
    "kmod",
    "less",
    "iputils-ping",
    "netbase",
)

# Shell run by mmdebstrap inside the finished tree ("$1" is its root). Host keys and the machine id
# must be unique per host, so the image carries none; `gpufleet lab up` writes them per host.
CUSTOMIZE_HOOKS = (
    'rm -f "$1"/etc/ssh/ssh_host_*',
    ': > "$1"/etc/machine-id',
    'rm -f "$1"/var/lib/dbus/machine-id',
    'mkdir -p -m 700 "$1"/root/.ssh',
)


UNRUN_KERNEL_CONF = "etc/dpkg/dpkg.cfg.d/gpufleet-lab-unrun-kernels"


def unrun_kernel_hook(paths: tuple[str, ...]) -> str:
    """A customize hook writing dpkg's path-exclude for these paths (in the image, so every host has it before
    its first apt run)."""
    lines = ["# gpufleet lab: hosts run the lab machine kernel; Debian kernel images and modules are not unpacked."]
    lines += [f"path-exclude={path}" for path in paths]
    return f'printf "%s\\n" {" ".join(shlex.quote(line) for line in lines)} > "$1"/{UNRUN_KERNEL_CONF}'


def recipe(release: OsRelease) -> dict:
    """Everything that determines the release's image; its hash names the cached tar."""
    hooks = list(CUSTOMIZE_HOOKS)
    if release.unrun_kernel_paths:
        hooks.append(unrun_kernel_hook(release.unrun_kernel_paths))
    return {
        "suite": release.suite,
        "variant": "minbase",
        "architecture": "amd64",
        "mirror": DEBIAN_ARCHIVE,
        "packages": sorted(PACKAGES),
        "customize_hooks": hooks,
    }


def recipe_hash(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def image_hash(release: OsRelease) -> str:
    """The release's image name: hosts record it, so a host of another OS or recipe is rebuilt."""
    return recipe_hash(recipe(release))


def cached_tar(cache_dir: Path, release: OsRelease) -> Path:
    return cache_dir / f"{image_hash(release)}.tar"


def mmdebstrap_command(target: Path, release: OsRelease) -> list[str]:
    data = recipe(release)
    command = [
        "mmdebstrap",
        f"--variant={data['variant']}",
        f"--architectures={data['architecture']}",
        f"--include={','.join(data['packages'])}",
        "--quiet",
    ]
    command += [f"--customize-hook={hook}" for hook in data["customize_hooks"]]
    return command + [data["suite"], str(target), data["mirror"]]


def ensure_rootfs(cache_dir: Path, release: OsRelease) -> tuple[Path, bool]:
    """The release's cached root file system tar, building it first if absent. Returns (path, built_now)."""
    target = cached_tar(cache_dir, release)
    if target.is_file():
        return target, False
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename, so an interrupted build never leaves a truncated cache entry.
    partial = target.with_name(f".{target.stem}.{os.getpid()}.partial.tar")
    print(f"lab: building the {release.label} root file system (once; cached as {target.name})", file=sys.stderr)
    result = subprocess.run(mmdebstrap_command(partial, release), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise GpufleetError(f"mmdebstrap failed to build the lab's {release.label} root file system:\n{tail}")
    os.replace(partial, target)
    return target, True


def extract(tar_path: Path, destination: Path) -> None:
    """Unpacks the image into an empty directory, keeping owners, modes and extended attributes."""
    destination.mkdir(parents=True, exist_ok=False)
    command = [
        "tar",
        "--extract",
        "--numeric-owner",
        "--preserve-permissions",
        "--xattrs",
        "--xattrs-include=*",
        "-C",
        str(destination),
        "-f",
        str(tar_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpufleetError(f"extracting {tar_path} into {destination} failed: {result.stderr.strip()}")


# A reused host tree was written by its guest, as root: any component of a path in it may be a symlink to a
# controller path (/root/.ssh -> /root/.ssh). The controller walks such paths one directory at a time with
# O_NOFOLLOW and replaces files by a rename inside the directory it opened, so nothing outside the tree is
# read or written.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PlantedLinkError(GpufleetError):
    """A path the controller writes in a host's tree is a symlink or not a directory."""


def _open_tree_dir(root: Path, relative: PurePosixPath, create_mode: int | None) -> int:
    """A descriptor of root/relative, every component opened without following a link; missing ones are made
    with create_mode (or refused when it is None)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in relative.parts:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                os.mkdir(part, create_mode, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as error:
        os.close(fd)
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise PlantedLinkError(
            f"{root / relative} is a symbolic link or not a directory (made inside the host?): "
            f"run `gpufleet lab down` and `gpufleet lab up` to rebuild the host from the "
            f"image"
        ) from error
    return fd


def tree_mkdir(root: Path, relative: str, mode: int) -> None:
    """root/relative as a directory (made with `mode` where missing), no link followed on the way."""
    os.close(_open_tree_dir(root, PurePosixPath(relative), mode))


def tree_write(root: Path, relative: str, text: str, mode: int = 0o644) -> None:
    """Replaces root/relative with `text` (a link there is replaced, not followed); parents made 0755."""
    path = PurePosixPath(relative)
    fd = _open_tree_dir(root, path.parent, 0o755)
    partial = f".{path.name}.gpufleet-{os.getpid()}"
    try:
        handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        try:
            os.write(handle, text.encode())
            os.fchmod(handle, mode)
        finally:
            os.close(handle)
        os.rename(partial, path.name, src_dir_fd=fd, dst_dir_fd=fd)
    except IsADirectoryError as error:
        os.unlink(partial, dir_fd=fd)
        raise PlantedLinkError(
            f"{root / relative} is a directory; run `gpufleet lab down` and `gpufleet lab up` "
            f"to rebuild the host from the image"
        ) from error
    finally:
        os.close(fd)


def tree_read(root: Path, relative: str) -> str:
    """root/relative's text; '' when it is missing or a link (which tree_write then replaces)."""
    path = PurePosixPath(relative)
    try:
        fd = _open_tree_dir(root, path.parent, None)
    except FileNotFoundError:
        return ""
    try:
        # O_NONBLOCK: a FIFO planted there must not hang the controller.
        handle = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return ""
    finally:
        os.close(fd)
    with os.fdopen(handle, "rb") as stream:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return ""
        return stream.read(1 << 20).decode(errors="replace")


_PYTHON_NAME = re.compile(r"^python3\.[0-9]+$")


def python_interpreter(root: Path) -> str:
    """The interpreter Ansible runs modules with on a host: the rootfs's own python3 (python3.11 on Debian 12,
    python3.13 on Debian 13), read from the usr/bin/python3 link without following any link of the tree."""
    fd = _open_tree_dir(root, PurePosixPath("usr/bin"), None)
    try:
        target = os.readlink("python3", dir_fd=fd)
    except OSError as error:
        raise GpufleetError(f"{root}/usr/bin/python3 is not a link to python3.N: {error}") from error
    finally:
        os.close(fd)
    if not _PYTHON_NAME.match(target):
        raise GpufleetError(f"{root}/usr/bin/python3 points at {target!r}, not at python3.N in usr/bin")
    return f"/usr/bin/{target}"
