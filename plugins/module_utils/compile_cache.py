# -*- coding: utf-8 -*-
"""An instance's compile and JIT caches, built once per key and shipped to every node of the key.

Shipped to targets with the vllm_compile_cache module: standard library only.

vLLM compiles its model (torch.compile: Dynamo, then Inductor, whose Triton kernels are built for the GPU) and
JIT-builds kernels (flashinfer's) at its first start, and keeps the results under the instance's home: vLLM's
cache (VLLM_CACHE_ROOT), Inductor's, Triton's and flashinfer's, each a directory of ~/.cache (the unit points
them there). They are the same on every node that runs the same wheels on the same kind of GPU (or CPU) with the
same model architecture and the same options, which is what the key digests. vLLM keys its own cache again
inside (a hash of its configuration and the model's code): a shipped cache that vLLM finds not to match is not
used, so the key only decides what is worth shipping; a cache whose archive fails its sha256 or carries another
key is never installed.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from typing import Any, Callable, Iterable

from ansible_collections.gpufleet.fleet.plugins.module_utils.digests import sha256_file
from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import Context, Finding, require
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import NvmlError, read_gpu_state

# The directories of the instance's ~/.cache that hold compiled or JIT-built code.
CACHE_DIRECTORIES = ("vllm", "torchinductor", "triton", "flashinfer")
# Inside an archive: the key record first, then each cache directory under cache/.
KEY_MEMBER = "gpufleet-compile-cache.json"
MARKER = ".gpufleet-compile-cache.json"
# Instance options that name the instance or where it listens, not what vLLM compiles.
NODE_LOCAL_OPTIONS = frozenset({"name", "port", "host", "served_model_name", "gpus", "env", "nodes", "api_key"})
# Environment that places or sizes an instance on its node, or carries a secret; any other VLLM_/TORCH variable
# may change what is compiled and is part of the key.
NODE_LOCAL_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "VLLM_API_KEY", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_HOST_IP"}
)
# The CPU's instruction sets Inductor's C++ code generation picks its kernels by (a CPU build's compiled code).
_CPU_FLAGS = ("avx", "avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile")
_DIST_INFO = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+)\.dist-info$")


class CompileCacheError(ValueError):
    """A cache that cannot be keyed, packed or installed: the message names the problem and what happens."""


def distributions(venv: str) -> list[str]:
    """Every distribution installed in the venv as 'name==version', sorted: the wheels the compiled code came from."""
    found = set()
    for site in glob.glob(os.path.join(venv, "lib", "python*", "site-packages")):
        for entry in os.listdir(site):
            match = _DIST_INFO.match(entry)
            if match:
                name = re.sub(r"[-_.]+", "-", match.group("name")).lower()
                found.add(f"{name}=={match.group('version')}")
    if not found:
        raise CompileCacheError(f"no installed distribution found in {venv}; is it the inference venv?")
    return sorted(found)


def python_version(venv: str) -> str:
    """The venv's Python version, from its pyvenv.cfg."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as handle:
            for line in handle:
                key, separator, value = line.partition("=")
                if separator and key.strip() in ("version", "version_info"):
                    return value.strip()
    except OSError as error:
        raise CompileCacheError(f"cannot read {venv}/pyvenv.cfg: {error.strerror}") from error
    raise CompileCacheError(f"{venv}/pyvenv.cfg names no Python version")


def cpu_identity(cpuinfo: str) -> dict[str, Any]:
    """The CPU's architecture and the instruction sets among those code generation depends on."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, separator, value = line.partition(":")
        if separator and key.strip() in ("flags", "Features"):
            flags.update(value.split())
            break
    return {"machine": os.uname().machine, "flags": [flag for flag in _CPU_FLAGS if flag in flags]}


def model_architecture(model: str) -> str:
    """sha256 of the model's config.json: compiled graphs depend on the architecture, not on the weights."""
    path = os.path.join(model, "config.json")
    try:
        return sha256_file(path)
    except OSError as error:
        raise CompileCacheError(f"cannot read {path}: {error.strerror}; is the model staged?") from error


def compile_options(instance: dict[str, Any]) -> dict[str, Any]:
    """The instance's declaration less what only places it on its node: its options, GPU count and compile env."""
    options = {key: value for key, value in instance.items() if key not in NODE_LOCAL_OPTIONS}
    options["gpu_count"] = len(instance.get("gpus") or [])
    env = instance.get("env") or {}
    options["env"] = {
        key: str(value)
        for key, value in sorted(env.items())
        if key not in NODE_LOCAL_ENV and key.startswith(("VLLM_", "TORCH", "TRITON_", "FLASHINFER_"))
    }
    return options


def libc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return ""


def instance_gpus(instance: dict[str, Any]) -> list[dict[str, Any]]:
    """Name and compute capability of the instance's GPUs; none where NVML does not answer (a CPU build)."""
    try:
        gpus = read_gpu_state()["gpus"]
    except (NvmlError, OSError):
        return []
    wanted = instance.get("gpus") or []
    return [gpu for gpu in gpus if gpu.get("index") in wanted]


def compiler_versions(run: Callable[[list[str]], tuple[int, str, str]]) -> dict[str, str]:
    """The first line of each C and C++ compiler's --version ('' for one that is not installed)."""
    versions = {}
    for compiler in ("cc", "c++"):
        rc, out, unused_err = run([compiler, "--version"])
        versions[compiler] = out.splitlines()[0].strip() if rc == 0 and out else ""
    return versions


def read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def node_key_components(
    venv: str, instance: dict[str, Any], home: str, run: Callable[[list[str]], tuple[int, str, str]]
) -> dict[str, Any]:
    """key_components with what this node reads itself: its GPUs (NVML), CPU and compilers."""
    return key_components(venv, instance, instance_gpus(instance), read_cpuinfo(), home, compiler_versions(run))


def key_components(
    venv: str,
    instance: dict[str, Any],
    gpus: list[dict[str, Any]],
    cpuinfo: str,
    home: str,
    compilers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What a cache built on one node depends on; two nodes with equal components can share it.

    HOME: the instance's home. vLLM's compile-cache hash and flashinfer's JIT builds (absolute paths in their ninja
    files) depend on where the caches live: on an H100 a cache installed in a home of another path was compiled
    and built again. Every node gives an instance the same home (its name under systemd's cache directory), so
    the path keys the instance's name in, not the node.
    COMPILERS: the first line of `cc --version` and `c++ --version`. Inductor and Triton build C and C++ code with
    them and key their own caches by them: a cache built with another compiler is compiled again (seen on the lab:
    Debian 12's gcc 12 and Debian 13's gcc 14 share no Inductor entry)."""
    return {
        "home": home,
        "distributions": distributions(venv),
        "python": python_version(venv),
        "gpus": [{"name": gpu.get("name"), "compute_capability": gpu.get("compute_capability")} for gpu in gpus],
        "cpu": cpu_identity(cpuinfo),
        "compilers": dict(sorted((compilers or {}).items())),
        "libc": libc_version(),
        "model_config_sha256": model_architecture(str(instance["model"])),
        "model": str(instance["model"]),
        "options": compile_options(instance),
    }


def cache_key(components: dict[str, Any]) -> str:
    """A short, stable digest of the components (canonical JSON)."""
    canonical = json.dumps(components, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def read_marker(home: str) -> dict[str, Any] | None:
    """The record of the cache installed in an instance's home, or None."""
    try:
        with open(os.path.join(home, MARKER), encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _cache_root(home: str) -> str:
    return os.path.join(home, ".cache")


def present_directories(home: str) -> list[str]:
    """The cache directories an instance's home holds (non-empty), in CACHE_DIRECTORIES order."""
    root = _cache_root(home)
    return [
        name
        for name in CACHE_DIRECTORIES
        if os.path.isdir(os.path.join(root, name)) and os.listdir(os.path.join(root, name))
    ]


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The same cache packs to the same bytes on any node: no owner, no time.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _walk_sorted(top: str) -> Iterable[str]:
    for directory, subdirectories, files in os.walk(top):
        subdirectories.sort()
        yield directory
        for name in sorted(files):
            yield os.path.join(directory, name)


def pack(home: str, key: str, components: dict[str, Any], archive: str) -> dict[str, Any]:
    """Write ARCHIVE (tar) from the cache directories of HOME with the key record first; return its facts."""
    directories = present_directories(home)
    if not directories:
        raise CompileCacheError(
            f"{_cache_root(home)} holds no compile or JIT cache to pack ({', '.join(CACHE_DIRECTORIES)})"
        )
    record = json.dumps({"key": key, "components": components}, sort_keys=True, indent=1).encode()
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    partial = archive + ".partial"
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        info = _normalized(tarfile.TarInfo(KEY_MEMBER))
        info.size = len(record)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(record))
        root = _cache_root(home)
        for name in directories:
            for path in _walk_sorted(os.path.join(root, name)):
                if os.path.islink(path) or not (os.path.isfile(path) or os.path.isdir(path)):
                    continue  # a lock file's link or a socket: nothing a start needs
                tar.add(path, arcname="cache/" + os.path.relpath(path, root), recursive=False, filter=_normalized)
    os.replace(partial, archive)
    packed = {
        "archive": archive,
        "sha256": sha256_file(archive),
        "size": os.path.getsize(archive),
        "directories": directories,
    }
    # The home holds this key's caches now, as a node that installed the archive does: nothing to install there.
    owner = os.stat(home)
    write_marker(home, {"key": key, "sha256": packed["sha256"], "directories": directories}, owner.st_uid, owner.st_gid)
    return packed


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or not (name == KEY_MEMBER or (parts[0] == "cache" and len(parts) > 1)):
        raise CompileCacheError(f"archive member {name!r} is outside the cache layout")
    if parts[0] == "cache" and parts[1] not in CACHE_DIRECTORIES:
        raise CompileCacheError(f"archive member {name!r} is not in a known cache directory")
    if not (member.isfile() or member.isdir()):
        raise CompileCacheError(f"archive member {name!r} is not a plain file or directory")


def archive_key(archive: str) -> dict[str, Any]:
    """The key record of an archive (its first member), checked to be one."""
    try:
        with tarfile.open(archive, "r:") as tar:
            first = tar.next()
            if first is None or first.name != KEY_MEMBER:
                raise CompileCacheError(f"{archive} does not start with {KEY_MEMBER}: not a gpufleet compile cache")
            handle = tar.extractfile(first)
            record = json.loads(handle.read().decode() if handle else "")
    except (tarfile.TarError, OSError, ValueError) as error:
        raise CompileCacheError(f"{archive} cannot be read as a compile cache: {error}") from error
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        raise CompileCacheError(f"{archive}: {KEY_MEMBER} names no key")
    return record


def verify(archive: str, sha256: str, key: str) -> dict[str, Any]:
    """Refuse an archive whose sha256 is not the recorded one or whose key record is another key's."""
    try:
        actual = sha256_file(archive)
    except OSError as error:
        raise CompileCacheError(f"cannot read {archive}: {error.strerror}") from error
    if actual != sha256:
        raise CompileCacheError(
            f"{archive} has sha256 {actual}, not the {sha256} recorded when it was built (corrupt or truncated)"
        )
    record = archive_key(archive)
    if record["key"] != key:
        raise CompileCacheError(f"{archive} was built for key {record['key']}, not this instance's {key}")
    return record


def install(archive: str, sha256: str, key: str, home: str) -> list[str]:
    """Verify ARCHIVE and put its cache directories in place of HOME's, owned like HOME; return them.

    The archive is unpacked beside the caches first; only a whole, verified unpack replaces them."""
    verify(archive, sha256, key)
    if not os.path.isdir(home):
        # Before the instance's first start: systemd gives the home to the instance's user when it starts.
        os.makedirs(os.path.dirname(home), mode=0o755, exist_ok=True)
        os.mkdir(home, 0o700)
    owner = os.stat(home)
    root = _cache_root(home)
    os.makedirs(root, mode=0o700, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".gpufleet-unpack-", dir=home)
    try:
        with tarfile.open(archive, "r:") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member)
            for member in members[1:]:
                tar.extract(member, staging, set_attrs=False)
        unpacked = [name for name in CACHE_DIRECTORIES if os.path.isdir(os.path.join(staging, "cache", name))]
        installed_at = time.time_ns()
        for name in unpacked:
            _touch_tree(os.path.join(staging, "cache", name), installed_at)
            _chown_tree(os.path.join(staging, "cache", name), owner.st_uid, owner.st_gid)
            target = os.path.join(root, name)
            if os.path.lexists(target):
                shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.unlink(target)
            os.rename(os.path.join(staging, "cache", name), target)
    except (tarfile.TarError, OSError) as error:
        raise CompileCacheError(f"unpacking {archive} into {root} failed: {error}") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_marker(home, {"key": key, "sha256": sha256, "directories": unpacked}, owner.st_uid, owner.st_gid)
    return unpacked


def _touch_tree(top: str, mtime_ns: int) -> None:
    """Give every file of TOP one time, newer than this node's venv, and rebase ninja's logs to it.

    flashinfer runs ninja before it loads a JIT-built kernel; ninja builds again when an output is older than an
    input (the venv's sources, installed on this node after the cache was built elsewhere) or than the time its
    logs recorded for that output. One time for outputs, generated sources and logs alike is up to date."""
    for directory, unused_dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(directory, name)
            if name == ".ninja_log":
                _rebase_ninja_log(path, mtime_ns)
            elif name == ".ninja_deps":
                _rebase_ninja_deps(path, mtime_ns)
            os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)


def _recorded_time(recorded: int, mtime_ns: int) -> int:
    # ninja 1.10 and later record nanoseconds, earlier ones seconds.
    return mtime_ns if recorded > 10**12 else mtime_ns // 10**9


def _rebase_ninja_log(path: str, mtime_ns: int) -> None:
    """Set the output time of every entry of a .ninja_log (tab-separated: start, end, mtime, output, hash)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        lines = handle.read().splitlines()
    rebased = []
    for line in lines:
        fields = line.split("\t")
        if len(fields) == 5 and fields[2].isdigit():
            fields[2] = str(_recorded_time(int(fields[2]), mtime_ns))
        rebased.append("\t".join(fields))
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as handle:
        handle.write("".join(line + "\n" for line in rebased))


_DEPS_HEADER = b"# ninjadeps\n"


def _rebase_ninja_deps(path: str, mtime_ns: int) -> None:
    """Set the output time of every record of a .ninja_deps (format 4: a 64-bit time after each output's id).

    A log of another format is left as it is: ninja then builds again, which is slow but right."""
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    start = len(_DEPS_HEADER) + 4
    if not data.startswith(_DEPS_HEADER) or int.from_bytes(data[len(_DEPS_HEADER) : start], "little") != 4:
        return
    offset = start
    while offset + 4 <= len(data):
        header = int.from_bytes(data[offset : offset + 4], "little")
        size = header & 0x7FFFFFFF
        if header & 0x80000000 and size >= 12:
            recorded = int.from_bytes(data[offset + 8 : offset + 16], "little")
            data[offset + 8 : offset + 16] = _recorded_time(recorded, mtime_ns).to_bytes(8, "little")
        offset += 4 + size
    with open(path, "wb") as handle:
        handle.write(data)


def _chown_tree(top: str, uid: int, gid: int) -> None:
    for path in _walk_sorted(top):
        os.lchown(path, uid, gid)


def write_marker(home: str, marker: dict[str, Any], uid: int, gid: int) -> None:
    path = os.path.join(home, MARKER)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(marker, handle, sort_keys=True)
    os.lchown(path + ".tmp", uid, gid)
    os.replace(path + ".tmp", path)


def in_use(home: str, key: str, published: Iterable[str]) -> str:
    """Which compile caches an instance's home holds, against KEY (computed on this node now) and the keys whose
    caches the controller holds (PUBLISHED), in one sentence for drift's report."""
    marker = read_marker(home) or {}
    installed = str(marker.get("key", ""))
    present = present_directories(home) if os.path.isdir(home) else []
    holds = "the controller holds them" if key in set(published) else "the controller does not hold them yet"
    if not installed:
        own = f"its own caches ({', '.join(present)})" if present else "no cache yet"
        return f"no shipped compile cache, {own}; key {key}: {holds}"
    sha256 = str(marker.get("sha256", ""))[:16]
    if installed == key:
        return f"compile caches of key {key} (archive sha256 {sha256}...)"
    return (
        f"compile caches of key {installed} (archive sha256 {sha256}...), but this node's key is now {key} (its "
        f"wheels, options or model changed): vLLM compiles again at its next start unless the caches of {key} are "
        f"installed first (the role installs them before it restarts the instance; {holds})"
    )


def check_compile_cache(spec: dict, ctx: Context) -> list[Finding]:
    """Drift kind `compile_cache`: which compile caches each instance (`instances`: name -> {instance, home}) uses.

    A note, never drift: the role installs a key's caches only before it restarts an instance, and a restart comes
    from a change that other checks report (the venv, the drop-in); provision changes nothing else here."""
    require(spec, "venv", "instances")
    for name, entry in sorted(spec["instances"].items()):
        try:
            components = node_key_components(spec["venv"], entry["instance"], entry["home"], ctx.run)
        except CompileCacheError as error:
            ctx.notes.append(f"vllm@{name}: compile caches not keyed: {error}")
            continue
        ctx.notes.append(f"vllm@{name}: " + in_use(entry["home"], cache_key(components), spec.get("published") or []))
    return []


KINDS = {"compile_cache": check_compile_cache}
