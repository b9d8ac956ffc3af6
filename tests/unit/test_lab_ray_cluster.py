"""The lab's Ray cluster in its inventory: `gpufleet lab up` puts hosts 1 and 2 (the ones its cluster link joins)
in group ray_cluster_lab with their link addresses, and the committed group_vars make the first the head; parsed
by the real ansible-inventory against the lab's own group_vars."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.lab import inventory, network
from gpufleet.lab.config import LabConfig


def rows(cluster: tuple[str, ...]) -> list[inventory.InventoryHost]:
    names = ("lab-1", "lab-2", "lab-3")
    return [
        inventory.InventoryHost(
            name,
            f"10.213.7.{4 * i + 6}",
            f"http://10.213.7.{4 * i + 5}:8780",
            "debian12",
            "/usr/bin/python3.11",
            cluster[i] if i < len(cluster) else "",
        )
        for i, name in enumerate(names)
    ]


def test_the_first_two_hosts_form_the_ray_group_with_their_link_addresses(tmp_path: Path) -> None:
    config = LabConfig(
        cache_dir=tmp_path / "c", lab_dir=tmp_path / "l", prefix="lab", inventory_path=tmp_path / "lab" / "hosts.yml"
    )
    shutil.copytree(PROJECT_ROOT / "inventories" / "lab" / "group_vars", tmp_path / "lab" / "group_vars")
    inventory.write(config.inventory_path, inventory.render(config, rows(network.CLUSTER_ADDRESSES)))
    tool = Path(sys.executable).with_name("ansible-inventory")
    result = subprocess.run(
        [str(tool), "-i", str(config.inventory_path), "--list"],
        capture_output=True,
        text=True,
        check=True,
        cwd=PROJECT_ROOT,
    )
    parsed = json.loads(result.stdout)
    assert parsed["ray_cluster_lab"]["hosts"] == ["lab-1", "lab-2"]
    hostvars = parsed["_meta"]["hostvars"]
    assert hostvars["lab-2"]["gpufleet_lab_cluster_address"] == "10.254.0.2"
    assert hostvars["lab-1"]["ray_cluster_networks"] == ["10.254.0.0/30"]
    assert hostvars["lab-1"]["ray_cluster_socket_ifname"] == network.CLUSTER_IFNAME
    assert "ray_cluster_head" not in hostvars["lab-3"] and "gpufleet_lab_cluster_address" not in hostvars["lab-3"]
    # Formed on demand (-e ray_cluster_group=ray_cluster_lab): the suite's other tests run without Ray.
    assert "ray_cluster_group" not in hostvars["lab-1"]


def test_a_one_host_lab_has_no_ray_group(tmp_path: Path) -> None:
    config = LabConfig(
        cache_dir=tmp_path / "c", lab_dir=tmp_path / "l", prefix="lab", inventory_path=tmp_path / "h.yml"
    )
    document = yaml.safe_load(inventory.render(config, rows(())[:1]))
    assert list(document["all"]["children"]) == ["gpu_nodes"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2")
def test_the_cluster_link_joins_two_namespaces_once_and_is_made_again_when_one_end_is_gone() -> None:
    first, second = f"gft-{os.getpid()}-a", f"gft-{os.getpid()}-b"
    try:
        for name in (first, second):
            subprocess.run(["ip", "netns", "add", name], check=True)
        assert network.ensure_cluster_link(first, second) is True
        assert network.ensure_cluster_link(first, second) is False, "an intact link is left alone"
        for name, address in zip((first, second), network.CLUSTER_ADDRESSES):
            shown = subprocess.run(
                ["ip", "-n", name, "-br", "addr", "show", "dev", network.CLUSTER_IFNAME],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert f"{address}/{network.CLUSTER_PREFIXLEN}" in shown and " UP " in shown
        # A host made anew gets a new namespace: its end of the pair is gone, and so is the peer.
        subprocess.run(["ip", "netns", "del", second], check=True)
        subprocess.run(["ip", "netns", "add", second], check=True)
        assert network.ensure_cluster_link(first, second) is True
    finally:
        for name in (first, second):
            subprocess.run(["ip", "netns", "del", name], check=False)
