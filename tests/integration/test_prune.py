"""`playbooks/prune.yml` on a converged lab node (issue 12, item 7): what the node declares (its stack's runfiles
and tarballs, its models, read through the real stack lookup) is never a candidate; three old entries planted
in its cache, one named by a rollback record: check mode removes nothing, the prune removes the two unrecorded
ones and nothing the node uses, and a rerun changes nothing. About 40 s."""

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
PLANTED = {sha * 64: f"gpufleet-prune-test-{sha}.run" for sha in "012"}
RECORDED = "2" * 64


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
def planted(lab_inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[tuple[str, set[str]]]:
    node = sorted(lab_hosts)[0]
    before = cached(lab_inventory, node)
    assert before, f"{node}'s artifact cache is empty: the suite's converged lab copies its artifacts there"
    # Older than anything the lab cached: 2001-01-0N.
    plant = "; ".join(
        f"mkdir {CACHE}/{sha} && head -c 1000 /dev/zero > {CACHE}/{sha}/{name} && "
        f"touch -d 2001-01-0{index + 1} {CACHE}/{sha}"
        for index, (sha, name) in enumerate(PLANTED.items())
    )
    rc, text = sh(lab_inventory, node, f"set -e; {plant}; echo '{json.dumps({'sha256': RECORDED})}' > {RECORD}")
    assert rc == 0, text
    yield node, before
    sh(lab_inventory, node, f"rm -rf {' '.join(f'{CACHE}/{sha}' for sha in PLANTED)} {RECORD}")


def test_prune_keeps_what_the_node_uses_and_its_records_and_removes_old_entries(
    lab_inventory: Path, planted: tuple[str, set[str]]
) -> None:
    node, real = planted
    # Retention 0, check mode: every entry neither declared nor recorded is listed, nothing is removed.
    count, files = said(prune(lab_inventory, node, retention=0, check=True))
    assert cached(lab_inventory, node) == real | set(PLANTED)
    assert PLANTED["0" * 64] in files and PLANTED["1" * 64] in files and PLANTED[RECORDED] not in files
    for declared in ("NVIDIA-Linux-x86_64-", "tiny-qwen2.tar.gz", "Python-", "pyenv-"):
        assert declared not in files, f"{declared}* is declared by {node} but would be pruned: {files}"
    undeclared = count - 2

    # Retention = the node's own undeclared entries (newer than the planted ones): only the two old ones go.
    count, files = said(prune(lab_inventory, node, retention=undeclared, check=False))
    assert count == 2, files
    assert cached(lab_inventory, node) == real | {RECORDED}
    rerun = prune(lab_inventory, node, retention=undeclared, check=False)
    assert re.search(rf"{re.escape(node)}\s*:\s*ok=\d+\s+changed=0\s", rerun), rerun[-2000:]
