"""What a long playbook run shows instead of ansible's scroll: a line per host as each play (a layer) ends, a
failure the moment it happens, a line each HEARTBEAT_SECONDS naming the task each host is still in and for how long
(a venv install or a runfile can take minutes with no other event), and at the end the serving instances a host was
left without.

LayerProgress is an ansible-runner event handler (runner.run_playbook's event_handler); ansible's own output
stays in the run's artifacts, and on the screen with `-v`.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

# The facts in which a run records the vllm@ instances it stopped and must start again (playbooks/resume.yml
# empties them once they serve again).
STOPPED_FACTS = ("nvidia_driver_stopped_instances", "rebuild_stopped_instances")
RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}
MESSAGE_LIMIT = 400
HEARTBEAT_SECONDS = 30.0


@dataclass
class HostCounts:
    ok: int = 0
    changed: int = 0
    failed: int = 0

    def describe(self) -> str:
        parts = [f"{self.ok} ok", f"{self.changed} changed"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        return ", ".join(parts)


@dataclass
class LayerProgress:
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    play: str = ""
    started: float = 0.0
    counts: dict[str, HostCounts] = field(default_factory=dict)
    # host -> fact -> the instances it lists now
    stopped: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    failed_hosts: set[str] = field(default_factory=set)
    # host -> (task, when it started, seconds since the epoch): the task each host is in now
    running: dict[str, tuple[str, float]] = field(default_factory=dict)
    heartbeat: float = HEARTBEAT_SECONDS
    _beating: threading.Event | None = None

    def __call__(self, event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if self._beating is None and self.heartbeat > 0:
            self._beating = threading.Event()
            threading.Thread(target=self._beat, args=(self._beating,), daemon=True).start()
        if kind == "runner_on_start":
            self.running[str(data.get("host", "?"))] = (str(data.get("task", "?")), started_at(event))
        elif kind in RESULT_EVENTS:
            self.running.pop(str(data.get("host", "?")), None)
        if kind == "playbook_on_play_start":
            self.end_play()
            self.play, self.started, self.counts = str(data.get("play", "")), self.clock(), {}
        elif kind in RESULT_EVENTS:
            self.record(RESULT_EVENTS[kind], data)
        elif kind == "playbook_on_stats":
            self.end_play()
            self.warn_stopped()
            if self._beating is not None:
                self._beating.set()
        # True: ansible-runner keeps the event in the run's artifacts.
        return True

    def record(self, status: str, data: dict) -> None:
        host = str(data.get("host", "?"))
        counts = self.counts.setdefault(host, HostCounts())
        result = data.get("res") or {}
        if status in ("failed", "unreachable") and not data.get("ignore_errors"):
            counts.failed += 1
            self.failed_hosts.add(host)
            self.say(f"{host}: {status.upper()} in {self.play!r} at {data.get('task', '?')!r}: {message(result)}")
        elif status != "skipped":
            counts.ok += 1
            counts.changed += bool(result.get("changed"))
        facts = result.get("ansible_facts") or {}
        for name in STOPPED_FACTS:
            if name in facts:
                self.stopped.setdefault(host, {})[name] = list(facts[name] or [])

    def still_running(self) -> str:
        """One line: each host's task and how long it has run ("" when no host is in a task)."""
        now = time.time()
        tasks = [f"{host}: {task} ({now - since:.0f} s)" for host, (task, since) in sorted(self.running.items())]
        return f"  still running: {'; '.join(tasks)}" if tasks else ""

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat):
            line = self.still_running()
            if line:
                self.say(line)

    def end_play(self) -> None:
        if not self.play or not self.counts:
            return
        seconds = self.clock() - self.started
        for host, counts in sorted(self.counts.items()):
            if counts.ok or counts.failed:
                self.say(f"{host}: {self.play}: {counts.describe()} ({seconds:.0f} s)")
        self.counts = {}

    def warn_stopped(self) -> None:
        for host, lists in sorted(self.stopped.items()):
            instances = sorted({name for names in lists.values() for name in names})
            if instances and host in self.failed_hosts:
                self.say(
                    f"{host}: NOT SERVING {', '.join(instances)}: the run stopped them (for the driver or the "
                    f"rebuild) and failed before it started them again; after fixing the failure above, start "
                    f"them with: gpufleet provision -i INVENTORY --limit {host} --tags {layers_to_start(instances)}"
                )


def layers_to_start(units: list[str]) -> str:
    """The layers whose run starts these units again: Ray's member (ray-head, ray-worker) before the instances."""
    return "ray_cluster,serve" if any(unit.startswith("ray-") for unit in units) else "serve"


def started_at(event: dict) -> float:
    """When ansible-runner saw the event (its `created`; UTC where it names no zone), or now."""
    try:
        created = datetime.fromisoformat(str(event["created"]))
    except (KeyError, ValueError):
        return time.time()
    return (created if created.tzinfo else created.replace(tzinfo=timezone.utc)).timestamp()


def message(result: dict) -> str:
    """A failed task's own message, one line (a no_log result is already censored by Ansible)."""
    text = result.get("msg") or result.get("stderr") or result.get("censored") or "failed"
    line = " ".join(str(text).split())
    return line if len(line) <= MESSAGE_LIMIT else line[:MESSAGE_LIMIT] + " ..."


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show ansible's own output instead of a line per host and layer"
    )


def progress_options(verbose: bool) -> dict:
    """run_playbook's keyword arguments for a run shown layer by layer, or with ansible's output (-v)."""
    return {"quiet": False} if verbose else {"quiet": True, "event_handler": LayerProgress()}
