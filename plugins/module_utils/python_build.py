# -*- coding: utf-8 -*-
"""Logic of CPython builds with pyenv's python-build, kept free of Ansible so it can be unit tested.

Shipped to targets with the pyenv_install module: standard library only.

Facts this file relies on (pyenv 2.x, plugins/python-build/bin/python-build):
- `python-build DEFINITION PREFIX` builds into PREFIX; DEFINITION is a name from share/python-build or a file.
- A tarball already in $PYTHON_BUILD_CACHE_PATH under the name python-build expects is used after its
  checksum is verified; $PYTHON_BUILD_SKIP_MIRROR stops it from asking pyenv's own mirror.
- With --enable-shared in $PYTHON_CONFIGURE_OPTS, python-build adds -Wl,-rpath,PREFIX/lib to LDFLAGS, so
  the interpreter finds its libpython without LD_LIBRARY_PATH.
- $MAKE_OPTS is passed to every make; $_PYTHON_BUILD_FORCE_SKIP_XZ makes a definition that offers both
  .tar.xz and .tgz pick the .tgz.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil

# Printed by the probe, run with the built interpreter and an empty environment: if libpython is not
# found through the rpath, the interpreter does not start and the build is not correct.
PROBE = (
    "import json, platform, sys, sysconfig\n"
    "print(json.dumps({'version': platform.python_version(),"
    " 'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED')),"
    " 'config_args': sysconfig.get_config_var('CONFIG_ARGS') or '',"
    " 'libdir': sysconfig.get_config_var('LIBDIR') or '',"
    " 'ldlibrary': sysconfig.get_config_var('LDLIBRARY') or '',"
    " 'executable': sys.executable}))\n"
)

_VERSION_NAME_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


class PythonBuildError(ValueError):
    """Bad input for a build: the message names the problem and the fix."""


def parse_version_name(version: str) -> tuple[int, int, int]:
    """'3.11.2' -> (3, 11, 2). Only released versions are built: the probe must be able to confirm them."""
    match = _VERSION_NAME_RE.match(str(version or "").strip())
    if not match:
        raise PythonBuildError(f"'{version}' is not a CPython release like 3.11.2; name an exact X.Y.Z version")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def interpreter_path(prefix: str, version: str) -> str:
    """The versioned interpreter of a build: PREFIX/bin/python3.11 for 3.11.2."""
    major, minor, dummy = parse_version_name(version)
    return os.path.join(prefix, "bin", f"python{major}.{minor}")


def configure_options(enable_shared: bool, optimizations: bool, lto: bool, extra: list[str]) -> list[str]:
    """The configure flags gpufleet asks for, in a stable order, without duplicates."""
    wanted: list[str] = []
    if enable_shared:
        wanted.append("--enable-shared")
    if optimizations:
        wanted.append("--enable-optimizations")
    if lto:
        wanted.append("--with-lto")
    for option in extra:
        if option not in wanted:
            wanted.append(option)
    return wanted


def make_jobs(requested: int, available_cores: int) -> int:
    """Parallel make jobs: the requested number, else one per core; never more jobs than cores."""
    cores = max(1, available_cores)
    return cores if requested <= 0 else min(requested, cores)


def build_environment(
    base: dict[str, str], pyenv_root: str, cache_path: str, options: list[str], jobs: int, tgz: bool, tmpdir: str
) -> dict[str, str]:
    """The environment python-build runs with."""
    env = dict(base)
    env.update(
        {
            "PYENV_ROOT": pyenv_root,
            "PYTHON_BUILD_CACHE_PATH": cache_path,
            "PYTHON_BUILD_SKIP_MIRROR": "1",
            "PYTHON_CONFIGURE_OPTS": " ".join(shlex.quote(o) for o in options),
            "MAKE_OPTS": f"-j{jobs}",
            "TMPDIR": tmpdir,
            "LC_ALL": "C",
        }
    )
    if tgz:
        env["_PYTHON_BUILD_FORCE_SKIP_XZ"] = "1"
    return env


def parse_probe(stdout: str) -> dict:
    """The probe's JSON line; raises PythonBuildError when the output is not what the probe prints."""
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "version" in data and "shared" in data:
            return data
    raise PythonBuildError(f"the interpreter probe printed no result: {stdout[-300:]!r}")


def mismatches(probe: dict | None, version: str, wanted_options: list[str]) -> list[str]:
    """Why an installed build is not the requested one; empty when it is correct and nothing must be built."""
    if probe is None:
        return ["not installed"]
    reasons = []
    if probe.get("version") != version:
        reasons.append(f"version is {probe.get('version')}, requested {version}")
    shared_wanted = "--enable-shared" in wanted_options
    if bool(probe.get("shared")) != shared_wanted:
        reasons.append(f"shared build is {bool(probe.get('shared'))}, requested {shared_wanted}")
    built_with = set(shlex.split(probe.get("config_args") or ""))
    # configure records its arguments quoted; compare the option words (e.g. --with-lto) as given.
    for option in wanted_options:
        if option != "--enable-shared" and option not in built_with:
            reasons.append(f"built without {option}")
    for option in ("--enable-optimizations", "--with-lto"):
        if option in built_with and option not in wanted_options:
            reasons.append(f"built with {option}, which is no longer requested")
    return reasons


def log_tail(path: str, lines: int) -> str:
    """The last lines of a build log (python-build prints make's errors at the end)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError as error:
        return f"(no build log at {path}: {error.strerror})"
    return "\n".join(text.splitlines()[-lines:])


# --- build beside, switch, keep the previous build -------------------------------------------------------
# A CPython prefix is not relocatable, so a build cannot be made elsewhere and moved in. Each build gets
# its own prefix, ROOT/builds/VERSION-KEY, and ROOT/versions/VERSION (the path every venv's pyvenv.cfg
# names) is a symbolic link that is switched by rename once the new build probes right. A failed build
# never touches the link, and the previous build stays, so running interpreters and venvs keep theirs.

_KEY_RE = re.compile(r"^[0-9a-z]{1,64}$")


def build_key(version: str, definition: str, wanted_options: list[str]) -> str:
    """A key for a build requested without one: what the module knows of its inputs."""
    text = json.dumps({"version": version, "definition": definition, "configure": wanted_options}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_prefix(pyenv_root: str, version: str, key: str) -> str:
    """Where the build of one key lives: ROOT/builds/VERSION-KEY."""
    parse_version_name(version)
    if not _KEY_RE.match(key or ""):
        raise PythonBuildError(f"build key '{key}' must be 1-64 lowercase letters or digits")
    return os.path.join(pyenv_root, "builds", f"{version}-{key}")


def link_target(link: str) -> str | None:
    """The build a version link points at (resolved), None when there is no link."""
    return os.path.realpath(link) if os.path.islink(link) else None


def switch_link(link: str, target: str) -> str | None:
    """Points LINK at TARGET in one rename; returns what it served before (a build prefix), if anything.

    A real directory there (the layout before builds were kept beside) moves into builds/ as
    VERSION-legacy first: two renames, the link follows at once.
    """
    previous = link_target(link)
    if os.path.isdir(link) and not os.path.islink(link):
        previous = os.path.join(os.path.dirname(target), os.path.basename(link) + "-legacy")
        if os.path.lexists(previous):
            shutil.rmtree(previous)
        os.rename(link, previous)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    staged = f"{link}.gpufleet-new"
    if os.path.lexists(staged):
        os.unlink(staged)
    os.symlink(target, staged)
    os.replace(staged, link)
    return previous


def stale_builds(builds_dir: str, version: str, keep: set[str]) -> list[str]:
    """Builds of VERSION under builds_dir other than those kept (the one in service and the one before)."""
    if not os.path.isdir(builds_dir):
        return []
    kept = {os.path.realpath(path) for path in keep if path}
    found = (
        os.path.join(builds_dir, name) for name in sorted(os.listdir(builds_dir)) if name.startswith(f"{version}-")
    )
    return [path for path in found if os.path.realpath(path) not in kept and not os.path.islink(path)]
