"""The repository builds as the collection gpufleet.fleet and installs from its tarball (all offline)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

import gpufleet

REPO = Path(__file__).resolve().parents[2]
GALAXY = Path(sys.executable).with_name("ansible-galaxy")


@pytest.fixture(scope="module")
def collection_tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("collection")
    subprocess.run(
        [str(GALAXY), "collection", "build", "--output-path", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    (tarball,) = out.glob("gpufleet-fleet-*.tar.gz")
    return tarball


def _members(tarball: Path) -> set[str]:
    with tarfile.open(tarball) as archive:
        return set(archive.getnames())


def _manifest(tarball: Path) -> dict:
    with tarfile.open(tarball) as archive:
        member = archive.extractfile("MANIFEST.json")
        assert member is not None
        return json.load(member)


def test_the_manifest_names_what_galaxy_yml_declares(collection_tarball: Path) -> None:
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    info = _manifest(collection_tarball)["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == (
        galaxy["namespace"],
        galaxy["name"],
        galaxy["version"],
    )
    assert collection_tarball.name == f"gpufleet-fleet-{galaxy['version']}.tar.gz"
    assert info["license_file"] == "LICENSE"


def test_the_collection_and_the_python_package_carry_one_version() -> None:
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpufleet.__version__"}
    assert galaxy["version"] == gpufleet.__version__ == version("gpufleet"), (
        "gpufleet/__init__.py owns the version: copy it to galaxy.yml and reinstall (make venv)"
    )


def test_the_tarball_carries_the_content_and_leaves_the_checkout_out(collection_tarball: Path) -> None:
    names = _members(collection_tarball)
    for needed in (
        "LICENSE",
        "meta/runtime.yml",
        "roles/vllm_service/tasks/main.yml",
        "plugins/modules/nvidia_gpu_info.py",
        "playbooks/site.yml",
        "data/compat/cpython.csv",
        # ansible-test sanity on the tarball reads its ignores from the collection itself.
        "tests/sanity/ignore-2.19.txt",
    ):
        assert needed in names, needed
    checkout_only = {".venv", ".git", ".mypy_cache", ".ruff_cache", ".ci", "molecule", "bench", "build"}
    # The CLI (installed with pip), the lab and its stand-in installers, the scripts and the development lock.
    checkout_only |= {"gpufleet", "lab", "scripts", "requirements.txt", "requirements.in", "pyproject.toml"}
    leaked = sorted(
        name
        for name in names
        if name.split("/")[0] in checkout_only
        or (name.startswith("tests/") and name.split("/")[1] != "sanity")
        or name.startswith(("inventories/lab/", "playbooks/lab_"))
        or "__pycache__" in name
    )
    assert leaked == []


def test_runtime_requires_the_ansible_core_line_requirements_pin() -> None:
    runtime = yaml.safe_load((REPO / "meta/runtime.yml").read_text())
    pinned = next(
        line.split("==")[1]
        for line in (REPO / "requirements.in").read_text().splitlines()
        if line.startswith("ansible-core==")
    )
    major_minor = ".".join(pinned.split(".")[:2])
    assert f">={major_minor}.0" in runtime["requires_ansible"]


def test_the_execution_environment_installs_what_the_controller_pins() -> None:
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert ee["version"] == 3
    pins = {
        line.split("==")[0]: line
        for line in (REPO / "requirements.in").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    deps = ee["dependencies"]
    assert deps["ansible_core"]["package_pip"] == pins["ansible-core"]
    assert deps["ansible_runner"]["package_pip"] == pins["ansible-runner"]
    # The collection's own requirements come from its introspection (below), not from a list here.
    assert "python" not in deps and "system" not in deps
    requirements = yaml.safe_load((REPO / deps["galaxy"]).read_text())
    (entry,) = requirements["collections"]
    (copied,) = ee["additional_build_files"]
    assert entry["name"].startswith(copied["dest"] + "/")


def test_an_execution_environment_takes_only_the_runtime_requirements(installed: Path) -> None:
    """Issue 30: the tarball carried the development lock as requirements.txt, and ansible-builder's introspection
    put molecule, pytest, mypy and ruff into every execution environment that included the collection."""
    result = subprocess.run(
        [str(GALAXY.with_name("ansible-builder")), "introspect", "--sanitize", str(installed)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    introspected = yaml.safe_load(result.stdout)
    runtime = _requirement_lines(REPO / "meta/requirements.txt")
    python = [line.split("#")[0].strip() for line in introspected.get("python") or []]
    # ansible-builder leaves out what every EE has (PyYAML among them); the rest is the collection's runtime list.
    assert set(python) <= set(runtime), python
    development = {line.split("==")[0].lower() for line in _requirement_lines(REPO / "requirements.in")}
    assert not {re.split(r"[<>=\[ ]", line)[0].lower() for line in python} & (development - {"pyyaml"}), python
    system = [line.split("#")[0].strip() for line in introspected.get("system") or []]
    assert system == _requirement_lines(REPO / "bindep.txt")


def _requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _only_path(path: Path) -> dict[str, str]:
    """An environment in which Ansible sees the collections under `path` only, and no ansible.cfg: a copy
    installed elsewhere (~/.ansible/collections) or the checkout would otherwise stand in for the one tested."""
    env = {
        name: value for name, value in os.environ.items() if not name.startswith("ANSIBLE_") and name != "PYTHONPATH"
    }
    return {**env, "ANSIBLE_COLLECTIONS_PATH": str(path), "ANSIBLE_NOCOLOR": "1"}


@pytest.fixture(scope="module")
def installed(collection_tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tarball installed into an empty collections path; the path that holds ansible_collections/."""
    path = tmp_path_factory.mktemp("collections")
    result = subprocess.run(
        [str(GALAXY), "collection", "install", "--offline", "-p", str(path), str(collection_tarball)],
        capture_output=True,
        text=True,
        check=False,
        env=_only_path(path),
        cwd=path,
    )
    assert result.returncode == 0, result.stderr
    return path


def test_the_built_collection_installs_into_an_empty_path(installed: Path) -> None:
    root = installed / "ansible_collections/gpufleet/fleet"
    assert (root / "roles/nvidia_driver/meta/argument_specs.yml").is_file()
    assert json.loads((root / "MANIFEST.json").read_text())["collection_info"]["name"] == "fleet"
    # The checkout's link back to itself is not content.
    assert not (root / "collections").exists()


def test_an_installed_module_runs_with_its_module_utils(installed: Path, tmp_path: Path) -> None:
    # drift_probe imports drift_checks and drift_stack, which import five more of the collection's module_utils:
    # with `ansible.module_utils.*` imports this failed ("Could not find imported module support code").
    watched = tmp_path / "cuda.conf"
    watched.write_text("/usr/local/cuda-12.8/lib64\n")
    args = {
        "layer": "toolkit",
        "checks": [{"kind": "file", "path": str(watched), "content": "/usr/local/cuda/lib64\n"}],
    }
    env = {
        **_only_path(installed),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
    }
    result = subprocess.run(
        [
            str(GALAXY.with_name("ansible")),
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "--check",
            "-m",
            "gpufleet.fleet.drift_probe",
            "-a",
            json.dumps(args),
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    host_result = json.loads(result.stdout.split("=>", 1)[1])
    assert host_result["changed"] is False
    assert (host_result["gpufleet_drift"]["status"], host_result["gpufleet_drift"]["drift"][0]["field"]) == (
        "drifted",
        "content",
    )


@pytest.mark.parametrize("playbook", ["site.yml", "drift.yml", "doctor.yml", "upgrade.yml"])
def test_the_installed_playbooks_pass_a_syntax_check(installed: Path, tmp_path: Path, playbook: str) -> None:
    # Roles, modules, filters and lookups resolve from the installed copy alone (no ansible.cfg, no checkout).
    path = installed / "ansible_collections/gpufleet/fleet/playbooks" / playbook
    result = subprocess.run(
        [str(GALAXY.with_name("ansible-playbook")), "--syntax-check", "-i", "localhost,", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env=_only_path(installed),
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lock_pins_every_direct_requirement_with_hashes() -> None:
    # requirements.in's pins are what requirements.txt (make lock) resolved them to, each with its sha256.
    direct = dict(
        line.split("==")
        for line in (REPO / "requirements.in").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    locked = (REPO / "requirements.txt").read_text()
    entries = dict(re.findall(r"(?m)^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:[0-9a-f]{64}", locked))
    normal = {name.lower().replace("_", "-").replace(".", "-"): version for name, version in entries.items()}
    stale = {
        name: version
        for name, version in direct.items()
        if normal.get(name.lower().replace("_", "-").replace(".", "-")) != version
    }
    assert stale == {}, f"requirements.txt does not lock these pins of requirements.in: {stale}; run make lock"
    unhashed = [line for line in locked.splitlines() if re.match(r"[A-Za-z0-9]", line) and not line.endswith(" \\")]
    assert unhashed == [], unhashed


@pytest.fixture(scope="module")
def pip_installed_cli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install CHECKOUT` into an empty venv (not editable): the gpufleet console script, without a checkout
    around it. Its dependencies come from the index pip is configured with."""
    venv = tmp_path_factory.mktemp("pip-cli") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    result = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return venv / "bin" / "gpufleet"


def test_a_cli_installed_with_pip_finds_the_installed_collection_or_says_how_to_install_it(
    pip_installed_cli: Path, installed: Path, tmp_path: Path
) -> None:
    """Issue 30: `pip install .` gave a gpufleet whose --version ended in a traceback (no ansible_collections)."""
    nowhere = _only_path(tmp_path / "nothing-here")
    version = subprocess.run([str(pip_installed_cli), "--version"], capture_output=True, text=True, env=nowhere)
    assert version.returncode == 0 and "collection gpufleet.fleet NOT FOUND" in version.stdout, version.stderr
    example = installed / "ansible_collections/gpufleet/fleet/inventories/example"
    plan = [
        str(pip_installed_cli),
        "plan",
        "-i",
        str(example),
        "--vault-password-file",
        str(example / "example-vault-password"),
    ]
    missing = subprocess.run(plan, capture_output=True, text=True, env=nowhere, cwd=tmp_path, timeout=120)
    (line,) = missing.stderr.strip().splitlines()
    assert missing.returncode == 1 and "ansible-galaxy collection install gpufleet-fleet-" in line, missing.stderr

    found = _only_path(installed)
    version = subprocess.run([str(pip_installed_cli), "--version"], capture_output=True, text=True, env=found)
    assert f"collection gpufleet.fleet at {installed}/ansible_collections/gpufleet/fleet" in version.stdout
    result = subprocess.run([*plan, "--json"], capture_output=True, text=True, env=found, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["compatible"] is True
