"""Drift compares the effective state (issue 12, item 5), against real state on the controller: a real venv
with real wheels installed by pip, whose files are then edited in place, and kernel settings read from a
/proc/sys tree. Drop-ins and enablement as systemd resolves them need a systemd: the lab test
tests/integration/test_drift_effective.py covers those."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import drift_checks, drift_stack, pip_lock

sys.path.insert(0, str(Path(__file__).parent))
from wheel_factory import make_wheel, sha256  # noqa: E402

drift_checks.register(drift_stack.KINDS)


def run(checks: list[dict], **context: object) -> dict:
    return drift_checks.run_checks(drift_checks.validate(checks), drift_checks.Context(**context))


def fields(result: dict) -> list[tuple]:
    return [(item["check"], item["field"], item["expected"], item["actual"]) for item in result["drift"]]


@pytest.fixture()
def venv(tmp_path: Path) -> tuple[Path, dict]:
    """A venv with two real wheels installed by pip, and the venv check that matches it."""
    wheels = tmp_path / "wheels"
    for name, version in (("demo-app", "1.0"), ("demo-lib", "2.0")):
        make_wheel(wheels, name, version)
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3.11", "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-index",
            "--find-links",
            str(wheels),
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "demo-app==1.0",
            "demo-lib==2.0",
        ],
        check=True,
    )
    lock = pip_lock.format_lock(
        {"stack": "demo"},
        [
            pip_lock.LockEntry("demo-app", "1.0", (sha256(wheels / "demo_app-1.0-py3-none-any.whl"),)),
            pip_lock.LockEntry("demo-lib", "2.0", (sha256(wheels / "demo_lib-2.0-py3-none-any.whl"),)),
        ],
    )
    (venv / "gpufleet.lock").write_text(lock)
    return venv, {"kind": "venv", "path": str(venv), "lock": lock.rstrip("\n")}


def installed(venv: Path, name: str) -> Path:
    (path,) = venv.glob(f"lib/python*/site-packages/{name}")
    return path


def test_a_file_edited_in_place_with_the_same_versions_is_drift(venv: tuple[Path, dict]) -> None:
    path, spec = venv
    assert run([spec])["status"] == "ok"
    module = installed(path, "demo_lib.py")
    time.sleep(0.01)
    module.write_text("VALUE = 2\n")  # same size as the installed "VALUE = 1\n": only the hash shows it
    ((check, field, expected, actual),) = fields(run([spec]))
    assert (check, field) == (f"venv {path}", f"file {module.relative_to(path)}")
    assert expected.startswith("sha256=") and actual.startswith("sha256=") and expected != actual


def test_a_removed_file_is_drift_and_a_chmod_alone_is_not(venv: tuple[Path, dict]) -> None:
    path, spec = venv
    app = installed(path, "demo_app.py")
    time.sleep(0.01)
    os.chmod(app, 0o600)  # ctime moves, the content does not: hashed, and found as installed
    assert run([spec])["status"] == "ok"
    app.unlink()
    assert fields(run([spec])) == [(f"venv {path}", f"file {app.relative_to(path)}", "as installed (RECORD)", "absent")]


def test_an_untouched_venv_reads_no_installed_file(venv: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    path, spec = venv
    read: list[str] = []
    digest = drift_stack.record_digest
    monkeypatch.setattr(drift_stack, "record_digest", lambda file: read.append(file) or digest(file))
    assert run([spec])["status"] == "ok" and read == []
    time.sleep(0.01)
    installed(path, "demo_app.py").write_text("VALUE = 3\n")
    assert len(fields(run([spec]))) == 1 and [Path(file).name for file in read] == ["demo_app.py"]


def test_kernel_settings_in_effect(tmp_path: Path) -> None:
    (tmp_path / "vm").mkdir()
    (tmp_path / "vm" / "swappiness").write_text("60\n")
    (tmp_path / "vm" / "max_map_count").write_text("1048576\n")
    (tmp_path / "net" / "ipv4").mkdir(parents=True)
    (tmp_path / "net" / "ipv4" / "ip_local_port_range").write_text("32768\t60999\n")
    spec = {
        "kind": "sysctl",
        "settings": {
            "vm.swappiness": 1,
            "vm.max_map_count": 1048576,
            "net.ipv4.ip_local_port_range": "32768 60999",
            "vm.nothing": 1,
        },
    }
    assert fields(run([spec], proc_sys=str(tmp_path))) == [
        ("sysctl vm.nothing", "value", "1", "no such setting"),
        ("sysctl vm.swappiness", "value", "1", "60"),
    ]


def test_a_read_only_proc_sys_is_noted_not_drift() -> None:
    # This controller runs in a container whose /proc/sys cannot be written, as the lab hosts'.
    if os.access("/proc/sys", os.W_OK) and not os.statvfs("/proc/sys").f_flag & os.ST_RDONLY:
        pytest.skip("/proc/sys is writable here")
    result = run([{"kind": "sysctl", "settings": {"vm.swappiness": 12345}}])
    assert result["status"] == "ok" and result["notes"] == [
        "/proc/sys is read-only here (a container): kernel settings in effect not compared"
    ]


def test_dkms_status_lines_of_both_dkms_generations() -> None:
    # dkms 3 (Debian 12, Ubuntu 24.04) and dkms 2 (Ubuntu 22.04) print a kernel per line; "added" has none.
    status = (
        "nvidia/580.95.05, 6.1.0-18-amd64, x86_64: installed\n"
        "nvidia, 580.95.05, 5.15.0-91-generic, x86_64: built\n"
        "nvidia/580.95.05: added\n"
    )
    assert drift_stack.dkms_kernel_states(status) == {"6.1.0-18-amd64": "installed", "5.15.0-91-generic": "built"}


def test_installed_kernels_are_the_images_in_boot(tmp_path: Path) -> None:
    for name in (
        "vmlinuz-6.1.0-18-amd64",
        "vmlinuz-6.1.0-17-amd64",
        "config-6.1.0-18-amd64",
        "initrd.img-6.1.0-18-amd64",
    ):
        (tmp_path / name).write_text("")
    assert drift_stack.installed_kernels(str(tmp_path)) == ["6.1.0-17-amd64", "6.1.0-18-amd64"]
    assert drift_stack.installed_kernels(str(tmp_path / "none")) == []


def test_bytecode_python_rewrote_is_not_drift(venv: tuple[Path, dict]) -> None:
    # On the lab, a kernel build importing numpy.distutils rewrote a .pyc that pip had installed and listed.
    path, spec = venv
    compile_app = [str(path / "bin" / "python"), "-m", "compileall", "-q", "-f", str(installed(path, "demo_app.py"))]
    subprocess.run(compile_app, check=True)
    record = next(path.glob("lib/python*/site-packages/demo_app-1.0.dist-info/RECORD"))
    (pyc,) = installed(path, "__pycache__").glob("demo_app.*.pyc")
    with record.open("a") as handle:
        handle.write(f"{pyc.relative_to(record.parent.parent)},sha256=AAAA,{pyc.stat().st_size}\n")
    time.sleep(0.01)
    subprocess.run(compile_app, check=True)  # rewritten after the RECORD, as Python rewrites its caches
    assert run([spec])["status"] == "ok"
