#!/usr/bin/python
"""Ansible module nvidia_fabric_manager_install: install NVIDIA's fabric manager redist archive of one driver version."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_fabric_manager_install
short_description: Install nvidia-fabricmanager from NVIDIA's redist archive of the driver's exact version
description:
  - Installs C(fabricmanager-linux-x86_64-VERSION-archive.tar.xz) (NVIDIA's redist archive, not a package) as
    its files are laid out in it - C(bin/) to O(bindir), C(lib/libnvfm.so.1) to O(libdir) with the
    C(libnvfm.so) link, C(etc/) and C(share/nvidia/nvswitch/) (the topologies) to O(datadir),
    C(systemd/nvidia-fabricmanager.service) to O(unitdir), C(LICENSE) to O(docdir).
  - Verifies the archive's sha256 before reading it, extracts it into a staging directory, runs the staged
    C(nv-fabricmanager --version) and refuses unless it is O(version); only then moves each file into place
    (a rename per file). A refused archive leaves the installed fabric manager as it was.
  - Changes only files whose content or mode differ; writes O(record) (version, sha256, files). Does not start
    or restart the service (the role does, after a daemon-reload when RV(unit_changed)).
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  archive:
    description: The archive on the node (fetched and verified by the artifact role). May be missing in check mode.
    type: path
    required: true
  sha256:
    description: The archive's pinned sha256.
    type: str
    required: true
  version:
    description: The driver version; the archive must be the fabric manager of exactly this version.
    type: str
    required: true
  bindir:
    description: Where C(bin/) goes.
    type: path
    default: /usr/bin
  libdir:
    description: Where C(libnvfm.so.1) goes.
    type: path
    default: /usr/lib/x86_64-linux-gnu
  datadir:
    description: Where the config files and the topologies go (the unit's C(-c) path is under it).
    type: path
    default: /usr/share/nvidia/nvswitch
  unitdir:
    description: Where the systemd unit goes.
    type: path
    default: /etc/systemd/system
  docdir:
    description: Where C(LICENSE) goes.
    type: path
    default: /usr/share/doc/nvidia-fabricmanager
  staging:
    description: Parent of the staging directory (made and removed by each install; must allow executing).
    type: path
    default: /var/lib/gpufleet
  record:
    description: The record of the installed fabric manager.
    type: path
    default: /var/lib/gpufleet/nvidia-fabricmanager.json
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Install fabric manager 580.95.05
  gpufleet.fleet.nvidia_fabric_manager_install:
    archive: /var/cache/gpufleet/artifacts/<sha256>/fabricmanager-linux-x86_64-580.95.05-archive.tar.xz
    sha256: "<sha256>"
    version: 580.95.05
"""

RETURN = r"""
installed:
  description: The fabric manager version now installed (the staged one in check mode).
  type: str
  returned: success
files:
  description: The paths written (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
unit_changed:
  description: Whether the systemd unit file changed (a daemon-reload is due).
  type: bool
  returned: always
ignored:
  description: Files of the archive this module does not install (headers, samples); links in it never are.
  type: list
  elements: str
  returned: success
"""

import json
import os
import shutil
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.digests import sha256_file
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import fabric_manager_version

C_LOCALE = {"LANGUAGE": "C", "LC_ALL": "C"}
REQUIRED = (
    "bin/nv-fabricmanager",
    "bin/nvidia-fabricmanager-start.sh",
    "lib/libnvfm.so.1",
    "etc/fabricmanager.cfg",
    "systemd/nvidia-fabricmanager.service",
)
UNIT = "systemd/nvidia-fabricmanager.service"


def destination(member: str, params: dict) -> tuple[str, int] | None:
    """(path on the node, mode) of an archive member below the top directory, or None for one not installed."""
    if member.startswith("bin/") and member.count("/") == 1:
        return os.path.join(params["bindir"], member[4:]), 0o755
    if member == "lib/libnvfm.so.1":
        return os.path.join(params["libdir"], "libnvfm.so.1"), 0o644
    if member.startswith("etc/") and member.count("/") == 1 and member.endswith(".cfg"):
        return os.path.join(params["datadir"], member[4:]), 0o644
    if member.startswith("share/nvidia/nvswitch/") and member.count("/") == 3:
        return os.path.join(params["datadir"], member.rsplit("/", 1)[1]), 0o644
    if member == UNIT:
        return os.path.join(params["unitdir"], "nvidia-fabricmanager.service"), 0o644
    if member == "LICENSE":
        return os.path.join(params["docdir"], "LICENSE"), 0o644
    return None


def read_archive(path: str, version: str) -> dict[str, bytes]:
    """The archive's regular files by path below its top directory (links in it are not installed: the library
    link is made here); refuses another version's archive and paths outside the top directory."""
    top = "fabricmanager-linux-x86_64-%s-archive/" % version
    files = {}
    with tarfile.open(path, "r:xz") as archive:
        for member in archive.getmembers():
            name = member.name.lstrip("./")
            if member.isdir() and (name + "/") == top:
                continue
            if not name.startswith(top) or ".." in name.split("/"):
                raise ValueError(
                    "%s holds %r outside %s: not the fabric manager archive of driver %s"
                    % (path, member.name, top, version)
                )
            if member.isfile():
                stream = archive.extractfile(member)
                if stream is None:
                    raise RuntimeError("a regular file member always has a stream")
                files[name[len(top) :]] = stream.read()
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise ValueError("%s lacks %s" % (path, ", ".join(missing)))
    return files


def differs(path: str, data: bytes, mode: int) -> bool:
    try:
        with open(path, "rb") as handle:
            same = handle.read() == data
        return not same or (os.stat(path).st_mode & 0o7777) != mode
    except OSError:
        return True


def staged_version(module: AnsibleModule, data: bytes, staging: str) -> str | None:
    """The version the archive's own nv-fabricmanager prints, run from a private staging directory."""
    os.makedirs(staging, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="gpufleet-fabricmanager.", dir=staging)
    try:
        binary = os.path.join(scratch, "nv-fabricmanager")
        with open(binary, "wb") as handle:
            handle.write(data)
        os.chmod(binary, 0o700)
        rc, out, err = module.run_command([binary, "--version"], environ_update=C_LOCALE)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return fabric_manager_version(out + err) if rc == 0 else None


def put(path: str, data: bytes, mode: int) -> None:
    """Writes next to the target and renames over it: a reader sees the old file or the new one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise


def link_missing(path: str) -> bool:
    return not (os.path.islink(path) and os.readlink(path) == "libnvfm.so.1")


def put_link(path: str) -> None:
    partial = path + ".gpufleet-new"
    if os.path.lexists(partial):
        os.unlink(partial)
    os.symlink("libnvfm.so.1", partial)
    os.replace(partial, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "archive": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
            "version": {"type": "str", "required": True},
            "bindir": {"type": "path", "default": "/usr/bin"},
            "libdir": {"type": "path", "default": "/usr/lib/x86_64-linux-gnu"},
            "datadir": {"type": "path", "default": "/usr/share/nvidia/nvswitch"},
            "unitdir": {"type": "path", "default": "/etc/systemd/system"},
            "docdir": {"type": "path", "default": "/usr/share/doc/nvidia-fabricmanager"},
            "staging": {"type": "path", "default": "/var/lib/gpufleet"},
            "record": {"type": "path", "default": "/var/lib/gpufleet/nvidia-fabricmanager.json"},
        },
        supports_check_mode=True,
    )
    params, version = module.params, module.params["version"]
    archive, pinned = params["archive"], params["sha256"].strip().lower()
    if not os.path.isfile(archive):
        if module.check_mode:
            module.exit_json(
                changed=True,
                files=[],
                unit_changed=True,
                msg="would install fabric manager %s (its archive is not fetched in check mode)" % version,
            )
        module.fail_json(msg="the fabric manager archive %s is missing" % archive, files=[], unit_changed=False)
    found = sha256_file(archive)
    if found != pinned:
        module.fail_json(
            msg="%s has sha256 %s, expected %s: not used" % (archive, found, pinned), files=[], unit_changed=False
        )
    try:
        members = read_archive(archive, version)
    except (ValueError, tarfile.TarError, EOFError, OSError) as error:
        module.fail_json(msg="cannot use the fabric manager archive: %s" % error, files=[], unit_changed=False)
    staged = staged_version(module, members["bin/nv-fabricmanager"], params["staging"])
    if staged != version:
        module.fail_json(
            msg="the archive's nv-fabricmanager reports version %s, not the driver's %s: the installed "
            "fabric manager is left as it was" % (staged or "(none)", version),
            files=[],
            unit_changed=False,
        )
    targets = {name: destination(name, params) for name in sorted(members)}
    plan = {}
    for name, target in targets.items():
        if target and differs(target[0], members[name], target[1]):
            plan[target[0]] = (members[name], target[1])
    library_link = os.path.join(params["libdir"], "libnvfm.so")
    unit_target = destination(UNIT, params)
    if unit_target is None:
        raise RuntimeError("destination() places the unit, a REQUIRED member")
    unit = unit_target[0]
    record = {
        "version": version,
        "archive": os.path.basename(archive),
        "sha256": pinned,
        "files": sorted(target[0] for target in targets.values() if target) + [library_link],
    }
    record_text = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    if differs(params["record"], record_text, 0o644):
        plan[params["record"]] = (record_text, 0o644)
    changed_files = sorted(plan) + ([library_link] if link_missing(library_link) else [])
    result = {
        "changed": bool(changed_files),
        "installed": version,
        "files": changed_files,
        "unit_changed": unit in plan,
        "ignored": [name for name, target in targets.items() if not target],
    }
    if module.check_mode or not changed_files:
        module.exit_json(**result)
    for path, (data, mode) in plan.items():
        if path != params["record"]:
            put(path, data, mode)
    if link_missing(library_link):
        put_link(library_link)
    if os.path.join(params["libdir"], "libnvfm.so.1") in plan:
        module.run_command(["ldconfig"], check_rc=True)
    # The record last: it names what is installed once all of it is.
    if params["record"] in plan:
        put(params["record"], record_text, 0o644)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
