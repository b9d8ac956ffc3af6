# -*- coding: utf-8 -*-
"""Action plugin controller_artifact: a controller file verified against its pinned sha256 once per run.

The artifact role's controller mode checks the controller's copy of every artifact for every host; for a model of
100 GB and a fleet of 1,000 nodes that was 1,000 hashes, one host at a time. Here the first host's task hashes
the file (downloading it first, with ansible.builtin.get_url, when a URL is given: get_url verifies what it
downloads or finds), and records the file's identity (device, inode, size, mtime and ctime in nanoseconds) and
the run beside the cache; the same run's other hosts find the record and the unchanged file and hash nothing.
A record of another run, or of a file changed since, is not trusted: the file is hashed again. The task must
run on the controller (delegate_to: localhost) with throttle: 1, so that hosts take turns.
Documentation: plugins/modules/controller_artifact.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "sha256": {"type": "str", "required": True},
    "url": {"type": "str"},
    "record_dir": {"type": "path", "required": True},
    "mode": {"type": "raw", "default": "0644"},
}


def run_identity() -> str:
    """The ansible-playbook process that forked this worker, with its start time (a pid can be reused)."""
    parent = os.getppid()
    try:
        with open("/proc/%d/stat" % parent) as handle:
            started = handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "?"
    return "%d:%s" % (parent, started)


def identity(stat: os.stat_result) -> list[int]:
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def record_path(record_dir: str, path: str) -> str:
    return os.path.join(record_dir, hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:32] + ".json")


def recorded(record_dir: str, path: str, sha256: str, run: str) -> os.stat_result | None:
    """The file's stat when this run already verified it unchanged, else None."""
    try:
        with open(record_path(record_dir, path)) as handle:
            record = json.load(handle)
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    wanted = {"path": os.path.abspath(path), "sha256": sha256, "run": run, "identity": identity(stat)}
    return stat if record == wanted else None


def record(record_dir: str, path: str, sha256: str, run: str, stat: os.stat_result) -> None:
    """Written beside the cache, replaced whole: a killed writer leaves the old record or none."""
    os.makedirs(record_dir, mode=0o755, exist_ok=True)
    text = json.dumps({"path": os.path.abspath(path), "sha256": sha256, "run": run, "identity": identity(stat)})
    handle, temporary = tempfile.mkstemp(dir=record_dir, prefix=".record-")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.replace(temporary, record_path(record_dir, path))


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: str, sha256: str, record_dir: str, run: str) -> dict[str, Any]:
    """A controller file checked once per run: exists, checksum (the pinned one when verified), size, hashed."""
    stat = recorded(record_dir, path, sha256, run)
    if stat is not None:
        return {"exists": True, "checksum": sha256, "size": stat.st_size, "hashed": False}
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return {"exists": False, "checksum": None, "size": None, "hashed": False}
    checksum = file_sha256(path)
    if checksum == sha256:
        try:
            record(record_dir, path, sha256, run, stat)
        except OSError:
            pass  # an unwritable record only costs the run's next hosts a hash each
    return {"exists": True, "checksum": checksum, "size": stat.st_size, "hashed": True}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars or {})
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if not getattr(self._connection, "_load_name", "").endswith("local"):
            result.update(failed=True, msg="controller_artifact runs on the controller: delegate the task to localhost")
            return result
        path, sha256, run = args["path"], args["sha256"], run_identity()
        result.update(changed=False, path=path, downloaded=False)
        if args.get("url") and recorded(args["record_dir"], path, sha256, run) is None:
            # get_url hashes a file already there (downloading again when it differs) or verifies what it fetched.
            fetched = self._execute_module(
                module_name="ansible.builtin.get_url",
                module_args={"url": args["url"], "dest": path, "checksum": "sha256:" + sha256, "mode": args["mode"]},
                task_vars=task_vars,
            )
            if fetched.get("failed"):
                result.update(failed=True, msg=fetched.get("msg", "the download failed"))
                return result
            stat = os.stat(path)
            record(args["record_dir"], path, sha256, run, stat)
            result.update(exists=True, checksum=sha256, size=stat.st_size, hashed=True)
            result.update(changed=bool(fetched.get("changed")), downloaded=bool(fetched.get("changed")))
            return result
        result.update(verify(path, sha256, args["record_dir"], run))
        return result
