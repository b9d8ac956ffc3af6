# -*- coding: utf-8 -*-
"""Action plugin stack_validate: check the declared GPU stack on the controller, before any host changes.

It runs plugins/module_utils/stack_chain.py (the validator the CLI `gpufleet plan` and the on-host
stack_host_check module use too) against the knowledge base in data/compat. It never contacts the host,
never changes anything and works the same in check mode. Documentation: plugins/modules/stack_validate.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ansible.plugins.action import ActionBase

PLUGINS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_KB_DIR = os.path.join(os.path.dirname(PLUGINS_DIR), "data", "compat")


def load_module_util(name: str):
    """Load plugins/module_utils/<name>.py: Ansible puts custom module_utils on the path of modules only."""
    qualified = "gpufleet_action_" + name
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(qualified, os.path.join(PLUGINS_DIR, "module_utils", name + ".py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[qualified] = module
    return sys.modules[qualified]


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
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        stack = args.get("stack")
        if stack is None:
            stack = task_vars.get("gpufleet_stack")
        if stack is None:
            result.update(failed=True, msg="no stack to validate: set gpufleet_stack in the inventory (group_vars) "
                                           "or pass stack: to stack_validate")
            return result
        kb_dir = args.get("kb_dir") or os.environ.get("GPUFLEET_COMPAT_DIR") or DEFAULT_KB_DIR
        chain = load_module_util("stack_chain")
        kb_module = load_module_util("stack_kb")
        try:
            kb = kb_module.load_kb(kb_dir)
            report = chain.validate_stack(chain.normalize_stack(self._plain(stack)), kb)
        except (chain.StackError, kb_module.KnowledgeBaseError) as error:
            result.update(failed=True, msg="gpufleet_stack is invalid: %s" % error)
            return result
        result.update(
            compatible=report["compatible"],
            stack=report["stack"],
            resolved=report["resolved"],
            errors=report["errors"],
            stack_warnings=report["warnings"],
            facts_used=report["facts"],
            knowledge_base=kb["kb_dir"],
        )
        result["warnings"] = ["[%s] %s" % (item["link"], item["message"]) for item in report["warnings"]]
        if report["errors"]:
            result["failed"] = True
            result["msg"] = "the declared stack is not compatible (%d error(s)): %s" % (
                len(report["errors"]),
                " | ".join("[%s] %s" % (item["link"], item["message"]) for item in report["errors"]))
        else:
            result["msg"] = "the declared stack is compatible (%d warning(s), %d sourced facts used)" % (
                len(report["warnings"]), len(report["facts"]))
        return result

    @staticmethod
    def _plain(value):
        """Templated inventory values arrive as Ansible's str/dict subclasses: make them plain for type checks."""
        if isinstance(value, dict):
            return dict((str(key), ActionModule._plain(item)) for key, item in value.items())
        if isinstance(value, list):
            return [ActionModule._plain(item) for item in value]
        if isinstance(value, str):
            return str(value)
        return value
