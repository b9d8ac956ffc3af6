"""`gpufleet demo` provisions and asks the lab that `gpufleet lab up` made: a private lab's inventory
(GPUFLEET_LAB_INVENTORY) too, not the shared lab's path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.commands import demo

PRIVATE = """
all:
  children:
    gpu_nodes:
      hosts:
        p-2: {ansible_host: 10.251.0.6}
        p-1: {ansible_host: 10.251.0.2}
"""


def test_the_demo_reads_the_inventory_lab_up_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = tmp_path / "p-hosts.yml"
    inventory.write_text(PRIVATE)
    monkeypatch.setenv("GPUFLEET_LAB_INVENTORY", str(inventory))
    assert demo.lab_inventory() == inventory
    assert demo.first_host_address() == "10.251.0.2"
