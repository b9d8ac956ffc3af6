"""`playbooks/prune.yml` on a converged lab node (issue 12, item 7; issue 28, review L11): what the node declares
(its stack's runfiles and tarballs, its models, read through the real stack lookup) is never a candidate; old
entries of one kind planted in its cache, one named by a rollback record: check mode removes nothing; with a
retention that keeps every one of the node's own entries, the prune keeps that many of the planted kind too (the
retention counts each kind on its own) and removes only the oldest planted ones beyond it, never the recorded one;
a rerun changes nothing. About 40 s."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_driver_support import sh

from conftest import BIN
from gpufleet import PROJECT_ROOT

CACHE = "/var/cache/gpufleet/artifacts"
RECORD = "/var/lib/gpufleet/prune-test-record.json"
RECORDED = "f" * 64


def planted_entries(count: int) -> dict[str, str]:
    """sha256 -> file name of `count` unrecorded entries of one kind, oldest first, and the recorded one."""
    entries = {f"{index:064x}": f"gpufleet-prune-test-{index}.run" for index in range(count)}
    return {**entries, RECORDED: "gpufleet-prune-test-recorded.run"}


def cached(inventory: Path, node: str) -> set[str]:
    rc, text = sh(inventory, node, f"ls -1 {CACHE}")
    assert rc == 0, text
    return set(text.split())


def prune(inventory: Path, node: str, retention: int, check: bool) -> str:
    command = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        "--limit",
        node,
        "playbooks/prune.yml",
        "-e",
        json.dumps({"artifact_node_cache_retention": retention}),
    ] + (["--check"] if check else [])
    result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


def said(output: str) -> tuple[int, str]:
    """(how many entries, the files) of the role's 'would remove / removed N cached artifact(s)' line."""
    found = re.search(
        r"(?:would remove|removed) (\d+) cached artifact\(s\), [^(]*\(([^)]*)\)", " ".join(output.split())
    )
    assert found, output[-3000:]
    return int(found.group(1)), found.group(2)


@pytest.fixture()
def node(lab_inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[str]:
    node = sorted(lab_hosts)[0]
    yield node
    # Every planted entry (a sha256 directory holding a gpufleet-prune-test-* file), and the record.
    sh(
        lab_inventory,
        node,
        f"find {CACHE} -mindepth 2 -maxdepth 2 -name 'gpufleet-prune-test-*' -printf '%h\\n' | xargs -r rm -rf; "
        f"rm -f {RECORD}",
    )


def plant(inventory: Path, node: str, entries: dict[str, str]) -> None:
    """Older than anything the lab cached (2001-01-01 onwards, oldest first); the last one named by a record."""
    commands = "; ".join(
        f"mkdir {CACHE}/{sha} && head -c 1000 /dev/zero > {CACHE}/{sha}/{name} && "
        f"touch -d '2001-01-01 +{index} days' {CACHE}/{sha}"
        for index, (sha, name) in enumerate(entries.items())
    )
    rc, text = sh(inventory, node, f"set -e; {commands}; echo '{json.dumps({'sha256': RECORDED})}' > {RECORD}")
    assert rc == 0, text


def test_prune_keeps_what_the_node_uses_and_its_records_and_removes_old_entries(lab_inventory: Path, node: str) -> None:
    real = cached(lab_inventory, node)
    assert real, f"{node}'s artifact cache is empty: the suite's converged lab copies its artifacts there"
    # The node's own entries that it does not declare: a retention of that many keeps every one of them.
    own, files = said(prune(lab_inventory, node, retention=0, check=True))
    for declared in ("NVIDIA-Linux-x86_64-", "tiny-qwen2.tar.gz", "Python-", "pyenv-"):
        assert declared not in files, f"{declared}* is declared by {node} but would be pruned: {files}"
    # Two more of the planted kind than that retention keeps: the two oldest must go, and only they.
    entries = planted_entries(own + 2)
    plant(lab_inventory, node, entries)

    # Retention 0, check mode: every entry neither declared nor recorded is listed, nothing is removed.
    count, files = said(prune(lab_inventory, node, retention=0, check=True))
    assert count == own + len(entries) - 1, files
    assert cached(lab_inventory, node) == real | set(entries)
    assert entries[RECORDED] not in files

    count, files = said(prune(lab_inventory, node, retention=own, check=False))
    oldest = list(entries)[:2]
    assert count == 2 and sorted(files.split(", ")) == sorted(entries[sha] for sha in oldest), files
    assert cached(lab_inventory, node) == real | (set(entries) - set(oldest))
    rerun = prune(lab_inventory, node, retention=own, check=False)
    assert re.search(rf"{re.escape(node)}\s*:\s*ok=\d+\s+changed=0\s", rerun), rerun[-2000:]
