"""gpufleet: provision NVIDIA GPU servers into vLLM inference nodes and keep a fleet identical."""

from importlib.metadata import version
from pathlib import Path

# pyproject.toml owns the version; galaxy.yml repeats it because ansible-galaxy reads only a literal there
# (tests/unit/test_collection_packaging.py fails when the two differ).
__version__ = version("gpufleet")

# The project root: playbooks, roles, plugins and inventories are found relative to it.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
