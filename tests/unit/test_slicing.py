"""One run over N processes or controllers (issue 37): `gpufleet provision --slice K/N`, the slices' locks, and
`gpufleet report` joining their --json documents.

The provision runs are real (ansible-playbook through the runner) against an inventory of the lab's declaration
whose hosts cannot be reached: each slice's preflight reaches for exactly its own nodes and reports them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT, exit_codes
from gpufleet.errors import BusyError, UsageError
from gpufleet.locks import fleet_operation
from gpufleet.slicing import Slice, parse

NODES = [f"node-{n:02d}" for n in range(1, 8)]


def test_slices_are_disjoint_round_robin_and_together_every_node() -> None:
    slices = [Slice(index, 3).of(list(reversed(NODES))) for index in (1, 2, 3)]
    assert slices == [
        ["node-01", "node-04", "node-07"],
        ["node-02", "node-05"],
        ["node-03", "node-06"],
    ]
    assert sorted(node for chosen in slices for node in chosen) == NODES


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "1/0", "a/b", "1/2/3", "-1/2"])
def test_a_slice_that_is_not_k_of_n_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(UsageError, match=r"give K/N, slice K of N with 1 <= K <= N"):
        parse(text)


def test_a_slice_with_no_node_is_refused() -> None:
    with pytest.raises(UsageError, match=r"2 node\(s\) make no slice 3 of 3; slice them 2 ways at most"):
        Slice(3, 3).of(["a", "b"])


def test_slices_run_side_by_side_but_never_beside_the_whole_run_or_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOCK_DIR", str(tmp_path))
    inventory = tmp_path / "hosts.yml"
    with fleet_operation("provision", inventory, part="1/2"), fleet_operation("provision", inventory, part="2/2"):
        with pytest.raises(BusyError, match=r"slice 1/2 of .* is held by `gpufleet provision` of .*pid"):
            with fleet_operation("provision", inventory, part="1/2"):
                pass
        with pytest.raises(BusyError, match=r"is held by `gpufleet provision` of .* and `gpufleet provision` of"):
            with fleet_operation("provision", inventory):
                pass
    with fleet_operation("upgrade", inventory):
        with pytest.raises(BusyError, match=r"is held by `gpufleet upgrade`"):
            with fleet_operation("provision", inventory, part="2/2"):
                pass


@pytest.fixture
def unreachable_lab(tmp_path: Path) -> Path:
    """The lab's declaration on three hosts that no ssh reaches, and the stand-ins' pins the lab reads."""
    inventory = tmp_path / "lab"
    shutil.copytree(PROJECT_ROOT / "inventories" / "lab" / "group_vars", inventory / "group_vars")
    ssh = tmp_path / "ssh-unreachable"
    ssh.write_text("#!/bin/sh\nexit 255\n")
    ssh.chmod(0o755)
    hosts = {
        f"lab-{n}": {
            "ansible_host": f"10.9.9.{4 * n + 2}",
            "gpufleet_mirror_url": f"http://10.9.9.{4 * n + 1}:8780",
            "ansible_ssh_executable": str(ssh),
        }
        for n in (1, 2, 3)
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    standins = tmp_path / "cache" / "lab-upstream" / "nvidia"
    standins.mkdir(parents=True)
    pins = ["NVIDIA-Linux-x86_64-580.95.05.run", "cuda_12.8.1_570.124.06_linux.run", "cuda_13.0.2_580.95.05_linux.run"]
    (standins / "sha256.json").write_text(json.dumps({name: str(n) * 64 for n, name in enumerate(pins, start=1)}))
    return inventory / "hosts.yml"


def gpufleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = dict(
        os.environ,
        GPUFLEET_CACHE=str(tmp_path / "cache"),
        GPUFLEET_RUNS_DIR=str(tmp_path / "runs"),
        GPUFLEET_LOCK_DIR=str(tmp_path / "locks"),
    )
    return subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=environment,
        timeout=600,
        check=False,
    )


def test_each_slice_runs_on_its_nodes_and_the_report_joins_them(tmp_path: Path, unreachable_lab: Path) -> None:
    documents = []
    for part, expected in (("1/2", ["lab-1", "lab-3"]), ("2/2", ["lab-2"])):
        result = gpufleet(tmp_path, "provision", "-i", str(unreachable_lab), "--slice", part, "--json")
        assert result.returncode == exit_codes.FAILED, result.stdout + result.stderr
        document = json.loads(result.stdout)
        assert document["slice"]["hosts"] == expected
        assert sorted(document["runs"][0]["hosts"]) == expected  # only its own nodes were reached for
        assert f"slice {part}: {len(expected)} of 3 node(s)" in result.stderr
        path = tmp_path / f"slice-{part.replace('/', '-of-')}.json"
        path.write_text(result.stdout)
        documents.append(path)

    joined = gpufleet(tmp_path, "report", *map(str, documents))
    assert joined.returncode == exit_codes.FAILED, joined.stdout + joined.stderr
    lines = joined.stdout.splitlines()
    assert lines[0] == "gpufleet provision in 2 slice(s):"
    assert lines[1].startswith("  slice 1/2: 2 node(s), exit 1:") and lines[2].startswith(
        "  slice 2/2: 1 node(s), exit 1"
    )
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("lab-")}
    assert sorted(rows) == ["lab-1", "lab-2", "lab-3"] and all(row[3] == "1" for row in rows.values())  # unreachable

    alone = gpufleet(tmp_path, "report", "--json", str(documents[1]))
    assert alone.returncode == exit_codes.FAILED
    combined = json.loads(alone.stdout)
    assert combined["missing_slices"] == [1] and "slice(s) 1/2 missing" in combined["error"]

    twice = gpufleet(tmp_path, "report", str(documents[0]), str(documents[0]))
    assert twice.returncode == exit_codes.USAGE and "slice 1/2 is given twice" in twice.stderr

    empty = gpufleet(tmp_path, "provision", "-i", str(unreachable_lab), "--slice", "4/4")
    assert empty.returncode == exit_codes.USAGE and "3 node(s) make no slice 4 of 4" in empty.stderr
