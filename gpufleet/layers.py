"""The layer registry (playbooks/vars/layers.yml) as Python: names, order, playbooks and what is built on what."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import yaml

from gpufleet import PROJECT_ROOT

REGISTRY = PROJECT_ROOT / "playbooks" / "vars" / "layers.yml"


@dataclass(frozen=True)
class Layer:
    name: str
    playbook: str | None
    provided_by: str | None
    needed_by: tuple[str, ...]


@lru_cache(maxsize=1)
def registry() -> tuple[Layer, ...]:
    entries = yaml.safe_load(REGISTRY.read_text())["gpufleet_layers"]
    return tuple(Layer(entry["name"], entry.get("playbook"), entry.get("provided_by"),
                       tuple(entry.get("needed_by", ()))) for entry in entries)


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
