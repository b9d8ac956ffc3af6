"""The CPython build logic (python_build) and the pyenv_install module, run for real on this machine.

The module runs through ansible-playbook with a local connection: against this machine's pyenv builds
in check mode (a correct build is not rebuilt; a build with other options would be), and with pyenv's real
python-build on a source tarball whose configure fails, to show the failure carries the log's tail.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "builders"))

from ansible_collections.gpufleet.fleet.plugins.module_utils import python_build  # noqa: E402
from ansible_collections.gpufleet.fleet.plugins.module_utils.python_build import PythonBuildError  # noqa: E402
from python_stack import make_pyenv_tarball  # noqa: E402  (the lab builder)

PYENV_CHECKOUT = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def test_configure_options_in_a_stable_order_without_duplicates() -> None:
    assert python_build.configure_options(True, False, False, ["--disable-test-modules", "--enable-shared"]) == [
        "--enable-shared",
        "--disable-test-modules",
    ]
    assert python_build.configure_options(False, True, True, []) == ["--enable-optimizations", "--with-lto"]


@pytest.mark.parametrize(
    ("requested", "cores", "expected"), [(0, 2, 2), (0, 64, 64), (8, 2, 2), (1, 16, 1), (-1, 0, 1)]
)
def test_make_jobs_never_exceed_the_cores(requested: int, cores: int, expected: int) -> None:
    assert python_build.make_jobs(requested, cores) == expected


@pytest.mark.parametrize("version", ["3.11", "3.12-dev", "pypy3.10-7.3.17", "", "3.11.2rc1"])
def test_only_exact_releases_are_built(version: str) -> None:
    with pytest.raises(PythonBuildError, match="not a CPython release"):
        python_build.interpreter_path("/opt/pyenv/versions/x", version)


def test_build_environment_sets_cache_mirror_options_and_jobs() -> None:
    env = python_build.build_environment(
        {"PATH": "/usr/bin"},
        "/opt/pyenv",
        "/opt/pyenv/cache",
        ["--enable-shared", "LDFLAGS=-L/x y"],
        2,
        True,
        "/var/tmp",
    )
    assert env["PYTHON_BUILD_CACHE_PATH"] == "/opt/pyenv/cache" and env["PYTHON_BUILD_SKIP_MIRROR"] == "1"
    assert env["PYTHON_CONFIGURE_OPTS"] == "--enable-shared 'LDFLAGS=-L/x y'" and env["MAKE_OPTS"] == "-j2"
    assert env["_PYTHON_BUILD_FORCE_SKIP_XZ"] == "1" and env["PATH"] == "/usr/bin"


SHARED_PROBE = {
    "version": "3.11.2",
    "shared": True,
    "config_args": "'--prefix=/opt/pyenv/versions/3.11.2' '--enable-shared' '--disable-test-modules'",
}


@pytest.mark.parametrize(
    ("probe", "wanted", "reasons"),
    [
        (SHARED_PROBE, ["--enable-shared", "--disable-test-modules"], []),
        (None, ["--enable-shared"], ["not installed"]),
        (
            {**SHARED_PROBE, "version": "3.11.1"},
            ["--enable-shared", "--disable-test-modules"],
            ["version is 3.11.1, requested 3.11.2"],
        ),
        (SHARED_PROBE, ["--disable-test-modules"], ["shared build is True, requested False"]),
        (
            SHARED_PROBE,
            ["--enable-shared", "--disable-test-modules", "--enable-optimizations"],
            ["built without --enable-optimizations"],
        ),
        (
            {**SHARED_PROBE, "config_args": SHARED_PROBE["config_args"] + " '--with-lto'"},
            ["--enable-shared", "--disable-test-modules"],
            ["built with --with-lto, which is no longer requested"],
        ),
    ],
)
def test_mismatches_decide_whether_to_build(probe: dict | None, wanted: list[str], reasons: list[str]) -> None:
    assert python_build.mismatches(probe, "3.11.2", wanted) == reasons


def test_parse_probe_takes_the_json_line_and_refuses_noise() -> None:
    assert python_build.parse_probe("warning: x\n" + json.dumps(SHARED_PROBE) + "\n")["shared"] is True
    with pytest.raises(PythonBuildError, match="printed no result"):
        python_build.parse_probe("Segmentation fault\n")


def test_log_tail_returns_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("".join(f"line {n}\n" for n in range(1000)))
    assert python_build.log_tail(str(log), 3) == "line 997\nline 998\nline 999"
    assert "no build log" in python_build.log_tail(str(tmp_path / "missing.log"), 3)


# --- the module, for real -----------------------------------------------------------------------------------

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Build or probe
      gpufleet.fleet.pyenv_install: "{{ module_args }}"
      register: result
      ignore_errors: true
    - name: Save the result
      check_mode: false
      ansible.builtin.copy:
        content: "{{ result | to_json }}"
        dest: "{{ result_file }}"
        mode: "0644"
"""


def _run_module(tmp_path: Path, module_args: dict, check: bool) -> dict:
    book, result_file = tmp_path / "play.yml", tmp_path / "result.json"
    book.write_text(PLAYBOOK)
    result_file.unlink(missing_ok=True)
    extra = {"module_args": module_args, "result_file": str(result_file), "ansible_python_interpreter": sys.executable}
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        "localhost,",
        str(book),
        "-e",
        json.dumps(extra),
    ] + (["--check"] if check else [])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    process = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-2000:]
    return json.loads(result_file.read_text())


def _shared_build_on_this_machine() -> tuple[Path, str]:
    """A shared pyenv build of this machine (the controller's own Python comes from pyenv)."""
    for prefix in sorted((PYENV_CHECKOUT / "versions").glob("3.1[1-3].*")):
        python = prefix / "bin" / f"python{'.'.join(prefix.name.split('.')[:2])}"
        out = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('Py_ENABLE_SHARED'))"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if out == "1":
            return PYENV_CHECKOUT, prefix.name
    pytest.fail(f"no shared CPython build under {PYENV_CHECKOUT}/versions on this machine")


def test_a_correct_build_is_not_rebuilt_and_another_request_would_rebuild(tmp_path: Path) -> None:
    root, version = _shared_build_on_this_machine()
    args = {"pyenv_root": str(root), "version": version, "cache_path": str(tmp_path), "configure_opts": []}
    correct = _run_module(tmp_path, args, check=True)
    assert not correct["changed"] and correct["reasons"] == [] and correct["probe"]["shared"] is True
    assert correct["probe"]["version"] == version

    static = _run_module(tmp_path, {**args, "enable_shared": False}, check=True)
    assert static["changed"] and static["built"] and static["reasons"] == ["shared build is True, requested False"]


def _broken_source(cache: Path, version: str) -> str:
    """A source tarball whose configure fails the way a missing compiler does; returns its sha256."""
    script = b"#!/bin/sh\necho 'checking for gcc... no'\necho 'configure: error: no acceptable C compiler found in $PATH' >&2\nexit 1\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"Python-{version}/configure")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    data = buffer.getvalue()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"Python-{version}.tar.gz").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_a_failed_build_fails_with_the_tail_of_its_log(tmp_path: Path) -> None:
    # pyenv itself, exactly as the lab ships it: the git archive the lab builder makes.
    tarball = tmp_path / "pyenv.tar.gz"
    make_pyenv_tarball(PYENV_CHECKOUT, "pyenv", tarball)
    subprocess.run(["tar", "-C", str(tmp_path), "-xzf", str(tarball)], check=True)
    root, cache, version = tmp_path / "pyenv", tmp_path / "cache", "3.99.0"
    digest = _broken_source(cache, version)
    definition = tmp_path / "definition"
    definition.write_text(
        f'install_package "Python-{version}" "http://127.0.0.1:9/Python-{version}.tgz#{digest}" standard\n'
    )

    result = _run_module(
        tmp_path,
        {
            "pyenv_root": str(root),
            "version": version,
            "definition": str(definition),
            "cache_path": str(cache),
            "log_dir": str(tmp_path / "logs"),
            "log_lines": 15,
        },
        check=False,
    )
    assert result["failed"] and result["built"]
    assert result["msg"].startswith(
        f"building CPython {version} failed (python-build exit 1); "
        f"{root / 'versions' / version} was not installed before either; last 15 lines of "
    )
    assert "configure: error: no acceptable C compiler found" in result["msg"]
    assert (tmp_path / "logs" / f"python-build-{version}.log").exists()
    assert not (root / "versions" / version / "bin").exists()
