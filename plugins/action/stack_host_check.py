# -*- coding: utf-8 -*-
"""Action plugin for the stack_host_check module: fill `compat_facts` from the controller's knowledge base
(data/compat), then run the module on the host. The check itself is plugins/module_utils/stack_chain.py."""

from __future__ import annotations

import importlib.util
import os
import sys

from ansible.plugins.action import ActionBase

PLUGINS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_KB_DIR = os.path.join(os.path.dirname(PLUGINS_DIR), "data", "compat")


def load_stack_kb():
    """Load plugins/module_utils/stack_kb.py: Ansible puts custom module_utils on the path of modules only."""
    name = "gpufleet_action_stack_kb"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(PLUGINS_DIR, "module_utils", "stack_kb.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        module_args = dict(self._task.args)
        if not module_args.get("compat_facts"):
            kb_module = load_stack_kb()
            kb_dir = os.environ.get("GPUFLEET_COMPAT_DIR") or DEFAULT_KB_DIR
            try:
                module_args["compat_facts"] = kb_module.host_check_subset(kb_module.load_kb(kb_dir))
            except kb_module.KnowledgeBaseError as error:
                result.update(failed=True, changed=False, msg="cannot load the knowledge base: %s" % error)
                return result
        result.update(self._execute_module(module_name="stack_host_check", module_args=module_args,
                                           task_vars=task_vars))
        result["changed"] = False
        return result
