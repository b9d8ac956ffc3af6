"""The units the driver layer stops before the installer runs (a module in use cannot be unloaded) are named by
nvidia_driver_gpu_units_pattern; the units themselves are other roles'. Both sides read from the roles' files."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
PATTERN = yaml.safe_load((ROLES / "nvidia_driver" / "defaults" / "main.yml").read_text())[
    "nvidia_driver_gpu_units_pattern"
]


def ray_member_unit(kind: str) -> str:
    """ray_cluster's unit for a member of this kind, from its vars/main.yml."""
    unit = yaml.safe_load((ROLES / "ray_cluster" / "vars" / "main.yml").read_text())["__ray_cluster_unit"]
    return jinja2.Template(unit).render(__ray_cluster_kind=kind)


def test_the_driver_layer_stops_the_instances_and_the_ray_member_whose_workers_hold_the_gpus() -> None:
    # H3: a Ray member's workers (an instance on Ray) kept the GPUs open and the installer failed ("no working
    # driver" after the old one was uninstalled).
    holders = ["vllm@main.service", ray_member_unit("head"), ray_member_unit("worker")]
    assert holders[1:] == ["ray-head.service", "ray-worker.service"]
    assert all(re.search(PATTERN, unit) for unit in holders)
    assert not [
        unit for unit in ("nginx.service", "ray.service", "vllm-nvidia-devices.service") if re.search(PATTERN, unit)
    ]
