"""Imports flow one way (issue 30): the CLI (gpufleet/) uses the collection, never the reverse; code shipped to
nodes (modules, module_utils) imports no controller-only code; a plugin imports shared code from module_utils or
plugin_utils, never another plugin."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT

PLUGINS = PROJECT_ROOT / "plugins"
COLLECTION = "ansible_collections.gpufleet.fleet.plugins."
SHIPPED = ("modules", "module_utils")
SHARED = ("module_utils", "plugin_utils")


def imported(path: Path) -> Iterator[str]:
    """Every module name a Python file imports (absolute names; the collection's files use no relative ones)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            yield node.module or ""
            # `from ...plugins.module_utils import stack_spec` names the module in the alias.
            yield from (
                f"{node.module}.{alias.name}" for alias in node.names if node.module and "plugins" in node.module
            )


def plugin_files() -> list[Path]:
    return sorted(path for path in PLUGINS.rglob("*.py") if "__pycache__" not in path.parts)


def kind(module: str) -> str:
    """The plugin directory an ansible_collections.gpufleet.fleet.plugins.<kind>... name is in."""
    return module.removeprefix(COLLECTION).split(".")[0]


@pytest.mark.parametrize("path", plugin_files(), ids=lambda path: str(path.relative_to(PLUGINS)))
def test_the_collection_imports_no_cli_and_shipped_code_no_controller_code(path: Path) -> None:
    names = list(imported(path))
    assert not [name for name in names if name == "gpufleet" or name.startswith("gpufleet.")], "the CLI package"
    own = {kind(name) for name in names if name.startswith(COLLECTION)}
    here = path.relative_to(PLUGINS).parts[0]
    if here in SHIPPED:
        assert own <= {"module_utils"}, f"shipped to nodes, imports {sorted(own - {'module_utils'})}"
    else:
        assert own <= set(SHARED), f"a plugin imports another plugin: {sorted(own - set(SHARED))}"


def test_the_graph_sees_the_imports_it_checks() -> None:
    """The checks above read real imports: the callback's report model, the action's preflight checks."""
    callback = set(imported(PLUGINS / "callback" / "gpufleet_drift.py"))
    assert f"{COLLECTION}plugin_utils.drift_report" in callback
    action = set(imported(PLUGINS / "action" / "stack_validate.py"))
    assert f"{COLLECTION}plugin_utils.preflight_checks" in action


def role_shipped_module_utils() -> list[Path]:
    """module_utils a role copies to nodes as they are (nvidia_driver's GPU watchdog runs them as a service)."""
    named = {
        match.group(1)
        for path in (PROJECT_ROOT / "roles").glob("*/vars/*.yml")
        for match in re.finditer(r"plugins/module_utils/(\w+)\.py", path.read_text())
    }
    return sorted(PLUGINS / "module_utils" / f"{name}.py" for name in named)


def test_every_module_util_is_shipped_for_a_module() -> None:
    """module_utils is what modules (or a role's service) carry to nodes: a file none reaches (directly or through
    another) is controller-only and belongs in plugin_utils. The review found four (the stack validator's, issue
    30)."""
    reached: set[str] = {path.stem for path in role_shipped_module_utils()}
    todo = sorted((PLUGINS / "modules").glob("*.py")) + role_shipped_module_utils()
    while todo:
        for name in imported(todo.pop()):
            if kind(name) == "module_utils" and name.startswith(COLLECTION):
                util = name.removeprefix(f"{COLLECTION}module_utils").lstrip(".").split(".")[0]
                if util and util not in reached and (PLUGINS / "module_utils" / f"{util}.py").is_file():
                    reached.add(util)
                    todo.append(PLUGINS / "module_utils" / f"{util}.py")
    shipped = {path.stem for path in (PLUGINS / "module_utils").glob("*.py")}
    assert shipped - reached == set()


def test_a_role_ships_every_module_util_its_code_imports() -> None:
    """The GPU watchdog runs outside Ansible: each module_util its files import must be copied beside them."""
    shipped = {path.stem for path in role_shipped_module_utils()}
    assert shipped, "nvidia_driver's watchdog ships module_utils"
    for path in role_shipped_module_utils():
        for name in imported(path):
            if kind(name) == "module_utils" and name.startswith(COLLECTION):
                util = name.removeprefix(f"{COLLECTION}module_utils").lstrip(".").split(".")[0]
                assert not util or util in shipped, f"{path.name} imports {util}, which no role copies beside it"
