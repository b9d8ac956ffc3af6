"""gpufleet: provision NVIDIA GPU servers into vLLM inference nodes and keep a fleet identical."""

from pathlib import Path

__version__ = "0.1.0"

# The project root: playbooks, roles, plugins and inventories are found relative to it.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
