"""playbooks/drift.yml is read-only by construction: every play in check mode, and every task of it and of
every task file it includes (the layers' task files in their roles, the roles' preflights) uses a read-only
module only.

The walk follows include_tasks/import_tasks (a templated layer file name is expanded for every layer the
play lists; inside a role, relative to its tasks/), include_role/import_role (tasks_from is required: a whole
role could install things; a role with dependencies would run them too) and blocks with their rescue and
always parts. An include_role templated on the layer (drift/layer.yml's) is expanded for every layer the play
lists into the role and task file the layer registry names. It is tested against bad playbooks too, so it
cannot pass by finding nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from ansible.playbook.block import Block
from ansible.playbook.task import Task

from gpufleet import PROJECT_ROOT, layers
from gpufleet.drift import LAYERS

PLAYBOOK = PROJECT_ROOT / "playbooks" / "drift.yml"
ROLES = PROJECT_ROOT / "roles"

# Modules that only read (or only run on the controller without touching the host), by their FQCN.
READ_ONLY_MODULES = frozenset(
    {
        f"gpufleet.fleet.{name}"
        for name in (
            "drift_probe",
            "drift_result",
            "gpu_health",
            "nvidia_fabric_manager",
            "nvidia_gpu_info",
            "torch_stack_info",
            "stack_host_check",
            "stack_validate",
            "role_values",
        )
    }
    | {
        "ansible.builtin.assert",
        "ansible.builtin.debug",
        "ansible.builtin.fail",
        "ansible.builtin.set_fact",
        "ansible.builtin.include_vars",
        "ansible.builtin.setup",
        "ansible.builtin.stat",
        "ansible.builtin.getent",
        "ansible.builtin.slurp",
        "ansible.builtin.service_facts",
        "ansible.builtin.package_facts",
    }
)
INCLUDES = frozenset({"ansible.builtin.include_tasks", "ansible.builtin.import_tasks"})
ROLE_INCLUDES = frozenset({"ansible.builtin.include_role", "ansible.builtin.import_role"})
KEYWORDS = frozenset(Task.fattributes) | frozenset(Block.fattributes) | {"local_action"}


def fqcn(name: str) -> str:
    """`stat` and `ansible.legacy.stat` are ansible.builtin.stat (gpufleet's own modules are called by FQCN)."""
    if "." not in name or name.startswith("ansible.legacy."):
        return "ansible.builtin." + name.split(".")[-1]
    return name


# Layer -> (role, task file) that compares it, from the layer registry (playbooks/vars/layers.yml).
REGISTRY = {layer.name: (layer.role, layer.drift_tasks) for layer in layers.registry()}


@dataclass
class Walk:
    """What the walk found: modules per file, and every problem. `roles` is where roles are looked up,
    `registry` what a layer-templated include_role expands to."""

    modules: dict[str, set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    files: set[Path] = field(default_factory=set)
    roles: Path = ROLES
    registry: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(REGISTRY))


def task_module(task: dict, where: str, walk: Walk) -> str | None:
    candidates = [key for key in task if key not in KEYWORDS and not key.startswith("with_")]
    if len(candidates) != 1:
        walk.problems.append(f"{where}: cannot tell the module of task {task.get('name')!r} (keys {candidates})")
        return None
    return fqcn(candidates[0])


def walk_tasks(tasks: list, path: Path, layers: list[str], walk: Walk) -> None:
    for task in tasks or []:
        where = f"{path.relative_to(PROJECT_ROOT)}: {task.get('name', '?')}"
        if task.get("check_mode") is False or str(task.get("check_mode")).lower() == "false":
            walk.problems.append(f"{where}: check_mode: false would let the task write")
        if "notify" in task:
            walk.problems.append(f"{where}: notifies a handler")
        if "block" in task:
            for part in ("block", "rescue", "always"):
                walk_tasks(task.get(part), path, layers, walk)
            continue
        module = task_module(task, where, walk)
        if module is None:
            continue
        walk.modules.setdefault(str(path.relative_to(PROJECT_ROOT)), set()).add(module)
        if module in INCLUDES:
            for included in expand(task[next(k for k in task if fqcn(k) == module)], path, layers):
                walk_file(included, layers, walk)
        elif module in ROLE_INCLUDES:
            walk_role(task[next(k for k in task if fqcn(k) == module)], where, layers, walk)
        elif module not in READ_ONLY_MODULES:
            walk.problems.append(f"{where}: module {module} is not read-only")


def expand(argument, path: Path, layers: list[str]) -> list[Path]:
    name = argument if isinstance(argument, str) else argument.get("file")
    names = [name.replace("{{ drift_layer }}", layer) for layer in layers] if "{{ drift_layer }}" in name else [name]
    return [path.parent / item for item in names]


def templated(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def walk_role(argument: dict, where: str, layers: list[str], walk: Walk) -> None:
    if not isinstance(argument, dict) or "tasks_from" not in argument:
        walk.problems.append(f"{where}: includes a whole role; only tasks_from (its preflight) may be included")
        return
    if templated(argument.get("name")) or templated(argument["tasks_from"]):
        # drift/layer.yml: the role and task file of each layer (test_the_layer_file_dispatches_through_the_registry
        # pins what the templates say).
        targets = []
        for layer in layers:
            if layer not in walk.registry:
                walk.problems.append(f"{where}: layer {layer} names no role in the layer registry")
                continue
            targets.append(walk.registry[layer])
    else:
        tasks_from = argument["tasks_from"]
        targets = [(argument["name"], tasks_from if tasks_from.endswith((".yml", ".yaml")) else tasks_from + ".yml")]
    for role, tasks_from in targets:
        meta = walk.roles / role / "meta" / "main.yml"
        if meta.is_file() and (yaml.safe_load(meta.read_text()) or {}).get("dependencies"):
            walk.problems.append(f"{where}: role {role} has dependencies, which including it would run")
        walk_file(walk.roles / role / "tasks" / tasks_from, layers, walk)


def walk_file(path: Path, layers: list[str], walk: Walk) -> None:
    if path in walk.files:
        return
    walk.files.add(path)
    if not path.is_file():
        walk.problems.append(f"{path.relative_to(PROJECT_ROOT)} is included but does not exist")
        return
    walk_tasks(yaml.safe_load(path.read_text()) or [], path, layers, walk)


def walk_playbook(path: Path, roles: Path = ROLES, registry: dict[str, tuple[str, str]] | None = None) -> Walk:
    walk = Walk(roles=roles, registry=dict(REGISTRY if registry is None else registry))
    for play in yaml.safe_load(path.read_text()):
        if play.get("check_mode") is not True:
            walk.problems.append(f"play {play.get('name')!r} does not set check_mode: true")
        # drift_layers defaults to every layer of the registry (vars/layers.yml, read through vars_files).
        declared = (play.get("vars") or {}).get("drift_layers")
        layers = list(declared) if isinstance(declared, list) else list(LAYERS)
        for part in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            walk_tasks(play.get(part), path, layers, walk)
        if play.get("roles"):
            walk.problems.append(f"play {play.get('name')!r} runs whole roles")
    return walk


def layer_file(layer: str) -> Path:
    role, tasks_from = REGISTRY[layer]
    return ROLES / role / "tasks" / tasks_from


def test_drift_playbook_uses_read_only_modules_only() -> None:
    walk = walk_playbook(PLAYBOOK)
    assert walk.problems == []
    layer_files = {str(layer_file(layer).relative_to(PROJECT_ROOT)) for layer in LAYERS}
    assert layer_files <= set(walk.modules), "every layer's task file is walked"
    assert (
        "roles/base/tasks/drift.yml" in layer_files and "roles/nvidia_driver/tasks/gpu_health_drift.yml" in layer_files
    )
    # The walk reached into the roles' preflights, and drift_probe compares the declared layers.
    assert any(name.startswith("roles/") and name.endswith("/tasks/preflight.yml") for name in walk.modules)
    assert {"gpufleet.fleet.drift_probe", "gpufleet.fleet.drift_result"} <= set().union(*walk.modules.values())


def test_the_playbook_compares_every_layer_of_the_registry() -> None:
    play = yaml.safe_load(PLAYBOOK.read_text())[0]
    assert play["vars_files"] == ["vars/layers.yml"]
    assert play["vars"]["drift_layers"] == "{{ gpufleet_layers | map(attribute='name') | list }}"
    assert all(layer_file(layer).is_file() for layer in LAYERS)
    # Each layer's drift lives with its role: none is left under playbooks/drift/layers/.
    assert not (PROJECT_ROOT / "playbooks" / "drift" / "layers").exists()


def test_the_layer_file_dispatches_through_the_registry() -> None:
    # What the walk's expansion of a templated include_role stands for: the role and task file of the layer.
    (task,) = yaml.safe_load((PROJECT_ROOT / "playbooks" / "drift" / "layer.yml").read_text())
    assert task["vars"] == {
        "__drift_layer": "{{ gpufleet_layers | selectattr('name', 'equalto', drift_layer) | first }}"
    }
    (include,) = task["block"]
    assert include["ansible.builtin.include_role"] == {
        "name": "{{ __drift_layer.role }}",
        "tasks_from": "{{ __drift_layer.drift_tasks | default('drift.yml') }}",
    }
    assert all(layer.drift_file.is_file() for layer in layers.registry())


def write(tmp: Path, name: str, document: object) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture
def scratch() -> Path:
    # Inside the project so that problems print relative paths, removed afterwards.
    directory = PROJECT_ROOT / "playbooks" / ".test-drift-lint"
    directory.mkdir(exist_ok=True)
    yield directory
    for path in sorted(directory.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    directory.rmdir()


def test_the_walk_finds_a_writing_module_in_an_included_layer(scratch: Path) -> None:
    write(
        scratch, "layers/base.yml", [{"name": "a sneaky write", "ansible.builtin.copy": {"dest": "/x", "content": ""}}]
    )
    play = {
        "name": "p",
        "hosts": "all",
        "check_mode": True,
        "vars": {"drift_layers": ["base"]},
        "tasks": [
            {"name": "t", "block": [{"name": "i", "ansible.builtin.include_tasks": "layers/{{ drift_layer }}.yml"}]}
        ],
    }
    walk = walk_playbook(write(scratch, "drift.yml", [play]))
    assert walk.problems == [
        "playbooks/.test-drift-lint/layers/base.yml: a sneaky write: module ansible.builtin.copy is not read-only"
    ]


def test_the_walk_refuses_check_mode_off_whole_roles_and_plays_outside_check_mode(scratch: Path) -> None:
    tasks = [
        {"name": "off", "stat": {"path": "/"}, "check_mode": False},
        {"name": "role", "ansible.builtin.include_role": {"name": "base"}},
        {"name": "cmd", "command": "true"},
    ]
    walk = walk_playbook(write(scratch, "drift.yml", [{"name": "p", "hosts": "all", "tasks": tasks}]))
    assert walk.problems == [
        "play 'p' does not set check_mode: true",
        "playbooks/.test-drift-lint/drift.yml: off: check_mode: false would let the task write",
        "playbooks/.test-drift-lint/drift.yml: role: includes a whole role; only tasks_from (its preflight) may be included",
        "playbooks/.test-drift-lint/drift.yml: cmd: module ansible.builtin.command is not read-only",
    ]


def sneaky_role(scratch: Path, name: str, drift_tasks: list) -> Path:
    """A role under scratch/roles whose tasks/drift.yml is drift_tasks, beside a preflight that writes."""
    roles = scratch / "roles"
    write(roles / name / "tasks", "drift.yml", drift_tasks)
    write(
        roles / name / "tasks",
        "preflight.yml",
        [{"name": "a sneaky write", "ansible.builtin.copy": {"dest": "/x", "content": ""}}],
    )
    write(roles / name / "meta", "main.yml", {"dependencies": []})
    return roles


def layer_play(scratch: Path) -> Path:
    """drift.yml's play over layer `base`, dispatching as drift/layer.yml does."""
    task = yaml.safe_load((PROJECT_ROOT / "playbooks" / "drift" / "layer.yml").read_text())
    write(scratch, "drift/layer.yml", task)
    play = {
        "name": "p",
        "hosts": "all",
        "check_mode": True,
        "vars": {"drift_layers": ["base"]},
        "tasks": [{"name": "t", "ansible.builtin.include_tasks": "drift/layer.yml"}],
    }
    return write(scratch, "drift.yml", [play])


def test_the_walk_follows_the_layer_into_its_role_and_finds_a_write_there(scratch: Path) -> None:
    roles = sneaky_role(
        scratch,
        "sneaky",
        [
            {"name": "sneaky: check", "block": [{"name": "pre", "ansible.builtin.include_tasks": "preflight.yml"}]},
            {"name": "sneaky: probe", "gpufleet.fleet.drift_probe": {"layer": "base", "checks": []}},
        ],
    )
    walk = walk_playbook(layer_play(scratch), roles=roles, registry={"base": ("sneaky", "drift.yml")})
    assert walk.problems == [
        "playbooks/.test-drift-lint/roles/sneaky/tasks/preflight.yml: a sneaky write: "
        "module ansible.builtin.copy is not read-only"
    ]
    assert "playbooks/.test-drift-lint/roles/sneaky/tasks/drift.yml" in walk.modules


def test_the_walk_refuses_a_layer_without_a_role_and_a_role_with_dependencies(scratch: Path) -> None:
    roles = sneaky_role(scratch, "needy", [{"name": "probe", "gpufleet.fleet.drift_result": {"layer": "base"}}])
    write(roles / "needy" / "meta", "main.yml", {"dependencies": ["base"]})
    assert walk_playbook(layer_play(scratch), roles=roles, registry={}).problems == [
        "playbooks/.test-drift-lint/drift/layer.yml: Run the checks of layer {{ drift_layer }}: "
        "layer base names no role in the layer registry"
    ]
    assert walk_playbook(layer_play(scratch), roles=roles, registry={"base": ("needy", "drift.yml")}).problems == [
        "playbooks/.test-drift-lint/drift/layer.yml: Run the checks of layer {{ drift_layer }}: "
        "role needy has dependencies, which including it would run"
    ]


def test_the_walk_follows_role_preflights(scratch: Path) -> None:
    tasks = [{"name": "pre", "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "install.yml"}}]
    walk = walk_playbook(
        write(scratch, "drift.yml", [{"name": "p", "hosts": "all", "check_mode": True, "tasks": tasks}])
    )
    # The driver role's install file installs the driver: the walk must see that.
    assert any("nvidia_runfile is not read-only" in problem for problem in walk.problems), walk.problems


def fabric_manager_reads(tasks: list) -> list[str]:
    """The tasks of a layer file (blocks included) that read the fabric manager: nvidia_fabric_manager itself,
    or a drift_probe check of kind fabric_manager."""
    found = []
    for task in tasks or []:
        if "block" in task:
            found += [name for part in ("block", "rescue", "always") for name in fabric_manager_reads(task.get(part))]
            continue
        checks = (task.get("gpufleet.fleet.drift_probe") or {}).get("checks") or []
        # A templated check list (a string) is searched as text.
        kinds = [check.get("kind") for check in checks if isinstance(check, dict)] if isinstance(checks, list) else []
        if (
            "gpufleet.fleet.nvidia_fabric_manager" in task
            or "fabric_manager" in kinds
            or isinstance(checks, str)
            and "fabric_manager" in checks
        ):
            found.append(task["name"])
    return found


def test_one_layer_owns_the_fabric_manager() -> None:
    # The driver layer installs it with the driver and its rebuild repairs it; a second reader (gpu_health did)
    # reports one wrong fabric manager twice, once as a layer whose rebuild is the driver's anyway.
    reads = {layer: fabric_manager_reads(yaml.safe_load(layer_file(layer).read_text())) for layer in LAYERS}
    assert {layer: names for layer, names in reads.items() if names} == {
        "driver": ["Layer driver: compare with the node"]
    }
