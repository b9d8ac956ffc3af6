"""What systemd's DeviceAllow= rules let a unit open, resolved the way systemd 252 resolves them.

systemd (src/core/bpf-devices.c) reads the rules when the unit starts: `/dev/...` paths are stat()ed (or, for
/dev/char/MAJ:MIN, parsed) to one major:minor; `char-NAME` takes every major whose name in the "Character
devices:" section of /proc/devices matches NAME as an fnmatch(3) glob, or NAME itself when it is a number; a
name that matches nothing allows nothing. DevicePolicy=closed adds the static set (/dev/null, /dev/zero,
/dev/full, /dev/random, /dev/urandom, /dev/tty, /dev/ptmx, and char-pts). tests/integration checks this model
against systemd itself (ENXIO where it allows a driverless node, EPERM where it denies).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

NODE_LINE = re.compile(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+(/dev/\S+)$")
STATIC_NODES = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)}


@dataclass(frozen=True)
class Node:
    path: str
    major: int
    minor: int


def character_classes(proc_devices: str) -> list[tuple[int, str]]:
    """(major, name) of the "Character devices:" section of a /proc/devices text."""
    classes, inside = [], False
    for line in proc_devices.splitlines():
        if line.strip() == "Character devices:":
            inside = True
        elif not line.strip() or line.endswith(":"):
            inside = False
        elif inside and re.match(r"^\s*\d+\s+\S", line):
            major, name = line.split(None, 1)
            classes.append((int(major), name.strip()))
    return classes


def listed_nodes(listing: str) -> list[Node]:
    """Character device nodes of an `ls -la /dev/...` listing."""
    return [Node(m.group(3), int(m.group(1)), int(m.group(2))) for m in map(NODE_LINE.match, listing.splitlines()) if m]


def device_rules(unit_text: str) -> tuple[str, list[str]]:
    """DevicePolicy= and the DeviceAllow= specifiers (without access letters) of a unit file, in order."""
    policy, allowed = "auto", []
    for line in unit_text.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "DevicePolicy":
            policy = value
        elif key == "DeviceAllow":
            # An empty assignment resets the list, as in systemd.
            allowed = allowed + [value.split()[0]] if value.strip() else []
    return policy, allowed


def allowed_devices(rules: list[str], proc_devices: str, nodes: list[Node]) -> set[tuple[int, int | None]]:
    """(major, minor) pairs the rules allow, minor None for a whole major; paths resolve through `nodes`."""
    by_path = {node.path: node for node in nodes}
    allowed: set[tuple[int, int | None]] = set()
    for rule in rules:
        if rule.startswith("char-"):
            name = rule.removeprefix("char-")
            if name.isdigit():
                allowed.add((int(name), None))
            else:
                allowed |= {(major, None) for major, cls in character_classes(proc_devices) if fnmatchcase(cls, name)}
        elif match := re.fullmatch(r"/dev/char/(\d+):(\d+)", rule):
            allowed.add((int(match.group(1)), int(match.group(2))))
        elif rule in by_path:
            allowed.add((by_path[rule].major, by_path[rule].minor))
    return allowed


def is_allowed(node: Node, policy: str, allowed: set[tuple[int, int | None]]) -> bool:
    if policy == "auto" and not allowed:
        return True
    static = policy in ("closed", "auto") and (
        (node.major, node.minor) in STATIC_NODES or node.major == 136
    )  # 136: pts
    return static or (node.major, None) in allowed or (node.major, node.minor) in allowed


def denied_nodes(unit_text: str, proc_devices: str, nodes: list[Node]) -> list[Node]:
    """The nodes a unit with this text could not open on a machine with these /proc/devices and nodes."""
    policy, rules = device_rules(unit_text)
    allowed = allowed_devices(rules, proc_devices, nodes)
    return [node for node in nodes if not is_allowed(node, policy, allowed)]
