"""What torch_stack_info returned on the real H200 (sanitized capture), re-derived with the module's own logic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils.cuda_arch import arch_coverage
from ansible_collections.gpufleet.fleet.plugins.module_utils.torch_diagnosis import diagnose
from ansible_collections.gpufleet.fleet.plugins.module_utils.torch_probe import (
    check_expect,
    packages_sha256,
    torch_gpus,
    torch_variant,
)

CAPTURE = Path(__file__).parent / "data" / "torch_stack_info_h200.json"


@pytest.fixture(scope="module")
def h200() -> dict:
    return json.loads(CAPTURE.read_text())["result"]


def test_the_capture_is_the_h200_stack(h200: dict) -> None:
    torch = h200["torch"]
    assert h200["python"]["version"] == "3.12.3" and h200["python"]["shared"] is True
    assert torch["version"] == "2.11.0+cu130" and torch["cuda"] == "13.0"
    assert torch["cudnn"] == 91900 and torch["nccl"] == "2.28.9"
    assert torch["cuda_available"] is True
    assert [(device["name"], device["capability"]) for device in torch["devices"]] == [("NVIDIA H200", "9.0")]
    assert h200["gpu_compute"]["ok"] is True
    assert h200["gpu_compute"]["devices"][0]["max_abs_error"] < 1e-4


def test_variant_comes_from_the_version_though_the_distribution_has_no_local_part(h200: dict) -> None:
    # The PyPI wheel's metadata says 2.11.0 while torch.__version__ says 2.11.0+cu130.
    assert h200["torch"]["distribution_version"] == "2.11.0"
    assert "torch==2.11.0" in h200["packages"]
    assert torch_variant("2.11.0+cu130", "13.0", None) == ("cu130", "local version suffix")
    assert h200["torch"]["variant"] == "cu130"


def test_arch_coverage_is_reproduced(h200: dict) -> None:
    covers, per_gpu = arch_coverage(h200["torch"]["arch_list"], torch_gpus(h200, []))
    assert covers is True and h200["torch"]["arch_covers_gpus"] is True
    assert per_gpu == h200["torch"]["arch_coverage"]
    assert per_gpu[0]["sass"] == ["sm_90"]


def test_diagnosis_is_reproduced(h200: dict) -> None:
    assert diagnose(h200) == h200["diagnosis"]
    # flash_attn_kernel was asked for on a venv without flash-attn: the only finding.
    assert [item["id"] for item in h200["diagnosis"]] == ["flash_attn_unavailable"]


def test_fingerprint_is_reproduced(h200: dict) -> None:
    assert packages_sha256(h200["packages"]) == h200["packages_sha256"]
    assert h200["packages"] == sorted(h200["packages"])


def test_the_stack_the_node_declares_is_met(h200: dict) -> None:
    expect = {
        "python_version": "3.12",
        "torch_version": "2.11.0+cu130",
        "torch_variant": "cu130",
        "cuda_available": True,
        "arch_covers_gpus": True,
    }
    assert check_expect(h200, expect) == []
    wrong = check_expect(h200, {"torch_variant": "cu128", "vllm_version": "0.19.1"})
    assert wrong == [
        {"key": "torch_variant", "expected": "cu128", "actual": "cu130"},
        {"key": "vllm_version", "expected": "0.19.1", "actual": None},
    ]
