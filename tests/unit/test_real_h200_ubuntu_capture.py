"""Ubuntu 24.04 on the real H200 machine (tests/fixtures/h200-real/ubuntu-24.04, scripts/verify-local-ubuntu.sh):
the release is accepted, the roles load their Ubuntu-24 data, and the build dependencies dpkg reported missing
are exactly the ones whose CPython modules the real build could not make."""

from __future__ import annotations

import json
import re

import yaml

from gpufleet import PROJECT_ROOT

CAPTURE = PROJECT_ROOT / "tests/fixtures/h200-real/ubuntu-24.04"
BUILD_DEPS = yaml.safe_load((PROJECT_ROOT / "roles/pyenv_python/vars/Ubuntu-24.yml").read_text())[
    "__pyenv_python_build_packages"
]
# The -dev package each optional CPython module is built against (CPython's setup.py detect_modules and the
# pyenv wiki's build environment). _tkinter and nis are left out on purpose: gpufleet installs no tk-dev and no
# libnsl-dev (servers need neither tkinter nor NIS).
MODULE_PACKAGES = {
    "_bz2": ["libbz2-dev"],
    "_curses": ["libncurses-dev"],
    "_curses_panel": ["libncurses-dev"],
    "_dbm": ["libgdbm-compat-dev"],
    "_gdbm": ["libgdbm-dev"],
    "_lzma": ["liblzma-dev"],
    "_uuid": ["uuid-dev"],
    "readline": ["libreadline-dev"],
    "_sqlite3": ["libsqlite3-dev"],
    "_ctypes": ["libffi-dev"],
}
NOT_WANTED = {"_tkinter", "nis"}


def text(name: str) -> str:
    return (CAPTURE / name).read_text()


def modules_not_built() -> set[str]:
    """Every module make listed as not found, disabled by configure, or failed."""
    make = text("cpython_make.txt")
    sections = re.findall(
        r"(?:were not found|\*disabled\* by configure|Failed to build these modules):\n"
        r"((?:[^\n]+\n)+?)(?:\n|To find)",
        make,
    )
    return {word for block in sections for word in block.split()} - {"To", "find"}


def dpkg_states() -> dict[str, str]:
    rows = [
        line.split()[:2] for line in text("build_deps.txt").splitlines() if line.startswith(("installed", "missing"))
    ]
    return {package: state for state, package in rows}


def test_the_machine_is_ubuntu_24_04_without_systemd() -> None:
    os_release = text("os.txt")
    assert 'VERSION_ID="24.04"' in os_release and 'NAME="Ubuntu"' in os_release
    assert "no packages found matching systemd" in os_release


def test_preflight_accepts_ubuntu_24_04() -> None:
    run = text("preflight_release.txt")
    assert "TASK [Refuse a release that is not in vars/platforms.yml]" in run
    assert "failed=0" in run and run.rstrip().endswith("rc=0")


def test_the_roles_loaded_their_ubuntu_24_data_and_stopped_only_at_apt() -> None:
    for name in ("base_check.txt", "python_check.txt"):
        run = text(name)
        assert "Load the release's OS data" in run
        # apt's check mode needs python3-apt, which the image lacks: that is where the check stops.
        assert "python3-apt must be installed to use check mode" in run


def test_dpkg_knows_every_build_dependency_name_of_the_ubuntu_24_list() -> None:
    assert sorted(dpkg_states()) == sorted(BUILD_DEPS)


def test_the_missing_packages_are_exactly_the_unbuilt_modules_packages() -> None:
    not_built = modules_not_built()
    assert not_built >= {"_bz2", "_ctypes", "_sqlite3", "readline"}
    needed = {package for module in not_built - NOT_WANTED for package in MODULE_PACKAGES[module]}
    missing = {package for package, state in dpkg_states().items() if state == "missing"}
    assert missing == needed
    # The build did not get the modules gpufleet's venvs need: what a node without the packages would lack.
    assert "No module named '_sqlite3'" in text("cpython_modules.txt")


def test_noble_renamed_the_runtime_libraries_not_the_dev_packages() -> None:
    installed = dict(line.split(" ", 1) for line in text("t64_libraries.txt").splitlines()[:12])
    assert installed["libssl3t64"].strip() and not installed["libssl3"].strip()
    assert installed["libreadline8t64"].strip() and not installed["libreadline8"].strip()
    assert dpkg_states()["libssl-dev"] == "installed"


def test_drift_read_the_real_driver_and_the_headers_by_the_release_prefix() -> None:
    report = json.loads(text("drift.json"))
    drift = text("drift.txt")
    assert "NVIDIA driver: installed: 580.159.04 -> not installed" in drift
    kernel = text("os.txt").splitlines()[text("os.txt").splitlines().index("LOGO=ubuntu-logo") + 1]
    headers = yaml.safe_load((PROJECT_ROOT / "roles/nvidia_driver/vars/Ubuntu-24.yml").read_text())
    assert f"package {headers['__nvidia_driver_kernel_headers_prefix']}{kernel}:" in drift
    # Every layer compared, none in error: the GPUs are healthy, and what gpufleet would install is absent.
    statuses = {name: layer["status"] for name, layer in report["nodes"]["localhost"]["layers"].items()}
    assert statuses == {
        "base": "drifted",
        "driver": "drifted",
        "gpu_health": "ok",
        "toolkit": "drifted",
        "python": "drifted",
    }
