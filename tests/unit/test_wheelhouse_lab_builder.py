"""The lab builder of the Python layer's artifacts makes bytes that match the lab inventory's pins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILDER = REPO / "lab" / "builders" / "python_stack.py"


def test_pyenv_tarball_and_kernel_sdist_are_reproducible_and_match_their_pins() -> None:
    # --check builds both locally (git archive of the pinned pyenv commit, the kernel fixture as an sdist)
    # and compares them with inventories/lab/group_vars/all; it downloads and publishes nothing.
    process = subprocess.run(
        [sys.executable, str(BUILDER), "--check", "--only", "pyenv", "kernel"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    assert "pyenv: pyenv-2.6.30.tar.gz matches its pin" in process.stdout
    assert "kernel: gpufleet_kernel_demo-0.1.0.tar.gz matches its pin" in process.stdout


def test_a_changed_kernel_source_is_refused_with_both_hashes(tmp_path: Path) -> None:
    sys.path.insert(0, str(BUILDER.parent))
    import python_stack

    pins = python_stack.load_pins()
    sdist = tmp_path / "gpufleet_kernel_demo-0.1.0.tar.gz"
    source = tmp_path / "src"
    subprocess.run(["cp", "-r", str(python_stack.KERNEL_SOURCE), str(source)], check=True)
    (source / "setup.py").write_text((source / "setup.py").read_text() + "\n# changed\n")
    python_stack.make_kernel_sdist(source, "gpufleet_kernel_demo-0.1.0", sdist)
    try:
        python_stack.check_pin("kernel", sdist, pins["kernel"])
    except python_stack.BuildError as error:
        assert pins["kernel"].sha256 in str(error) and "nothing was published" in str(error)
    else:
        raise AssertionError("a changed source must not match the pin")
