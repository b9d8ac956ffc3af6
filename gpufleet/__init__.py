"""gpufleet: provision NVIDIA GPU servers into vLLM inference nodes and keep a fleet identical."""

import os
import sys
from pathlib import Path

# The one place of gpufleet's version: pyproject.toml reads it (setuptools' dynamic version), galaxy.yml repeats
# it because ansible-galaxy reads only a literal there (tests/unit/test_collection_packaging.py fails when they
# differ). A literal, not the installed metadata: a checkout runs this package without installing it.
__version__ = "0.1.0"


def collection_search_paths() -> list[Path]:
    """Where Ansible looks for installed collections: ANSIBLE_COLLECTIONS_PATH, its defaults, then sys.path (pip)."""
    configured = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS")
    defaults = [Path.home() / ".ansible" / "collections", Path("/usr/share/ansible/collections")]
    named = [Path(item).expanduser() for item in configured.split(os.pathsep) if item] if configured else defaults
    return [*named, *(Path(entry) for entry in sys.path if entry)]


def find_project_root() -> Path:
    """The collection gpufleet.fleet this package belongs to: the checkout around it, or (a CLI installed with pip;
    the collection's tarball does not carry this package) the collection Ansible would find; else the package's
    parent, where the CLI then says what is missing (gpufleet.collection.missing_collection)."""
    here = Path(__file__).resolve().parent.parent
    if (here / "galaxy.yml").is_file():
        return here
    for base in collection_search_paths():
        candidate = base / "ansible_collections" / "gpufleet" / "fleet"
        if (candidate / "playbooks").is_dir() and (candidate / "MANIFEST.json").is_file():
            return candidate.absolute()
    return here


# The project root: playbooks, roles, plugins and inventories are found relative to it.
PROJECT_ROOT: Path = find_project_root()

# The CLI uses the collection gpufleet.fleet (its module_utils and plugin_utils, e.g. the drift report model) by
# the names Ansible gives them, ansible_collections.gpufleet.fleet...; the collection never imports this package.
from gpufleet.collection import collections_dir  # noqa: E402

if str(collections_dir()) not in sys.path:
    sys.path.append(str(collections_dir()))
