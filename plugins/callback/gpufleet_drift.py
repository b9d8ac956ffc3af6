# -*- coding: utf-8 -*-
"""Callback plugin gpufleet_drift: the fleet drift report of a playbooks/drift.yml run.

It collects the `gpufleet_drift` results of drift_probe and drift_result (and every unreachable node), then
writes the report in all its formats and prints the summary table. The report model and writers are the
collection's plugin_utils drift_report and drift_report_formats (controller side; this file only adapts Ansible's
events; the gpufleet CLI imports them from the collection too).
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_drift
type: aggregate
short_description: Fleet drift report (JSON, Markdown, JUnit XML, Prometheus textfile) of playbooks/drift.yml
description:
  - Collects what playbooks/drift.yml found per node and per layer - ok, drifted (expected and actual values),
    not_declared, unreachable, error - and at the end writes report.json, report.md, junit.xml and drift.prom
    into O(report_dir), and prints a table of nodes by layers.
  - Every node of the play is in the report, each with every layer of the run; an unreachable node is
    reported as such, never left out.
  - Must be enabled (C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.fleet.gpufleet_drift)); C(gpufleet drift) does it.
options:
  report_dir:
    description: Directory the report files are written to; without it only the table is printed.
    type: path
    env:
      - name: GPUFLEET_DRIFT_REPORT_DIR
    ini:
      - section: callback_gpufleet_drift
        key: report_dir
  run_id:
    description: Name of the run in the report (default the start time).
    type: str
    env:
      - name: GPUFLEET_DRIFT_RUN_ID
"""

import time
from pathlib import Path

from ansible.plugins.callback import CallbackBase
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import ReportBuilder
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import summary_table, write_all


def preload_template_plugins() -> None:
    """Loads every filter and test plugin and the stack lookup in ansible-playbook's own process, before any
    worker is forked. Ansible forks one worker per task and host, and each loaded its plugins from source again
    (about 1.8 s of a one-node drift run's 13 s on the lab); forked from a process that has them, none does."""
    from ansible.plugins.loader import filter_loader, lookup_loader, test_loader

    for loader in (filter_loader, test_loader):
        for _plugin in loader.all():
            pass
    lookup_loader.get("gpufleet.fleet.gpufleet_stack")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet_drift"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None, options=None) -> None:
        super().__init__(display=display, options=options)
        self.builder = ReportBuilder()
        self.host_started: dict[str, float] = {}
        preload_template_plugins()

    # ---- Ansible's events ---------------------------------------------------------------------------

    def v2_runner_on_start(self, host, task) -> None:
        self.host_started.setdefault(host.get_name(), time.monotonic())

    def v2_runner_on_ok(self, result) -> None:
        host, data = result._host.get_name(), result._result
        if "gpufleet_drift_plan" in data:
            self.builder.record_plan(host, data["gpufleet_drift_plan"])
        elif isinstance(data.get("gpufleet_drift"), dict):
            self.builder.record_layer(host, data["gpufleet_drift"])
            self._progress(host)
        else:
            self.builder.seen(host)

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        if ignore_errors:
            return
        host = result._host.get_name()
        message = str(result._result.get("msg") or "failed").strip().splitlines()[0]
        self.builder.record_failure(host, f"{result._task.get_name()}: {message}")

    def v2_runner_on_unreachable(self, result) -> None:
        host = result._host.get_name()
        self.builder.record_unreachable(host, str(result._result.get("msg") or "unreachable"))
        self._display.display(f"drift: {host}: unreachable: {result._result.get('msg', '')}".rstrip())

    def v2_playbook_on_stats(self, stats) -> None:
        run_id = self.get_option("run_id") or time.strftime("%Y%m%dT%H%M%S")
        report = self.builder.build(run_id=run_id)
        directory = self.get_option("report_dir")
        if directory:
            written = write_all(report, Path(directory), time.time())
            self._display.display(f"drift report: {', '.join(str(path) for path in written.values())}")
        self._display.display(summary_table(report))

    # ---- progress ----------------------------------------------------------------------------------------

    def _progress(self, host: str) -> None:
        """One line per node once every planned layer of it has a result."""
        plan = self.builder.plans.get(host)
        results = self.builder.results.get(host, {})
        if not plan or any(layer not in results for layer in plan):
            return
        drifted = [layer for layer in plan if results[layer].status == "drifted"]
        errors = [layer for layer in plan if results[layer].status == "error"]
        seconds = time.monotonic() - self.host_started.get(host, time.monotonic())
        words = (f"drifted: {', '.join(drifted)}" if drifted else "no drift") + (
            f"; error: {', '.join(errors)}" if errors else ""
        )
        self._display.display(f"drift: {host}: {len(plan)} layers in {seconds:.1f} s, {words}")
