#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Module archive_members: screen a tarball's members before it is unpacked (issue 29, M9)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: archive_members
short_description: Refuse a tarball whose members could write or read outside the directory it is unpacked into
description:
  - Reads the member headers of a tar archive (any compression tarfile reads) and fails, naming the first offending
    member, when one has an absolute path or a C(..) component, is a device or a FIFO, is a link whose target leaves
    the tree (or any link, with O(links=refuse)), or is a hard link to a path outside it.
  - Checks the names as GNU tar sees them after O(strip_components); members with no more components are skipped,
    as tar skips them.
  - Reads only; never changes anything, so it behaves the same in check mode.
version_added: "0.2.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  path:
    description: The archive on the node.
    type: path
    required: true
  strip_components:
    description: The C(--strip-components) the archive is unpacked with.
    type: int
    default: 0
  links:
    description:
      - C(refuse) any symbolic or hard link (model weights need none, and a link is something root would later
        follow); C(inside) links whose target stays inside the tree (a CPython build's C(bin/python3)).
    type: str
    choices: [refuse, inside]
    default: refuse
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
- name: Refuse a model tarball with links, devices or paths outside its tree
  gpufleet.fleet.archive_members:
    path: /var/cache/gpufleet/artifacts/tiny-qwen2.tar.gz
    strip_components: 1
"""

RETURN = r"""
members:
  description: How many members the archive has.
  returned: always
  type: int
regular_bytes:
  description: The sum of the regular members' sizes.
  returned: always
  type: int
"""

import posixpath
import tarfile

from ansible.module_utils.basic import AnsibleModule


def stripped(name: str, strip: int) -> list[str] | None:
    """The member's path components below the unpack directory, or None when tar skips it."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    return parts[strip:] if len(parts) > strip else None


def escapes(parts: list[str]) -> bool:
    """Whether a path of these components (relative to the tree) leaves it."""
    depth = 0
    for part in parts:
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return True
    return False


def problem(member: tarfile.TarInfo, strip: int, links: str) -> str | None:
    """What is wrong with one member, or None."""
    if member.name.startswith("/"):
        return "has an absolute path"
    parts = stripped(member.name, strip)
    if parts is None:
        return None
    if ".." in parts:
        return "has a .. component"
    if member.isdev():
        return "is a device or a FIFO"
    if not (member.issym() or member.islnk()):
        return None
    kind = "a symbolic link" if member.issym() else "a hard link"
    if links == "refuse":
        return "is %s (to %r); this archive may hold none" % (kind, member.linkname)
    if member.linkname.startswith("/"):
        return "is %s to an absolute path (%r)" % (kind, member.linkname)
    if member.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname("/".join(parts)), member.linkname))
        target_parts = target.split("/")
    else:  # a hard link names another member, from the archive's top, stripped like it
        target_parts = stripped(member.linkname, strip) or [".."]
    if escapes(target_parts) or target_parts[0] == "..":
        return "is %s (to %r) that leaves the tree" % (kind, member.linkname)
    return None


def screen(path: str, strip: int, links: str) -> tuple[int, int]:
    """(members, regular bytes); raises ValueError naming the first offending member."""
    count = size = 0
    with tarfile.open(path) as archive:
        for member in archive:
            count += 1
            wrong = problem(member, strip, links)
            if wrong:
                raise ValueError("%s: member %r %s" % (path, member.name, wrong))
            if member.isreg():
                size += member.size
    return count, size


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            strip_components=dict(type="int", default=0),
            links=dict(type="str", choices=["refuse", "inside"], default="refuse"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        members, regular = screen(params["path"], params["strip_components"], params["links"])
    except (OSError, tarfile.TarError) as error:
        module.fail_json(msg="cannot read %s as a tar archive: %s" % (params["path"], error))
    except ValueError as error:
        module.fail_json(msg="%s; nothing was unpacked: rebuild the archive without it" % error)
    module.exit_json(changed=False, members=members, regular_bytes=regular)


if __name__ == "__main__":
    main()
