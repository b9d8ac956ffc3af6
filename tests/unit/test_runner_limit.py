"""A --limit of thousands of hosts (the upgrade's batches, a slice of a large fleet) reaches ansible-playbook as a
file: joined on the command line it is one argument over Linux's 128 KiB and the run never starts (E2BIG)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet import runner

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def fleet(tmp_path: Path, count: int) -> tuple[Path, Path, list[str]]:
    names = [f"gpu-node-{index:05d}.rack-{index // 40:03d}.fleet.example.internal" for index in range(count)]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": dict.fromkeys(names, {"ansible_connection": "local"})}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: all\n  gather_facts: false\n  tasks: []\n")
    return inventory, playbook, names


def listed_hosts(inventory: Path, playbook: Path, limit: str) -> list[str]:
    command = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook), "--limit", limit, "--list-hosts"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    start = next(index for index, line in enumerate(lines) if line.strip().startswith("hosts ("))
    return [line.strip() for line in lines[start + 1 :] if line.strip()]


def test_a_limit_of_thousands_of_hosts_goes_to_ansible_as_a_file(tmp_path: Path) -> None:
    inventory, playbook, names = fleet(tmp_path, 5000)
    limit = ",".join(names[1:])

    # As one argument (what the upgrade passed before): the kernel refuses to start the process.
    with pytest.raises(OSError) as refused:
        listed_hosts(inventory, playbook, limit)
    assert refused.value.errno == errno.E2BIG

    argument = runner.limit_argument(limit, tmp_path)
    assert argument == f"@{tmp_path}/limit"
    assert sorted(listed_hosts(inventory, playbook, argument)) == names[1:]


def test_a_short_limit_stays_inline() -> None:
    assert runner.limit_argument("lab-1,lab-2", Path("/nonexistent")) == "lab-1,lab-2"
    assert runner.limit_argument(None, Path("/nonexistent")) is None
