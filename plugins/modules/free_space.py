#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Refuse a step that would not fit: the free bytes where it writes against the bytes it needs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: free_space
short_description: Fail before a large write when the file system it goes to has too little free space
description:
  - Reads the free bytes (C(statvfs), the blocks available to the caller) of the file system that holds
    O(path), or its nearest existing parent when O(path) does not exist yet, and fails with the path, the
    free and the needed bytes when they are short.
  - The bytes needed are O(bytes) plus, for each file in O(archives), its unpacked size read from the tar
    headers (gzip, bzip2 and xz tarballs), plus O(reserve_bytes).
  - Read-only; never reports a change.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  path:
    description: Where the step writes (a directory; need not exist yet).
    type: path
    required: true
  bytes:
    description: Bytes the step writes there, e.g. the size of an artifact to copy.
    type: int
    default: 0
  archives:
    description: Tarballs on this host that are unpacked into O(path); their unpacked sizes are added.
    type: list
    elements: path
    default: []
  reserve_bytes:
    description: Bytes that must stay free after the step.
    type: int
    default: 0
  what:
    description: What the step is, for the message.
    type: str
    default: this step
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Refuse to unpack the model unless its unpacked size fits
  gpufleet.fleet.free_space:
    path: /var/lib/gpufleet/models
    archives: [/var/cache/gpufleet/artifacts/81dc.../tiny-qwen2.tar.gz]
    what: unpacking model tiny-qwen2
"""

RETURN = r"""
mount_path:
  description: The existing directory whose file system was measured.
  returned: always
  type: str
free_bytes:
  description: Free bytes there.
  returned: always
  type: int
needed_bytes:
  description: Bytes needed (O(bytes), unpacked archives and O(reserve_bytes)).
  returned: always
  type: int
"""

import os
import tarfile

from ansible.module_utils.basic import AnsibleModule


def existing_parent(path: str) -> str:
    """PATH itself or its nearest existing parent directory."""
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        current = os.path.dirname(current)
    return current


def unpacked_size(archive: str) -> int:
    """Sum of the regular members' sizes, read from the tar headers (the stream is decompressed once)."""
    with tarfile.open(archive) as tar:
        return sum(member.size for member in tar if member.isreg())


def human(count: int) -> str:
    return f"{count} bytes ({count / 2**30:.2f} GiB)"


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            bytes=dict(type="int", default=0),
            archives=dict(type="list", elements="path", default=[]),
            reserve_bytes=dict(type="int", default=0),
            what=dict(type="str", default="this step"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        needed = p["bytes"] + sum(unpacked_size(archive) for archive in p["archives"]) + p["reserve_bytes"]
    except (OSError, tarfile.TarError) as error:
        module.fail_json(msg=f"cannot read the unpacked size of {', '.join(p['archives'])}: {error}")
    measured = existing_parent(p["path"])
    stats = os.statvfs(measured)
    free = stats.f_bavail * stats.f_frsize
    result = dict(changed=False, mount_path=measured, free_bytes=free, needed_bytes=needed)
    if free < needed:
        module.fail_json(
            msg=f"not enough free space for {p['what']}: {p['path']} (file system of {measured}) has "
            f"{human(free)} free, {human(needed)} needed; free {human(needed - free)} there "
            "or move the directory to a larger file system",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
