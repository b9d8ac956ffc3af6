"""The cordon file as nginx sees it, read through inference_proxy's cordon_state entry point (the one reader that
upgrade, rebuild and drift use), for real by ansible-playbook on this machine: any file is a cordon. Review L4: a
hand-made empty file made upgrade and drift fail with a JSON error, and `{}` counted as not cordoned while nginx
answered 503."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from local_playbook import run_local_playbook

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the node's cordon
      ansible.builtin.include_role:
        name: inference_proxy
        tasks_from: cordon_state.yml
    - name: Show it
      ansible.builtin.copy:
        content: "{{ inference_proxy_cordon | to_json }}"
        dest: "{{ state_out }}"
        mode: "0600"
"""


def cordon_state(tmp_path: Path, text: str | None) -> dict:
    state_dir = tmp_path / "state"
    state_dir.mkdir(parents=True)
    if text is not None:
        (state_dir / "cordon").write_text(text)
    run_local_playbook(
        tmp_path, PLAYBOOK, {"inference_proxy_state_dir": str(state_dir), "state_out": str(tmp_path / "cordon.json")}
    )
    return json.loads((tmp_path / "cordon.json").read_text())


def test_no_file_is_no_cordon_and_gpufleets_record_is_read_as_written(tmp_path: Path) -> None:
    assert cordon_state(tmp_path / "none", None) == {}
    record = cordon_state(tmp_path / "ours", '{"reason": "fan noise", "since": "2026-12-05T10:00:00Z"}\n')
    assert record == {"reason": "fan noise", "since": "2026-12-05T10:00:00Z"}


@pytest.mark.parametrize("text", ["", "{}", "not json", '{"since": "2026-12-05T10:00:00Z"}'])
def test_a_file_made_by_hand_is_a_cordon_with_reason_unknown(tmp_path: Path, text: str) -> None:
    record = cordon_state(tmp_path, text)
    assert record["reason"].startswith("unknown"), record
    assert record["since"]
