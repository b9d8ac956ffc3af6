"""The node artifact cache is pruned to what the node uses, what a rollback record names and the retention
(issue 12, item 7). The role's prune.yml runs for real through ansible-playbook against a cache directory on
this machine (connection local): check mode first, then the prune, then a rerun that changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "artifact" / "library"))
from artifact_cache_prune import plan  # noqa: E402

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: artifact
        tasks_from: prune.yml
    # What the role's prune task returned, for the test to read.
    - ansible.builtin.copy:
        content: "{{ __artifact_pruned | to_json }}"
        dest: "{{ result_file }}"
        mode: "0600"
      check_mode: false
"""
DRIVER_NOW, DRIVER_BEFORE, DRIVER_OLDER, TOOLKIT_OLD, TOOLKIT_OLDEST = (c * 64 for c in "abcde")


def cache_entry(cache: Path, sha256: str, name: str, size: int, age_days: int) -> None:
    entry = cache / sha256
    entry.mkdir(parents=True)
    (entry / name).write_bytes(b"\0" * size)
    when = 1_800_000_000 - age_days * 86400
    os.utime(entry, (when, when))


def a_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "artifacts"
    cache_entry(cache, DRIVER_NOW, "NVIDIA-Linux-x86_64-580.95.05.run", 300, 1)
    cache_entry(cache, DRIVER_BEFORE, "NVIDIA-Linux-x86_64-570.133.20.run", 200, 40)
    cache_entry(cache, DRIVER_OLDER, "NVIDIA-Linux-x86_64-570.124.06.run", 100, 90)
    cache_entry(cache, TOOLKIT_OLD, "cuda_12.8.1_570.124.06_linux.run", 1000, 60)
    cache_entry(cache, TOOLKIT_OLDEST, "cuda_12.4.1_550.54.15_linux.run", 900, 200)
    (cache / "not-a-sha256").mkdir()
    (cache / ("f" * 64)).symlink_to(cache / "not-a-sha256")
    return cache


def prune(tmp_path: Path, cache: Path, check: bool, **variables: object) -> dict:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    (tmp_path / "vars.json").write_text(
        json.dumps(
            {
                "artifact_node_cache": str(cache),
                "artifact_node_records_dir": str(tmp_path / "records"),
                "ansible_python_interpreter": str(REPO / ".venv/bin/python"),
                "result_file": str(tmp_path / "pruned.json"),
                **variables,
            }
        )
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    argv = [str(REPO / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(book), "-e", f"@{tmp_path / 'vars.json'}"]
    result = subprocess.run(
        argv + (["--check", "--diff"] if check else []), cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    return json.loads((tmp_path / "pruned.json").read_text())


def cached_entries(*entries: tuple[str, str]) -> list[dict]:
    """(sha256, file name), newest first."""
    return [{"sha256": sha, "files": [name], "mtime": 100 - index} for index, (sha, name) in enumerate(entries)]


def test_plan_keeps_declared_recorded_and_the_newest_others_of_each_kind() -> None:
    cached = cached_entries(
        (DRIVER_NOW, "NVIDIA-Linux-x86_64-580.95.05.run"),
        (DRIVER_BEFORE, "NVIDIA-Linux-x86_64-570.133.20.run"),
        (TOOLKIT_OLD, "cuda_12.8.1_570.124.06_linux.run"),
        (DRIVER_OLDER, "NVIDIA-Linux-x86_64-570.124.06.run"),
        (TOOLKIT_OLDEST, "cuda_12.4.1_550.54.15_linux.run"),
    )
    kept, removed = plan(cached, {DRIVER_NOW}, {TOOLKIT_OLDEST}, retention=1)
    assert kept == {
        DRIVER_NOW: "declared",
        TOOLKIT_OLDEST: "recorded",
        DRIVER_BEFORE: "retention",
        TOOLKIT_OLD: "retention",
    }
    assert [entry["sha256"] for entry in removed] == [DRIVER_OLDER]
    assert plan(cached, set(), set(), retention=0)[1][0]["sha256"] == TOOLKIT_OLDEST


def test_the_previous_driver_is_not_crowded_out_by_newer_artifacts_of_other_kinds() -> None:
    """Review L11: after an upgrade of driver, CPython and kernels, the retention counted every kind together,
    and the two newest unused entries were a CPython tarball and a kernel wheel: the previous driver went."""
    python_old, wheel_old = "1" * 64, "2" * 64
    cached = cached_entries(
        (python_old, "Python-3.12.6.tar.xz"),
        (wheel_old, "flash_attn-2.7.3-cp312-cp312-linux_x86_64.whl"),
        (DRIVER_BEFORE, "NVIDIA-Linux-x86_64-570.133.20.run"),
    )
    kept, removed = plan(cached, set(), set(), retention=1)
    assert set(kept) == {python_old, wheel_old, DRIVER_BEFORE} and removed == []


def test_check_mode_removes_nothing_then_the_prune_removes_what_it_said_and_a_rerun_changes_nothing(
    tmp_path: Path,
) -> None:
    cache = a_cache(tmp_path)
    records = tmp_path / "records"
    records.mkdir()
    # The driver's record names the runfile a failed upgrade reinstalls: it stays although it is the oldest.
    (records / "nvidia-driver.json").write_text(json.dumps({"version": "550.54.15", "sha256": TOOLKIT_OLDEST.upper()}))
    (records / "broken.json").write_text("{not json")
    before = sorted(path.name for path in cache.iterdir())

    checked = prune(tmp_path, cache, check=True, artifact_prune_keep=[DRIVER_NOW], artifact_node_cache_retention=1)
    assert checked["changed"] is True and sorted(path.name for path in cache.iterdir()) == before
    # One of each kind stays: the newer of the two unused drivers, the unused toolkit.
    assert [entry["files"] for entry in checked["removed"]] == [["NVIDIA-Linux-x86_64-570.124.06.run"]]
    assert checked["freed_bytes"] == 100
    removed_file = "NVIDIA-Linux-x86_64-570.124.06.run"
    assert removed_file in checked["diff"]["before"] and removed_file not in checked["diff"]["after"]

    pruned = prune(tmp_path, cache, check=False, artifact_prune_keep=[DRIVER_NOW], artifact_node_cache_retention=1)
    assert pruned["removed"] == checked["removed"] and pruned["changed"] is True
    assert pruned["kept"] == {
        DRIVER_NOW: "declared",
        TOOLKIT_OLDEST: "recorded",
        DRIVER_BEFORE: "retention",
        TOOLKIT_OLD: "retention",
    }
    assert sorted(path.name for path in cache.iterdir()) == sorted(
        [DRIVER_NOW, DRIVER_BEFORE, TOOLKIT_OLD, TOOLKIT_OLDEST, "not-a-sha256", "f" * 64]
    )

    rerun = prune(tmp_path, cache, check=False, artifact_prune_keep=[DRIVER_NOW], artifact_node_cache_retention=1)
    assert rerun["changed"] is False and rerun["removed"] == []


def test_the_default_retention_keeps_two_of_each_kind_and_a_missing_cache_is_nothing_to_do(tmp_path: Path) -> None:
    cache = a_cache(tmp_path)
    pruned = prune(tmp_path, cache, check=False, artifact_prune_keep=[])
    assert [entry["sha256"] for entry in pruned["removed"]] == [DRIVER_OLDER]
    assert prune(tmp_path, tmp_path / "none", check=False, artifact_prune_keep=[])["changed"] is False
