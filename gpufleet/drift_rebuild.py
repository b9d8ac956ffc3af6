"""Which layers a rebuild runs, from a drift report of the node: the ones that drifted or could not be
compared, and every layer built on them (a new Python means a new venv, a new venv new kernels, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet import layers as layer_registry
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import FleetReport, LayerResult

# From the layer registry (playbooks/vars/layers.yml): the layers playbooks/rebuild.yml can run, in provisioning
# order; the layer that repairs each drift-only layer; what is built on each layer and must follow it.
REBUILDABLE = layer_registry.rebuildable()
PROVIDED_BY = layer_registry.provided_by()
DEPENDENTS = layer_registry.dependents()
REINSTALLABLE = ("driver", "toolkit")
NEEDS_REBUILD = ("drifted", "error")
_NO_LAYER = LayerResult("not_declared")


@dataclass
class RebuildPlan:
    """The layers to rebuild, in order, and how."""

    layers: list[str] = field(default_factory=list)
    fresh_venv: bool = False
    fresh_models: list[str] = field(default_factory=list)
    reinstall: list[str] = field(default_factory=list)
    # Layers that need a rebuild no playbook can do yet.
    unrebuildable: list[str] = field(default_factory=list)
    reason: str = ""
    refused: str = ""

    def extravars(self, allow_many: bool) -> dict:
        return {
            "rebuild_layers": self.layers,
            "rebuild_fresh_venv": self.fresh_venv,
            "rebuild_fresh_models": self.fresh_models,
            "rebuild_reinstall": self.reinstall,
            "rebuild_allow_many": allow_many,
        }


def declared_layers(report: FleetReport) -> set[str]:
    """Layers some node of the report declares, as the rebuildable layer that provides them."""
    return {
        PROVIDED_BY.get(layer, layer)
        for node in report.nodes.values()
        for layer, result in node.layers.items()
        if result.status != "not_declared"
    }


def with_dependents(layers: set[str]) -> set[str]:
    result = set(layers)
    pending = list(layers)
    while pending:
        for dependent in DEPENDENTS.get(pending.pop(), ()):
            if dependent not in result:
                result.add(dependent)
                pending.append(dependent)
    return result


def untrusted_venv(report: FleetReport) -> bool:
    """A package installed outside the lock: the venv role leaves extras alone, so only a new venv drops it."""
    return any(
        item.field.startswith("package ") and str(item.expected).startswith("absent (not in the lock)")
        for node in report.nodes.values()
        for item in node.layers.get("venv", _NO_LAYER).drift
    )


def damaged_models(report: FleetReport) -> list[str]:
    """Models with a weight file that differs from its tarball: model_store trusts a staged version by its
    marker, so only staging it again from the verified tarball repairs it."""
    names = {
        item.check.removeprefix("model ")
        for node in report.nodes.values()
        for item in node.layers.get("model", _NO_LAYER).drift
        if item.check.startswith("model ") and item.field.startswith("file ")
    }
    return sorted(names)


def plan_rebuild(report: FleetReport, *, full: bool = False, reinstall: list[str] | None = None) -> RebuildPlan:
    """The rebuild the drift report calls for; refused when a node could not be reached."""
    reinstall = list(reinstall or [])
    unreachable = sorted(name for name, node in report.nodes.items() if node.status == "unreachable")
    if unreachable:
        return RebuildPlan(
            refused=f"{', '.join(unreachable)} cannot be reached: nothing was rebuilt "
            f"({report.nodes[unreachable[0]].message})"
        )
    declared = declared_layers(report) & set(REBUILDABLE)
    if full:
        wanted = set(declared)
    else:
        wanted = {
            PROVIDED_BY.get(layer, layer)
            for node in report.nodes.values()
            for layer, result in node.layers.items()
            if result.status in NEEDS_REBUILD
        }
    wanted |= set(reinstall)
    not_rebuildable = sorted(layer for layer in wanted if layer not in REBUILDABLE)
    wanted = with_dependents(wanted & set(REBUILDABLE)) & declared
    # Rebuilding stops the node's instances; the serve layer starts them again.
    if wanted and "serve" in declared:
        wanted.add("serve")
    fresh_venv = "venv" in wanted and (full or untrusted_venv(report))
    fresh_models = damaged_models(report) if "model" in wanted else []
    reason = "full rebuild" if full else "drifted layers and the layers built on them"
    if fresh_venv:
        reason += "; a new venv" + ("" if full else " (a package outside the lock is installed)")
    if fresh_models:
        reason += f"; models staged again from their tarballs: {', '.join(fresh_models)}"
    if not_rebuildable:
        reason += f"; no playbook rebuilds {', '.join(not_rebuildable)} yet"
    return RebuildPlan(
        [layer for layer in REBUILDABLE if layer in wanted],
        fresh_venv=fresh_venv,
        fresh_models=fresh_models,
        reinstall=reinstall,
        unrebuildable=not_rebuildable,
        reason=reason,
    )
