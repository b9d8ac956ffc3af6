"""pyenv_python's snapshot and restore (issue 28, review M10), run for real by ansible-playbook on this machine
against a pyenv root in a temporary directory: an upgrade that switched a CPython link to a new build and failed is
rolled back to the build it served; a kept build that is gone is named, and its link left alone. Before, the python
layer kept nothing, so every venv, the restored one included, went on using the upgrade's CPython."""

from __future__ import annotations

import json
from pathlib import Path

from local_playbook import rollback_playbook, run_local_playbook

UPGRADE = """
    - name: Switch the link to the new build, as the python layer does
      ansible.builtin.file:
        src: "{{ pyenv_python_root }}/builds/3.12.7-new"
        dest: "{{ pyenv_python_root }}/versions/3.12.7"
        state: link
        force: true
    - name: Remove a kept build, when the test asks
      ansible.builtin.file:
        path: "{{ pyenv_python_root }}/builds/3.12.7-old"
        state: absent
      when: remove_kept | bool
"""


def pyenv_root(tmp_path: Path) -> Path:
    root = tmp_path / "pyenv"
    for build in ("3.12.7-old", "3.12.7-new"):
        interpreter = root / "builds" / build / "bin" / "python3"
        interpreter.parent.mkdir(parents=True)
        interpreter.write_text("#!/bin/sh\nexit 0\n")
        interpreter.chmod(0o755)
    (root / "versions").mkdir()
    (root / "versions" / "3.12.7").symlink_to(root / "builds" / "3.12.7-old")
    return root


def roll_back(tmp_path: Path, root: Path, *, remove_kept: bool) -> dict:
    run_local_playbook(
        tmp_path,
        rollback_playbook("pyenv_python", UPGRADE),
        {
            "pyenv_python_root": str(root),
            "pyenv_python_versions": [{"version": "3.12.7"}],
            "pyenv_python_snapshot_dir": str(tmp_path / "snapshot"),
            "remove_kept": remove_kept,
        },
    )
    assert json.loads((tmp_path / "snapshot" / "state.json").read_text()) == {
        "links": {str(root / "versions" / "3.12.7"): str(root / "builds" / "3.12.7-old")}
    }
    return json.loads((tmp_path / "restored.json").read_text())


def test_a_rollback_points_the_cpython_link_back_at_the_build_it_served(tmp_path: Path) -> None:
    root = pyenv_root(tmp_path)
    restored = roll_back(tmp_path, root, remove_kept=False)
    assert (root / "versions" / "3.12.7").readlink() == root / "builds" / "3.12.7-old"
    assert restored == {"restored": ["CPython 3.12.7-old"], "not_restored": []}


def test_a_kept_build_that_is_gone_is_named_and_its_link_left_alone(tmp_path: Path) -> None:
    root = pyenv_root(tmp_path)
    restored = roll_back(tmp_path, root, remove_kept=True)
    assert (root / "versions" / "3.12.7").readlink() == root / "builds" / "3.12.7-new"
    assert restored == {"restored": [], "not_restored": [f"{root}/builds/3.12.7-old is gone or broken"]}
