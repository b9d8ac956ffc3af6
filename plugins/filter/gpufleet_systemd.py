# -*- coding: utf-8 -*-
"""Filters for units and their files: systemd_units parses what `systemctl show --property=Id,... UNIT...` printed
into {unit: {property: value}} — the one parser of that output (vllm_service's snapshot reads which instances run
and start at boot with it); expand_patterns names every file of several units from patterns of one name."""

from __future__ import annotations

import base64
import re

DOCUMENTATION = r"""
name: systemd_units
short_description: Parse the output of systemctl show for several units
description:
  - "C(systemctl show --property=Id,ActiveState,UnitFileState UNIT...) prints one block of C(NAME=VALUE) lines per
    unit, the blocks separated by an empty line. This filter returns them keyed by each block's C(Id)."
options:
  _input:
    description: The command's standard output.
    type: str
    required: true
"""

EXAMPLES = r"""
units: "{{ show.stdout | gpufleet.fleet.systemd_units }}"
"""

RETURN = r"""
_value:
  description: Unit name -> its properties, every value a string.
  type: dict
"""


def systemd_units(text: str) -> dict:
    units = {}
    for block in str(text).split("\n\n"):
        properties = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if properties.get("Id"):
            units[properties["Id"]] = properties
    return units


def expand_patterns(names: list, patterns: list) -> list:
    """Each pattern filled with each name ('%s' in the pattern), the names in order: a flat list of paths."""
    return [str(pattern) % str(name) for name in names for pattern in patterns]


def _dropin_option(text: str, flag: str) -> str | None:
    """The value of one quoted option of a drop-in's ExecStart (the role quotes every argument)."""
    match = re.search(r'"%s" "((?:[^"\\]|\\.)*)"' % re.escape(flag), text)
    return match.group(1) if match else None


def vllm_instance_states(names: list, units: dict, dropins: list) -> dict:
    """Instance name -> {active, enabled, port, served_model_name, headless}: systemd's state of vllm@NAME.service
    (from systemd_units) and the port and served name its drop-in configures (slurp results, item = the name);
    headless: a member of an instance across nodes that another node leads, which serves no API here."""
    texts = {}
    for result in dropins:
        if result.get("content"):
            texts[str(result["item"])] = base64.b64decode(result["content"]).decode("utf-8", "replace")
    states = {}
    for name in names:
        unit = units.get("vllm@%s.service" % name, {})
        port = _dropin_option(texts.get(str(name), ""), "--port")
        states[str(name)] = {
            "active": unit.get("ActiveState") == "active",
            "enabled": unit.get("UnitFileState") in ("enabled", "enabled-runtime"),
            "port": int(port) if port and port.isdigit() else None,
            "served_model_name": _dropin_option(texts.get(str(name), ""), "--served-model-name") or str(name),
            "headless": '"--headless"' in texts.get(str(name), ""),
        }
    return states


class FilterModule(object):
    def filters(self):
        return {
            "systemd_units": systemd_units,
            "expand_patterns": expand_patterns,
            "vllm_instance_states": vllm_instance_states,
        }
