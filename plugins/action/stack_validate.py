# -*- coding: utf-8 -*-
"""Action plugin stack_validate: check the declared GPU stack on the controller, before any host changes.

It runs plugins/plugin_utils/stack_declared.py (the validator the CLI `gpufleet plan` uses too; the on-host
stack_host_check module checks the same links with stack_host.py) against the knowledge base in data/compat. It never contacts the host,
never changes anything and works the same in check mode. Documentation: plugins/modules/stack_validate.py.
"""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_resolve as helpers
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_conflicts

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
        result["changed"] = False
        if args.get("kb_dir"):
            os.environ["GPUFLEET_COMPAT_DIR"] = args["kb_dir"]
        # The role variables the stack owns are read here only when the inventory sets them: this play loads
        # no role, so no role default is among the task's variables.
        role_variables = stack_conflicts.ROLE_VARIABLES
        names = (
            "gpufleet_mirror_url",
            "gpufleet_artifact_sha256",
            "cuda_toolkit_extra_versions",
            "inference_venv_stack_options",
            "pyenv_python_pyenv_version",
            "gpufleet_stack",
        ) + role_variables
        variables = dict((name, self._templar.template(task_vars[name])) for name in names if name in task_vars)
        if args.get("stack") is not None:
            variables["gpufleet_stack"] = args["stack"]
        inputs = helpers.inputs_of(variables)
        if inputs["pyenv_version"] == "":
            inputs["pyenv_version"] = self._pyenv_default()
        outcome = helpers.validate_and_resolve(inputs)
        report = outcome["report"]
        if report is None:
            result.update(failed=True, msg=outcome["error"])
            return result
        result.update(
            compatible=report["compatible"],
            stack=report["stack"],
            resolved=report["resolved"],
            errors=report["errors"],
            stack_warnings=report["warnings"],
            facts_used=report["facts"],
            knowledge_base=helpers.kb_dir(),
        )
        result["warnings"] = ["[%s] %s" % (item["link"], item["message"]) for item in report["warnings"]]
        if outcome["error"]:
            result.update(failed=True, msg=outcome["error"])
            return result
        resolved = outcome["resolved"]
        result["artifacts"] = resolved["artifacts"]
        result["chain"] = dict((key, value) for key, value in resolved.items() if key != "artifacts")
        return self._conflicts(result, variables, resolved, task_vars)

    def _conflicts(self, result, variables, resolved, task_vars):
        """Fail when an inventory value of a role variable contradicts the stack, naming both and where each is."""
        plain = helpers.plain(
            dict((name, variables[name]) for name in stack_conflicts.ROLE_VARIABLES if name in variables)
        )
        host, groups = task_vars.get("inventory_hostname"), list(task_vars.get("group_names") or [])
        found = stack_conflicts.conflicts(plain, resolved)
        result["conflicts"] = [
            stack_conflicts.describe(item, host, groups, task_vars.get("inventory_dir")) for item in found
        ]
        if found:
            result["failed"] = True
            result["msg"] = "the inventory sets %d role variable(s) against the declared stack: %s" % (
                len(found),
                " | ".join(result["conflicts"]),
            )
        else:
            result["msg"] = "the declared stack is compatible (%d warning(s), %d sourced facts used, %d artifacts)" % (
                len(result["stack_warnings"]),
                len(result["facts_used"]),
                len(result["artifacts"]),
            )
        return result

    def _pyenv_default(self):
        """pyenv_python's default release, so preflight resolves pyenv's tarball as the role will."""
        defaults = os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "roles",
            "pyenv_python",
            "defaults",
            "main.yml",
        )
        return str(self._loader.load_from_file(defaults).get("pyenv_python_pyenv_version", ""))
