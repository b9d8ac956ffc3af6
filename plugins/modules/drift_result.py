#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the drift_result action plugin (plugins/action/drift_result.py): it runs only on the
controller, so this file holds no code, like ansible.builtin.debug's module file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drift_result
short_description: Record a drift layer that was not compared (not declared, or an error), or the planned layers
description:
  - Used by C(playbooks/drift.yml). A layer whose role the inventory does not declare reports C(not_declared);
    a layer whose checks could not run (the rescue of the layer's block) reports C(error) with the reason;
    the pseudo-layer C(cordon) of a cordoned node reports C(cordoned) with the cordon's reason.
  - With O(plan), records the layers the run will compare on the host, so that the fleet report names every
    layer of every node even when the node cannot be reached.
  - Runs on the controller only (an action plugin); it never connects to the host and never changes anything.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  layer:
    description: The layer, e.g. C(serve). Required with O(status).
    type: str
  status:
    description: The layer's outcome.
    type: str
    choices: [not_declared, error, cordoned]
  message:
    description: Why (which variable is not declared, what failed).
    type: str
    default: ""
  plan:
    description: The layers of the run, in order. Exclusive with O(layer).
    type: list
    elements: str
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.fleet.drift_probe
"""

EXAMPLES = r"""
- name: Report the serve layer as not declared
  gpufleet.fleet.drift_result:
    layer: serve
    status: not_declared
    message: roles/vllm_service does not exist yet

- name: Record the layers of the run
  gpufleet.fleet.drift_result:
    plan: [base, driver, toolkit]
"""

RETURN = r"""
ansible_facts:
  description: C(gpufleet_drift_last), the same result as C(gpufleet_drift).
  returned: with layer
  type: dict
gpufleet_drift:
  description: The layer's result, in the shape drift_probe returns it (no drift entries, no checks run).
  returned: with layer
  type: dict
  sample: {"layer": "serve", "status": "not_declared", "drift": [], "errors": [], "checked": 0, "notes": [],
           "message": "roles/vllm_service does not exist yet"}
gpufleet_drift_plan:
  description: The planned layers.
  returned: with plan
  type: list
  elements: str
  sample: [base, driver, toolkit]
"""
