"""The lab's hosts run the OS the inventory records, and each got its own release's OS data (package names).
Read-only, on the converged lab (seconds)."""

from __future__ import annotations

import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.lab.releases import RELEASES

from conftest import AnsibleRunner


def test_each_host_runs_the_os_its_inventory_entry_records(lab_hosts: dict[str, dict], ansible: AnsibleRunner) -> None:
    facts = ansible("gpu_nodes", "ansible.builtin.setup", "gather_subset=!all")
    for name, entry in lab_hosts.items():
        release = RELEASES[entry["gpufleet_lab_os"]]
        found = facts[name]["ansible_facts"]
        assert (found["ansible_distribution"], found["ansible_distribution_major_version"]) == (
            release.distribution,
            release.major,
        )
        assert found["ansible_python"]["executable"] == entry["ansible_python_interpreter"]


def test_each_host_has_its_releases_python_build_dependencies(
    lab_hosts: dict[str, dict], ansible: AnsibleRunner
) -> None:
    """The Debian 13 host installed libncurses-dev (trixie has no libncursesw5-dev): each release's own list."""
    packages = ansible("gpu_nodes", "ansible.builtin.package_facts")
    for name, entry in lab_hosts.items():
        release = RELEASES[entry["gpufleet_lab_os"]]
        wanted = yaml.safe_load((PROJECT_ROOT / "roles/pyenv_python/vars" / f"{release.release_key}.yml").read_text())[
            "__pyenv_python_build_packages"
        ]
        installed = packages[name]["ansible_facts"]["packages"]
        assert [package for package in wanted if package not in installed] == [], name


def test_no_host_carries_a_kernel_it_does_not_run(lab_hosts: dict[str, dict], ansible: AnsibleRunner) -> None:
    """Lab hosts run the controller's kernel. A kernel image in /boot is one DKMS has no module for, which drift
    reports as a node that would boot without its GPUs: Debian 13's headers pull their image package in, whose
    vmlinuz the lab's image leaves out (dpkg path-exclude)."""
    found = ansible("gpu_nodes", "ansible.builtin.find", "paths=/boot patterns=vmlinuz-*")
    assert {name: [item["path"] for item in found[name]["files"]] for name in lab_hosts} == {
        name: [] for name in lab_hosts
    }
