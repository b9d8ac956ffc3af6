"""flash_attn's snapshot and restore (issue 28, review M10), run for real by ansible-playbook on this machine against
venvs in a temporary directory. The kernel wheels go into the venv the venv layer names: an upgrade that built a
new venv left the kept venv's kernels whole, and the rollback says so; an upgrade that reinstalled kernel wheels
into the venv in service cannot be taken back by the kernels layer, and the rollback names the markers that
differ. Before, the layer kept nothing and every rollback said "kernel wheels the upgrade installed stay"."""

from __future__ import annotations

import json
from pathlib import Path

from local_playbook import run_local_playbook

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Keep the kernels, as an upgrade does before anything changes
      ansible.builtin.include_role:
        name: flash_attn
        tasks_from: snapshot.yml
    - name: The upgrade's kernels layer
      ansible.builtin.copy:
        content: '{"key": "new"}'
        dest: "{{ upgraded_venv }}/gpufleet-kernels/flash_attn.json"
        mode: "0644"
    - name: Roll back
      ansible.builtin.include_role:
        name: flash_attn
        tasks_from: restore.yml
    - name: Say what was restored
      ansible.builtin.copy:
        content: "{{ flash_attn_restored | to_json }}"
        dest: "{{ playbook_dir }}/restored.json"
        mode: "0644"
"""


def roll_back(tmp_path: Path, upgraded: str) -> dict:
    venvs = tmp_path / "venvs"
    for name in ("kept", "new"):
        (venvs / name / "gpufleet-kernels").mkdir(parents=True)
    (venvs / "kept" / "gpufleet-kernels" / "flash_attn.json").write_text('{"key": "old"}')
    (venvs / "current").symlink_to(venvs / "kept")
    run_local_playbook(
        tmp_path,
        PLAYBOOK,
        {
            "flash_attn_venv_in_service": str(venvs / "current"),
            "flash_attn_snapshot_dir": str(tmp_path / "snapshot"),
            "upgraded_venv": str(venvs / upgraded),
        },
    )
    assert json.loads((tmp_path / "snapshot" / "state.json").read_text()) == {
        "venv": str(venvs / "kept"),
        "markers": {"flash_attn.json": '{"key": "old"}'},
    }
    return json.loads((tmp_path / "restored.json").read_text())


def test_kernels_that_went_into_a_new_venv_leave_the_kept_venv_whole(tmp_path: Path) -> None:
    assert roll_back(tmp_path, "new") == {"restored": ["kernel packages of kept"], "not_restored": []}


def test_kernels_reinstalled_into_the_venv_in_service_are_named_as_not_rolled_back(tmp_path: Path) -> None:
    restored = roll_back(tmp_path, "kept")
    assert restored["restored"] == []
    assert restored["not_restored"] == [
        f"kernel wheels the upgrade reinstalled into {tmp_path}/venvs/kept stay (its kernel markers differ: "
        "flash_attn.json)"
    ]
