"""The lab inventory: shape Ansible expects, host keys verified, parsed by the real ansible-inventory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.lab import inventory
from gpufleet.lab.config import LabConfig

ROWS = [
    inventory.InventoryHost("lab-1", "10.213.7.6", "http://10.213.7.5:8780", "debian12", "/usr/bin/python3.11"),
    inventory.InventoryHost("lab-2", "10.213.7.10", "http://10.213.7.9:8780", "debian12", "/usr/bin/python3.11"),
]


@pytest.fixture
def config(tmp_path: Path) -> LabConfig:
    return LabConfig(
        cache_dir=tmp_path / "cache", lab_dir=tmp_path / "lab", prefix="lab", inventory_path=tmp_path / "hosts.yml"
    )


def test_hosts_are_in_gpu_nodes_in_order(config: LabConfig) -> None:
    document = yaml.safe_load(inventory.render(config, ROWS))
    hosts = document["all"]["children"]["gpu_nodes"]["hosts"]
    assert list(hosts) == ["lab-1", "lab-2"]
    assert hosts["lab-2"]["ansible_host"] == "10.213.7.10"
    assert hosts["lab-2"]["gpufleet_mirror_url"] == "http://10.213.7.9:8780"


def test_every_host_has_connection_settings(config: LabConfig) -> None:
    hosts = yaml.safe_load(inventory.render(config, ROWS))["all"]["children"]["gpu_nodes"]["hosts"]
    for entry in hosts.values():
        assert entry["ansible_user"] == "root"
        assert entry["ansible_ssh_private_key_file"] == str(config.private_key)
        assert entry["ansible_python_interpreter"] == "/usr/bin/python3.11"
        args = entry["ansible_ssh_common_args"]
        assert f"UserKnownHostsFile={config.known_hosts}" in args
        assert "StrictHostKeyChecking=yes" in args
        assert "StrictHostKeyChecking=no" not in args


def test_write_is_atomic_and_replaces(config: LabConfig) -> None:
    inventory.write(config.inventory_path, "first\n")
    inventory.write(config.inventory_path, inventory.render(config, ROWS[:1]))
    assert "lab-1" in config.inventory_path.read_text()
    assert [p.name for p in config.inventory_path.parent.iterdir()] == ["hosts.yml"]


def test_ansible_inventory_parses_it(config: LabConfig) -> None:
    tool = Path(sys.executable).with_name("ansible-inventory")
    if not tool.exists():
        tool = Path(shutil.which("ansible-inventory") or "ansible-inventory")
    inventory.write(config.inventory_path, inventory.render(config, ROWS))
    result = subprocess.run(
        [str(tool), "-i", str(config.inventory_path), "--list"], capture_output=True, text=True, check=True
    )
    parsed = json.loads(result.stdout)
    assert sorted(parsed["gpu_nodes"]["hosts"]) == ["lab-1", "lab-2"]
    assert parsed["_meta"]["hostvars"]["lab-1"]["ansible_host"] == "10.213.7.6"
