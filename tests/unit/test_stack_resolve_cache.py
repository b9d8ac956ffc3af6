"""The stack's validation is kept on the controller's disk for the other forked workers of a run (stack_resolve):
the same answer from the cache, and never a stale one once a knowledge-base table changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_resolve
from gpufleet import PROJECT_ROOT

STACK = yaml.safe_load((PROJECT_ROOT / "inventories/example/group_vars/h200.yml").read_text())["gpufleet_stack"]
PINS = yaml.safe_load((PROJECT_ROOT / "inventories/example/group_vars/all/main.yml").read_text())[
    "gpufleet_artifact_sha256"
]


def inputs() -> dict:
    return stack_resolve.inputs_of(
        {"gpufleet_stack": STACK, "gpufleet_mirror_url": "https://mirror.invalid/g", "gpufleet_artifact_sha256": PINS}
    )


def test_a_worker_gets_the_validation_from_disk_and_a_changed_table_is_a_new_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = tmp_path / "compat"
    shutil.copytree(PROJECT_ROOT / "data" / "compat", kb)
    monkeypatch.setenv("GPUFLEET_COMPAT_DIR", str(kb))
    monkeypatch.setattr(stack_resolve.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    stack_resolve._CACHE.clear()
    first = stack_resolve.validate_and_resolve(inputs())
    assert first["error"] is None and first["report"]["compatible"]
    (cached,) = (tmp_path / "tmp").glob("gpufleet-stack-*/*.json")

    stack_resolve._CACHE.clear()  # another worker: the answer comes from disk, the same
    assert stack_resolve.validate_and_resolve(inputs()) == first
    assert sorted((tmp_path / "tmp").glob("gpufleet-stack-*/*")) == [cached]

    # vLLM 0.26.0 gone from the knowledge base: the next worker validates again and refuses it.
    table = kb / "vllm.csv"
    table.write_text("".join(line for line in table.read_text().splitlines(keepends=True) if ",0.26.0," not in line))
    stack_resolve._CACHE.clear()
    again = stack_resolve.validate_and_resolve(inputs())
    assert again["error"] is not None and "0.26.0" in again["error"]
