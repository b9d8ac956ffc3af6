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
