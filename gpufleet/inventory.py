"""Reads an inventory in-process, before any playbook runs: the nodes it targets, or one line saying why none.

Every command that runs a playbook asks here first, so that an inventory that is missing or does not parse, one
without a gpu_nodes group, or a --limit that matches nothing is a usage error (exit 64) and never an empty run
that "succeeds".
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import UsageError

NODE_GROUP = "gpu_nodes"
# Ansible's words for a source it could not read (a YAML error, an unknown format).
PARSE_FAILURES = ("Failed to parse", "Unable to parse", "Completely failed to parse")


@dataclass(frozen=True)
class InventoryRead:
    """The nodes of group gpu_nodes (narrowed by the limit), every group's name, and what Ansible warned."""

    nodes: list[str]
    groups: list[str]
    warnings: list[str]

    @property
    def parse_failure(self) -> str:
        """Ansible's first line about a source it could not parse ("" when every source parsed)."""
        return next((line for line in self.warnings if any(word in line for word in PARSE_FAILURES)), "")


def read_inventory(inventory: Path, limit: str | None = None) -> InventoryRead:
    from ansible.inventory.manager import InventoryManager  # imported here so `gpufleet --help` stays fast
    from ansible.parsing.dataloader import DataLoader

    if not inventory.exists():
        raise UsageError(f"inventory {inventory} does not exist (for the lab, run `gpufleet lab up` first)")
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
        groups = sorted(manager.groups)
        if limit:
            manager.subset(limit)
        nodes = sorted(host.name for host in manager.get_hosts(NODE_GROUP))
    warnings = [" ".join(line.split()) for line in captured.getvalue().splitlines() if line.strip()]
    return InventoryRead(nodes, groups, warnings)


def pass_on_warnings(read: InventoryRead) -> None:
    """Ansible's warnings about the inventory, on stderr; a limit that matches nothing is said once, by the caller."""
    for line in read.warnings:
        if "Could not match supplied host pattern" not in line:
            print(line, file=sys.stderr)


def inventory_hosts(inventory: Path, limit: str | None = None) -> list[str]:
    """The nodes (group gpu_nodes) of an inventory, narrowed by an ansible --limit pattern; maybe none."""
    read = read_inventory(inventory, limit)
    pass_on_warnings(read)
    return read.nodes


def target_nodes(inventory: Path, limit: str | None = None) -> list[str]:
    """The nodes a command will run on; UsageError naming the problem and the fix when there are none."""
    read = read_inventory(inventory, limit)
    if read.nodes:
        pass_on_warnings(read)
        return read.nodes
    graph = f"`ansible-inventory -i {inventory} --graph` shows what Ansible reads"
    if read.parse_failure:
        raise UsageError(f"inventory {inventory} does not parse: {read.parse_failure}; fix it ({graph})")
    if NODE_GROUP not in read.groups:
        others = ", ".join(group for group in read.groups if group not in ("all", "ungrouped")) or "none"
        raise UsageError(
            f"inventory {inventory} has no group {NODE_GROUP} (its groups: {others}): put the GPU nodes in a "
            f"group named {NODE_GROUP}"
        )
    if limit:
        raise UsageError(f"--limit {limit} matches no node of {inventory} (group {NODE_GROUP}); {graph}")
    raise UsageError(f"inventory {inventory}: group {NODE_GROUP} has no host; add the GPU nodes to it")
