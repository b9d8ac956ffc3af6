"""The layer contract: every role of the layer registry (playbooks/vars/layers.yml) declares the entry points the
fleet operations call — main (converge), drift (read-only compare), reset (clear for a rebuild), snapshot (keep
what serves now) and restore (put it back) — in its meta/argument_specs.yml, with the task file beside it; every
`tasks_from:` anywhere names a declared entry point; and no role's private variable (`__<role>_...`) is read
outside its role. Derived from the files: nothing here lists which role has which entry point."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "tasks").is_dir())
LAYER_ROLES = sorted(
    {layer["role"] for layer in yaml.safe_load((ROOT / "playbooks/vars/layers.yml").read_text())["gpufleet_layers"]}
)
CONTRACT = ("main", "drift", "reset", "snapshot", "restore")
YAML_FILES = sorted(
    [*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/handlers/*.yml")]
)


def entry_points(role: str) -> set[str]:
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return set(specs)


def include_roles(node: object) -> list[tuple[dict, object]]:
    """Every include_role/import_role argument mapping in a parsed YAML document, with its task's loop."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("ansible.builtin.include_role", "ansible.builtin.import_role") and isinstance(value, dict):
                found.append((value, node.get("loop")))
            found.extend(include_roles(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(include_roles(item))
    return found


def test_the_registry_has_layer_roles() -> None:
    assert {"vllm_service", "nvidia_driver", "inference_proxy"} <= set(LAYER_ROLES)


@pytest.mark.parametrize("role", LAYER_ROLES)
def test_every_layer_role_declares_the_contract_with_its_task_files(role: str) -> None:
    declared = entry_points(role)
    missing = [name for name in CONTRACT if name not in declared]
    assert missing == [], f"{role} does not declare {missing} in meta/argument_specs.yml"
    absent = [name for name in CONTRACT if not (ROOT / "roles" / role / "tasks" / f"{name}.yml").is_file()]
    assert absent == [], f"{role} declares {absent} without roles/{role}/tasks/<entry point>.yml"


@pytest.mark.parametrize("role", ROLES)
def test_every_declared_entry_point_has_its_task_file(role: str) -> None:
    for name in entry_points(role):
        assert (ROOT / "roles" / role / "tasks" / f"{name}.yml").is_file(), f"{role} declares {name} without its file"


def test_every_tasks_from_names_a_declared_entry_point() -> None:
    checked, wrong = 0, []
    for path in YAML_FILES:
        for call, loop in include_roles(yaml.safe_load(path.read_text())):
            target = call.get("tasks_from")
            if target is None or "{{" in str(target):
                continue
            name = str(target).removesuffix(".yml")
            # A role named by a template is each role of a literal loop, else any layer role (the registry's loops).
            if "{{" not in str(call["name"]):
                roles = [str(call["name"]).split(".")[-1]]
            else:
                roles = [str(item) for item in loop] if isinstance(loop, list) else LAYER_ROLES
            for role in roles:
                checked += 1
                if name not in entry_points(role):
                    wrong.append(f"{path.relative_to(ROOT)}: {role} tasks_from {target}")
    assert checked > 20
    assert wrong == [], "tasks_from names an entry point the role does not declare: " + "; ".join(wrong)


def test_no_private_variable_is_read_outside_its_role() -> None:
    pattern = re.compile(r"\b__(%s)_[a-z0-9_]+" % "|".join(ROLES))
    leaks = []
    for path in sorted(
        [*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/*/**/*.yml"), *ROOT.glob("roles/*/**/*.j2")]
    ):
        relative = path.relative_to(ROOT)
        owner = relative.parts[1] if relative.parts[0] == "roles" else None
        for match in pattern.finditer(path.read_text()):
            if match.group(1) != owner:
                leaks.append(f"{relative}: {match.group(0)}")
    assert leaks == [], "private variables read outside their role: " + "; ".join(sorted(set(leaks)))
