# -*- coding: utf-8 -*-
"""What preflight checks for one host on the controller, given its variables already templated: the declared stack
(action stack_validate), every role's values against its argument specs and value rules (action role_values) and
each vLLM instance against its GPUs (action capacity_check).

The action plugins template a task's variables and call these functions; `gpufleet plan -i` templates each
distinct declaration of a fleet once, in one process, and calls the very same ones (issue 37: a plan of 1,000
hosts in seconds, where one task per host and fork cost minutes). Controller only; never shipped to nodes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import (
    gpu_memory,
    instance_capacity,
    stack_conflicts,
    stack_kb,
    stack_resolve,
    value_rules,
)

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
# The host variables stack validation reads; the role variables the stack owns are read only where the inventory
# sets them (preflight's plays load no role, so no role default is among them).
STACK_VARIABLES = (
    "gpufleet_mirror_url",
    "gpufleet_artifact_sha256",
    "cuda_toolkit_extra_versions",
    "inference_venv_stack_options",
    "pyenv_python_pyenv_version",
    "gpufleet_stack",
) + stack_conflicts.ROLE_VARIABLES
# What the type check keeps of an option's spec: required options and defaults belong to the role's own call.
SPEC_KEYS = ("type", "elements", "choices", "no_log")


def _plain(value: Any) -> Any:
    return stack_resolve.plain(value)


# --- the declared stack -----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def pyenv_default() -> str:
    """pyenv_python's default release, so preflight resolves pyenv's tarball as the role will."""
    return str(role_defaults("pyenv_python").get("pyenv_python_pyenv_version", ""))


def stack_result(variables: dict, host: str, groups: list, inventory_dir: str) -> dict:
    """stack_validate's result for a host whose STACK_VARIABLES (those it has) are `variables`, templated:
    failed and msg, or the chain and artifacts the stack installs."""
    inputs = stack_resolve.inputs_of(variables)
    if inputs["pyenv_version"] == "":
        inputs["pyenv_version"] = pyenv_default()
    outcome = stack_resolve.validate_and_resolve(inputs)
    report = outcome["report"]
    result: dict[str, Any] = {"changed": False}
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
        knowledge_base=stack_resolve.kb_dir(),
    )
    result["warnings"] = ["[%s] %s" % (item["link"], item["message"]) for item in report["warnings"]]
    if outcome["error"]:
        result.update(failed=True, msg=outcome["error"])
        return result
    resolved = outcome["resolved"]
    result["artifacts"] = resolved["artifacts"]
    result["chain"] = dict((key, value) for key, value in resolved.items() if key != "artifacts")
    plain = _plain(dict((name, variables[name]) for name in stack_conflicts.ROLE_VARIABLES if name in variables))
    found = stack_conflicts.conflicts(plain, resolved)
    result["conflicts"] = [stack_conflicts.describe(item, host, groups, inventory_dir) for item in found]
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


# --- every role's values ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def declared_roles() -> tuple:
    return tuple(sorted(path.parent.parent.name for path in ROLES_DIR.glob("*/meta/value_rules.yml")))


@functools.lru_cache(maxsize=None)
def role_options(role: str) -> dict:
    """Option name -> its spec, over every entry point of the role (the first declaration of a name wins)."""
    specs = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options: dict = {}
    for entry in specs.values():
        for name, spec in (entry.get("options") or {}).items():
            options.setdefault(name, spec)
    return options


@functools.lru_cache(maxsize=None)
def role_defaults(role: str) -> dict:
    """The role's defaults/main.yml: the one place an option's default is written (the argument specs document
    the plain ones and name the file for the computed ones)."""
    path = ROLES_DIR / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


@functools.lru_cache(maxsize=None)
def role_rules(role: str) -> dict:
    return yaml.safe_load((ROLES_DIR / role / "meta" / "value_rules.yml").read_text()) or {}


@functools.lru_cache(maxsize=None)
def role_rules_by_option(role: str) -> dict:
    """The role's value rules, by the option each applies to: a value is checked against its own option's only."""
    grouped: dict = {}
    for path, rule in role_rules(role).items():
        grouped.setdefault(value_rules.parse_rule_path(path)[0], {})[path] = rule
    return grouped


def derived_default(default: Any) -> bool:
    """A default built from other variables (gpufleet_snapshot_dir, gpufleet_mirror_url): checked though the
    inventory does not set it. One that looks something up is the role's own business when it runs."""
    return isinstance(default, str) and "{{" in default and "lookup(" not in default


def type_spec(spec: dict) -> dict:
    """The part of an option's spec that checks types and choices, nested options included."""
    kept: dict = {key: spec[key] for key in SPEC_KEYS if key in spec}
    if isinstance(kept.get("choices"), str):  # a templated choice list is the role's own business
        del kept["choices"]
    if spec.get("options"):
        kept["options"] = {name: type_spec(option) for name, option in spec["options"].items()}
    return kept


def role_problems(role: str, values: dict) -> list:
    """One line per value of `values` (option -> templated value) that breaks the role's value rules, or,
    passing them, its types and choices."""
    options = role_options(role)
    rules = role_rules_by_option(role)
    problems = value_rules.problems(
        values, dict((path, rule) for name in values for path, rule in rules.get(name, {}).items())
    )
    found = [str(problem) for problem in problems]
    # Types and choices of the values that passed their rules (a message may quote a value).
    typed = {name: value for name, value in values.items() if name not in {problem.variable for problem in problems}}
    validator = ArgumentSpecValidator({name: type_spec(options[name]) for name in typed})
    for error in validator.validate(typed).errors:
        found.append("%s (role %s, meta/argument_specs.yml)" % (_one_line(error.msg), role))
    return found


def _one_line(text: str) -> str:
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in text)


# --- each instance against its GPUs -----------------------------------------------------------------------------


def stack_gpus(stack: dict, directory: str) -> tuple:
    """The memory of each GPU the stack declares, or ([], why one has none)."""
    try:
        normalized = stack_spec.normalize_stack(stack)
        if not normalized["gpu"]:
            return [], ""
        kb = stack_kb.load_kb(directory)
        rows = gpu_memory.read_rows(directory)
    except (stack_spec.StackError, stack_kb.KnowledgeBaseError, gpu_memory.GpuMemoryError) as error:
        return [], str(error)
    index = KbIndex(kb)
    memories = []
    for entry in normalized["gpu"]:
        resolved = index.resolve_gpu(entry)
        if resolved is None or resolved["row"] is None:
            return [], (
                "GPU %r is declared by compute capability or unknown: the planner needs a GPU model with a memory "
                "figure in data/compat/gpu_memory.csv (or capacity_check: false)" % entry
            )
        try:
            memories.append(gpu_memory.memory_of(rows, resolved["row"]["match"], entry))
        except gpu_memory.GpuMemoryError as error:
            return [], str(error)
    return memories, ""


def capacity_checks(stack: Any, instances: list, defaults: dict, models: list, directory: str) -> tuple:
    """(each instance's verdict, the stack's GPUs) for a host's templated declarations."""
    stack = _plain(stack)
    gpus, gpu_problem = stack_gpus(stack, directory)
    checks = instance_capacity.check_instances(
        _plain(instances),
        _plain(defaults),
        _plain(models),
        gpus,
        str(stack.get("vllm") or ""),
        gpu_problem,
    )
    return checks, gpus


def capacity_result(host: str, checks: list, gpus: list) -> dict:
    """capacity_check's result before any start: every verdict, the GPUs, and failed naming each instance that
    cannot start."""
    result: dict[str, Any] = {
        "changed": False,
        "capacity": [check.as_dict() for check in checks],
        "gpus": [
            {
                "gpu": "%s %s" % (gpu.match, gpu.variant),
                "cuda_total_bytes": gpu.cuda_total_bytes,
                "assumed": gpu.assumed,
                "status": gpu.status,
                "source": gpu.source,
            }
            for gpu in gpus
        ],
    }
    failing = [check for check in checks if check.status in ("does_not_fit", "refused")]
    if failing:
        result.update(
            failed=True,
            msg=" | ".join("%s: instance %s: %s" % (host, check.instance, check.message) for check in failing),
        )
    else:
        result["msg"] = "%d instance(s): %s" % (
            len(checks),
            "; ".join("%s %s" % (check.instance, check.status) for check in checks) or "none declared",
        )
    return result
