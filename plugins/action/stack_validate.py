# -*- coding: utf-8 -*-
"""Action plugin stack_validate: check the declared GPU stack on the controller, before any host changes.

It templates the host's stack variables and runs plugins/plugin_utils/preflight_checks.py's stack_result (the
validator in stack_declared.py against the knowledge base in data/compat, then the role variables that contradict
the stack), which `gpufleet plan -i` calls too; the on-host stack_host_check module checks the same links with
stack_host.py. It never contacts the host, never changes anything and works the same in check mode.
Documentation: plugins/modules/stack_validate.py.
"""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import preflight_checks

ARGUMENT_SPEC = {
    "stack": {"type": "dict"},
    "kb_dir": {"type": "path"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args.get("kb_dir"):
            os.environ["GPUFLEET_COMPAT_DIR"] = args["kb_dir"]
        variables = dict(
            (name, self._templar.template(task_vars[name]))
            for name in preflight_checks.STACK_VARIABLES
            if name in task_vars
        )
        if args.get("stack") is not None:
            variables["gpufleet_stack"] = args["stack"]
        result.update(
            preflight_checks.stack_result(
                variables,
                task_vars.get("inventory_hostname"),
                list(task_vars.get("group_names") or []),
                task_vars.get("inventory_dir"),
            )
        )
        return result
