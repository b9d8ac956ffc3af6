# -*- coding: utf-8 -*-
"""Drift check kinds of the GPU and Python stack: driver, GPUs, toolkits, CPython builds, venv, kernels, models.

Shipped to targets with the drift_probe module. Each kind reuses the logic of the module that provisions
the layer (runfile.py for nvidia_runfile, python_build.py for pyenv_install, pip_lock.py for pip_lock,
kernel_key.py for kernel_build_key, nvml.py for nvidia_gpu_info), so a drift run and a provisioning run
agree on what "installed as declared" means. Nothing here writes to the host.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import tarfile
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import (
    CheckError,
    Context,
    Finding,
    check_service,
    require,
    short_hash,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.digests import sha256_file, sha256_stream
from ansible_collections.gpufleet.fleet.plugins.module_utils.fabric_manager import (
    NVSWITCH_DEVICES,
    UNIT,
    count_nvswitches,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.kernel_key import (
    TORCH_PROBE,
    KernelKeyError,
    build_key,
    key_components,
    parse_nvcc_version,
    torch_identity,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import fabric_manager_version, nvcc_release
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import (
    NvmlError,
    check_expectations,
    loaded_driver_state,
    read_fabric,
    read_gpu_state,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.pip_lock import (
    BOOTSTRAP_PACKAGES,
    LockError,
    canonical_name,
    diff_against_lock,
    parse_lock,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.python_build import PROBE as PYTHON_PROBE
from ansible_collections.gpufleet.fleet.plugins.module_utils.python_build import (
    PythonBuildError,
    configure_options,
    interpreter_path,
    mismatches,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.python_build import parse_probe as parse_python_probe
from ansible_collections.gpufleet.fleet.plugins.module_utils.runfile import (
    installed_driver,
    installed_toolkit,
    loaded_driver_from_kernel,
)

# What model_store writes beside the weights: never "unexpected files".
MODEL_MARKER = ".gpufleet-model.json"
MODEL_ORIGINALS = ".gpufleet-original"
MODEL_JSON_FILES = ("config.json", "generation_config.json")
KERNEL_MARKERS = "gpufleet-kernels"


# ---- driver and GPUs ------------------------------------------------------------------------------------


def loaded_driver(library: str | None) -> tuple[str, str | None]:
    """(state, version) of the loaded driver, as nvidia_runfile sees it: NVML first, then /proc and /sys."""
    try:
        return loaded_driver_state(loaded_driver_from_kernel(), library)
    except NvmlError as error:
        raise CheckError(f"NVML cannot be read: {error}") from None


LOADED_STATES = {
    "mismatch": "libraries and loaded kernel module differ (NVML: Driver/library version mismatch)",
    "not_loaded": "no NVIDIA kernel module loaded",
    "no_library": "no NVML library (libnvidia-ml.so.1) and no loaded module",
}


def check_driver(spec: dict, ctx: Context) -> list[Finding]:
    """The declared driver installed (nvidia-installer's record) and loaded (NVML, /proc)."""
    require(spec, "version")
    wanted, label = str(spec["version"]), "NVIDIA driver"
    found = []
    on_disk = installed_driver()
    if on_disk != wanted:
        found.append(Finding(label, "installed", wanted, on_disk or "not installed"))
    state, loaded = loaded_driver(spec.get("library"))
    if state != "loaded":
        found.append(Finding(label, "loaded", wanted, LOADED_STATES[state] + (f" ({loaded})" if loaded else "")))
    elif loaded != wanted:
        found.append(Finding(label, "loaded", wanted, loaded))
    return found


def check_fabric_manager(spec: dict, ctx: Context) -> list[Finding]:
    """On an NVSwitch system (found as nvidia_fabric_manager finds it): nvidia-fabricmanager of exactly the driver's
    version, its service enabled and active. Nothing is expected of any other system."""
    require(spec, "version")
    try:
        nvswitch = read_fabric(spec.get("library"))["nvswitch"]
    except NvmlError:
        # A driver NVML cannot reach is the driver check's finding; the driver's NVSwitch list still answers.
        nvswitch = False
    if not (nvswitch or count_nvswitches(spec.get("nvswitch_devices") or NVSWITCH_DEVICES)):
        return []
    wanted = str(spec["version"])
    rc, out, err = ctx.run(["nv-fabricmanager", "--version"])
    installed = fabric_manager_version(out + err) if rc == 0 else None
    found = (
        []
        if installed == wanted
        else [
            Finding(
                "nvidia-fabricmanager", "version", wanted, installed or "not installed", "CUDA fails with error 802"
            )
        ]
    )
    return found + check_service({"name": UNIT, "enabled": True, "active": True}, ctx)


def check_gpus(spec: dict, ctx: Context) -> list[Finding]:
    """GPU health through NVML against `expect` (nvidia_gpu_info's keys); a lost GPU is always a finding."""
    expect = dict(spec.get("expect") or {})
    try:
        state = read_gpu_state(spec.get("library"))
    except NvmlError as error:
        return [Finding("GPUs", "driver", "usable through NVML", str(error).split(". ", maxsplit=1)[0])]
    ctx.cache["gpus"] = state
    return [
        Finding(
            f"GPU {item['gpu']} ({item['uuid']})" if item["gpu"] is not None else "GPUs",
            item["field"],
            item["expected"],
            item["actual"],
            item["message"],
        )
        for item in check_expectations(state, expect)
    ]


# `dkms status` lines: "nvidia/580.95.05, 6.1.0-18-amd64, x86_64: installed" (dkms 3), "nvidia, 580.95.05,
# 6.1.0-18-amd64, x86_64: installed" (dkms 2); a module only registered is "nvidia/580.95.05: added".
DKMS_LINE = re.compile(r"^[^,/\s]+[/,]\s*[^,:]+,\s*(?P<kernel>[^,:]+),\s*[^:]+:\s*(?P<state>\S+)")


def dkms_kernel_states(status: str) -> dict[str, str]:
    """Kernel -> state (installed, built, ...) of the module, from `dkms status -m M -v V`."""
    return {
        match.group("kernel").strip(): match.group("state").rstrip(",")
        for match in map(DKMS_LINE.match, status.splitlines())
        if match
    }


def installed_kernels(boot_dir: str) -> list[str]:
    """Kernels the bootloader can start: /boot/vmlinuz-<release>."""
    try:
        return sorted(name[len("vmlinuz-") :] for name in os.listdir(boot_dir) if name.startswith("vmlinuz-"))
    except FileNotFoundError:
        return []


def check_dkms(spec: dict, ctx: Context) -> list[Finding]:
    """DKMS knows the module at the declared version, and has installed it for every installed kernel.

    A kernel that came without the module (an unattended upgrade without its headers) boots without GPUs:
    each is a finding. `boot_dir` (default /boot) is where the installed kernels are.
    """
    require(spec, "module", "version")
    label = f"DKMS module {spec['module']}"
    rc, out, err = ctx.run(["dkms", "status", "-m", spec["module"], "-v", str(spec["version"])])
    if rc == 127:
        return [Finding(label, "registered", str(spec["version"]), "dkms is not installed")]
    if rc != 0:
        raise CheckError(f"dkms status failed (exit {rc}): {(err or out).strip()[-200:]}")
    if not out.strip():
        return [Finding(label, "registered", str(spec["version"]), "not registered")]
    kernels = installed_kernels(str(spec.get("boot_dir") or "/boot"))
    if not kernels:
        ctx.notes.append(
            f"no kernel image (vmlinuz-*) in {spec.get('boot_dir') or '/boot'}: the module's build "
            "for each installed kernel not compared (a container)"
        )
    states = dkms_kernel_states(out)
    return [
        Finding(
            f"kernel {kernel}",
            f"{spec['module']} module (DKMS)",
            "installed",
            states.get(kernel, "not built"),
            "this kernel would boot without the GPU driver",
        )
        for kernel in kernels
        if states.get(kernel) != "installed"
    ]


# ---- CUDA toolkits and the loader ------------------------------------------------------------------


def toolkit_nvcc_release(prefix: str, ctx: Context) -> str | None:
    nvcc = os.path.join(prefix, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        return None
    rc, out, err = ctx.run([nvcc, "--version"])
    return nvcc_release(out) if rc == 0 else None


def check_toolkits(spec: dict, ctx: Context) -> list[Finding]:
    """Each toolkit {version, prefix}: version.json says the version and its nvcc reports the release."""
    require(spec, "toolkits")
    found = []
    for toolkit in spec["toolkits"]:
        prefix, wanted = toolkit["prefix"], str(toolkit["version"])
        label = f"CUDA toolkit {prefix}"
        installed = installed_toolkit(prefix)
        if installed != wanted:
            found.append(Finding(label, "version", wanted, installed or "not installed"))
            continue
        release = ".".join(wanted.split(".")[:2])
        reported = toolkit_nvcc_release(prefix, ctx)
        if reported != release:
            found.append(Finding(label, "nvcc release", release, reported or "nvcc missing or failing"))
    return found


def check_ld_cache(spec: dict, ctx: Context) -> list[Finding]:
    """The loader cache (ldconfig -p) holds the libraries of `directory` (e.g. /usr/local/cuda/lib64).

    ldconfig caches libraries by their soname links, so the check asks for at least one cached library of
    the directory and for no cached entry of it that no longer exists (a toolkit switched without ldconfig).
    """
    require(spec, "directory")
    directory = str(spec["directory"]).rstrip("/")
    label = f"loader cache for {directory}"
    try:
        libraries = [name for name in os.listdir(directory) if re.search(r"\.so(\.\d+)*$", name)]
    except OSError:
        return [Finding(label, "libraries", "in the cache (ldconfig)", f"{directory} does not exist")]
    rc, out, err = ctx.run(["ldconfig", "-p"])
    if rc != 0:
        raise CheckError(f"ldconfig -p failed (exit {rc}): {(err or out).strip()[-200:]}")
    cached = sorted(
        {
            line.rsplit("=> ", 1)[-1].strip()
            for line in out.splitlines()
            if "=> " in line and line.rsplit("=> ", 1)[-1].strip().startswith(directory + "/")
        }
    )
    if libraries and not cached:
        return [Finding(label, "libraries", "in the cache (ldconfig)", "none of them in the cache")]
    stale = [path for path in cached if not os.path.exists(path)]
    if stale:
        return [
            Finding(
                label,
                "libraries",
                "in the cache (ldconfig)",
                f"stale entries: {', '.join(os.path.basename(path) for path in stale[:5])}",
            )
        ]
    return []


# ---- CPython builds ------------------------------------------------------------------------------------


def python_probe(python: str, ctx: Context) -> dict | None:
    if not os.path.exists(python):
        return None
    # -B: a drift run never writes, not even the bytecode cache of what the probe imports.
    rc, out, err = ctx.run([python, "-I", "-B", "-c", PYTHON_PROBE])
    if rc != 0:
        # A shared build whose libpython cannot be found fails here: pyenv_install counts it as wrong too.
        return {"version": None, "shared": False, "config_args": "", "error": (err or out).strip()[-300:]}
    try:
        return parse_python_probe(out)
    except PythonBuildError as error:
        raise CheckError(str(error)) from None


def check_pythons(spec: dict, ctx: Context) -> list[Finding]:
    """Each pyenv build {version, configure_opts}: the requested version and build options (pyenv_install)."""
    require(spec, "pyenv_root", "versions")
    found = []
    for item in spec["versions"]:
        version = str(item["version"])
        prefix = os.path.join(spec["pyenv_root"], "versions", version)
        wanted = configure_options(
            bool(spec.get("enable_shared", True)),
            bool(spec.get("optimizations", False)),
            bool(spec.get("lto", False)),
            list(spec.get("configure_opts") or []) + list(item.get("configure_opts") or []),
        )
        try:
            python = interpreter_path(prefix, version)
        except PythonBuildError as error:
            raise CheckError(str(error)) from None
        probe = python_probe(python, ctx)
        for reason in mismatches(probe, version, wanted):
            actual = probe.get("error") if probe and probe.get("error") else reason
            found.append(
                Finding(f"CPython {python}", "build", f"{version} ({' '.join(wanted) or 'default options'})", actual)
            )
    return found


# ---- the venv and the kernels in it --------------------------------------------------------------------


def site_packages(venv: str) -> list[str]:
    lib = os.path.join(venv, "lib")
    try:
        return sorted(
            os.path.join(lib, name, "site-packages")
            for name in os.listdir(lib)
            if name.startswith("python") and os.path.isdir(os.path.join(lib, name, "site-packages"))
        )
    except OSError:
        return []


def read_metadata(path: str) -> tuple[str, str] | None:
    """(Name, Version) from a dist-info METADATA file's headers."""
    name = version = None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
    except OSError:
        return None
    return (name, version) if name and version else None


def venv_distributions(venv: str) -> dict[str, tuple[str, str]]:
    """{canonical name: (name, version)} of a venv, from its dist-info directories (no interpreter is run)."""
    found: dict[str, tuple[str, str]] = {}
    for directory in site_packages(venv):
        for entry in sorted(os.listdir(directory)):
            if entry.endswith(".dist-info"):
                meta = read_metadata(os.path.join(directory, entry, "METADATA"))
                if meta:
                    found.setdefault(canonical_name(meta[0]), meta)
    return found


def read_pyvenv_home(venv: str) -> str | None:
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as handle:
            for line in handle:
                key, dummy, value = line.partition("=")
                if key.strip() == "home":
                    return value.strip()
    except OSError:
        return None
    return None


def check_venv(spec: dict, ctx: Context) -> list[Finding]:
    """The venv holds exactly its lock: pinned versions, nothing removed that must go, no unknown extras.

    `allow_extra` names distributions installed outside the lock on purpose (kernels built on the node).
    """
    require(spec, "path", "lock")
    venv, label = spec["path"], f"venv {spec['path']}"
    if not os.path.isdir(venv):
        return [Finding(label, "exists", "present", "absent")]
    try:
        lock = parse_lock(spec["lock"])
        installed = venv_distributions(venv)
        diff = diff_against_lock(lock, installed, list(spec.get("remove") or []))
    except LockError as error:
        raise CheckError(f"the lock cannot be used: {error}") from None
    found = [Finding(label, f"package {item['name']}", item["version"], "absent") for item in diff.added]
    found += [Finding(label, f"package {item['name']}", item["to"], item["from"]) for item in diff.changed]
    found += [
        Finding(label, f"package {item['name']}", "absent (declared for removal)", item["version"])
        for item in diff.removed
    ]
    allowed = {canonical_name(name) for name in spec.get("allow_extra") or []} | BOOTSTRAP_PACKAGES
    found += [
        Finding(label, f"package {item['name']}", "absent (not in the lock)", item["version"])
        for item in diff.extra
        if canonical_name(item["name"]) not in allowed
    ]
    found += venv_record_findings(venv, label, spec)
    found += installed_file_findings(venv, label)
    return found


# A venv's file findings beyond this many are counted, not listed: the report names where to look.
FILE_FINDINGS = 20


def record_entries(venv: str) -> dict[str, list[tuple[str, int, float]]]:
    """Installed file -> [(urlsafe-base64 sha256, size, ctime of the RECORD that lists it)] of every
    distribution of the venv (a file two distributions ship is listed by both), .pyc files left out."""
    entries: dict[str, list[tuple[str, int, float]]] = {}
    for directory in site_packages(venv):
        for entry in sorted(os.listdir(directory)):
            record = os.path.join(directory, entry, "RECORD")
            if not entry.endswith(".dist-info") or not os.path.isfile(record):
                continue
            written = os.stat(record).st_ctime
            with open(record, encoding="utf-8", errors="replace", newline="") as handle:
                rows = list(csv.reader(io.StringIO(handle.read())))
            for row in rows:
                # Compiled bytecode is a cache Python rewrites when it sees fit (a build importing a module
                # with other flags): it is not compared, its source is.
                if len(row) >= 3 and row[1].startswith("sha256=") and row[2].isdigit() and not row[0].endswith(".pyc"):
                    path = os.path.normpath(os.path.join(directory, row[0]))
                    entries.setdefault(path, []).append((row[1][len("sha256=") :], int(row[2]), written))
    return entries


def record_digest(path: str) -> str:
    """The sha256 as pip's RECORD writes it: urlsafe base64 without padding."""
    with open(path, "rb") as handle:
        digest = sha256_stream(handle).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def installed_file_findings(venv: str, label: str) -> list[Finding]:
    """Every file pip installed, against its distribution's RECORD (sha256 and size).

    One pass: each file is stat'ed, and read only when its size differs or it changed (ctime) after the
    RECORD that lists it was written; a write cannot leave ctime behind, so an untouched venv reads no file
    and one edited in place, same versions, is found.
    """
    found: list[Finding] = []
    for path, listed in sorted(record_entries(venv).items()):
        relative = os.path.relpath(path, venv)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            found.append(Finding(label, f"file {relative}", "as installed (RECORD)", "absent"))
            continue
        if any(info.st_size == size and info.st_ctime <= written for dummy, size, written in listed):
            continue
        actual = record_digest(path)
        if not any(actual == digest and info.st_size == size for digest, size, dummy in listed):
            found.append(
                Finding(
                    label,
                    f"file {relative}",
                    "sha256=" + listed[0][0],
                    "sha256=" + actual,
                    "changed after it was installed (same package versions)",
                )
            )
    if len(found) > FILE_FINDINGS:
        more = len(found) - FILE_FINDINGS
        found = found[:FILE_FINDINGS] + [Finding(label, "files", "as installed (RECORD)", f"{more} more files differ")]
    return found


def venv_record_findings(venv: str, label: str, spec: dict) -> list[Finding]:
    """The lock pip_lock installed (VENV/gpufleet.lock) and the interpreter the venv was made from."""
    found = []
    record_path = os.path.join(venv, "gpufleet.lock")
    wanted = str(spec["lock"]).rstrip("\n") + "\n"
    try:
        with open(record_path, encoding="utf-8") as handle:
            record = handle.read()
    except OSError:
        record = None
    if record != wanted:
        actual = "absent" if record is None else short_hash(_digest(record))
        found.append(Finding(label, "installed lock", short_hash(_digest(wanted)), actual))
    if spec.get("python"):
        home = read_pyvenv_home(venv)
        wanted_home = os.path.dirname(str(spec["python"]))
        if home != wanted_home:
            found.append(Finding(label, "interpreter", wanted_home, home or "no pyvenv.cfg"))
    return found


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def torch_probe(venv: str, ctx: Context, marker: dict) -> dict:
    """What a kernel build would link against in this venv (kernel_build_key's probe), once per venv. The probe
    the kernel's marker recorded stands while torch's identity is the recorded one: importing torch costs
    seconds of CPU per node, the identity a few reads."""
    key = ("torch_probe", venv)
    recorded = marker.get("torch_probe")
    if key not in ctx.cache and isinstance(recorded, dict) and marker.get("torch_identity"):
        if marker["torch_identity"] == torch_identity(venv):
            ctx.cache[key] = recorded
    if key not in ctx.cache:
        python = os.path.join(venv, "bin", "python")
        if not os.path.exists(python):
            raise CheckError(f"{venv} has no bin/python: the venv layer is missing")
        rc, out, err = ctx.run([python, "-I", "-B", "-c", TORCH_PROBE])
        if rc != 0:
            raise CheckError(f"the venv's interpreter cannot run: {(err or out).strip()[-300:]}")
        ctx.cache[key] = json.loads(out.strip().splitlines()[-1])
    return ctx.cache[key]


def node_arch_list(ctx: Context, library: str | None) -> str:
    """Compute capabilities of this node's GPUs, for CUDA kernels whose arch list is not declared."""
    state = ctx.cache.get("gpus")
    if state is None:
        try:
            state = read_gpu_state(library)
        except NvmlError as error:
            raise CheckError(f"cannot read the GPUs for the kernels' arch list: {error}") from None
    return ";".join(sorted({gpu["compute_capability"] for gpu in state["gpus"] if gpu.get("compute_capability")}))


def kernel_key(package: dict, spec: dict, ctx: Context, marker: dict) -> str:
    """The build key the flash_attn role would compute for this node's venv now."""
    venv = spec["venv"]
    probe = torch_probe(venv, ctx, marker)
    requires_cuda = bool(package.get("requires_cuda", True))
    nvcc = None
    arch_list = str(spec.get("arch_list") or "")
    if requires_cuda:
        rc, out, dummy = ctx.run([os.path.join(spec.get("cuda_home") or "/usr/local/cuda", "bin", "nvcc"), "--version"])
        nvcc = parse_nvcc_version(out) if rc == 0 else None
        arch_list = arch_list or node_arch_list(ctx, spec.get("library"))
    return build_key(key_components(package, probe, nvcc, arch_list, package.get("env") or {}))


def check_kernels(spec: dict, ctx: Context) -> list[Finding]:
    """Each kernel package installed in the venv at its version, built for the venv's torch/CUDA/arch now."""
    require(spec, "venv", "packages")
    venv = spec["venv"]
    installed = venv_distributions(venv)
    found = []
    for package in spec["packages"]:
        name, label = str(package["name"]), f"kernel {package['name']} in {venv}"
        version = installed.get(canonical_name(name), (name, None))[1]
        if version != str(package["version"]):
            found.append(Finding(label, "version", str(package["version"]), version or "not installed"))
            continue
        marker = _read_json(os.path.join(venv, KERNEL_MARKERS, f"{name}.json"))
        try:
            wanted_key = kernel_key(package, spec, ctx, marker)
        except KernelKeyError as error:
            found.append(Finding(label, "build key", "a key for this venv", str(error)))
            continue
        if marker.get("key") != wanted_key:
            found.append(
                Finding(
                    label,
                    "build key",
                    wanted_key,
                    marker.get("key") or "no marker",
                    "the installed wheel was built for another torch, CUDA, arch list or source: rebuild",
                )
            )
    return found


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---- models --------------------------------------------------------------------------------------------


def merge(base: Any, overrides: Any) -> Any:
    """Recursive merge as Ansible's combine(recursive=True): mappings merge, anything else is replaced."""
    if isinstance(base, dict) and isinstance(overrides, dict):
        merged = dict(base)
        for key, value in overrides.items():
            merged[key] = merge(base.get(key), value)
        return merged
    return overrides


def archive_name(model: dict) -> str:
    """The file name the artifact role gives the tarball in the node cache."""
    if model.get("filename"):
        return str(model["filename"])
    source = str(model.get("url") or model.get("path") or "")
    return os.path.basename(re.sub(r"[?#].*$", "", source))


def check_models(spec: dict, ctx: Context) -> list[Finding]:
    """Each model {name, sha256, ...} of model_store: link, marker, files against the tarball, JSON overrides.
    version_dirs (name -> directory) comes from the role's naming rule (filter model_version_dirs)."""
    require(spec, "root", "models", "version_dirs")
    found = []
    for model in spec["models"]:
        sha = str(model["sha256"]).lower()
        link = os.path.join(spec["root"], str(model["name"]))
        version_dir = spec["version_dirs"][str(model["name"])]
        label = f"model {model['name']}"
        target = os.readlink(link) if os.path.islink(link) else None
        if target != version_dir:
            found.append(
                Finding(label, "link", version_dir, target or ("not a link" if os.path.lexists(link) else "absent"))
            )
        marker = _read_json(os.path.join(version_dir, MODEL_MARKER))
        if marker.get("sha256") != sha:
            found.append(
                Finding(
                    label,
                    "staged version",
                    short_hash(sha),
                    short_hash(marker["sha256"]) if marker.get("sha256") else "not staged",
                )
            )
            continue
        archive = model.get("shared_path") or os.path.join(spec.get("archive_cache") or "", sha, archive_name(model))
        found += model_file_findings(label, version_dir, archive, int(model.get("strip_components") or 0), ctx)
        found += model_json_findings(label, version_dir, model)
    return found


def member_path(name: str, strip: int) -> str | None:
    parts = [part for part in name.split("/") if part not in ("", ".")]
    return "/".join(parts[strip:]) or None


def model_file_findings(label: str, version_dir: str, archive: str, strip: int, ctx: Context) -> list[Finding]:
    """Every weight file byte-identical to its member in the verified tarball; nothing extra, nothing missing."""
    if not os.path.isfile(archive):
        ctx.notes.append(f"{label}: files not compared, the verified tarball {archive} is no longer on the node")
        return []
    found = []
    expected: set[str] = set()
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                relative = member_path(member.name, strip)
                if not member.isfile() or relative is None:
                    continue
                expected.add(relative)
                # The JSON files overrides may change are compared by model_json_findings instead.
                if relative in MODEL_JSON_FILES:
                    continue
                found += compare_member(label, tar, member, version_dir, relative)
    except (tarfile.TarError, OSError) as error:
        raise CheckError(f"{label}: cannot read the tarball {archive}: {error}") from None
    for relative in sorted(staged_files(version_dir) - expected - set(MODEL_JSON_FILES)):
        found.append(Finding(label, f"file {relative}", "absent (not in the tarball)", "present"))
    return found


def compare_member(
    label: str, tar: tarfile.TarFile, member: tarfile.TarInfo, version_dir: str, relative: str
) -> list[Finding]:
    """One tar member against the staged file, by sha256 (the member is streamed, never unpacked)."""
    stream = tar.extractfile(member)
    if stream is None:
        raise RuntimeError("the caller passes regular file members only")
    digest = sha256_stream(stream)
    path = os.path.join(version_dir, relative)
    if not os.path.isfile(path):
        return [Finding(label, f"file {relative}", short_hash(digest.hexdigest()), "absent")]
    actual = sha256_file(path)
    if actual != digest.hexdigest():
        return [Finding(label, f"file {relative}", short_hash(digest.hexdigest()), short_hash(actual))]
    return []


def staged_files(version_dir: str) -> set[str]:
    """Files of a staged version, relative, without model_store's own marker and originals."""
    files = set()
    for directory, subdirectories, names in os.walk(version_dir):
        subdirectories[:] = [name for name in subdirectories if name != MODEL_ORIGINALS]
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), version_dir)
            if relative != MODEL_MARKER:
                files.add(relative)
    return files


def model_json_findings(label: str, version_dir: str, model: dict) -> list[Finding]:
    """config.json / generation_config.json: the shipped original merged with the declared overrides."""
    found = []
    declared = {
        "config.json": model.get("config_overrides") or {},
        "generation_config.json": model.get("generation_config_overrides") or {},
    }
    for name, overrides in declared.items():
        original = _load_json_or_none(os.path.join(version_dir, MODEL_ORIGINALS, name))
        if original is None and not overrides:
            expected = None
        else:
            expected = merge(original or {}, overrides) if overrides else original
        actual = _load_json_or_none(os.path.join(version_dir, name))
        if actual != expected:
            shown_expected, shown_actual = _differing_keys(expected, actual)
            found.append(Finding(label, name, shown_expected, shown_actual))
    return found


def _load_json_or_none(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError as error:
        return f"invalid JSON ({error})"


ABSENT = "<absent>"


def _differing_keys(expected: Any, actual: Any) -> tuple[str, str]:
    """Both sides as JSON, narrowed to the top-level keys that differ when both are objects."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        keys = sorted(
            key for key in set(expected) | set(actual) if expected.get(key, ABSENT) != actual.get(key, ABSENT)
        )
        expected = {key: expected.get(key, ABSENT) for key in keys}
        actual = {key: actual.get(key, ABSENT) for key in keys}
    return _shown(expected), _shown(actual)


def _shown(value: Any) -> str:
    if value is None:
        return "absent"
    text = json.dumps(value, sort_keys=True)
    return "sha256:" + _digest(text)[:16] if len(text) > 200 else text


KINDS = {
    "driver": check_driver,
    "fabric_manager": check_fabric_manager,
    "gpus": check_gpus,
    "dkms": check_dkms,
    "toolkits": check_toolkits,
    "ld_cache": check_ld_cache,
    "pythons": check_pythons,
    "venv": check_venv,
    "kernels": check_kernels,
    "models": check_models,
}
