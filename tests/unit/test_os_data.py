"""OS data per release: every role with OS data has it for every supported release, loaded most specific first;
preflight refuses another release by name (run for real against this machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT

ROLES = PROJECT_ROOT / "roles"
SUPPORTED = yaml.safe_load((PROJECT_ROOT / "playbooks/vars/platforms.yml").read_text())["gpufleet_supported_releases"]
# Ansible's os_family of each supported distribution (ansible.module_utils.facts.system.distribution OS_FAMILY_MAP).
OS_FAMILY = {"Debian": "Debian", "Ubuntu": "Debian"}


def roles_with_os_data() -> list[str]:
    """Roles whose tasks load vars through the first_found chain."""
    return sorted(path.parent.parent.name for path in ROLES.glob("*/tasks/*.yml") if "_os_vars) }}" in path.read_text())


def first_found(role: str, release: str) -> Path | None:
    """The file the roles' include_vars picks for a release: <distribution>-<major>, <distribution>, <os_family>."""
    distribution = release.split("-")[0]
    for name in (f"{release}.yml", f"{distribution}.yml", f"{OS_FAMILY[distribution]}.yml"):
        if (ROLES / role / "vars" / name).is_file():
            return ROLES / role / "vars" / name
    return None


def test_the_roles_with_os_data_are_the_expected_ones() -> None:
    assert roles_with_os_data() == ["base", "inference_proxy", "nvidia_driver", "pyenv_python"]


@pytest.mark.parametrize("role", roles_with_os_data())
def test_every_supported_release_has_its_own_file_with_the_same_keys(role: str) -> None:
    keys = {}
    for release in SUPPORTED:
        found = first_found(role, release)
        assert found is not None and found.name == f"{release}.yml", f"{role} has no vars/{release}.yml"
        keys[release] = sorted(yaml.safe_load(found.read_text()))
    assert len({tuple(value) for value in keys.values()}) == 1, keys


def test_no_role_carries_data_for_a_release_outside_the_list() -> None:
    stray = [str(path.relative_to(ROLES)) for path in ROLES.glob("*/vars/*-*.yml") if path.stem not in SUPPORTED]
    assert stray == []


def test_ubuntu_24_04_and_debian_13_name_no_package_they_dropped() -> None:
    for release in ("Ubuntu-24", "Debian-13"):
        packages = yaml.safe_load((ROLES / "pyenv_python/vars" / f"{release}.yml").read_text())
        assert "libncursesw5-dev" not in packages["__pyenv_python_build_packages"]
        assert "libncurses-dev" in packages["__pyenv_python_build_packages"]


def run_release_check(tmp_path: Path, supported: list[str]) -> subprocess.CompletedProcess[str]:
    """preflight.yml's release check against this machine, over a local connection."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_nodes": {
                            "hosts": {
                                "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                            }
                        }
                    }
                }
            }
        )
    )
    command = [
        str(Path(sys.executable).with_name("ansible-playbook")),
        "-i",
        str(inventory),
        str(PROJECT_ROOT / "playbooks/preflight.yml"),
        "--start-at-task",
        "Read each host's distribution and release",
        "-e",
        json.dumps({"gpufleet_supported_releases": supported}),
    ]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, check=False)


def this_machine_release() -> str:
    fields = {
        key: value.strip('"')
        for key, _, value in (line.partition("=") for line in Path("/etc/os-release").read_text().splitlines())
    }
    return f"{fields['NAME'].split()[0]}-{fields['VERSION_ID'].split('.')[0]}"


def test_preflight_accepts_this_machines_release(tmp_path: Path) -> None:
    result = run_release_check(tmp_path, SUPPORTED)
    assert result.returncode == 0, result.stdout[-2000:]
    assert this_machine_release() in SUPPORTED


def test_preflight_refuses_a_release_outside_the_list_by_name(tmp_path: Path) -> None:
    others = [release for release in SUPPORTED if release != this_machine_release()]
    result = run_release_check(tmp_path, others)
    assert result.returncode != 0
    name, major = this_machine_release().split("-")
    assert f"runs {name} {major}" in result.stdout
    assert "which gpufleet has no package data for" in result.stdout
