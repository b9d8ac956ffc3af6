#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Build one CPython version with pyenv's python-build, only when the installed one is not the requested build."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pyenv_install
short_description: Compile a CPython version with pyenv, only when it is missing or not the requested build
description:
  - Probes C(PYENV_ROOT/versions/VERSION/bin/pythonX.Y) with an empty environment and reads, through
    C(sysconfig), the version, whether it is a shared build (C(Py_ENABLE_SHARED)) and the configure
    arguments. When they match the request the module does nothing; otherwise it builds.
  - The build runs pyenv's C(python-build) with the definition O(definition) (a name from pyenv's own
    definitions or a definition file), C(PYTHON_BUILD_CACHE_PATH=)O(cache_path) (the verified source
    tarball must already be there, under the name python-build expects) and C(PYTHON_BUILD_SKIP_MIRROR=1),
    so a node never downloads source on its own.
  - "O(enable_shared) adds C(--enable-shared); python-build then links the interpreter with an rpath to
    C(PREFIX/lib), so it finds its libpython without C(LD_LIBRARY_PATH) (the probe runs without it)."
  - The whole build output goes to a log file; a failed build fails the task with the last O(log_lines)
    lines of that log and its path. A build that succeeds but probes wrong fails too.
  - Each build has its own prefix, C(PYENV_ROOT/builds/VERSION-KEY) (O(build_key)), and
    C(PYENV_ROOT/versions/VERSION), the path venvs name, is a link switched by rename only once the new
    build probes right. A failed build leaves the link, and every venv on it, as it was; the build served
    before stays (running interpreters use it), older builds of the version are removed.
  - A correct build already at the key's prefix (unpacked from a shared build) is switched to, not rebuilt.
  - Several versions live side by side, one link and its builds each; building one never touches another.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  pyenv_root:
    description: pyenv's root (C(PYENV_ROOT)); builds go to C(PYENV_ROOT/versions/VERSION).
    type: path
    required: true
  version:
    description: The CPython release to build, exactly C(X.Y.Z), e.g. C(3.11.2).
    type: str
    required: true
  build_key:
    description:
      - Names the build's prefix, C(PYENV_ROOT/builds/VERSION-KEY); nodes that share builds must use the same
        key for the same build (the prefix is compiled in). Lowercase letters and digits.
      - Defaults to a digest of O(version), O(definition) and the configure options.
    type: str
  definition:
    description:
      - python-build definition, a name from C(PYENV_ROOT/plugins/python-build/share/python-build) or a path
        to a definition file. Defaults to pyenv's own definition named O(version).
    type: str
  cache_path:
    description: Directory holding the verified source tarball (C(PYTHON_BUILD_CACHE_PATH)).
    type: path
    required: true
  source_is_tgz:
    description:
      - The source in O(cache_path) is the C(.tgz), not the C(.tar.xz). Makes pyenv's own definitions, which
        prefer C(.tar.xz) when C(xz) is installed, use the C(.tgz) line and its checksum.
    type: bool
    default: false
  enable_shared:
    description: Build libpython as a shared library (C(--enable-shared)), with an rpath to it.
    type: bool
    default: true
  optimizations:
    description: Profile-guided optimization (C(--enable-optimizations)); runs CPython's test suite as training, slow.
    type: bool
    default: false
  lto:
    description: Link-time optimization (C(--with-lto)); slow.
    type: bool
    default: false
  configure_opts:
    description: Further configure options, e.g. C(--disable-test-modules). Each must appear in the probed build.
    type: list
    elements: str
    default: []
  make_jobs:
    description: Parallel make jobs. C(0) means one per core the node gives this process; never more than that.
    type: int
    default: 0
  log_dir:
    description: Where the build log goes (C(python-build-VERSION.log)).
    type: path
    default: /var/log/gpufleet
  build_tmpdir:
    description:
      - Where python-build unpacks and compiles (C(TMPDIR)); needs about 500 MB and must allow executables.
        python-build makes its own directory in it with C(mktemp -d); the role passes a root-only directory
        made for the run.
    type: path
    default: /var/tmp
  log_lines:
    description: How many lines of the build log a failure shows.
    type: int
    default: 40
  timeout:
    description: Seconds the build may take before it is stopped and fails.
    type: int
    default: 7200
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Probes and reports whether a build would run and why; builds nothing.
  diff_mode:
    support: full
    details: Before and after are the probed and the requested build.
notes:
  - The build dependencies (compiler, headers of OpenSSL, zlib, libffi, ...) must be installed first; the
    pyenv_python role does that per OS family.
seealso:
  - name: pyenv's python-build
    description: The build tool and the environment variables this module sets.
    link: https://github.com/pyenv/pyenv/tree/master/plugins/python-build
"""

EXAMPLES = r"""
- name: Build CPython 3.11.2 as a shared library from the verified tarball in the pyenv cache
  gpufleet.fleet.pyenv_install:
    pyenv_root: /opt/pyenv
    version: "3.11.2"
    cache_path: /opt/pyenv/cache
    source_is_tgz: true
    configure_opts: [--disable-test-modules]
  register: python_build

- name: Build with PGO and LTO for production nodes
  gpufleet.fleet.pyenv_install:
    pyenv_root: /opt/pyenv
    version: "3.12.8"
    cache_path: /opt/pyenv/cache
    optimizations: true
    lto: true
"""

RETURN = r"""
python:
  description: The versioned interpreter of the build.
  returned: always
  type: str
  sample: /opt/pyenv/versions/3.11.2/bin/python3.11
prefix:
  description: The version's link, the prefix venvs use.
  returned: always
  type: str
  sample: /opt/pyenv/versions/3.11.2
build_prefix:
  description: The prefix of the requested build, where the link points once it is switched.
  returned: always
  type: str
  sample: /opt/pyenv/builds/3.11.2-3f9c0a1b2c3d4e5f
built:
  description: Whether a build ran (in check mode, whether one would run).
  returned: always
  type: bool
serving:
  description: The build the version's link pointed at when the module started (resolved); null without a link.
  returned: always
  type: str
switched_from:
  description: The build the link pointed at before this run switched it; null when there was none.
  returned: when the link was switched
  type: str
removed:
  description: Older builds of this version that were removed after the switch.
  returned: when the link was switched
  type: list
  elements: str
reasons:
  description: Why a build was needed; empty when the installed build is the requested one.
  returned: always
  type: list
  elements: str
  sample: ["not installed"]
probe:
  description: What the interpreter reports about itself after the run (before it, in check mode).
  returned: when an interpreter was found
  type: dict
  contains:
    version:
      description: C(platform.python_version()).
      type: str
      sample: "3.11.2"
    shared:
      description: C(sysconfig) C(Py_ENABLE_SHARED).
      type: bool
    config_args:
      description: C(sysconfig) C(CONFIG_ARGS), the configure command line of the build.
      type: str
    ldlibrary:
      description: The libpython it links (C(libpython3.11.so) for a shared build).
      type: str
configure_opts:
  description: The configure options requested.
  returned: always
  type: list
  elements: str
make_jobs:
  description: The parallel make jobs used.
  returned: always
  type: int
build_seconds:
  description: How long the build took.
  returned: when a build ran
  type: float
log:
  description: The build log.
  returned: always
  type: str
  sample: /var/log/gpufleet/python-build-3.11.2.log
"""

import os
import shutil
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.python_build import (
    PROBE,
    PythonBuildError,
    build_environment,
    build_key,
    build_prefix,
    configure_options,
    interpreter_path,
    link_target,
    log_tail,
    make_jobs,
    mismatches,
    parse_probe,
    stale_builds,
    switch_link,
)


def probe(module: AnsibleModule, python: str) -> dict | None:
    """What the interpreter says about itself, run with an empty environment; None when it is absent."""
    if not os.path.exists(python):
        return None
    rc, out, err = module.run_command([python, "-I", "-c", PROBE], environ_update={"LC_ALL": "C"}, check_rc=False)
    if rc != 0:
        # A shared build whose libpython cannot be found fails here: that build is not correct.
        return {"version": None, "shared": False, "config_args": "", "error": (err or out).strip()[-500:]}
    return parse_probe(out)


def python_build_command(pyenv_root: str, definition: str, prefix: str) -> list[str]:
    tool = os.path.join(pyenv_root, "plugins", "python-build", "bin", "python-build")
    return [tool, "--verbose", definition, prefix]


def run_build(module: AnsibleModule, command: list[str], env: dict[str, str], log_path: str) -> tuple[int, float]:
    """Runs python-build with all its output in the log file; returns the exit code and the seconds taken."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(command) + "\n").encode())
        log.flush()
        try:
            process = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=module.params["timeout"],
                check=False,
            )
            rc = process.returncode
        except subprocess.TimeoutExpired:
            log.write(f"\ngpufleet: build stopped after {module.params['timeout']} s\n".encode())
            rc = -1
    return rc, round(time.monotonic() - started, 1)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            pyenv_root=dict(type="path", required=True),
            version=dict(type="str", required=True),
            build_key=dict(type="str", no_log=False),
            definition=dict(type="str"),
            cache_path=dict(type="path", required=True),
            source_is_tgz=dict(type="bool", default=False),
            enable_shared=dict(type="bool", default=True),
            optimizations=dict(type="bool", default=False),
            lto=dict(type="bool", default=False),
            configure_opts=dict(type="list", elements="str", default=[]),
            make_jobs=dict(type="int", default=0),
            log_dir=dict(type="path", default="/var/log/gpufleet"),
            build_tmpdir=dict(type="path", default="/var/tmp"),
            log_lines=dict(type="int", default=40),
            timeout=dict(type="int", default=7200),
        ),
        supports_check_mode=True,
    )
    try:
        run(module)
    except PythonBuildError as error:
        module.fail_json(msg=str(error))


def run(module: AnsibleModule) -> None:
    p = module.params
    link = os.path.join(p["pyenv_root"], "versions", p["version"])
    python = interpreter_path(link, p["version"])
    wanted = configure_options(p["enable_shared"], p["optimizations"], p["lto"], p["configure_opts"])
    definition = p["definition"] or p["version"]
    target = build_prefix(p["pyenv_root"], p["version"], p["build_key"] or build_key(p["version"], definition, wanted))
    jobs = make_jobs(p["make_jobs"], len(os.sched_getaffinity(0)))
    log_path = os.path.join(p["log_dir"], f"python-build-{p['version']}.log")
    result = dict(
        changed=False,
        built=False,
        python=python,
        prefix=link,
        build_prefix=target,
        serving=link_target(link),
        configure_opts=wanted,
        make_jobs=jobs,
        log=log_path,
    )

    before = probe(module, python)
    reasons = mismatches(before, p["version"], wanted)
    result["reasons"] = reasons
    if before is not None:
        result["probe"] = before
    if not reasons:
        module.exit_json(**result)

    # The key's prefix may already hold the requested build (unpacked from another node's build).
    live = result["serving"] == os.path.realpath(target)
    staged = None if live else probe(module, interpreter_path(target, p["version"]))
    must_build = bool(mismatches(staged, p["version"], wanted))
    result.update(
        changed=True,
        built=must_build,
        diff=dict(
            before=f"{p['version']}: {'; '.join(reasons)}\n",
            after=f"{p['version']}: configure {' '.join(wanted)} at {target}\n",
        ),
    )
    if module.check_mode:
        module.exit_json(**result)
    if must_build:
        build(module, definition, target, wanted, jobs, log_path, result)
    switch(module, link, target, result)
    module.exit_json(**result)


def build(
    module: AnsibleModule, definition: str, target: str, wanted: list[str], jobs: int, log_path: str, result: dict
) -> None:
    """Compiles into the key's own prefix; the version's link is not touched here, whatever happens."""
    p = module.params
    env = build_environment(
        dict(os.environ), p["pyenv_root"], p["cache_path"], wanted, jobs, p["source_is_tgz"], p["build_tmpdir"]
    )
    # Only the key's own prefix is replaced: a half-built one from an earlier failure, or a wrong build.
    # It is the build in service only when that build is itself the broken one.
    if os.path.lexists(target):
        shutil.rmtree(target)
    rc, seconds = run_build(module, python_build_command(p["pyenv_root"], definition, target), env, log_path)
    result["build_seconds"] = seconds
    served = (
        f"the node still serves {result['prefix']} as before"
        if os.path.exists(result["python"])
        else f"{result['prefix']} was not installed before either"
    )
    if rc != 0:
        module.fail_json(
            msg=f"building CPython {p['version']} failed (python-build exit {rc}); {served}; last "
            f"{p['log_lines']} lines of {log_path}:\n{log_tail(log_path, p['log_lines'])}",
            **result,
        )
    built = probe(module, interpreter_path(target, p["version"]))
    still_wrong = mismatches(built, p["version"], wanted)
    if still_wrong:
        result["probe"] = built
        module.fail_json(
            msg=f"CPython {p['version']} was built at {target} but is not the requested build: "
            f"{'; '.join(still_wrong)}; {served} (build log {log_path})",
            **result,
        )


def switch(module: AnsibleModule, link: str, target: str, result: dict) -> None:
    """Points the version's link at the verified build and removes builds older than the one it replaced."""
    previous = switch_link(link, target)
    removed = stale_builds(os.path.dirname(target), module.params["version"], {target, previous or ""})
    for path in removed:
        shutil.rmtree(path)
    result.update(switched_from=previous, removed=removed, probe=probe(module, result["python"]))


if __name__ == "__main__":
    main()
