"""The lab's Ray cluster in its inventory: `gpufleet lab up` puts hosts 1 and 2 (the ones its cluster link joins)
in group ray_cluster_lab with their link addresses, and the committed group_vars make the first the head; parsed
by the real ansible-inventory against the lab's own group_vars."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.lab import inventory, network
from gpufleet.lab.config import LabConfig


def rows(cluster: tuple[str, ...]) -> list[inventory.InventoryHost]:
    names = ("lab-1", "lab-2", "lab-3")
    return [inventory.InventoryHost(name, f"10.213.7.{4 * i + 6}", f"http://10.213.7.{4 * i + 5}:8780", "debian12",
                                    "/usr/bin/python3.11", cluster[i] if i < len(cluster) else "")
            for i, name in enumerate(names)]


def test_the_first_two_hosts_form_the_ray_group_with_their_link_addresses(tmp_path: Path) -> None:
    config = LabConfig(cache_dir=tmp_path / "c", lab_dir=tmp_path / "l", prefix="lab",
                       inventory_path=tmp_path / "lab" / "hosts.yml")
    shutil.copytree(PROJECT_ROOT / "inventories" / "lab" / "group_vars", tmp_path / "lab" / "group_vars")
    inventory.write(config.inventory_path, inventory.render(config, rows(network.CLUSTER_ADDRESSES)))
    tool = Path(sys.executable).with_name("ansible-inventory")
    result = subprocess.run([str(tool), "-i", str(config.inventory_path), "--list"], capture_output=True, text=True,
                            check=True, cwd=PROJECT_ROOT)
    parsed = json.loads(result.stdout)
    assert parsed["ray_cluster_lab"]["hosts"] == ["lab-1", "lab-2"]
    hostvars = parsed["_meta"]["hostvars"]
    assert hostvars["lab-2"]["gpufleet_lab_cluster_address"] == "10.254.0.2"
    assert hostvars["lab-1"]["ray_cluster_group"] == "ray_cluster_lab"
    assert "ray_cluster_group" not in hostvars["lab-3"] and "gpufleet_lab_cluster_address" not in hostvars["lab-3"]


def test_a_one_host_lab_has_no_ray_group(tmp_path: Path) -> None:
    config = LabConfig(cache_dir=tmp_path / "c", lab_dir=tmp_path / "l", prefix="lab", inventory_path=tmp_path / "h.yml")
    document = yaml.safe_load(inventory.render(config, rows(())[:1]))
    assert list(document["all"]["children"]) == ["gpu_nodes"]
