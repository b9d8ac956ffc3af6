"""Which layers `gpufleet rebuild` runs, from a drift report of the node."""

from __future__ import annotations

from gpufleet.drift_rebuild import plan_rebuild
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import FleetReport, ReportBuilder

ALL = ["base", "driver", "gpu_health", "toolkit", "python", "venv", "kernels", "model", "ray_cluster", "serve", "proxy"]


def report(
    statuses: dict[str, str],
    drift: dict[str, list[dict]] | None = None,
    unreachable: bool = False,
    not_declared: tuple[str, ...] = ("proxy",),
    layers: list[str] = ALL,
) -> FleetReport:
    builder = ReportBuilder()
    builder.record_plan("lab-1", layers)
    if unreachable:
        builder.record_unreachable("lab-1", "Connection refused")
        return builder.build()
    for layer in layers:
        status = "not_declared" if layer in not_declared else statuses.get(layer, "ok")
        builder.record_layer(
            "lab-1", {"layer": layer, "status": status, "drift": (drift or {}).get(layer, []), "checked": 1}
        )
    return builder.build()


def item(check: str, field: str, expected: str, actual: str) -> dict:
    return {"check": check, "field": field, "expected": expected, "actual": actual, "detail": ""}


def test_a_clean_node_needs_nothing() -> None:
    plan = plan_rebuild(report({}))
    assert plan.layers == [] and not plan.refused


def test_a_drifted_layer_brings_the_layers_built_on_it_and_serve() -> None:
    assert plan_rebuild(report({"toolkit": "drifted"})).layers == ["toolkit", "kernels", "serve"]
    assert plan_rebuild(report({"python": "drifted"})).layers == ["python", "venv", "kernels", "serve"]
    assert plan_rebuild(report({"base": "error"})).layers == ["base", "model", "serve"]
    # gpu_health has no role: the driver layer (nvidia-persistenced) is what can bring it back.
    assert plan_rebuild(report({"gpu_health": "drifted"})).layers == ["driver", "serve"]


def test_layers_that_are_not_declared_are_never_rebuilt() -> None:
    plan = plan_rebuild(report({"venv": "drifted"}, not_declared=("kernels", "serve", "proxy")))
    assert plan.layers == ["venv"]
    # With the proxy declared, serve brings it along; a layer of a newer drift.yml has no playbook here yet.
    assert plan_rebuild(report({"model": "drifted"}, not_declared=())).layers == ["model", "serve", "proxy"]
    plan = plan_rebuild(report({"network": "drifted"}, layers=ALL + ["network"]))
    assert plan.layers == [] and plan.unrebuildable == ["network"]


def test_full_rebuilds_every_declared_layer_with_a_new_venv() -> None:
    plan = plan_rebuild(report({}, not_declared=("ray_cluster", "serve", "proxy")), full=True)
    assert plan.layers == ["base", "driver", "toolkit", "python", "venv", "kernels", "model"]
    assert plan.fresh_venv and plan.extravars(False)["rebuild_fresh_venv"] is True


def test_a_package_outside_the_lock_needs_a_new_venv_and_a_damaged_weight_a_new_staging() -> None:
    venv = [item("venv /opt/gpufleet/venvs/x", "package requests-mock", "absent (not in the lock)", "1.0")]
    model = [
        item("model tiny-qwen2", "file model.safetensors", "sha256:aaaa", "sha256:bbbb"),
        item("model tiny-qwen2-greedy", "generation_config.json", '{"temperature": 0.0}', '{"temperature": 0.5}'),
    ]
    plan = plan_rebuild(report({"venv": "drifted", "model": "drifted"}, {"venv": venv, "model": model}))
    assert plan.fresh_venv and plan.fresh_models == ["tiny-qwen2"]
    assert plan.extravars(False) == {
        "rebuild_layers": ["venv", "kernels", "model", "serve"],
        "rebuild_fresh_venv": True,
        "rebuild_fresh_models": ["tiny-qwen2"],
        "rebuild_reinstall": [],
        "rebuild_allow_many": False,
    }
    changed = [item("venv /opt/gpufleet/venvs/x", "package idna", "3.20", "2.0")]
    assert not plan_rebuild(report({"venv": "drifted"}, {"venv": changed})).fresh_venv


def test_reinstall_adds_its_layer_and_an_unreachable_node_is_refused() -> None:
    plan = plan_rebuild(report({}), reinstall=["driver"])
    assert plan.layers == ["driver", "serve"] and plan.reinstall == ["driver"]
    refused = plan_rebuild(report({}, unreachable=True))
    assert refused.refused == "lab-1 cannot be reached: nothing was rebuilt (Connection refused)"
