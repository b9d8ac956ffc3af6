# -*- coding: utf-8 -*-
"""Configuration gpufleet did not write that changes what a managed component does (drift kind `foreign`).

Shipped to targets with the drift_probe module: standard library and gpufleet's other module_utils only.

A layer declares, besides what it writes, where foreign configuration of its component can live: files (globs,
and the lines in them that concern the component), the kernel command line, the environment systemd gives every
unit, the loader's resolution of a library, package holds and pins. Each line, setting or resolution found there
that the layer did not write is a finding naming the file, the line and its effect on the component. Where the
effective value can be read (the library the loader resolves, systemd's environment, a loaded module's
parameters), that is what is compared. Unrelated content in those places is not reported.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.module_utils.drift_checks import (
    Context,
    Finding,
    SpecError,
    require,
)

EXPECTED = "nothing gpufleet did not write"
# Drift reports foreign configuration; no run removes it (it may be a colleague's deliberate fix).
REMEDY = "; gpufleet leaves it in place: remove it, or declare what it sets in the inventory"
MODULE_PARAMETERS = "/sys/module/{module}/parameters/{name}"
_OPTION = re.compile(r"^\s*options\s+(\S+)\s+(.*)$")


def _lines(path: str) -> list[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [(number, line.rstrip("\n")) for number, line in enumerate(handle, start=1)]
    except OSError:
        return []


def _significant(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _module_parameter(line: str) -> str:
    """For `options nvidia NVreg_X=1`, what the loaded module reports for each parameter, where it is loaded."""
    match = _OPTION.match(line)
    if match is None:
        return ""
    module, settings = match.group(1), match.group(2).split()
    seen = []
    for setting in settings:
        name = setting.split("=", 1)[0]
        path = MODULE_PARAMETERS.format(module=module.replace("-", "_"), name=name)
        try:
            with open(path, encoding="utf-8") as handle:
                seen.append(f"{name}={handle.read().strip()}")
        except OSError:
            continue
    return f"; the loaded {module} module has {', '.join(seen)}" if seen else ""


def foreign_files(place: dict, own: set[str], label: str) -> list[Finding]:
    """Lines matching the place's pattern in files of its globs that the layer did not write."""
    require(place, "glob", "match", "effect")
    pattern = re.compile(place["match"])
    findings = []
    for spec in place["glob"] if isinstance(place["glob"], list) else [place["glob"]]:
        for path in sorted(glob.glob(spec)):
            if os.path.realpath(path) in own or path in own or not os.path.isfile(path):
                continue
            for number, line in _lines(path):
                if _significant(line) and pattern.search(line):
                    effect = place["effect"] + (_module_parameter(line) if place.get("module_parameters") else "")
                    findings.append(Finding(label, f"{path}:{number}", EXPECTED, line.strip(), effect))
    return findings


def foreign_cmdline(spec: dict, label: str, path: str = "/proc/cmdline") -> list[Finding]:
    """Kernel command-line parameters of the running kernel that concern the component."""
    require(spec, "match", "effect")
    pattern = re.compile(spec["match"])
    text = " ".join(line for number, line in _lines(path)).split(" -- ", maxsplit=1)[0]
    return [Finding(label, path, EXPECTED, token, spec["effect"]) for token in text.split() if pattern.search(token)]


def foreign_environment(spec: dict, ctx: Context, label: str) -> list[Finding]:
    """Variables in the environment systemd's manager gives every unit (its effective value, `systemctl
    show-environment`) that concern the component, other than those the layer sets."""
    require(spec, "match", "effect")
    pattern, own = re.compile(spec["match"]), set(spec.get("own") or [])
    rc, out, dummy = ctx.run(["systemctl", "show-environment"])
    if rc != 0:
        return []
    findings = []
    for line in out.splitlines():
        name = line.split("=", 1)[0]
        if name not in own and pattern.search(name):
            findings.append(Finding(label, "systemctl show-environment", EXPECTED, line, spec["effect"]))
    return findings


def foreign_loader(spec: dict, ctx: Context, label: str) -> list[Finding]:
    """Each library the loader's cache resolves (`ldconfig -p`) outside the prefixes the layer installs."""
    require(spec, "libraries", "prefixes", "effect")
    rc, out, dummy = ctx.run(["ldconfig", "-p"])
    if rc != 0:
        return []
    prefixes = tuple(os.path.join(prefix, "") for prefix in spec["prefixes"])
    findings = []
    for line in out.splitlines():
        name, dummy, target = line.strip().partition(" => ")
        soname = name.split(" (")[0]
        if any(re.fullmatch(re.escape(library) + r"(\.[0-9]+)*", soname) for library in spec["libraries"]):
            resolved = os.path.realpath(target)
            if not (target.startswith(prefixes) or resolved.startswith(prefixes)):
                findings.append(
                    Finding(label, f"loader: {soname}", f"under {', '.join(spec['prefixes'])}", target, spec["effect"])
                )
    return findings


def foreign_holds(spec: dict, ctx: Context, label: str) -> list[Finding]:
    """Packages matching the pattern held by someone else (`apt-mark showhold`)."""
    require(spec, "match", "effect")
    pattern, own = re.compile(spec["match"]), set(spec.get("own") or [])
    rc, out, dummy = ctx.run(["apt-mark", "showhold"])
    if rc != 0:
        return []
    return [
        Finding(label, "apt-mark showhold", EXPECTED, f"{name} held", spec["effect"])
        for name in out.split()
        if pattern.search(name) and name not in own
    ]


def check_foreign(spec: dict, ctx: Context) -> list[Finding]:
    """Every place the layer declares where foreign configuration of its component can live."""
    require(spec, "component")
    label = f"foreign configuration of {spec['component']}"
    own: set[str] = set()
    for path in spec.get("own") or []:
        own.update((path, os.path.realpath(path)))
    findings: list[Finding] = []
    for place in spec.get("files") or []:
        if not isinstance(place, dict):
            raise SpecError(f"check foreign: each of files is a dict (got {place!r})")
        findings += foreign_files(place, own, label)
    if spec.get("cmdline"):
        findings += foreign_cmdline(spec["cmdline"], label, spec["cmdline"].get("path", "/proc/cmdline"))
    if spec.get("environment"):
        findings += foreign_environment(spec["environment"], ctx, label)
    if spec.get("loader"):
        findings += foreign_loader(spec["loader"], ctx, label)
    if spec.get("holds"):
        findings += foreign_holds(spec["holds"], ctx, label)
    for finding in findings:
        finding.detail += REMEDY
    return findings


KINDS: dict[str, Any] = {"foreign": check_foreign}
