#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the capacity_check action plugin (plugins/action/capacity_check.py): it runs only on the
controller, so this file holds no code, like ansible.builtin.debug's module file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: capacity_check
short_description: Refuse a vLLM instance whose model cannot fit its GPUs, before any host is touched
description:
  - Predicts, per declared vLLM instance, what vLLM would budget on each GPU (weights at the declared tensor and
    pipeline parallel sizes, activation, non-torch and CUDA-graph overhead, the KV cache left), the KV-cache size
    in tokens and the maximum concurrency at C(max_model_len), as vLLM logs them at start.
  - The model's shape comes from the small files of its repository, in the controller directory its
    C(model_store_models) entry names as C(shape) (C(config.json), C(model.safetensors.index.json) or the
    safetensors headers), with its C(config_overrides) merged in; the GPU's memory from the knowledge base
    (C(data/compat/gpu_memory.csv)).
  - Fails, naming the number that does not fit and each single change that fixes it (tensor parallel size,
    C(max_model_len), KV-cache dtype, utilisation), when an instance cannot start; refuses an instance whose model
    has no shape, a shape the planner does not know or a GPU without a memory figure, unless the instance sets
    C(capacity_check) to false.
  - Runs on the controller only (an action plugin); it never connects to the host and never changes anything.
version_added: "0.3.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  instances:
    description: The host's vLLM instances (C(vllm_service_instances)).
    type: list
    elements: dict
    required: true
  instance_defaults:
    description: The defaults under every instance (C(vllm_service_instance_defaults)).
    type: dict
    default: {}
  models:
    description: The host's C(model_store_models); an instance serves the entry whose name ends its model path.
    type: list
    elements: dict
    default: []
  stack:
    description: The GPU stack whose GPUs the instances run on. Defaults to the inventory variable C(gpufleet_stack).
    type: dict
  logged:
    description:
      - After instances started, what each logged (instance name -> its journal's KV-cache lines). The predictions
        are then compared with vLLM's own figures and a warning names each that differs by more than O(tolerance);
        nothing fails.
    type: dict
  tolerance:
    description: With O(logged), the largest difference from vLLM's KV-cache tokens that is not warned about.
    type: float
    default: 0.05
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
seealso:
  - module: gpufleet.fleet.stack_validate
"""

EXAMPLES = r"""
- name: Refuse an instance whose model cannot fit its GPUs
  gpufleet.fleet.capacity_check:
    instances: "{{ vllm_service_instances }}"
    instance_defaults: "{{ vllm_service_instance_defaults }}"
    models: "{{ model_store_models | default([]) }}"
"""

RETURN = r"""
capacity:
  description: One verdict per instance.
  returned: always
  type: list
  elements: dict
  contains:
    instance:
      description: The instance's name.
      type: str
    model:
      description: The model path the instance serves.
      type: str
    status:
      description: C(fits), C(does_not_fit), C(refused) (an input the planner cannot size) or C(not_checked).
      type: str
    message:
      description: One line with the prediction, or what does not fit and the fixes.
      type: str
    figures:
      description: >-
        The prediction's numbers (bytes per GPU: weights, activation, non-torch, CUDA graphs, KV cache; KV bytes
        per token per layer kind; KV-cache tokens; max_model_len; maximum concurrency).
      type: dict
    fixes:
      description: Each single change that makes the instance fit (setting, value, text), the smallest first.
      type: list
      elements: dict
compared:
  description: With O(logged), per instance the predicted and the logged KV-cache tokens and the warning, if any.
  returned: when logged is given
  type: list
  elements: dict
gpus:
  description: The memory the planner used for each GPU of the stack, with the variant and its source.
  returned: always
  type: list
  elements: dict
"""
