"""Drift runs: playbooks/drift.yml through ansible-runner with the gpufleet_drift callback, one directory per
run (runner artifacts and the report), progress as nodes finish, and comparison of two stored runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet import layers as layer_registry
from gpufleet.errors import GpufleetError, UsageError
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import (
    JSON_SCHEMA,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    FleetReport,
    ReportError,
)
from gpufleet.runner import run_playbook, runs_dir

# In provisioning order, from the layer registry (playbooks/vars/layers.yml); each layer is compared by the
# task file of the role that owns it (roles/<role>/tasks/drift.yml).
LAYERS = layer_registry.names()
REPORT_SUBDIR = "drift"
RUN_SUFFIX = "-drift"


@dataclass
class DriftRun:
    """One drift run: where it is kept, how ansible ended, and the report (None when none was written)."""

    run_id: str
    run_dir: Path
    ansible_rc: int
    ansible_status: str
    report: FleetReport | None

    @property
    def report_dir(self) -> Path:
        return self.run_dir / REPORT_SUBDIR

    @property
    def exit_code(self) -> int:
        """FleetReport.exit_code (0, 2 or 3, or 1 when not every node or layer was compared); 1 with no report."""
        if self.report is None or not self.report.nodes:
            return 1
        return self.report.exit_code


def parse_layers(text: str | None) -> list[str] | None:
    """'toolkit,venv' -> ['toolkit', 'venv'] in provisioning order; GpufleetError naming unknown layers."""
    if not text:
        return None
    wanted = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in wanted if item not in LAYERS]
    if unknown or not wanted:
        raise UsageError(f"unknown layer(s) {', '.join(unknown) or '(none given)'}; layers are {', '.join(LAYERS)}")
    return [layer for layer in LAYERS if layer in wanted]


class Progress:
    """ansible-runner event handler: one line per node when all its layers are compared or it is unreachable."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.plans: dict[str, list[str]] = {}
        self.done: dict[str, dict[str, str]] = {}
        self.started = time.monotonic()

    def __call__(self, event: dict) -> bool:
        data = event.get("event_data") or {}
        host, result = data.get("host"), data.get("res") or {}
        if not host:
            return True
        if event.get("event") == "runner_on_unreachable":
            self.say(f"  {host}: unreachable ({str(result.get('msg', '')).strip()[:200]})")
        elif event.get("event") == "runner_on_ok" and "gpufleet_drift_plan" in result:
            self.plans[host] = list(result["gpufleet_drift_plan"])
        elif event.get("event") == "runner_on_ok" and isinstance(result.get("gpufleet_drift"), dict):
            self._layer(host, result["gpufleet_drift"])
        return True

    def _layer(self, host: str, payload: dict) -> None:
        self.done.setdefault(host, {})[str(payload.get("layer"))] = str(payload.get("status"))
        plan = self.plans.get(host)
        if not plan or len(self.done[host]) != len(plan):
            return
        drifted = [layer for layer in plan if self.done[host].get(layer) == "drifted"]
        errors = [layer for layer in plan if self.done[host].get(layer) == "error"]
        words = f"drifted: {', '.join(drifted)}" if drifted else "no drift"
        if errors:
            words += f"; error: {', '.join(errors)}"
        self.say(f"  {host}: {len(plan)} layers compared after {time.monotonic() - self.started:.1f} s, {words}")


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}{RUN_SUFFIX}"


def run_drift(
    inventory: Path,
    *,
    limit: str | None = None,
    layers: list[str] | None = None,
    extravars: dict | None = None,
    say: Callable[[str], None] = print,
) -> DriftRun:
    """Runs playbooks/drift.yml read-only against the inventory's nodes; the report is kept with the run."""
    run_id = new_run_id()
    run_dir = runs_dir() / run_id
    report_dir = run_dir / REPORT_SUBDIR
    result = run_playbook(
        "drift.yml",
        inventory,
        limit=limit,
        # The play is check mode already; --check also sets ansible_check_mode, which the roles' preflights
        # read to accept a layer that is not built yet (drift_probe then reports it as missing).
        check=True,
        extravars={**(extravars or {}), **({"drift_layers": layers} if layers else {})},
        run_id=run_id,
        envvars={
            # The collection's callback, by its full name (found through the run's collections path).
            "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.fleet.gpufleet_drift",
            "GPUFLEET_DRIFT_REPORT_DIR": str(report_dir),
            "GPUFLEET_DRIFT_RUN_ID": run_id,
        },
        quiet=True,
        event_handler=Progress(say),
    )
    report = read_report(report_dir) if (report_dir / "report.json").is_file() else None
    return DriftRun(run_id, run_dir, result.rc, result.status, report)


def failure_reason(run: DriftRun) -> str:
    """Why a run produced no report: the end of ansible's output."""
    stdout = sorted(run.run_dir.glob("artifacts/*/stdout"))
    tail = stdout[-1].read_text(errors="replace").strip().splitlines()[-15:] if stdout else []
    return "\n".join(tail) or f"ansible ended {run.ansible_status} (rc {run.ansible_rc}) without output"


# ---- stored runs -------------------------------------------------------------------------------------


def stored_runs() -> list[Path]:
    """Directories of the drift runs kept under the runs directory that hold a report, oldest first."""
    directory = runs_dir()
    if not directory.is_dir():
        return []
    return sorted(
        path
        for path in directory.iterdir()
        if path.name.endswith(RUN_SUFFIX) and (path / REPORT_SUBDIR / "report.json").is_file()
    )


def prune_artifacts(keep: int) -> list[Path]:
    """Removes ansible-runner's files (events, output) of all but the newest `keep` drift runs; every run's
    report stays, so any two runs can still be compared. Returns the runs pruned."""
    pruned = []
    for run in stored_runs()[:-keep] if keep > 0 else stored_runs():
        leftovers = [path for path in run.iterdir() if path.name != REPORT_SUBDIR]
        for path in leftovers:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        if leftovers:
            pruned.append(run)
    return pruned


def read_report(path: Path) -> FleetReport:
    """Reads report.json (or the report.json inside a directory), checked against the report's JSON Schema;
    ReportError naming the reason, or the first place where the document departs from the schema."""
    path = path / "report.json" if path.is_dir() else path
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path} does not exist") from None
    except ValueError as error:
        raise ReportError(f"{path} is not a drift report: {error}") from None
    if isinstance(document, dict) and (document.get("schema"), document.get("version")) == (
        SCHEMA_NAME,
        SCHEMA_VERSION,
    ):
        violation = best_match(Draft202012Validator(JSON_SCHEMA).iter_errors(document))
        if violation is not None:
            where = "/".join(str(part) for part in violation.absolute_path) or "its top level"
            raise ReportError(f"{path} does not follow the drift report's schema at {where}: {violation.message}")
    try:
        return FleetReport.from_dict(document)
    except (AttributeError, TypeError, ValueError) as error:
        raise ReportError(f"{path} is not a drift report: {error}") from None


def find_report(reference: str) -> tuple[str, FleetReport]:
    """A stored run by id, `last`, `previous`, or a path (run directory, report directory or report.json)."""
    runs = stored_runs()
    if reference in ("last", "previous"):
        index = -1 if reference == "last" else -2
        if len(runs) < -index:
            raise GpufleetError(f"no {reference} drift run is stored in {runs_dir()} (found {len(runs)})")
        path = runs[index] / REPORT_SUBDIR
    elif re.fullmatch(r"[0-9T]+-\d+-drift", reference):
        path = runs_dir() / reference / REPORT_SUBDIR
    else:
        path = Path(reference)
        if path.is_dir() and (path / REPORT_SUBDIR).is_dir():
            path = path / REPORT_SUBDIR
    try:
        return reference, read_report(path)
    except ReportError as error:
        raise GpufleetError(
            f"cannot compare with {reference}: {error}; list the stored runs with `gpufleet drift --runs`"
        ) from None
