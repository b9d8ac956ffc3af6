#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the controller_artifact action plugin (plugins/action/controller_artifact.py): it runs only on
the controller, so this file holds no code, like ansible.builtin.debug's module file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: controller_artifact
short_description: Verify a controller file against its pinned sha256 once per run, downloading it when missing
description:
  - Used by the C(artifact) role's controller mode. The first host's task hashes O(path) (after downloading it
    from O(url) with C(ansible.builtin.get_url) when given; get_url verifies the sha256 of what it downloads or
    finds) and records the file's identity (device, inode, size, mtime and ctime) with the run in O(record_dir);
    the same run's other hosts find the record and the unchanged file and hash nothing.
  - A record of another run, or of a file changed since, is not trusted; the file is hashed again.
  - Runs on the controller only (delegate the task to localhost, with C(throttle=1) so that hosts take turns).
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  path:
    description: The controller file (the cache's copy of a downloaded artifact, or a controller path).
    type: path
    required: true
  sha256:
    description: The pinned sha256.
    type: str
    required: true
  url:
    description: Where to download O(path) from when it is missing or differs.
    type: str
  record_dir:
    description: Where the records of verified files are kept (beside the cache).
    type: path
    required: true
  mode:
    description: The downloaded file's mode.
    type: raw
    default: "0644"
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Verify the model in the controller cache, downloading it once
  gpufleet.fleet.controller_artifact:
    path: /var/cache/gpufleet/artifacts/sha256/5b0f...
    sha256: 5b0f...
    url: http://mirror.internal/models/tiny.tar.gz
    record_dir: /var/cache/gpufleet/artifacts/sha256/.verified
  delegate_to: localhost
  throttle: 1
"""

RETURN = r"""
exists:
  description: Whether the file is there.
  type: bool
  returned: success
checksum:
  description: Its sha256 (the pinned one when verified), or null when missing.
  type: str
  returned: success
size:
  description: Its size in bytes.
  type: int
  returned: success
hashed:
  description: Whether this task hashed the file (false when this run had verified it already).
  type: bool
  returned: success
downloaded:
  description: Whether this task downloaded it.
  type: bool
  returned: success
"""
