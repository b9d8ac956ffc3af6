# -*- coding: utf-8 -*-
"""Action plugin capacity_check: will each vLLM instance of this host fit its GPUs? Controller only, before any
host changes (issue 34). It runs plugins/plugin_utils/instance_capacity.py on the host's declared instances,
the small files of each model's repository (model_store_models[].shape) and the memory of the stack's GPUs
(data/compat/gpu_memory.csv). It never contacts the host, never changes anything and works the same in check
mode. Documentation: plugins/modules/capacity_check.py.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import instance_capacity, preflight_checks
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.stack_resolve import kb_dir, plain

ARGUMENT_SPEC = {
    "instances": {"type": "list", "elements": "dict", "required": True},
    "instance_defaults": {"type": "dict", "default": {}},
    "models": {"type": "list", "elements": "dict", "default": []},
    "stack": {"type": "dict"},
    "kb_dir": {"type": "path"},
    "logged": {"type": "dict"},
    "tolerance": {"type": "float", "default": 0.05},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        stack = args.get("stack")
        if stack is None:
            stack = self._templar.template(task_vars.get("gpufleet_stack"))
        stack = plain(stack)
        if not isinstance(stack, dict):
            result.update(failed=True, msg="no gpufleet_stack is declared for this host")
            return result
        checks, gpus = preflight_checks.capacity_checks(
            stack, args["instances"], args["instance_defaults"], args["models"], args.get("kb_dir") or kb_dir()
        )
        result["capacity"] = [check.as_dict() for check in checks]
        if args.get("logged") is not None:
            # After a start: compare with what vLLM logged, and warn; the verdicts were preflight's to enforce.
            logged = plain(args["logged"])
            compared = [
                instance_capacity.compare_with_log(check, logged[check.instance], args["tolerance"])
                for check in checks
                if check.instance in logged
            ]
            result["compared"] = compared
            result["warnings"] = [item["warning"] for item in compared if item["warning"]]
            return result
        result.update(preflight_checks.capacity_result(task_vars.get("inventory_hostname"), checks, gpus))
        return result
