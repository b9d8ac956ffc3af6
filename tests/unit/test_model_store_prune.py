"""model_store's prune keeps what a rollback needs (review H2), run for real by ansible-playbook on this machine
against a model root in a temporary directory: after a failed upgrade B -> C and a retry B -> D, the version in
service before the run (B, which an upgrade's snapshot also names) survives; the old prune kept versions by
directory age, kept C and deleted B, and the retry's rollback then pointed the link at nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from local_playbook import run_local_playbook

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the version in service before the run, as model.yml does
      ansible.builtin.stat:
        path: "{{ model_store_root }}/tiny"
        follow: false
      register: __model_store_link_before
    - name: Prune as the model layer does after pointing the link at D
      ansible.builtin.include_role:
        name: model_store
        tasks_from: prune.yml
      vars:
        __model_store_version_dir: "{{ model_store_root }}/tiny-dddddddddddddddd"
"""


def test_the_version_in_service_before_a_retry_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "models"
    versions = {}
    for age, letter in ((300, "b"), (200, "c"), (100, "d")):
        versions[letter] = root / f"tiny-{letter * 16}"
        versions[letter].mkdir(parents=True)
        stamp = time.time() - age
        os.utime(versions[letter], (stamp, stamp))
    # The failed upgrade B -> C was rolled back: B serves, C (newer) stays; the retry staged D.
    (root / "tiny").symlink_to(versions["b"])
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "state.json").write_text(json.dumps({"links": {str(root / "tiny"): str(versions["b"])}}))
    run_local_playbook(
        tmp_path,
        PLAYBOOK,
        {
            "model_store_root": str(root),
            "model_store_snapshot_dir": str(snapshot),
            "model_store_keep_versions": 2,
            "model_store_model": {"name": "tiny", "sha256": "d" * 64},
        },
    )
    # D in service now, B the one before (and named by the snapshot): both stay; C, beyond the two kept, goes.
    assert sorted(path.name for path in root.iterdir() if not path.is_symlink()) == [
        "tiny-" + "b" * 16,
        "tiny-" + "d" * 16,
    ]
