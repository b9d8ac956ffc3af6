"""The fleet drift report: per node and per layer, ok / drifted (expected -> actual) / not_declared /
unreachable / error. Built by the gpufleet_drift callback plugin from drift_probe and drift_result results,
stored as JSON, compared between runs.

JSON document (schema "gpufleet-drift-report", version 1; `gpufleet drift --schema` prints the JSON Schema):

    {
      "schema": "gpufleet-drift-report", "version": 1,
      "run_id": "20251129T221501-4242-drift", "started": "2025-11-29T22:15:01Z", "finished": "...Z",
      "duration_seconds": 41.2, "playbook": "playbooks/drift.yml",
      "layers": ["base", "driver", ...],                 # the layers compared, in order
      "summary": {"nodes": 2, "ok": 1, "drifted": 1, "unreachable": 0, "error": 0, "exit_code": 2},
      "nodes": {
        "lab-1": {
          "status": "drifted",                           # unreachable > drifted > error > ok
          "message": "",                                 # why the node is unreachable, if it is
          "layers": {
            "toolkit": {"status": "drifted", "checked": 5, "message": "", "notes": [], "errors": [],
                        "drift": [{"check": "link /usr/local/cuda", "field": "target",
                                   "expected": "/usr/local/cuda-13.0", "actual": "/usr/local/cuda-12.8",
                                   "detail": ""}]},
            ...
          }
        }
      }
    }

Layer status: `ok` (every check matches), `drifted` (some declared value differs; `drift` lists them),
`not_declared` (the inventory does not declare the layer's role; `message` says what is missing), `error`
(the layer could not be compared; `message` and `errors` say why), `unreachable` (the node could not be
reached), `cordoned` (the pseudo-layer `cordon` of a node an operator cordoned, `gpufleet cordon`; `message` is
its reason and time: the node is `cordoned`, not drifted, whatever its layers, and counts as neither drift nor
a node not compared). Exit code: 0 every node compared, no drift; 2 drift, every node compared; 3 drift, and some node or
layer could not be compared (unreachable or an error: the drift found is not all there is); 1 nothing drifted
but some node or layer could not be compared (no claim of "no drift" can be made for it), or nothing was. New
fields may be added within version 1; a field is never removed or changed in meaning without a new version.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

SCHEMA_NAME = "gpufleet-drift-report"
SCHEMA_VERSION = 1
LAYER_STATUSES = ("ok", "drifted", "not_declared", "unreachable", "error", "cordoned")
NODE_STATUSES = ("ok", "drifted", "unreachable", "error", "cordoned")
EXIT_OK, EXIT_FAILED, EXIT_DRIFT, EXIT_DRIFT_INCOMPLETE = 0, 1, 2, 3


class ReportError(ValueError):
    """A report file that cannot be read as a gpufleet drift report."""


@dataclass
class DriftItem:
    """One declared value the node does not have."""

    check: str
    field: str
    expected: Any
    actual: Any
    detail: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> DriftItem:
        return cls(
            str(data.get("check", "")),
            str(data.get("field", "")),
            data.get("expected"),
            data.get("actual"),
            str(data.get("detail") or ""),
        )

    def key(self) -> tuple[str, str]:
        return self.check, self.field

    def describe(self) -> str:
        return f"{self.check}: {self.field}: {format_value(self.expected)} -> {format_value(self.actual)}"


@dataclass
class LayerResult:
    """What a drift run found for one layer of one node."""

    status: str
    drift: list[DriftItem] = field(default_factory=list)
    message: str = ""
    checked: int = 0
    notes: list[str] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict) -> LayerResult:
        status = str(data.get("status", "error"))
        if status not in LAYER_STATUSES:
            raise ReportError(f"unknown layer status {status!r}")
        return cls(
            status,
            [DriftItem.from_dict(item) for item in data.get("drift") or []],
            str(data.get("message") or ""),
            int(data.get("checked") or 0),
            [str(note) for note in data.get("notes") or []],
            list(data.get("errors") or []),
        )

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "checked": self.checked,
            "message": self.message,
            "notes": self.notes,
            "errors": self.errors,
            "drift": [vars(item) for item in self.drift],
        }

    def summary(self) -> str:
        """The layer in a few words: what differs, or why it was not compared."""
        if self.status == "drifted":
            return "; ".join(item.describe() for item in self.drift)
        if self.status in ("error", "unreachable", "not_declared", "cordoned"):
            return self.message or "; ".join(str(error.get("message", "")) for error in self.errors)
        return f"{self.checked} checks match"


@dataclass
class NodeResult:
    """One node: its layers, and why it could not be reached if it could not."""

    name: str
    layers: dict[str, LayerResult] = field(default_factory=dict)
    message: str = ""

    @property
    def status(self) -> str:
        statuses = {layer.status for layer in self.layers.values()}
        for status in ("unreachable", "cordoned", "drifted", "error"):
            if status in statuses:
                return status
        return "ok"

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "message": self.message,
            "layers": {name: layer.to_dict() for name, layer in self.layers.items()},
        }


@dataclass
class FleetReport:
    """One drift run over a fleet."""

    layers: list[str]
    nodes: dict[str, NodeResult] = field(default_factory=dict)
    run_id: str = ""
    started: str = ""
    finished: str = ""
    duration_seconds: float = 0.0
    playbook: str = "playbooks/drift.yml"

    def count(self, status: str) -> int:
        return sum(1 for node in self.nodes.values() if node.status == status)

    @property
    def exit_code(self) -> int:
        incomplete = bool(self.count("unreachable") or self.count("error"))
        if self.count("drifted"):
            return EXIT_DRIFT_INCOMPLETE if incomplete else EXIT_DRIFT
        if incomplete or not self.nodes:
            return EXIT_FAILED
        return EXIT_OK

    def not_compared(self) -> list[str]:
        """Nodes the run could not compare (wholly or in part), with why: 'lab-3 (unreachable)'."""
        return [
            f"{name} ({node.status})"
            for name, node in sorted(self.nodes.items())
            if node.status in ("unreachable", "error")
        ]

    def summary(self) -> dict:
        counts = {status: self.count(status) for status in NODE_STATUSES}
        return {"nodes": len(self.nodes), **counts, "exit_code": self.exit_code}

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_NAME,
            "version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "started": self.started,
            "finished": self.finished,
            "duration_seconds": round(self.duration_seconds, 1),
            "playbook": self.playbook,
            "layers": self.layers,
            "summary": self.summary(),
            "nodes": {name: self.nodes[name].to_dict() for name in sorted(self.nodes)},
        }

    @classmethod
    def from_dict(cls, data: dict) -> FleetReport:
        if data.get("schema") != SCHEMA_NAME:
            raise ReportError(f"not a {SCHEMA_NAME} document (schema {data.get('schema')!r})")
        if data.get("version") != SCHEMA_VERSION:
            raise ReportError(
                f"report version {data.get('version')!r} is not supported (this gpufleet reads "
                f"version {SCHEMA_VERSION})"
            )
        nodes = {}
        for name, node in (data.get("nodes") or {}).items():
            layers = {layer: LayerResult.from_dict(result) for layer, result in (node.get("layers") or {}).items()}
            nodes[name] = NodeResult(name, layers, str(node.get("message") or ""))
        return cls(
            list(data.get("layers") or []),
            nodes,
            str(data.get("run_id") or ""),
            str(data.get("started") or ""),
            str(data.get("finished") or ""),
            float(data.get("duration_seconds") or 0.0),
            str(data.get("playbook") or ""),
        )


def format_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- building a report from a run's results ------------------------------------------------------


class ReportBuilder:
    """Collects the results of a drift run, as the callback plugin receives them, into a FleetReport.

    Every node gets every planned layer: a layer without a result is an error ("no result"), a node that
    could not be reached has all its layers that had no result yet unreachable.
    """

    def __init__(self, layers: list[str] | None = None) -> None:
        self.default_layers = list(layers or [])
        self.plans: dict[str, list[str]] = {}
        self.results: dict[str, dict[str, LayerResult]] = {}
        self.unreachable: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.started = utc_now()
        self.clock = time.monotonic()

    def seen(self, host: str) -> None:
        self.results.setdefault(host, {})

    def record_plan(self, host: str, layers: list[str]) -> None:
        self.seen(host)
        self.plans[host] = [str(layer) for layer in layers]

    def record_layer(self, host: str, payload: dict) -> None:
        """A drift_probe or drift_result payload (its gpufleet_drift value)."""
        self.seen(host)
        layer = str(payload.get("layer", ""))
        self.results[host][layer] = LayerResult.from_dict(payload)

    def record_unreachable(self, host: str, message: str) -> None:
        self.seen(host)
        self.unreachable.setdefault(host, message.strip() or "unreachable")

    def record_failure(self, host: str, message: str) -> None:
        """A task failed outside a layer's rescue (fact gathering, a broken play): the node's other layers."""
        self.seen(host)
        self.failures.setdefault(host, message.strip() or "failed")

    def build(self, run_id: str = "") -> FleetReport:
        order = self._layer_order()
        report = FleetReport(
            order,
            run_id=run_id,
            started=self.started,
            finished=utc_now(),
            duration_seconds=time.monotonic() - self.clock,
        )
        for host in sorted(self.results):
            node = NodeResult(host, message=self.unreachable.get(host, ""))
            for layer in self.plans.get(host, order):
                node.layers[layer] = self.results[host].get(layer) or self._missing(host)
            for layer, result in self.results[host].items():
                node.layers.setdefault(layer, result)
            report.nodes[host] = node
        return report

    def _layer_order(self) -> list[str]:
        order = list(self.default_layers)
        for layers in self.plans.values():
            order += [layer for layer in layers if layer not in order]
        for results in self.results.values():
            order += [layer for layer in results if layer not in order]
        return order

    def _missing(self, host: str) -> LayerResult:
        if host in self.unreachable:
            return LayerResult("unreachable", message=self.unreachable[host])
        reason = self.failures.get(host, "the run ended before this layer was compared")
        return LayerResult("error", message=f"no result: {reason}")


# ---- comparing two runs ----------------------------------------------------------------------------------


@dataclass
class Change:
    """Something that differs between two runs, for one node (and layer)."""

    node: str
    layer: str
    what: str

    def describe(self) -> str:
        return f"{self.node} {self.layer}: {self.what}" if self.layer else f"{self.node}: {self.what}"


def compare_reports(before: FleetReport, after: FleetReport) -> list[Change]:
    """What changed from `before` to `after`: nodes, layer statuses and drift entries."""
    changes: list[Change] = []
    for node in sorted(set(before.nodes) | set(after.nodes)):
        if node not in after.nodes:
            changes.append(Change(node, "", "not in the newer run"))
            continue
        if node not in before.nodes:
            changes.append(Change(node, "", f"new node ({after.nodes[node].status})"))
            continue
        changes += compare_nodes(node, before.nodes[node], after.nodes[node])
    return changes


def compare_nodes(node: str, before: NodeResult, after: NodeResult) -> list[Change]:
    changes = []
    for layer in list(after.layers) + [name for name in before.layers if name not in after.layers]:
        old, new = before.layers.get(layer), after.layers.get(layer)
        if old is None or new is None:
            changes.append(
                Change(
                    node, layer, "compared only in the newer run" if old is None else "compared only in the older run"
                )
            )
            continue
        if old.status != new.status:
            changes.append(Change(node, layer, f"{old.status} -> {new.status}"))
        changes += compare_items(node, layer, old, new)
    return changes


def compare_items(node: str, layer: str, old: LayerResult, new: LayerResult) -> list[Change]:
    before = {item.key(): item for item in old.drift}
    after = {item.key(): item for item in new.drift}
    changes = []
    for key in sorted(set(before) | set(after)):
        if key not in before:
            changes.append(Change(node, layer, f"new drift: {after[key].describe()}"))
        elif key not in after:
            changes.append(
                Change(
                    node,
                    layer,
                    f"back to declared: {before[key].check}: {before[key].field} "
                    f"({format_value(before[key].expected)})",
                )
            )
        elif before[key].actual != after[key].actual:
            changes.append(
                Change(
                    node,
                    layer,
                    f"{after[key].check}: {after[key].field} now "
                    f"{format_value(after[key].actual)} (was {format_value(before[key].actual)})",
                )
            )
    return changes


# ---- the JSON Schema of the document --------------------------------------------------------------------

_ITEM = {
    "type": "object",
    "required": ["check", "field", "expected", "actual", "detail"],
    "properties": {
        "check": {"type": "string"},
        "field": {"type": "string"},
        "expected": {},
        "actual": {},
        "detail": {"type": "string"},
    },
}
_LAYER = {
    "type": "object",
    "required": ["status", "checked", "message", "notes", "errors", "drift"],
    "properties": {
        "status": {"enum": list(LAYER_STATUSES)},
        "checked": {"type": "integer", "minimum": 0},
        "message": {"type": "string"},
        "notes": {"type": "array", "items": {"type": "string"}},
        "errors": {"type": "array", "items": {"type": "object"}},
        "drift": {"type": "array", "items": _ITEM},
    },
}
JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "gpufleet drift report, version 1",
    "type": "object",
    "required": [
        "schema",
        "version",
        "run_id",
        "started",
        "finished",
        "duration_seconds",
        "playbook",
        "layers",
        "summary",
        "nodes",
    ],
    "properties": {
        "schema": {"const": SCHEMA_NAME},
        "version": {"const": SCHEMA_VERSION},
        "run_id": {"type": "string"},
        "started": {"type": "string"},
        "finished": {"type": "string"},
        "duration_seconds": {"type": "number", "minimum": 0},
        "playbook": {"type": "string"},
        "layers": {"type": "array", "items": {"type": "string"}},
        "summary": {
            "type": "object",
            "required": ["nodes", *NODE_STATUSES, "exit_code"],
            "properties": {
                "nodes": {"type": "integer"},
                "exit_code": {"enum": [EXIT_OK, EXIT_FAILED, EXIT_DRIFT, EXIT_DRIFT_INCOMPLETE]},
                **{status: {"type": "integer"} for status in NODE_STATUSES},
            },
        },
        "nodes": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["status", "message", "layers"],
                "properties": {
                    "status": {"enum": list(NODE_STATUSES)},
                    "message": {"type": "string"},
                    "layers": {"type": "object", "additionalProperties": _LAYER},
                },
            },
        },
    },
}
