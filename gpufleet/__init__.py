"""gpufleet: provision NVIDIA GPU servers into vLLM inference nodes and keep a fleet identical."""

import sys
from pathlib import Path

# The one place of gpufleet's version: pyproject.toml reads it (setuptools' dynamic version), galaxy.yml repeats
# it because ansible-galaxy reads only a literal there (tests/unit/test_collection_packaging.py fails when they
# differ). A literal, not the installed metadata: an installed collection runs this package without pip.
__version__ = "0.1.0"

# The project root: playbooks, roles, plugins and inventories are found relative to it.
PROJECT_ROOT: Path = Path(__file__).resolve().parent.parent

# The CLI uses the collection gpufleet.fleet (its module_utils and plugin_utils, e.g. the drift report model) by
# the names Ansible gives them, ansible_collections.gpufleet.fleet...; the collection never imports this package.
from gpufleet.collection import collections_dir  # noqa: E402

if str(collections_dir()) not in sys.path:
    sys.path.append(str(collections_dir()))
