"""cuda_toolkit's snapshot and restore (issue 28), run for real by ansible-playbook on this machine against a
toolkit link and two toolkit prefixes in a temporary directory: an upgrade that made another toolkit active and
failed is rolled back to the toolkit that served; a kept toolkit that is gone is named, and the link left alone.
Before, the toolkit layer kept nothing, and every build after a rollback went on using the upgrade's toolkit."""

from __future__ import annotations

import json
from pathlib import Path

from local_playbook import rollback_playbook, run_local_playbook

UPGRADE = """
    - name: Make the new toolkit active, as the toolkit layer does
      ansible.builtin.file:
        src: "{{ toolkits }}/cuda-12.9"
        dest: "{{ cuda_toolkit_link }}"
        state: link
        force: true
    - name: Remove the kept toolkit, when the test asks
      ansible.builtin.file:
        path: "{{ toolkits }}/cuda-12.8"
        state: absent
      when: remove_kept | bool
"""


def toolkits(tmp_path: Path) -> Path:
    root = tmp_path / "toolkits"
    for version in ("12.8", "12.9"):
        nvcc = root / f"cuda-{version}" / "bin" / "nvcc"
        nvcc.parent.mkdir(parents=True)
        nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version}'\n")
        nvcc.chmod(0o755)
    (root / "cuda").symlink_to(root / "cuda-12.8")
    return root


def roll_back(tmp_path: Path, root: Path, *, remove_kept: bool) -> dict:
    run_local_playbook(
        tmp_path,
        rollback_playbook("cuda_toolkit", UPGRADE),
        {
            "toolkits": str(root),
            "cuda_toolkit_link": str(root / "cuda"),
            "cuda_toolkit_snapshot_dir": str(tmp_path / "snapshot"),
            "remove_kept": remove_kept,
        },
    )
    kept = json.loads((tmp_path / "snapshot" / "state.json").read_text())
    assert kept == {"link": str(root / "cuda"), "target": str(root / "cuda-12.8")}
    return json.loads((tmp_path / "restored.json").read_text())


def test_a_rollback_makes_the_toolkit_that_served_active_again(tmp_path: Path) -> None:
    root = toolkits(tmp_path)
    restored = roll_back(tmp_path, root, remove_kept=False)
    assert (root / "cuda").readlink() == root / "cuda-12.8"
    assert restored == {"restored": ["CUDA toolkit cuda-12.8 active again"], "not_restored": []}
    # The toolkit the upgrade installed stays, inactive.
    assert (root / "cuda-12.9" / "bin" / "nvcc").is_file()


def test_a_kept_toolkit_that_is_gone_is_named_and_the_link_left_alone(tmp_path: Path) -> None:
    root = toolkits(tmp_path)
    restored = roll_back(tmp_path, root, remove_kept=True)
    assert (root / "cuda").readlink() == root / "cuda-12.9"
    assert restored == {
        "restored": [],
        "not_restored": [f"CUDA toolkit {root}/cuda-12.8 is gone or broken: {root}/cuda left as the upgrade set it"],
    }
