"""Every benchmark in bench/ still starts: its imports resolve and it parses its arguments (`--help`). The
figures themselves come from running them on the lab, never from a test; this keeps them runnable between runs
(bench/drift.py once imported a helper from where it no longer was)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT

BENCHES = sorted((PROJECT_ROOT / "bench").glob("*.py"))


def test_there_are_benchmarks() -> None:
    assert {path.name for path in BENCHES} >= {"drift.py", "rollout.py", "lab_up.py"}


@pytest.mark.parametrize("script", BENCHES, ids=lambda path: path.name)
def test_each_benchmark_starts_and_explains_its_arguments(script: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("usage: "), result.stdout
