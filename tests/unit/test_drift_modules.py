"""drift_probe and drift_result as Ansible runs them (`ansible localhost -m ...`), and their documentation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT

BIN = Path(sys.executable).parent


def ansible_module(module: str, args: dict, check: bool = True) -> dict:
    command = [
        str(BIN / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        f"gpufleet.fleet.{module}",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ] + (["--check"] if check else [])
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(PROJECT_ROOT / "ansible.cfg"),
    }
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False
    )
    found = re.search(r"^localhost \| (SUCCESS|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, result.stdout + result.stderr
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end() :])
    host_result["failed"] = found.group(1) == "FAILED!"
    return host_result


@pytest.mark.parametrize("check", [True, False])
def test_drift_probe_reports_drift_and_never_changes(tmp_path: Path, check: bool) -> None:
    path = tmp_path / "cuda.conf"
    path.write_text("/usr/local/cuda-12.8/lib64\n")
    result = ansible_module(
        "drift_probe",
        {
            "layer": "toolkit",
            "checks": [
                {"kind": "file", "path": str(path), "content": "/usr/local/cuda/lib64\n"},
                {"kind": "link", "path": str(tmp_path / "cuda"), "target": "/usr/local/cuda-13.0", "applies": False},
            ],
        },
        check=check,
    )
    assert not result["failed"] and result["changed"] is False
    payload = result["gpufleet_drift"]
    assert (payload["layer"], payload["status"], payload["checked"]) == ("toolkit", "drifted", 1)
    assert payload["drift"][0]["field"] == "content"
    assert path.read_text() == "/usr/local/cuda-12.8/lib64\n"


def test_drift_probe_refuses_an_unknown_kind() -> None:
    result = ansible_module("drift_probe", {"layer": "base", "checks": [{"kind": "selinux", "name": "enforcing"}]})
    assert result["failed"] and result["msg"].startswith("layer base: check 0: unknown kind 'selinux'")


def test_drift_result_records_without_contacting_the_host() -> None:
    result = ansible_module("drift_result", {"layer": "serve", "status": "not_declared", "message": "no instances"})
    assert result["gpufleet_drift"] == {
        "layer": "serve",
        "status": "not_declared",
        "drift": [],
        "errors": [],
        "checked": 0,
        "notes": [],
        "message": "no instances",
    }
    plan = ansible_module("drift_result", {"plan": ["base", "toolkit"]})
    assert plan["gpufleet_drift_plan"] == ["base", "toolkit"] and plan["changed"] is False
    bad = ansible_module("drift_result", {"plan": ["base"], "layer": "base", "status": "error"})
    assert bad["failed"] and "mutually exclusive" in bad["msg"]


@pytest.mark.parametrize(
    ("kind", "name"), [("module", "drift_probe"), ("module", "drift_result"), ("callback", "gpufleet_drift")]
)
def test_the_documentation_renders(kind: str, name: str) -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT_ROOT / "ansible.cfg")}
    name = f"gpufleet.fleet.{name}"
    result = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", kind, "--json", name],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)[name]["doc"]
    assert document["short_description"]


def test_drift_probe_documents_its_arguments_and_return() -> None:
    source = (PROJECT_ROOT / "plugins" / "modules" / "drift_probe.py").read_text()
    namespace: dict = {}
    exec(compile(source.split("import traceback", 1)[0], "drift_probe", "exec"), namespace)  # noqa: S102 - the docs only
    documentation = yaml.safe_load(namespace["DOCUMENTATION"])
    assert {
        name: (option["type"], option.get("required", False)) for name, option in documentation["options"].items()
    } == {"layer": ("str", True), "checks": ("list", True)}
    assert set(yaml.safe_load(namespace["RETURN"])["gpufleet_drift"]["contains"]) == {
        "layer",
        "status",
        "drift",
        "errors",
        "checked",
        "notes",
    }
