#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the upgrade_result action plugin (plugins/action/upgrade_result.py): it runs only on the
controller, so this file holds no code, like ansible.builtin.debug's module file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade_result
short_description: Record one node's outcome of a rolling upgrade
description:
  - Used by C(playbooks/upgrade.yml) once per node. The outcome is returned under C(gpufleet_upgrade), the key
    C(gpufleet upgrade) reads from the run's events, and set as the fact C(ansible_facts.upgrade_outcome) for the
    playbook's own report and failure budget.
  - Node text (a failure message, a journal line) is folded to one line without control characters.
  - Runs on the controller only (an action plugin); it never connects to the host and never changes anything.
version_added: "0.2.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  status:
    description:
      - C(upgraded) the node serves the new declaration; C(unchanged) it matched it; C(skipped) it is cordoned;
        C(not_upgraded) nothing was changed (its snapshot could not be taken); C(rolled_back) it failed and serves
        what it served before; C(failed) the rollback failed too.
    type: str
    required: true
    choices: [upgraded, unchanged, skipped, not_upgraded, rolled_back, failed]
  layers:
    description: The layers the upgrade applied to the node.
    type: list
    elements: str
    default: []
  reason:
    description: Why the node failed, or why it was left as it is.
    type: str
    default: ""
  state:
    description: What the node serves now, in words (NOT SERVING with the command that starts it, where so).
    type: str
    required: true
  began:
    description: When the node's upgrade began (seconds since the epoch), for its duration.
    type: float
  restored:
    description: What a rollback put back.
    type: list
    elements: str
    default: []
  not_restored:
    description: What a rollback could not put back, each with the reason.
    type: list
    elements: str
    default: []
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
- name: Record the node's outcome
  gpufleet.fleet.upgrade_result:
    status: upgraded
    layers: [venv, serve]
    state: serving the new declaration
    began: "{{ __upgrade_began }}"
"""

RETURN = r"""
gpufleet_upgrade:
  description: The outcome.
  returned: always
  type: dict
  contains:
    node: {description: The node., type: str}
    status: {description: As given., type: str}
    layers: {description: As given., type: list, elements: str}
    reason: {description: One line., type: str}
    state: {description: One line., type: str}
    restored: {description: As given., type: list, elements: str}
    not_restored: {description: As given., type: list, elements: str}
    seconds: {description: "Seconds since O(began); 0 without it.", type: float}
"""
