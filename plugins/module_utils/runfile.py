# -*- coding: utf-8 -*-
"""Logic of NVIDIA .run installs, kept free of Ansible so it can be unit tested.

Shipped to targets with the nvidia_runfile module: standard library only.

Facts this file encodes (sources in the module's DOCUMENTATION):
- nvidia-installer records the installed driver in /var/lib/nvidia/log; line 1 is a backwards-compatible
  version string "1.0-<digits> (<version>)" (nvidia-installer backup.c, BACKUP_LOG).
- /proc/driver/nvidia/version and /sys/module/nvidia/version show the kernel module that is loaded.
- A CUDA toolkit prefix holds version.json with {"cuda": {"version": "X.Y.Z"}}; `nvcc --version` prints
  "Cuda compilation tools, release X.Y, VX.Y.N".
- Driver flags: --silent (implies --ui=none --no-questions), --dkms, --no-opengl-files, --no-drm, --no-x-check;
  the kernel module flavour is --kernel-module-type=open|proprietary from the R560 installer on, and
  -m=kernel-open|kernel (--kernel-module-build-directory, deprecated later) on R515..R555.
- Toolkit flags: --silent --toolkit --toolkitpath=PREFIX, --override, --no-opengl-libs, --no-man-page;
  --driver is never passed: the driver is managed by its own runfile.
"""

from __future__ import annotations

import json
import os
import re

DRIVER_RECORD = "/var/lib/nvidia/log"
DRIVER_PROC_VERSION = "/proc/driver/nvidia/version"
DRIVER_SYS_VERSION = "/sys/module/nvidia/version"
DRIVER_UNINSTALLER = "/usr/bin/nvidia-uninstall"
DRIVER_LOG = "/var/log/nvidia-installer.log"
TOOLKIT_LOG = "/var/log/cuda-installer.log"

# The first branch whose installer takes --kernel-module-type; older open-module branches take -m.
KERNEL_MODULE_TYPE_FLAG_SINCE = 560
OPEN_MODULES_SINCE = 515

_VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}$")
_DRIVER_RUNFILE_RE = re.compile(r"^NVIDIA-Linux-x86_64-(\d+\.\d+(?:\.\d+)?)(?:-[\w-]+)?\.run$")
_TOOLKIT_RUNFILE_RE = re.compile(r"^cuda_(\d+\.\d+\.\d+)_(\d+\.\d+(?:\.\d+)?)_linux(?:_sbsa)?\.run$")


class RunfileError(ValueError):
    """Bad input for a runfile install: the message names the problem and the fix."""


def parse_version(text: str) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5); raise RunfileError on anything else."""
    text = (text or "").strip()
    if not _VERSION_RE.match(text):
        raise RunfileError(f"'{text}' is not a version number like 580.95.05 or 12.8.1")
    return tuple(int(part) for part in text.split("."))


def driver_branch(version: str) -> int:
    """The driver branch (major number): 580 for 580.95.05."""
    return parse_version(version)[0]


def toolkit_release(version: str) -> str:
    """The CUDA release (major.minor) of a toolkit version: '12.8' for 12.8.1."""
    parts = parse_version(version)
    return f"{parts[0]}.{parts[1]}"


def parse_driver_record(text: str) -> str | None:
    """Version from nvidia-installer's record (/var/lib/nvidia/log), e.g. '1.0-5809505 (580.95.05)'."""
    first_line = text.splitlines()[0] if text else ""
    match = re.search(r"\((\d+\.\d+(?:\.\d+)?)\)", first_line)
    if match:
        return match.group(1)
    # Records of very old installers hold only the X.Y-ZZZZ form; they are not upgradable safely anyway.
    return None


def parse_proc_version(text: str) -> str | None:
    """Version of the loaded kernel module from /proc/driver/nvidia/version (NVRM line)."""
    for line in (text or "").splitlines():
        if line.startswith("NVRM version:"):
            match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            if match:
                return match.group(1)
    return None


def parse_toolkit_version_json(text: str) -> str | None:
    """The toolkit version from a prefix's version.json ({"cuda": {"version": "12.8.1"}})."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    version = data.get("cuda", {}).get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) and _VERSION_RE.match(version) else None


def runfile_version_from_name(kind: str, filename: str) -> str | None:
    """The version NVIDIA's file name carries, or None for a name that follows no NVIDIA pattern."""
    name = os.path.basename(filename)
    pattern = _DRIVER_RUNFILE_RE if kind == "driver" else _TOOLKIT_RUNFILE_RE
    match = pattern.match(name)
    return match.group(1) if match else None


def kernel_module_flag(version: str, kernel_module_type: str) -> list[str]:
    """The installer flag that selects open or proprietary kernel modules for this driver branch."""
    if kernel_module_type == "default":
        return []
    branch = driver_branch(version)
    if branch >= KERNEL_MODULE_TYPE_FLAG_SINCE:
        return [f"--kernel-module-type={kernel_module_type}"]
    if kernel_module_type == "open" and branch < OPEN_MODULES_SINCE:
        raise RunfileError(
            f"driver {version} has no open kernel modules (they start with R{OPEN_MODULES_SINCE}); "
            "use kernel_module_type: proprietary or a newer driver"
        )
    return ["-m=kernel-open" if kernel_module_type == "open" else "-m=kernel"]


def driver_flags(
    version: str,
    *,
    dkms: bool = True,
    kernel_module_type: str = "open",
    opengl_files: bool = False,
    drm: bool = True,
    x_check: bool = False,
    extra: list[str] | None = None,
) -> list[str]:
    """Arguments for NVIDIA-Linux-x86_64-<version>.run, unattended."""
    flags = ["--silent"]
    if dkms:
        flags.append("--dkms")
    flags += kernel_module_flag(version, kernel_module_type)
    if not opengl_files:
        flags.append("--no-opengl-files")
    if not drm:
        flags.append("--no-drm")
    if not x_check:
        flags.append("--no-x-check")
    return flags + list(extra or [])


def toolkit_flags(
    prefix: str,
    *,
    override: bool = False,
    opengl_libs: bool = False,
    man_pages: bool = False,
    extra: list[str] | None = None,
) -> list[str]:
    """Arguments for cuda_<version>_<driver>_linux.run installing only the toolkit into prefix."""
    if not os.path.isabs(prefix):
        raise RunfileError(f"toolkit prefix '{prefix}' must be an absolute path such as /usr/local/cuda-12.8")
    flags = ["--silent", "--toolkit", f"--toolkitpath={prefix}"]
    if override:
        flags.append("--override")
    if not opengl_libs:
        flags.append("--no-opengl-libs")
    if not man_pages:
        flags.append("--no-man-page")
    return flags + list(extra or [])


# What the module does, from what is installed and what is requested.
NOTHING = "none"
INSTALL = "install"
UPGRADE = "upgrade"
DOWNGRADE = "downgrade"


def decide(installed: str | None, requested: str, allow_downgrade: bool) -> str:
    """One of NOTHING, INSTALL, UPGRADE, DOWNGRADE; raise RunfileError for a refused downgrade."""
    wanted = parse_version(requested)
    if installed is None:
        return INSTALL
    have = parse_version(installed)
    if have == wanted:
        return NOTHING
    if have < wanted:
        return UPGRADE
    if not allow_downgrade:
        raise RunfileError(
            f"{installed} is installed and {requested} is older: a downgrade is refused; "
            "set allow_downgrade: true to replace it anyway"
        )
    return DOWNGRADE


def settle_unmanaged(kind: str, found: str, requested: str, prefix: str | None = None) -> str:
    """NOTHING when an install made another way already is the requested one; RunfileError otherwise.

    found is a driver's version, or a toolkit's release (X.Y, all nvcc says) for a prefix without version.json.
    """
    wanted = requested if kind == "driver" else toolkit_release(requested)
    if found == wanted:
        return NOTHING
    if kind == "driver":
        where, record, fix = "", "nvidia-installer has no record of it (/var/lib/nvidia/log)", "remove it and reboot"
    else:
        where, record, fix = f" in {prefix}", "there is no version.json", "remove it or choose another prefix"
    raise RunfileError(
        f"{kind} {found} is installed{where} but {record}: it was installed another way (host image, packages, "
        f"container runtime); gpufleet does not install {requested} over it: {fix}"
    )


def tail(path: str, lines: int = 40) -> str:
    """The last lines of a text file, '' when it does not exist."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def read_text(path: str) -> str | None:
    """File content, None when it does not exist or cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def installed_driver(root: str = "/") -> str | None:
    """The driver version nvidia-installer recorded as installed (on disk, maybe not loaded yet)."""
    text = read_text(os.path.join(root, DRIVER_RECORD.lstrip("/")))
    return parse_driver_record(text) if text else None


def loaded_driver_from_kernel(root: str = "/") -> str | None:
    """The version of the nvidia kernel module the running kernel has loaded, from /proc or /sys."""
    text = read_text(os.path.join(root, DRIVER_PROC_VERSION.lstrip("/")))
    version = parse_proc_version(text) if text else None
    if version:
        return version
    text = read_text(os.path.join(root, DRIVER_SYS_VERSION.lstrip("/")))
    return text.strip() if text and _VERSION_RE.match(text.strip()) else None


def installed_toolkit(prefix: str) -> str | None:
    """The toolkit version under prefix (version.json), None when no toolkit is there."""
    text = read_text(os.path.join(prefix, "version.json"))
    return parse_toolkit_version_json(text) if text else None


# Distribution and NVIDIA-repository packages that carry the driver (Debian: nvidia-driver, nvidia-kernel-dkms,
# libnvidia-ml1, nvidia-smi; Ubuntu: nvidia-driver-580, nvidia-dkms-580, nvidia-utils-580, libnvidia-compute-580;
# NVIDIA's CUDA repository: cuda-drivers, nvidia-open). A runfile install over them breaks both.
_DRIVER_PACKAGE_RE = re.compile(
    r"^(nvidia-driver(-[\w.-]+)?|nvidia-open(-[\w.-]+)?|nvidia-dkms-[\w.-]+|nvidia-kernel-(open-)?dkms|"
    r"nvidia-utils-[\w.-]+|libnvidia-compute-[\w.-]+|libnvidia-ml1|nvidia-smi|cuda-drivers(-[\w.-]+)?)$"
)
DPKG_QUERY_ARGS = ["-W", "-f", "${Package} ${db:Status-Status}\n", "*nvidia*", "cuda-drivers*"]


def packaged_driver(dpkg_output: str) -> list[str]:
    """Installed packages that carry an NVIDIA driver, from `dpkg-query -W -f '${Package} ${db:Status-Status}'`."""
    found = []
    for line in (dpkg_output or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "installed" and _DRIVER_PACKAGE_RE.match(parts[0]):
            found.append(parts[0])
    return sorted(found)


def check_runfile_name(kind: str, runfile: str, version: str) -> None:
    """Refuse a runfile whose NVIDIA file name names another version than the one requested."""
    named = runfile_version_from_name(kind, runfile)
    if named is not None and named != version:
        raise RunfileError(
            f"{os.path.basename(runfile)} is {kind} {named} but version {version} was requested; "
            "point the artifact at the matching runfile or fix the version"
        )
