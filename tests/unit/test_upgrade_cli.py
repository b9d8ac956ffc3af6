"""`gpufleet upgrade` and `gpufleet cordon`: the checks made before any node is touched, the per-node plan
from a drift report, and the outcomes read from the playbook's events."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli import build_parser
from gpufleet.commands.upgrade import (
    OUTCOME_KEY,
    Outcomes,
    unavailable_budget,
    named_hosts,
    describe_plan,
    left_out,
    node_plans,
    parse_max_unavailable,
    report,
    unreachable_nodes,
)
from gpufleet.errors import GpufleetError
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import ReportBuilder

INVENTORY = """
all:
  children:
    gpu_nodes:
      children:
        h200:
          hosts:
            node-1: {}
            node-2: {}
            node-3: {}
"""


@pytest.fixture()
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return path


@pytest.mark.parametrize(
    ("text", "fleet", "expected"), [("1", 3, "1"), ("3", 3, "3"), ("50%", 4, "50%"), ("34%", 3, "34%")]
)
def test_max_unavailable_within_the_fleet(text: str, fleet: int, expected: str) -> None:
    assert parse_max_unavailable(text, fleet) == expected


@pytest.mark.parametrize(
    ("text", "fleet", "message"),
    [
        ("4", 3, "more than the 3 nodes"),
        ("0", 3, "1 or more"),
        ("two", 3, "a number of nodes"),
        ("10%", 3, "no node at all"),
        ("150%", 3, "more than all"),
    ],
)
def test_max_unavailable_beyond_the_fleet_is_refused(text: str, fleet: int, message: str) -> None:
    with pytest.raises(GpufleetError, match=message):
        parse_max_unavailable(text, fleet)


def test_named_hosts_and_an_unknown_node(inventory: Path) -> None:
    assert named_hosts(inventory, "node-1,node-3") == ["node-1", "node-3"]
    # Groups and patterns name no node one by one.
    assert named_hosts(inventory, "h200:!node-2") == []
    assert named_hosts(inventory, None) == []
    with pytest.raises(GpufleetError, match="node-9 is no node of"):
        named_hosts(inventory, "node-1,node-9")


UNTRUSTED_PACKAGE = {
    "check": "venv /opt/gpufleet/venvs/x",
    "field": "package requests-mock",
    "expected": "absent (not in the lock)",
    "actual": "1.0",
}
DAMAGED_WEIGHTS = {"check": "model tiny", "field": "file model.safetensors", "expected": "sha256 ab", "actual": "cd"}


def drift_report(
    drifted: dict[str, list[str]], unreachable: tuple[str, ...] = (), items: dict[str, list[dict]] | None = None
) -> object:
    builder = ReportBuilder()
    for node in ("node-1", "node-2"):
        builder.record_plan(node, ["venv", "model", "kernels", "serve", "proxy"])
        if node in unreachable:
            builder.record_unreachable(node, "Connection refused")
            continue
        for layer in ("venv", "model", "kernels", "serve", "proxy"):
            drift = (items or {}).get(f"{node} {layer}", [])
            status = "drifted" if layer in drifted.get(node, []) or drift else "ok"
            builder.record_layer(node, {"layer": layer, "status": status, "drift": drift, "checked": 1})
    return builder.build()


def test_each_node_gets_its_own_changed_layers() -> None:
    plans = node_plans(drift_report({"node-1": ["venv"], "node-2": ["serve"]}))
    assert {name: plan.layers for name, plan in plans.items()} == {
        "node-1": ["venv", "kernels", "serve", "proxy"],
        "node-2": ["serve", "proxy"],
    }
    assert {name: plan.layers for name, plan in node_plans(drift_report({})).items()} == {"node-1": [], "node-2": []}


def test_a_venv_it_cannot_trust_and_damaged_weights_are_built_again_not_only_their_layers_rerun() -> None:
    """Review M7: the upgrade kept only each node's layers, so a venv with a package outside the lock and a model
    whose weights differ from its tarball stayed, and the node was reported upgraded."""
    report = drift_report({}, items={"node-1 venv": [UNTRUSTED_PACKAGE], "node-2 model": [DAMAGED_WEIGHTS]})
    plans = node_plans(report)
    assert (plans["node-1"].fresh_venv, plans["node-1"].fresh_models) == (True, [])
    assert (plans["node-2"].fresh_venv, plans["node-2"].fresh_models) == (False, ["tiny"])
    assert describe_plan(plans["node-1"]) == "layers venv, kernels, serve, proxy (a new venv)"
    assert describe_plan(plans["node-2"]) == "layers model, serve, proxy (model tiny staged again)"


def test_an_unreachable_node_is_left_out_and_the_others_are_upgraded(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: one unreachable node stopped the upgrade of every node."""
    report = drift_report({"node-1": ["venv"]}, unreachable=("node-2",))
    unreachable = unreachable_nodes(report)
    assert unreachable == ["node-2"]
    assert left_out(["node-1", "node-2"], unreachable, all_or_nothing=False) == ["node-1"]
    assert "node-2: the drift check could not reach it: left out, not upgraded" in capsys.readouterr().out
    assert {name: plan.layers for name, plan in node_plans(report).items()} == {
        "node-1": ["venv", "kernels", "serve", "proxy"]
    }


def test_an_unreachable_node_stops_an_all_or_nothing_upgrade_before_it_starts() -> None:
    with pytest.raises(GpufleetError, match="node-2 cannot be reached, and the upgrade is all or nothing.*no node was"):
        left_out(["node-1", "node-2"], ["node-2"], all_or_nothing=True)
    with pytest.raises(GpufleetError, match=r"no node could be reached \(node-1, node-2\)"):
        left_out(["node-1", "node-2"], ["node-1", "node-2"], all_or_nothing=False)


def test_outcomes_are_read_from_the_playbooks_events(capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = Outcomes()
    outcome = {
        "node": "node-1",
        "status": "rolled_back",
        "layers": ["serve"],
        "seconds": 12.5,
        "reason": "vllm@main did not become ready",
        "state": "rolled back, serving",
    }
    # Read by the structured key gpufleet.fleet.upgrade_result returns, whatever the task is called.
    outcomes(
        {
            "event": "runner_on_ok",
            "event_data": {"task": "any name at all", "res": {OUTCOME_KEY: outcome, "ansible_facts": {}}},
        }
    )
    outcomes({"event": "runner_on_ok", "event_data": {"task": "Record the node's outcome", "res": {}}})
    assert outcomes.nodes == {"node-1": outcome}
    assert (
        "node-1: rolled_back (layers serve, 12.5 s) - vllm@main did not become ready; rolled back, serving"
        in capsys.readouterr().out
    )
    with pytest.raises(GpufleetError, match="the rollout stopped: node-1: rolled_back"):
        report(2, ["node-1", "node-2"], outcomes.nodes, Path("/nowhere"))


def test_a_failure_without_a_message_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    # A whitespace-only msg raised IndexError inside the runner's event loop and crashed the upgrade (review L5).
    outcomes = Outcomes()
    assert outcomes(
        {"event": "runner_on_failed", "event_data": {"host": "node-1", "task": "t", "res": {"msg": " \n "}}}
    )
    assert "upgrade: node-1: t: failed" in capsys.readouterr().out


def test_a_clean_rollout_reports_every_node(capsys: pytest.CaptureFixture[str]) -> None:
    done = {"node-1": {"node": "node-1", "status": "upgraded", "layers": ["serve"], "reason": "", "state": "serving"}}
    assert report(0, ["node-1", "node-2"], done, Path("/nowhere")) == 0
    assert "node-2: not started" in capsys.readouterr().out


def test_cordon_and_uncordon_are_subcommands() -> None:
    args = build_parser().parse_args(["cordon", "--limit", "node-1", "-i", "hosts.yml", "--reason", "fan noise"])
    assert (args.action, args.limit, args.reason) == ("cordon", "node-1", "fan noise")
    assert build_parser().parse_args(["uncordon", "--limit", "node-1", "-i", "hosts.yml"]).action == "uncordon"
    args = build_parser().parse_args(["upgrade", "-i", "hosts.yml", "--max-unavailable", "2", "--force"])
    assert (args.max_unavailable, args.max_fail, args.force) == ("2", 0, True)


def test_nodes_out_of_service_count_against_max_unavailable() -> None:
    # Review M3(b): a cordoned node took no slot, and the next node was drained beside it.
    assert unavailable_budget("2", 4, ["node-3"], ["node-1"]) == "1"
    assert unavailable_budget("50%", 4, ["node-3"], ["node-1"]) == "1"
    assert unavailable_budget("1", 4, [], ["node-1"]) == "1"
    # Nothing to do: nothing refused.
    assert unavailable_budget("1", 4, ["node-3"], []) == "1"
    with pytest.raises(GpufleetError, match=r"1 node\(s\) already out of service \(node-3\) .* no node was touched"):
        unavailable_budget("1", 4, ["node-3"], ["node-1"])


def test_the_plan_lists_the_batches_serial_makes_with_the_nodes_that_change() -> None:
    from gpufleet.commands.upgrade import rollout_plan

    hosts = ["n1", "n2", "n3", "n4", "n5"]
    assert rollout_plan(hosts, ["n1", "n3", "n4"], ["n5"], "50%").splitlines() == [
        "upgrade --plan: 3 node(s) would change, at most 2 at once; nothing was changed",
        "  batch 1: n1",
        "  batch 2: n3, n4",
        "  skipped, cordoned: n5",
        "  unchanged, matching the declaration: n2",
    ]
