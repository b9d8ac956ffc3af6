# -*- coding: utf-8 -*-
"""Action plugin role_values: refuse role variables that break their role's argument specs and value rules.

One mechanism for every role, on the controller, before any host changes: each role's meta/argument_specs.yml
gives the options (every entry point's) with their types and choices, its meta/value_rules.yml what each string
under them may be (plugins/plugin_utils/value_rules.py). A value is checked when the task's variables hold it
(inventory, group and extra variables; a role's defaults too when a role's own preflight runs it), or when the
option's default is built from other variables (gpufleet_snapshot_dir, gpufleet_mirror_url). A message names the
host, the value's path and the rule, never the value. The checks are plugins/plugin_utils/preflight_checks.py's, which
`gpufleet plan -i` calls too. Documentation: plugins/modules/role_values.py.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import preflight_checks

ARGUMENT_SPEC = {"roles": {"type": "list", "elements": "str"}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        host = task_vars.get("inventory_hostname", "?")
        roles = args.get("roles") or preflight_checks.declared_roles()
        lines: list[str] = []
        checked = 0
        for role in roles:
            values = self._values(preflight_checks.role_options(role), preflight_checks.role_defaults(role), task_vars)
            checked += len(values)
            lines.extend("%s: %s" % (host, line) for line in preflight_checks.role_problems(role, values))
        result["checked"] = checked
        if lines:
            result.update(failed=True, msg="\n".join(lines), problems=lines)
        return result

    def _values(self, options: dict[str, dict], defaults: dict[str, Any], task_vars: dict) -> dict[str, Any]:
        """The value each option has for this host, where the inventory sets it or its default is derived."""
        values = {}
        for name in options:
            default = defaults.get(name)
            if name in task_vars:
                raw = task_vars[name]
            elif preflight_checks.derived_default(default):
                raw = trust_as_template(default)
            else:
                continue
            try:
                values[name] = self._templar.template(raw)
            except AnsibleError:
                continue  # undefined here: the role reports it with its own context when it runs
        return values
