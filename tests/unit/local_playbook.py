"""Runs a small playbook for real on this machine (connection local) against the repository's collection and roles,
with the repository's ansible.cfg: how unit tests drive a role's task file on a temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_local_playbook(directory: Path, playbook: str, variables: dict) -> None:
    """Writes the playbook and its variables into `directory`, runs it there, asserts it succeeded."""
    (directory / "play.yml").write_text(playbook)
    variables = {**variables, "ansible_python_interpreter": str(REPO / ".venv/bin/python")}
    (directory / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", "play.yml", "-e", "@vars.json"]
    result = subprocess.run(argv, cwd=directory, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def rollback_playbook(role: str, upgrade_tasks: str) -> str:
    """A role's snapshot, then `upgrade_tasks` (what an upgrade changes; YAML tasks indented four spaces), then the
    role's restore, which writes its `<role>_restored` fact to restored.json beside the playbook."""
    return f"""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Keep what serves now, as an upgrade does before anything changes
      ansible.builtin.include_role:
        name: {role}
        tasks_from: snapshot.yml
{upgrade_tasks.rstrip()}
    - name: Roll back
      ansible.builtin.include_role:
        name: {role}
        tasks_from: restore.yml
    - name: Say what was restored
      ansible.builtin.copy:
        content: "{{{{ {role}_restored | to_json }}}}"
        dest: "{{{{ playbook_dir }}}}/restored.json"
        mode: "0644"
"""
