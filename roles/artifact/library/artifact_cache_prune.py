#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Module artifact_cache_prune: drop what a node's artifact cache holds beyond what it needs and a retention."""

from __future__ import annotations

DOCUMENTATION = r"""
module: artifact_cache_prune
short_description: Remove cached artifacts a node no longer needs, keeping the newest few for a rollback
description:
  - The node's artifact cache holds one directory per artifact, named by its sha256 (C(<path>/<sha256>/<file>),
    as the artifact role writes it). Each driver or CUDA upgrade adds a runfile of hundreds of MB to GBs.
  - Keeps every entry named in O(keep) (what the node's declaration uses now), every sha256 recorded in a
    JSON file of O(records_dir) (a record of what a failed upgrade reinstalls, such as the driver's), and the
    O(retention) newest of the others of each kind (by the time they were cached); removes the rest.
  - An entry's kind is its file's name with the version numbers taken out (C(NVIDIA-Linux-x86_64-580.95.05.run)
    and C(NVIDIA-Linux-x86_64-570.124.06.run) are one kind), so the previous driver runfile a rollback needs is
    never crowded out by newer artifacts of other kinds after a multi-layer upgrade.
  - Only directories named by a sha256 (64 lowercase hex digits) are ever considered; anything else in
    O(path), links included, is left alone.
  - Check mode reports what would be removed; diff mode shows the entries before and after.
version_added: "0.1.0"
author: gpufleet
options:
  path:
    description: The node's artifact cache.
    type: path
    required: true
  keep:
    description: The sha256 of every artifact the node's declaration uses now.
    type: list
    elements: str
    default: []
  records_dir:
    description: A directory of JSON records (top-level C(sha256) keys) whose artifacts stay; none when unset.
    type: path
  retention:
    description: How many of the other entries of each kind stay, newest first (0 removes every one not kept above).
    type: int
    default: 2
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Prune the node's artifact cache, keeping the two newest unused runfiles
  artifact_cache_prune:
    path: /var/cache/gpufleet/artifacts
    keep: ["{{ driver_sha256 }}", "{{ toolkit_sha256 }}"]
    records_dir: /var/lib/gpufleet
    retention: 2
"""

RETURN = r"""
removed:
  description: The entries removed (would be, in check mode), oldest first.
  returned: always
  type: list
  elements: dict
  sample: [{sha256: 3f1c..., files: [NVIDIA-Linux-x86_64-570.124.06.run], bytes: 371224576}]
kept:
  description: The sha256 of every entry that stays, with why (C(declared), C(recorded) or C(retention)).
  returned: always
  type: dict
freed_bytes:
  description: Bytes the removed entries held.
  returned: always
  type: int
"""

import json
import os
import re
import shutil
from typing import Any

from ansible.module_utils.basic import AnsibleModule

SHA256 = re.compile(r"[0-9a-f]{64}")


def entries(path: str) -> list[dict[str, Any]]:
    """The cache's sha256 directories (links and other names left out), newest first."""
    found = []
    if not os.path.isdir(path):
        return found
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        if not SHA256.fullmatch(name) or os.path.islink(entry) or not os.path.isdir(entry):
            continue
        files = sorted(os.listdir(entry))
        size = sum(os.lstat(os.path.join(entry, file)).st_size for file in files)
        found.append({"sha256": name, "files": files, "bytes": size, "mtime": os.lstat(entry).st_mtime})
    return sorted(found, key=lambda item: (-item["mtime"], item["sha256"]))


def recorded(records_dir: str | None) -> set[str]:
    """Every top-level sha256 in the JSON records of records_dir (unreadable or foreign files are skipped)."""
    found: set[str] = set()
    if not records_dir or not os.path.isdir(records_dir):
        return found
    for name in sorted(os.listdir(records_dir)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(records_dir, name), encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        value = record.get("sha256") if isinstance(record, dict) else None
        if isinstance(value, str) and SHA256.fullmatch(value.lower()):
            found.add(value.lower())
    return found


VERSION_NUMBERS = re.compile(r"[0-9]+")


def kind(entry: dict[str, Any]) -> str:
    """The entry's file name with its version numbers taken out: every release of one artifact is one kind."""
    return VERSION_NUMBERS.sub("#", "/".join(entry.get("files", [])))


def plan(
    cached: list[dict[str, Any]], declared: set[str], records: set[str], retention: int
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(sha256 -> why it stays, the entries to remove oldest first); `cached` is newest first."""
    kept: dict[str, str] = {}
    removed = []
    retained: dict[str, int] = {}
    for entry in cached:
        if entry["sha256"] in declared:
            kept[entry["sha256"]] = "declared"
        elif entry["sha256"] in records:
            kept[entry["sha256"]] = "recorded"
        elif retained.get(kind(entry), 0) < retention:
            retained[kind(entry)] = retained.get(kind(entry), 0) + 1
            kept[entry["sha256"]] = "retention"
        else:
            removed.append(entry)
    return kept, list(reversed(removed))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "keep": {"type": "list", "elements": "str", "default": []},
            "records_dir": {"type": "path"},
            "retention": {"type": "int", "default": 2},
        },
        supports_check_mode=True,
    )
    if module.params["retention"] < 0:
        module.fail_json(msg="retention is %d: it counts entries to keep, 0 or more" % module.params["retention"])
    declared = {value.lower() for value in module.params["keep"]}
    cached = entries(module.params["path"])
    kept, removed = plan(cached, declared, recorded(module.params["records_dir"]), module.params["retention"])
    if not module.check_mode:
        for entry in removed:
            shutil.rmtree(os.path.join(module.params["path"], entry["sha256"]))
    result = {
        "changed": bool(removed),
        "removed": [{key: entry[key] for key in ("sha256", "files", "bytes")} for entry in removed],
        "kept": kept,
        "freed_bytes": sum(entry["bytes"] for entry in removed),
    }
    if module._diff:
        listing = ["%s/%s" % (entry["sha256"], "/".join(entry["files"])) for entry in cached]
        gone = {entry["sha256"] for entry in removed}
        result["diff"] = {
            "before": "\n".join(sorted(listing)) + "\n",
            "after": "\n".join(sorted(item for item in listing if item[:64] not in gone)) + "\n",
            "before_header": module.params["path"],
            "after_header": module.params["path"],
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
