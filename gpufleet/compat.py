"""The controller side of the version-chain check: load the knowledge base and the one validator.

The validator lives in the collection (plugins/module_utils/stack_spec.py reads a stack, which modules ship to
hosts; plugins/plugin_utils/stack_declared.py checks it, on the controller only); the CLI imports those very files
(not copies) by their collection path.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from gpufleet import collection
from gpufleet.errors import GpufleetError

INVALID_EXIT_CODE = 2


def load_module_util(name: str) -> ModuleType:
    """plugins/module_utils/<name>.py of the collection."""
    return collection.module_util(name)


def load_plugin_util(name: str) -> ModuleType:
    """plugins/plugin_utils/<name>.py of the collection (controller-only code)."""
    return collection.plugin_util(name)


def stack_spec() -> ModuleType:
    """The stack description's checker (plugins/module_utils/stack_spec.py: normalize_stack, StackError)."""
    return load_module_util("stack_spec")


def stack_declared() -> ModuleType:
    """The declared stack's validator (plugins/plugin_utils/stack_declared.py: validate_stack)."""
    return load_plugin_util("stack_declared")


def stack_kb() -> ModuleType:
    """The knowledge-base loader (plugins/plugin_utils/stack_kb.py)."""
    return load_plugin_util("stack_kb")


def kb_dir_from_env() -> Path:
    """The knowledge base directory: $GPUFLEET_COMPAT_DIR or data/compat in the collection."""
    return Path(os.environ.get("GPUFLEET_COMPAT_DIR") or stack_kb().default_kb_dir())


def load_knowledge_base(kb_dir: Path | None = None) -> dict[str, Any]:
    """Load all knowledge-base tables; a broken knowledge base is an operator error, not a traceback."""
    kb_module = stack_kb()
    try:
        return kb_module.load_kb(str(kb_dir or kb_dir_from_env()))
    except kb_module.KnowledgeBaseError as error:
        raise GpufleetError(f"{error}; restore data/compat from git or run scripts/refresh_compat.py") from error


def read_stack_file(path: Path) -> dict[str, Any]:
    """Parse a stack YAML file into a normalised stack dict; every problem is one GpufleetError line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise GpufleetError(f"stack file {path} does not exist", INVALID_EXIT_CODE) from error
    except (OSError, UnicodeDecodeError) as error:
        raise GpufleetError(f"cannot read stack file {path}: {error}", INVALID_EXIT_CODE) from error
    try:
        raw = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise GpufleetError(
            f"stack file {path} is not valid YAML{where}: {error.problem}; fix the syntax", INVALID_EXIT_CODE
        ) from error
    except yaml.YAMLError as error:
        raise GpufleetError(f"stack file {path} is not valid YAML: {error}", INVALID_EXIT_CODE) from error
    spec = stack_spec()
    try:
        return spec.normalize_stack(raw)
    except spec.StackError as error:
        raise GpufleetError(f"stack file {path}: {error}", INVALID_EXIT_CODE) from error
