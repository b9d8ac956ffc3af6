#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Documentation of the role_values action plugin (plugins/action/role_values.py): it runs only on the controller,
so this file holds no code, like ansible.builtin.debug's module file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: role_values
short_description: Refuse role variables that break their role's argument specs and value rules
description:
  - Checks, for the host, every option each role declares in C(meta/argument_specs.yml) (every entry point's),
    against its type and choices and against the rule C(meta/value_rules.yml) gives each string under it (a
    name, a path, a URL, a systemd size...; the rules are in C(plugins/plugin_utils/value_rules.py)). No string
    anywhere may hold a control or line-separator character or be longer than 4096 characters.
  - A value is checked when the task's variables hold it (inventory, group and extra variables; a role's
    defaults too when the role's own preflight runs this), or when the option's default is built from other
    variables without a lookup.
  - Fails with one line per offending value, naming the host, the value's path and the rule; never the value.
  - Runs on the controller only (an action plugin); it never connects to the host and never changes anything.
version_added: "0.2.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  roles:
    description: The roles to check; by default every role of the collection that declares value rules.
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
"""

EXAMPLES = r"""
- name: Check every role's variables for this host
  gpufleet.fleet.role_values:

- name: Check this role's variables
  gpufleet.fleet.role_values:
    roles: [vllm_service]
"""

RETURN = r"""
checked:
  description: How many variables were checked.
  returned: always
  type: int
problems:
  description: One line per offending value.
  returned: failed
  type: list
  elements: str
"""
