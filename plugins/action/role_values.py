# -*- coding: utf-8 -*-
"""Action plugin role_values: refuse role variables that break their role's argument specs and value rules.

One mechanism for every role, on the controller, before any host changes: each role's meta/argument_specs.yml
gives the options (every entry point's) with their types and choices, its meta/value_rules.yml what each string
under them may be (plugins/plugin_utils/value_rules.py). A value is checked when the task's variables hold it
(inventory, group and extra variables; a role's defaults too when a role's own preflight runs it), or when the
option's default is built from other variables (gpufleet_snapshot_dir, gpufleet_mirror_url). A message names the
host, the value's path and the rule, never the value. Documentation: plugins/modules/role_values.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import value_rules

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
ARGUMENT_SPEC = {"roles": {"type": "list", "elements": "str"}}
# What the type check keeps of an option's spec: required options and defaults belong to the role's own call.
SPEC_KEYS = ("type", "elements", "choices", "no_log")


def declared_roles() -> list[str]:
    return sorted(path.parent.parent.name for path in ROLES_DIR.glob("*/meta/value_rules.yml"))


def role_options(role: str) -> dict[str, dict]:
    """Option name -> its spec, over every entry point of the role (the first declaration of a name wins)."""
    specs = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options: dict[str, dict] = {}
    for entry in specs.values():
        for name, spec in (entry.get("options") or {}).items():
            options.setdefault(name, spec)
    return options


def role_defaults(role: str) -> dict[str, Any]:
    """The role's defaults/main.yml: the one place an option's default is written (the argument specs document
    the plain ones and name the file for the computed ones)."""
    path = ROLES_DIR / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def role_rules(role: str) -> dict[str, str]:
    return yaml.safe_load((ROLES_DIR / role / "meta" / "value_rules.yml").read_text()) or {}


def type_spec(spec: dict) -> dict:
    """The part of an option's spec that checks types and choices, nested options included."""
    kept: dict[str, Any] = {key: spec[key] for key in SPEC_KEYS if key in spec}
    if isinstance(kept.get("choices"), str):  # a templated choice list is the role's own business
        del kept["choices"]
    if spec.get("options"):
        kept["options"] = {name: type_spec(option) for name, option in spec["options"].items()}
    return kept


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
        roles = args.get("roles") or declared_roles()
        lines: list[str] = []
        checked = 0
        for role in roles:
            options = role_options(role)
            values = self._values(options, role_defaults(role), task_vars)
            checked += len(values)
            lines.extend("%s: %s" % (host, line) for line in self._problems(role, options, values))
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
            elif isinstance(default, str) and "{{" in default and "lookup(" not in default:
                raw = trust_as_template(default)
            else:
                continue
            try:
                values[name] = self._templar.template(raw)
            except AnsibleError:
                continue  # undefined here: the role reports it with its own context when it runs
        return values

    @staticmethod
    def _problems(role: str, options: dict[str, dict], values: dict[str, Any]) -> list[str]:
        problems = value_rules.problems(values, role_rules(role))
        found = [str(problem) for problem in problems]
        # Types and choices of the values that passed their rules (a message may quote a value).
        typed = {
            name: value for name, value in values.items() if name not in {problem.variable for problem in problems}
        }
        validator = ArgumentSpecValidator({name: type_spec(options[name]) for name in typed})
        for error in validator.validate(typed).errors:
            found.append("%s (role %s, meta/argument_specs.yml)" % (_one_line(error.msg), role))
        return found


def _one_line(text: str) -> str:
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in text)
