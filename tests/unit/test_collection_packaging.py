"""The repository builds as the collection gpufleet.fleet and installs from its tarball (all offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GALAXY = Path(sys.executable).with_name("ansible-galaxy")


@pytest.fixture(scope="module")
def collection_tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("collection")
    subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(out), str(REPO)],
                   check=True, capture_output=True, text=True)
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
    assert (info["namespace"], info["name"], info["version"]) == (galaxy["namespace"], galaxy["name"],
                                                                  galaxy["version"])
    assert collection_tarball.name == f"gpufleet-fleet-{galaxy['version']}.tar.gz"
    assert info["license_file"] == "LICENSE"


def test_the_tarball_carries_the_content_and_leaves_the_checkout_out(collection_tarball: Path) -> None:
    names = _members(collection_tarball)
    for needed in ("LICENSE", "meta/runtime.yml", "roles/vllm_service/tasks/main.yml",
                   "plugins/modules/nvidia_gpu_info.py", "playbooks/site.yml", "data/compat/cpython.csv"):
        assert needed in names, needed
    leaked = sorted(name for name in names
                    if name.split("/")[0] in {".venv", ".git", "tests", "molecule", "bench", "build"}
                    or "__pycache__" in name or name.endswith("-hosts.yml"))
    assert leaked == []


def test_runtime_requires_the_ansible_core_line_requirements_pin() -> None:
    runtime = yaml.safe_load((REPO / "meta/runtime.yml").read_text())
    pinned = next(line.split("==")[1] for line in (REPO / "requirements.txt").read_text().splitlines()
                  if line.startswith("ansible-core=="))
    major_minor = ".".join(pinned.split(".")[:2])
    assert f">={major_minor}.0" in runtime["requires_ansible"]


def test_the_execution_environment_installs_what_the_controller_pins() -> None:
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert ee["version"] == 3
    pins = {line.split("==")[0]: line for line in (REPO / "requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    deps = ee["dependencies"]
    assert deps["ansible_core"]["package_pip"] == pins["ansible-core"]
    assert deps["ansible_runner"]["package_pip"] == pins["ansible-runner"]
    for requirement in deps["python"]:
        assert requirement == pins[requirement.split("==")[0]]
    assert (REPO / deps["system"]).is_file()
    requirements = yaml.safe_load((REPO / deps["galaxy"]).read_text())
    (entry,) = requirements["collections"]
    (copied,) = ee["additional_build_files"]
    assert entry["name"].startswith(copied["dest"] + "/")


def test_the_built_collection_installs_into_an_empty_path(collection_tarball: Path, tmp_path: Path) -> None:
    # Only tmp_path is searched: a copy installed elsewhere (~/.ansible/collections) would otherwise make
    # galaxy answer "Nothing to do" and install nothing here.
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(tmp_path)}
    result = subprocess.run([str(GALAXY), "collection", "install", "--offline", "-p", str(tmp_path),
                             str(collection_tarball)], capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stderr
    installed = tmp_path / "ansible_collections/gpufleet/fleet"
    assert (installed / "roles/nvidia_driver/meta/argument_specs.yml").is_file()
    assert json.loads((installed / "MANIFEST.json").read_text())["collection_info"]["name"] == "fleet"
