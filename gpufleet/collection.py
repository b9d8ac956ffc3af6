"""The Ansible side of gpufleet is the collection gpufleet.fleet, rooted at PROJECT_ROOT: a checkout, or a copy
that ansible-galaxy installed, which a CLI installed with pip finds on Ansible's collections path.

Ansible finds the collection through a collections path; the CLI imports the collection's module_utils through
the same path, so the controller runs the very files that modules ship to hosts.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

from gpufleet import PROJECT_ROOT, __version__

NAMESPACE, NAME = "gpufleet", "fleet"
PACKAGE = f"ansible_collections.{NAMESPACE}.{NAME}"


def collections_dir(root: Path = PROJECT_ROOT) -> Path:
    """The directory holding ansible_collections/gpufleet/fleet for `root`: the collections path an installed
    copy sits in, or the checkout's collections/ (where gpufleet/fleet is a link back to the checkout)."""
    if (root.name, root.parent.name, root.parent.parent.name) == (NAME, NAMESPACE, "ansible_collections"):
        return root.parents[2]
    return root / "collections"


def module_util(name: str) -> ModuleType:
    """plugins/module_utils/<name>.py, imported by its collection path as modules and plugins import it (the
    package gpufleet puts collections_dir() on sys.path)."""
    return importlib.import_module(f"{PACKAGE}.plugins.module_utils.{name}")


def plugin_util(name: str) -> ModuleType:
    """plugins/plugin_utils/<name>.py (controller-only code), imported by its collection path as plugins import it."""
    return importlib.import_module(f"{PACKAGE}.plugins.plugin_utils.{name}")


def missing_collection(root: Path = PROJECT_ROOT) -> str:
    """Why the CLI cannot run playbooks from `root` ("" when it can): no collection found (a CLI installed with
    pip, without the collection), or an installed collection of another version than this CLI."""
    if not (root / "playbooks").is_dir():
        return (
            f"gpufleet's collection gpufleet.fleet was not found (not around this package, nor on Ansible's "
            f"collections path or sys.path): install it with `ansible-galaxy collection install "
            f"gpufleet-fleet-{__version__}.tar.gz` (`make collection` builds it), or run gpufleet from a checkout"
        )
    manifest = root / "MANIFEST.json"
    if manifest.is_file():
        installed = json.loads(manifest.read_text()).get("collection_info", {}).get("version")
        if installed != __version__:
            return (
                f"the collection gpufleet.fleet at {root} is version {installed}, this gpufleet CLI {__version__}: "
                "install the same version of both"
            )
    return ""
