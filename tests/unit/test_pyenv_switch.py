"""pyenv_install builds beside the version in service and switches its link only once the build probes right.

Run for real through ansible-playbook on this machine: the "builds" are this machine's own CPython
interpreters (pyenv's and Debian's), the failing build is pyenv's real python-build on a source whose
configure fails, and the venv is a real venv on the version's link.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_venv_python_build import PYENV_CHECKOUT, _broken_source, _run_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab" / "builders"))

from python_stack import make_pyenv_tarball  # noqa: E402  (the lab builder)

VERSION = "3.11.7"  # the machine's pyenv build (shared, the controller's Python)
SERVING = PYENV_CHECKOUT / "versions" / VERSION
DEBIAN = Path("/usr/bin/python3.11")  # another 3.11 interpreter: Debian's 3.11.2


def _pyenv(tmp_path: Path) -> Path:
    tarball = tmp_path / "pyenv.tar.gz"
    make_pyenv_tarball(PYENV_CHECKOUT, "pyenv", tarball)
    subprocess.run(["tar", "-C", str(tmp_path), "-xzf", str(tarball)], check=True)
    return tmp_path / "pyenv"


def _venv_on(link: Path, where: Path) -> Path:
    subprocess.run([str(link / "bin" / "python3.11"), "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python"


def _venv_runs(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import ssl, platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def test_a_failed_rebuild_leaves_the_build_in_service_and_its_venvs(tmp_path: Path) -> None:
    root = _pyenv(tmp_path)
    link = root / "versions" / VERSION
    link.parent.mkdir()
    link.symlink_to(SERVING)
    venv_python = _venv_on(link, tmp_path / "venv")
    assert _venv_runs(venv_python) == VERSION

    cache = tmp_path / "cache"
    digest = _broken_source(cache, VERSION)
    definition = tmp_path / "definition"
    definition.write_text(
        f'install_package "Python-{VERSION}" "http://127.0.0.1:9/Python-{VERSION}.tgz#{digest}" standard\n'
    )
    # The build in service is shared; a static build is requested, so a rebuild runs and fails.
    result = _run_module(
        tmp_path,
        {
            "pyenv_root": str(root),
            "version": VERSION,
            "definition": str(definition),
            "cache_path": str(cache),
            "enable_shared": False,
            "log_dir": str(tmp_path / "logs"),
        },
        check=False,
    )
    assert result["failed"] and result["built"]
    assert link.is_symlink() and os.readlink(link) == str(SERVING)
    assert _venv_runs(venv_python) == VERSION
    assert f"the node still serves {link} as before" in result["msg"]


def _unpacked(prefix: Path) -> None:
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3.11").symlink_to(SERVING / "bin" / "python3.11")


def test_a_verified_build_is_switched_to_and_the_one_before_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "pyenv"
    link, builds = root / "versions" / VERSION, root / "builds"
    # The layout before builds were kept beside: a real directory at the link's path (here one whose
    # interpreter is Debian's 3.11.2, so it is not the requested build).
    (link / "bin").mkdir(parents=True)
    (link / "bin" / "python3.11").symlink_to(DEBIAN)
    venv_python = _venv_on(link, tmp_path / "venv")
    assert _venv_runs(venv_python) == "3.11.2"
    # Correct builds already unpacked at their keys' prefixes (as a shared build is): directories whose
    # interpreter is the machine's pyenv build.
    _unpacked(builds / f"{VERSION}-k1")
    args = {
        "pyenv_root": str(root),
        "version": VERSION,
        "cache_path": str(tmp_path),
        "configure_opts": [],
        "build_key": "k1",
    }

    check = _run_module(tmp_path, args, check=True)
    assert check["changed"] and not check["built"] and check["reasons"] == ["version is 3.11.2, requested 3.11.7"]
    assert not link.is_symlink() and _venv_runs(venv_python) == "3.11.2"

    first = _run_module(tmp_path, args, check=False)
    assert first["changed"] and not first["built"] and not first.get("failed")
    assert first["switched_from"] == str(builds / f"{VERSION}-legacy") and first["removed"] == []
    assert os.readlink(link) == str(builds / f"{VERSION}-k1") and first["probe"]["version"] == VERSION
    assert _venv_runs(venv_python) == VERSION
    again = _run_module(tmp_path, args, check=False)
    assert not again["changed"] and "switched_from" not in again

    # The build in service breaks (its interpreter gone) and another key is requested: the switch goes to
    # k2, k1 (the one served before) stays, the legacy build, older still, is removed.
    (builds / f"{VERSION}-k1" / "bin" / "python3.11").unlink()
    _unpacked(builds / f"{VERSION}-k2")
    second = _run_module(tmp_path, {**args, "build_key": "k2"}, check=False)
    assert second["reasons"] == ["not installed"] and not second["built"]
    assert second["switched_from"] == str(builds / f"{VERSION}-k1")
    assert second["removed"] == [str(builds / f"{VERSION}-legacy")]
    assert os.readlink(link) == str(builds / f"{VERSION}-k2") and _venv_runs(venv_python) == VERSION
    assert sorted(path.name for path in builds.iterdir()) == [f"{VERSION}-k1", f"{VERSION}-k2"]
