"""The inference_venv role on the project's H100 (issue 38, tests/fixtures/h100-real/README.md): the lock it
installed is read and written back by pip_lock unchanged, torch_stack_info's real report of the venv meets the
expectations the role derives from that lock and fails the ones it should, and the flash_attn role's build
environment restricts flash-attn's own arch list to the fleet's (the device's build log shows sm_90 alone)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.gpufleet.fleet.plugins.module_utils import pip_lock
from ansible_collections.gpufleet.fleet.plugins.module_utils.torch_probe import check_expect
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.vllm_start import start_phases

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "h100-real" / "role-venv"


def module_result(path: Path) -> dict[str, Any]:
    """The JSON document of a one-task `ansible -m` capture ("localhost | SUCCESS => {...}")."""
    text = path.read_text()
    return json.loads(text[text.index("{") : text.rindex("}") + 1])


def test_the_lock_the_role_installed_round_trips_through_pip_lock() -> None:
    text = (CAPTURE / "lock.txt").read_text()
    lock = pip_lock.parse_lock(text)
    assert lock.header["stack"] == "h200-vllm-cu130"
    pinned = {entry.key: entry.version for entry in lock.entries}
    # The image's torch distribution is PyPI's 2.11.0 (its default Linux build is CUDA 13.0's): no local suffix.
    assert (pinned["torch"], pinned["vllm"], len(pinned)) == ("2.11.0", "0.26.0", 159)
    assert pip_lock.format_lock(lock.header, lock.entries) == text


def test_the_real_probe_meets_what_the_role_expects_of_the_lock() -> None:
    report = module_result(CAPTURE / "torch_stack_info.txt")
    assert report["torch"]["variant"] == "cu130" and report["vllm"]["extension_ok"] is True
    assert all(device["ok"] for device in report["gpu_compute"]["devices"])
    # The role's expectations (verify.yml): the lock's torch and vLLM, the stack's Python, CUDA asked for.
    expected = {
        "torch_version": "2.11.0+cu130",
        "vllm_version": "0.26.0",
        "python_version": "3.12",
        "cuda_available": True,
    }
    assert check_expect(report, expected) == []
    wrong = check_expect(report, expected | {"torch_version": "2.11.0+cu128"})
    assert [(item["key"], item["actual"]) for item in wrong] == [("torch_version", "2.11.0+cu130")]


def test_the_role_ran_twice_and_the_second_run_changed_nothing() -> None:
    changed = {
        name: len(re.findall(r"^localhost \| CHANGED", (CAPTURE / name).read_text(), re.M))
        for name in ("role.txt", "role-rerun.txt")
    }
    assert changed == {"role.txt": 3, "role-rerun.txt": 0}


def build_environment(arch_list: str) -> dict[str, str]:
    """The flash_attn role's build task's environment, templated by Ansible for one package and arch list."""
    tasks = yaml.safe_load((REPO / "roles" / "flash_attn" / "tasks" / "build.yml").read_text())
    block = next(task for task in tasks if "block" in task)["block"]
    build = next(task for task in block if "ansible.builtin.command" in task)
    variables = {
        "__flash_attn_jobs": 16,
        "flash_attn_cuda_home": "/usr/local/cuda",
        "flash_attn_venv": "/opt/gpufleet/venvs/current",
        "__flash_attn_key": {"components": {"arch_list": arch_list}},
        "__flash_attn_package": {"name": "flash-attn", "env": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}},
    }
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(build["environment"]))


@pytest.mark.parametrize(("arch_list", "flash_attn_archs"), [("9.0", "90"), ("8.0;9.0", "80;90"), ("9.0+PTX", "90")])
def test_flash_attn_builds_only_the_fleet_archs(arch_list: str, flash_attn_archs: str) -> None:
    environment = build_environment(arch_list)
    assert (environment["TORCH_CUDA_ARCH_LIST"], environment["FLASH_ATTN_CUDA_ARCHS"]) == (arch_list, flash_attn_archs)


def test_the_device_build_compiled_sm_90_alone() -> None:
    # flash-attn 2.8.3's setup.py adds a -gencode per FLASH_ATTN_CUDA_ARCHS entry (default 80;90;100;120); with the
    # role's environment for an H100 every nvcc line names sm_90 alone.
    log = (CAPTURE / "flash-attn-build.log").read_text()
    gencodes = set(re.findall(r"-gencode arch=(compute_\d+),code=(sm_\d+)", log))
    assert gencodes == {("compute_90", "sm_90")}


def wheel_source_accepted(find_links: str) -> bool:
    """inference_venv's preflight condition on the wheel source, templated by Ansible."""
    tasks = yaml.safe_load((REPO / "roles" / "inference_venv" / "tasks" / "preflight.yml").read_text())
    check = next(task for task in tasks if task["name"].startswith("Refuse a wheel source"))
    variables = {"inference_venv_index_url": "", "inference_venv_find_links": find_links}
    templar = Templar(loader=DataLoader(), variables=variables)
    return all(
        templar.template(trust_as_template("{{ %s }}" % condition))
        for condition in check["ansible.builtin.assert"]["that"]
    )


@pytest.mark.parametrize(
    ("find_links", "accepted"),
    [
        # A wheelhouse on the node's own disk (the H100 run): the value rules accept file:///, so must the preflight.
        ("file:///var/lib/gpufleet/wheels/h200-vllm-cu130/", True),
        ("http://mirror.internal/wheels/h200-vllm-cu130/", True),
        ("/wheels/h200-vllm-cu130/", False),
        ("/wheels/", False),
    ],
)
def test_a_local_wheelhouse_is_a_wheel_source(find_links: str, accepted: bool) -> None:
    assert wheel_source_accepted(find_links) is accepted


# --- the role's venv serving on the H100 (second device session) -------------------------------------------------

SERVED = REPO / "tests" / "fixtures" / "h100-real" / "role-venv-serve"
MIB = 1024 * 1024


def test_the_role_built_venv_needed_no_hand_fix() -> None:
    """The repacking holes of the first session (uvloop, ptxas's mode, ninja's binary) are gone: the venv the role
    built from the repacked wheelhouse has each, and the role's second run changed nothing."""
    checks = (SERVED / "checks.txt").read_text()
    assert re.search(r"^-rwxr-xr-x .* /WORK/venvs/[^/ ]+/bin/ninja$", checks, re.M), checks
    assert len(re.findall(r"^-rwxr-xr-x .*/bin/ptxas$", checks, re.M)) == 2, checks
    assert "uvloop 0.23.0" in checks
    assert not re.search(r"^localhost \| CHANGED", (SERVED / "role-rerun.txt").read_text(), re.M)


def test_time_to_serving_on_the_role_venv_is_read_from_its_logs() -> None:
    figures = json.loads((SERVED / "time-to-serving.json").read_text())["starts"]
    logs = {"(a) cold": "vllm.log", "(b) restart": "vllm-restart.log", "(c) shipped": "vllm-shipped.log"}
    for start, log in logs.items():
        assert start_phases((SERVED / log).read_text()).as_dict() == figures[start]["phases"], start
    cold, restart, shipped = (figures[start] for start in logs)
    assert cold["phases"]["compile_cache_hit"] is False
    assert restart["phases"]["compile_cache_hit"] is True and shipped["phases"]["compile_cache_hit"] is True
    assert (cold["healthy_s"], restart["healthy_s"], shipped["healthy_s"]) == (151.29, 27.06, 29.06)
    assert shipped["healthy_s"] / restart["healthy_s"] < 1.2


def gpu_memory_module() -> Any:
    path = REPO / "roles" / "vllm_service" / "library" / "vllm_gpu_memory.py"
    spec = importlib.util.spec_from_file_location("vllm_gpu_memory", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_memory_check_passed_the_warmed_up_instance_and_would_fail_a_cold_one() -> None:
    captured = module_result(SERVED / "gpu_memory_check.txt")
    assert captured["problems"] == []
    (row,) = captured["instances"][0]["gpus"]
    assert (row["held_mib"], row["share_mib"], row["total_mib"]) == (73796, 73403, 81559)
    check = gpu_memory_module().check
    gpu = {"index": 0, "total": row["total_mib"] * MIB, "free": row["free_mib"] * MIB}
    instance = {"name": "gpu0", "gpu_memory_utilization": 0.9, "gpus": [0], "pids": {2716}}
    warmed = [{"pid": 2716, "used_memory_bytes": row["held_mib"] * MIB}]
    assert check([instance], [{**gpu, "processes": warmed}], 0.05)[1] == []
    # The same instance holding only its weights (no KV cache allocated): named, with the fix.
    cold = [{"pid": 2716, "used_memory_bytes": 2048 * MIB}]
    (problem,) = check([instance], [{**gpu, "processes": cold, "free": (row["total_mib"] - 2048) * MIB}], 0.05)[1]
    assert "less than its share 73403 MiB" in problem


def test_flash_attn_with_ninja_built_sm_90_alone_at_about_20_kernels_in_400_seconds() -> None:
    steps = [line.split() for line in (SERVED / "flash-attn-ninja.log").read_text().splitlines() if line[0] == "["]
    assert steps[-1][0] == "[21/73]"
    assert {" ".join(step[3:]) for step in steps if step[1] == "nvcc"} == {"-gencode arch=compute_90,code=sm_90"}
