# -*- coding: utf-8 -*-
"""Action plugin for the stack_host_check module: fill `compat_facts` from the controller's knowledge base
(data/compat), then run the module on the host. The check itself is plugins/module_utils/stack_host.py."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_kb


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        module_args = dict(self._task.args)
        if not module_args.get("compat_facts"):
            kb_dir = os.environ.get("GPUFLEET_COMPAT_DIR") or stack_kb.default_kb_dir()
            try:
                module_args["compat_facts"] = stack_kb.host_check_subset(stack_kb.load_kb(kb_dir))
            except stack_kb.KnowledgeBaseError as error:
                result.update(failed=True, changed=False, msg="cannot load the knowledge base: %s" % error)
                return result
        result.update(
            self._execute_module(
                module_name="gpufleet.fleet.stack_host_check", module_args=module_args, task_vars=task_vars
            )
        )
        result["changed"] = False
        return result
