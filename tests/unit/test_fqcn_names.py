"""gpufleet's own modules, filters and lookups are called by their full names (gpufleet.fleet.NAME): the checkout
has no library or plugin paths, so a short name fails, and a filter or lookup only when a run templates it."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from gpufleet import PROJECT_ROOT

PLUGINS = PROJECT_ROOT / "plugins"
MODULES = sorted(path.stem for path in (PLUGINS / "modules").glob("*.py"))
LOOKUPS = sorted(path.stem for path in (PLUGINS / "lookup").glob("*.py"))


def filter_names() -> list[str]:
    """The names each filter plugin's FilterModule.filters() returns (its dict literal's keys)."""
    names = []
    for path in (PLUGINS / "filter").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "filters":
                returned = next(item for item in ast.walk(node) if isinstance(item, ast.Return))
                names += [key.value for key in returned.value.keys]
    return sorted(names)


def content_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "playbooks", "roles", "molecule", "inventories"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [PROJECT_ROOT / name for name in listed if re.search(r"\.(ya?ml|j2)$", name)]


def short_names(text: str) -> list[str]:
    found = re.findall(r"^[ \t]*-?[ \t]*(%s):[ \t]*(?:#.*)?$" % "|".join(MODULES), text, flags=re.M)
    found += re.findall(r"(?:lookup|query)\(\s*['\"](%s)['\"]" % "|".join(LOOKUPS), text)
    found += re.findall(r"\|\s*(%s)\b" % "|".join(filter_names()), text)
    return found


def test_the_scan_knows_gpufleet_plugins_and_catches_short_names() -> None:
    assert {"drift_probe", "gpufleet_stack", "cordon_record"} <= set(MODULES) | set(LOOKUPS) | set(filter_names())
    text = "- drift_probe:\n    x: \"{{ lookup('gpufleet_stack', 'venv') | cordon_record }}\"\n"
    assert short_names(text) == ["drift_probe", "gpufleet_stack", "cordon_record"]
    assert (
        short_names(
            text.replace("drift_probe", "gpufleet.fleet.drift_probe")
            .replace("'gpufleet_stack'", "'gpufleet.fleet.gpufleet_stack'")
            .replace("| cordon_record", "| gpufleet.fleet.cordon_record")
        )
        == []
    )


def test_playbooks_roles_and_scenarios_use_full_names() -> None:
    found = {
        str(path.relative_to(PROJECT_ROOT)): names
        for path in content_files()
        if (names := short_names(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def ad_hoc_short_names(text: str) -> list[str]:
    """Modules run by short name from code: testinfra's host.ansible("X"), argv ["-m", "X"], a shell `-m X`."""
    names = "|".join(MODULES)
    return re.findall(r"""(?:host\.ansible\(\s*|["']-m["'],\s*)["'](%s)["']""" % names, text) + re.findall(
        r"-m[ \t]+(%s)\b" % names, text
    )


def test_tests_and_scripts_run_gpufleet_modules_by_full_name() -> None:
    # A short name here fails only when the testinfra check, lab test or device script runs (the python_stack
    # scenario's torch_stack_info check and the fabric manager lab test did, after the checkout lost its
    # library path).
    assert ad_hoc_short_names(
        'host.ansible("torch_stack_info", "venv=x") ["-m", "nvidia_fabric_manager"] -m '
        "gpu_health -m gpufleet.fleet.gpu_health"
    ) == ["torch_stack_info", "nvidia_fabric_manager", "gpu_health"]
    listed = subprocess.run(
        ["git", "ls-files", "molecule", "tests/integration", "scripts", "bench"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = {
        name: hits
        for name in listed
        if re.search(r"\.(py|sh)$", name)
        if (hits := ad_hoc_short_names((PROJECT_ROOT / name).read_text(encoding="utf-8")))
    }
    assert found == {}
