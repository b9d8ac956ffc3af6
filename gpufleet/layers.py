"""The layer registry (playbooks/vars/layers.yml) as Python: names, order, owning roles, playbooks and what is
built on what."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from gpufleet import PROJECT_ROOT

REGISTRY = PROJECT_ROOT / "playbooks" / "vars" / "layers.yml"


@dataclass(frozen=True)
class Layer:
    name: str
    playbook: str | None
    provided_by: str | None
    needed_by: tuple[str, ...]
    # The role that owns the layer, and its task file that compares it (drift/layer.yml includes it).
    role: str
    drift_tasks: str = "drift.yml"

    @property
    def drift_file(self) -> Path:
        """roles/<role>/tasks/<drift_tasks>: the task file drift.yml runs for this layer."""
        return PROJECT_ROOT / "roles" / self.role / "tasks" / self.drift_tasks


@lru_cache(maxsize=1)
def registry() -> tuple[Layer, ...]:
    entries = yaml.safe_load(REGISTRY.read_text())["gpufleet_layers"]
    return tuple(
        Layer(
            entry["name"],
            entry.get("playbook"),
            entry.get("provided_by"),
            tuple(entry.get("needed_by", ())),
            entry["role"],
            entry.get("drift_tasks", "drift.yml"),
        )
        for entry in entries
    )


def names() -> tuple[str, ...]:
    """Every layer, in provisioning order (what drift compares)."""
    return tuple(layer.name for layer in registry())


def rebuildable() -> tuple[str, ...]:
    """Layers with a playbook, in provisioning order (what rebuild can run)."""
    return tuple(layer.name for layer in registry() if layer.playbook)


def provided_by() -> dict[str, str]:
    """Drift-only layer -> the layer whose run repairs it."""
    return {layer.name: layer.provided_by for layer in registry() if layer.provided_by}


def dependents() -> dict[str, tuple[str, ...]]:
    """Layer -> the layers built on it."""
    return {layer.name: layer.needed_by for layer in registry() if layer.playbook}
