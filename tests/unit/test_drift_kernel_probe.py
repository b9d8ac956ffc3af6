"""Drift's kernels check takes the torch probe the kernel's marker recorded while torch's identity (its RECORD,
the venv's pyvenv.cfg and interpreter) is unchanged, and imports torch again once it changed (issue 12, item 10:
importing torch was most of a drift run's CPU). A real venv of this interpreter with a small torch package
that logs each import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.gpufleet.fleet.plugins.module_utils import drift_checks, drift_stack, kernel_key

PACKAGE = {"name": "gpufleet-kernel-demo", "version": "0.1.0", "sha256": "0" * 64, "requires_cuda": False}
TORCH = """\
import os
with open(os.environ["TORCH_IMPORT_LOG"], "a") as log:
    log.write("imported\\n")
__version__ = "2.13.0+cpu"
class version:
    cuda = None
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
"""


def make_venv(tmp_path: Path) -> tuple[Path, Path]:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(TORCH)
    torch_info = site / "torch-2.13.0+cpu.dist-info"
    torch_info.mkdir()
    (torch_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    (torch_info / "RECORD").write_text("torch/__init__.py,sha256=x,1\n")
    kernel_info = site / "gpufleet_kernel_demo-0.1.0.dist-info"
    kernel_info.mkdir()
    (kernel_info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpufleet-kernel-demo\nVersion: 0.1.0\n")
    return venv, torch_info / "RECORD"


def probe(venv: Path) -> dict:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-B", "-c", kernel_key.TORCH_PROBE],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def mark(venv: Path, recorded: dict) -> None:
    """The marker the flash_attn role writes: the key, the probe it came from and torch's identity then."""
    key = kernel_key.build_key(kernel_key.key_components(PACKAGE, recorded, None, "", {}))
    (venv / "gpufleet-kernels").mkdir(exist_ok=True)
    (venv / "gpufleet-kernels" / f"{PACKAGE['name']}.json").write_text(
        json.dumps({"key": key, "torch_probe": recorded, "torch_identity": kernel_key.torch_identity(str(venv))})
    )


def check(venv: Path) -> list[drift_checks.Finding]:
    return drift_stack.check_kernels({"venv": str(venv), "packages": [PACKAGE]}, drift_checks.Context())


def test_an_unchanged_torch_is_not_imported_again(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "imports"
    monkeypatch.setenv("TORCH_IMPORT_LOG", str(log))
    venv, record = make_venv(tmp_path)
    mark(venv, probe(venv))
    log.unlink()

    assert check(venv) == []
    assert not log.exists(), "drift imported torch although its identity is the marker's"

    record.write_text("torch/__init__.py,sha256=y,1\n")
    assert check(venv) == []
    assert log.read_text() == "imported\n", "a reinstalled torch (new RECORD) must be probed again"


def test_a_torch_changed_since_the_marker_is_reported_from_a_new_probe(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_IMPORT_LOG", str(tmp_path / "imports"))
    venv, record = make_venv(tmp_path)
    mark(venv, probe(venv))
    site = record.parent.parent
    (site / "torch" / "__init__.py").write_text(TORCH.replace("2.13.0+cpu", "2.14.1+cpu"))
    record.write_text("torch/__init__.py,sha256=z,1\n")

    (finding,) = check(venv)
    assert (finding.field, finding.detail) == (
        "build key",
        "the installed wheel was built for another torch, CUDA, arch list or source: rebuild",
    )


def test_a_marker_without_an_identity_is_probed(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "imports"
    monkeypatch.setenv("TORCH_IMPORT_LOG", str(log))
    venv, dummy = make_venv(tmp_path)
    recorded = probe(venv)
    key = kernel_key.build_key(kernel_key.key_components(PACKAGE, recorded, None, "", {}))
    (venv / "gpufleet-kernels").mkdir()
    (venv / "gpufleet-kernels" / f"{PACKAGE['name']}.json").write_text(json.dumps({"key": key}))
    log.unlink()

    assert check(venv) == []
    assert log.read_text() == "imported\n"
