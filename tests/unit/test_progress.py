"""The layer-by-layer view of a playbook run (gpufleet.progress), fed by ansible-runner's real events."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import ansible_runner
import pytest

from gpufleet.cli import build_parser
from gpufleet.progress import LayerProgress, layers_to_start, message, progress_options
from gpufleet.runner import ensure_ansible_on_path

# Two layers on localhost as site.yml runs them: the first stops an instance (records it as rebuild.yml does)
# and changes something, the second fails; resume.yml's play never comes.
FAILING_RUN = """
- name: Base layer
  hosts: all
  gather_facts: false
  tasks:
    - name: Change something
      ansible.builtin.command: "true"
      changed_when: true
    - name: Record the instances stopped for the rebuild
      ansible.builtin.set_fact:
        rebuild_stopped_instances: [vllm@main.service, vllm@greedy.service]
    - name: Leave something alone
      ansible.builtin.debug:
        msg: nothing
- name: CUDA toolkit layer
  hosts: all
  gather_facts: false
  tasks:
    - name: Install the toolkit runfile
      ansible.builtin.fail:
        msg: "the runfile's checksum does not match: expected abc, got def"
"""


def run_with_progress(tmp_path: Path, playbook: str) -> tuple[int, list[str]]:
    ensure_ansible_on_path()
    lines: list[str] = []
    book = tmp_path / "project" / "play.yml"
    book.parent.mkdir()
    book.write_text(playbook)
    clock = iter(float(second) for second in range(0, 1000, 7))
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path),
        playbook=str(book),
        inventory="localhost ansible_connection=local",
        extravars={"ansible_python_interpreter": sys.executable},
        quiet=True,
        event_handler=LayerProgress(say=lines.append, clock=lambda: next(clock)),
    )
    return int(runner.rc), lines


def test_a_failing_run_shows_each_layer_the_failure_and_what_it_left_stopped(tmp_path: Path) -> None:
    rc, lines = run_with_progress(tmp_path, FAILING_RUN)
    assert rc != 0
    assert lines[0] == "localhost: Base layer: 3 ok, 1 changed (7 s)"
    assert lines[1] == (
        "localhost: FAILED in 'CUDA toolkit layer' at 'Install the toolkit runfile': "
        "the runfile's checksum does not match: expected abc, got def"
    )
    assert lines[2] == "localhost: CUDA toolkit layer: 0 ok, 0 changed, 1 failed (7 s)"
    assert lines[3].startswith("localhost: NOT SERVING vllm@greedy.service, vllm@main.service: the run stopped them")
    assert lines[3].endswith("gpufleet provision -i INVENTORY --limit localhost --tags serve")
    assert len(lines) == 4


def test_instances_started_again_are_not_reported(tmp_path: Path) -> None:
    # resume.yml empties the record once they serve again; a later failure then leaves nothing stopped.
    forgotten = FAILING_RUN.replace(
        "- name: CUDA toolkit layer",
        """- name: Serve again
  hosts: all
  gather_facts: false
  tasks:
    - name: Forget the stopped instances, they serve again
      ansible.builtin.set_fact:
        rebuild_stopped_instances: []
- name: CUDA toolkit layer""",
    )
    rc, lines = run_with_progress(tmp_path, forgotten)
    assert rc != 0
    assert not [line for line in lines if "NOT SERVING" in line]
    assert "localhost: Serve again: 1 ok, 0 changed (7 s)" in lines


def test_a_run_that_does_not_fail_warns_of_nothing() -> None:
    lines: list[str] = []
    progress = LayerProgress(say=lines.append, clock=lambda: 0.0)
    progress({"event": "playbook_on_play_start", "event_data": {"play": "NVIDIA driver layer"}})
    progress(
        {
            "event": "runner_on_ok",
            "event_data": {
                "host": "node-1",
                "task": "Record",
                "res": {"changed": False, "ansible_facts": {"nvidia_driver_stopped_instances": ["vllm@main.service"]}},
            },
        }
    )
    progress({"event": "runner_on_skipped", "event_data": {"host": "node-2", "task": "Record"}})
    progress({"event": "playbook_on_stats", "event_data": {}})
    # node-2 only skipped: no line for it; node-1 did not fail, so resume.yml (tagged driver) takes its record.
    assert lines == ["node-1: NVIDIA driver layer: 1 ok, 0 changed (0 s)"]


def test_an_ignored_failure_is_not_a_failure_and_unreachable_is_said() -> None:
    lines: list[str] = []
    progress = LayerProgress(say=lines.append, clock=lambda: 0.0)
    progress({"event": "playbook_on_play_start", "event_data": {"play": "Base layer"}})
    progress(
        {
            "event": "runner_on_failed",
            "event_data": {"host": "node-1", "task": "Probe", "ignore_errors": True, "res": {"msg": "no"}},
        }
    )
    progress(
        {
            "event": "runner_on_unreachable",
            "event_data": {
                "host": "node-2",
                "task": "Gather",
                "res": {"msg": "ssh: connect to host 10.0.0.2 port 22: No route to host"},
            },
        }
    )
    progress({"event": "playbook_on_stats", "event_data": {}})
    assert lines == [
        "node-2: UNREACHABLE in 'Base layer' at 'Gather': ssh: connect to host 10.0.0.2 port 22: No route to host",
        "node-1: Base layer: 1 ok, 0 changed (0 s)",
        "node-2: Base layer: 0 ok, 0 changed, 1 failed (0 s)",
    ]


def test_a_censored_or_long_message_stays_one_bounded_line() -> None:
    assert message(
        {"censored": "the output has been hidden due to the fact that 'no_log: true' was specified"}
    ).startswith("the output has been hidden")
    long = message({"msg": "line one\nline two " + "x" * 1000})
    assert long.startswith("line one line two x") and long.endswith(" ...") and len(long) == 404


@pytest.mark.parametrize(
    "command", [["provision", "-i", "hosts.yml"], ["rebuild", "-i", "hosts.yml", "--limit", "n1"], ["demo"]]
)
def test_the_long_commands_show_layers_unless_verbose(command: list[str]) -> None:
    quiet = progress_options(build_parser().parse_args(command).verbose)
    assert quiet["quiet"] is True and isinstance(quiet["event_handler"], LayerProgress)
    assert progress_options(build_parser().parse_args([*command, "-v"]).verbose) == {"quiet": False}


def test_a_long_task_is_named_while_it_runs_with_its_time(tmp_path: Path) -> None:
    """Issue 30: minutes of a venv install showed nothing. The heartbeat names the task each host is in."""
    ensure_ansible_on_path()
    lines: list[str] = []
    book = tmp_path / "project" / "play.yml"
    book.parent.mkdir()
    book.write_text(
        "- name: Venv layer\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Install the pinned wheels\n      ansible.builtin.command: sleep 2\n      changed_when: false\n"
    )
    progress = LayerProgress(say=lines.append, heartbeat=0.5)
    ansible_runner.run(
        private_data_dir=str(tmp_path),
        playbook=str(book),
        inventory="localhost ansible_connection=local",
        extravars={"ansible_python_interpreter": sys.executable},
        quiet=True,
        event_handler=progress,
    )
    beats = [line for line in lines if line.startswith("  still running: localhost: Install the pinned wheels (")]
    assert beats, lines
    # At least the task's 2 s (more on a loaded machine).
    assert re.fullmatch(r"localhost: Venv layer: 1 ok, 0 changed \([2-9][0-9]* s\)", lines[-1]), lines
    count = len(lines)
    time.sleep(1.0)
    assert len(lines) == count, "the heartbeat stops with the run"


def test_a_stopped_ray_member_is_started_again_by_its_own_layer_before_the_instances() -> None:
    assert layers_to_start(["vllm@main.service"]) == "serve"
    assert layers_to_start(["ray-head.service", "vllm@big.service"]) == "ray_cluster,serve"
