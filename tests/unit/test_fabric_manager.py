"""nvidia_fabric_manager run for real against the simulated GPU: the real H200 (no NVSwitch, as captured) needs no
fabric manager; the simulated HGX board (lab/simgpu/hgx-h200x8.json) needs one of exactly the driver's version.
nvidia_fabric_manager_install run for real on the lab's stand-in of NVIDIA's archive (lab/runfiles/build.py),
into a temporary root."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT
from gpufleet.simgpu import SimulatedMachine

from ansible_collections.gpufleet.fleet.plugins.module_utils import drift_checks, drift_stack

HGX = PROJECT_ROOT / "lab" / "simgpu" / "hgx-h200x8.json"


def run_module(args: dict, module: str = "nvidia_fabric_manager", check: bool = True) -> dict:
    command = [
        str(Path(sys.executable).parent / "ansible"),
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
    ]
    command += ["--check"] if check else []
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
    }
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=120, check=False
    )
    found = re.search(r"^localhost \| (SUCCESS|CHANGED|FAILED!) => ", result.stdout, re.MULTILINE)
    assert found, result.stdout + result.stderr
    host_result, _ = json.JSONDecoder().raw_decode(result.stdout[found.end() :])
    host_result["failed"] = found.group(1) == "FAILED!"
    return host_result


@pytest.fixture
def fabric_manager(tmp_path: Path) -> Path:
    """A stand-in nv-fabricmanager that prints its version as `--version` does (NVIDIA's is not downloadable here)."""
    binary = tmp_path / "nv-fabricmanager"
    binary.write_text('#!/bin/sh\necho "Fabric Manager version is : ${FM_VERSION}"\n')
    binary.chmod(0o755)
    return binary


def args(machine: SimulatedMachine, tmp_path: Path, binary: Path | str = "nv-fabricmanager-absent") -> dict:
    return {"library": str(machine.library), "binary": str(binary), "nvswitch_devices": str(tmp_path / "none")}


def test_the_real_h200_is_no_nvswitch_system(simgpu_machine: SimulatedMachine, tmp_path: Path) -> None:
    result = run_module(args(simgpu_machine, tmp_path))
    assert not result["failed"] and result["nvswitch"] is False and result["changed"] is False
    assert [gpu["state"] for gpu in result["fabric"]] == ["not_supported"]


def test_an_hgx_board_without_fabric_manager_is_refused(simgpu_machine: SimulatedMachine, tmp_path: Path) -> None:
    shutil.copy(HGX, simgpu_machine.description)
    result = run_module(args(simgpu_machine, tmp_path))
    assert result["failed"] and result["nvswitch"] is True and len(result["fabric"]) == 8
    assert "install fabric manager 580.159.04" in result["msg"]


def test_a_fabric_manager_of_another_version_is_refused_naming_both(
    simgpu_machine: SimulatedMachine, tmp_path: Path, fabric_manager: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(HGX, simgpu_machine.description)
    monkeypatch.setenv("FM_VERSION", "580.95.05")
    refused = run_module(args(simgpu_machine, tmp_path, fabric_manager))
    assert refused["failed"] and refused["fabric_manager_version"] == "580.95.05"
    assert "nvidia-fabricmanager 580.95.05 does not match the NVIDIA driver 580.159.04" in refused["msg"]
    monkeypatch.setenv("FM_VERSION", "580.159.04")
    assert not run_module(args(simgpu_machine, tmp_path, fabric_manager))["failed"]


def test_refuse_false_reports_the_problem_and_service_active_requires_the_unit(
    simgpu_machine: SimulatedMachine, tmp_path: Path, fabric_manager: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(HGX, simgpu_machine.description)
    reported = run_module(dict(args(simgpu_machine, tmp_path), refuse=False))
    assert not reported["failed"] and "install fabric manager 580.159.04" in reported["problem"]
    monkeypatch.setenv("FM_VERSION", "580.159.04")
    # No nvidia-fabricmanager.service runs here.
    inactive = run_module(dict(args(simgpu_machine, tmp_path, fabric_manager), service_active=True))
    assert (
        inactive["failed"] and "nvidia-fabricmanager.service is" in inactive["msg"] and "not active" in inactive["msg"]
    )


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The lab's stand-ins of NVIDIA's fabric manager archive, built into a temporary cache: version -> Runfile."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("GPUFLEET_CACHE", str(tmp_path_factory.mktemp("cache")))
    sys.path.insert(0, str(PROJECT_ROOT / "lab" / "runfiles"))
    try:
        import build

        return {version: build.build_fabric_manager(version) for version in ("570.124.06", "580.95.05")}
    finally:
        sys.path.remove(str(PROJECT_ROOT / "lab" / "runfiles"))
        monkeypatch.undo()


def install_args(root: Path, archive, version: str, sha256: str = "") -> dict:
    return {
        "archive": str(archive.path),
        "sha256": sha256 or archive.sha256,
        "version": version,
        "bindir": str(root / "usr/bin"),
        "libdir": str(root / "usr/lib"),
        "datadir": str(root / "usr/share/nvswitch"),
        "unitdir": str(root / "etc/systemd/system"),
        "docdir": str(root / "usr/share/doc/fm"),
        "staging": str(root / "var/lib/gpufleet"),
        "record": str(root / "var/lib/gpufleet/fm.json"),
    }


def tree(root: Path) -> dict:
    return {
        str(path.relative_to(root)): (
            path.read_bytes()
            if path.is_file() and not path.is_symlink()
            else str(path.readlink())
            if path.is_symlink()
            else None
        )
        for path in sorted(root.rglob("*"))
    }


def test_the_archive_is_installed_in_its_layout_and_a_rerun_changes_nothing(archives: dict, tmp_path: Path) -> None:
    archive = archives["580.95.05"]
    planned = run_module(install_args(tmp_path, archive, "580.95.05"), "nvidia_fabric_manager_install")
    assert planned["changed"] and not (tmp_path / "usr").exists(), "check mode wrote files"
    installed = run_module(install_args(tmp_path, archive, "580.95.05"), "nvidia_fabric_manager_install", check=False)
    assert not installed["failed"] and installed["changed"] and installed["unit_changed"]
    assert installed["files"] == planned["files"]
    for name in ("nv-fabricmanager", "nvidia-fabricmanager-start.sh", "nvswitch-audit"):
        assert (tmp_path / "usr/bin" / name).stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "usr/lib/libnvfm.so").readlink() == Path("libnvfm.so.1")
    assert {path.name for path in (tmp_path / "usr/share/nvswitch").iterdir()} == {
        "fabricmanager.cfg",
        "fabricmanager_multinode.cfg",
        "dgxh100_hgxh100_topology",
    }
    assert "Type=forking" in (tmp_path / "etc/systemd/system/nvidia-fabricmanager.service").read_text()
    assert "LAB-STANDIN" in (tmp_path / "usr/share/doc/fm/LICENSE").read_text()
    version = subprocess.run(
        [tmp_path / "usr/bin/nv-fabricmanager", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert version == "Fabric Manager version is : 580.95.05\n"
    record = json.loads((tmp_path / "var/lib/gpufleet/fm.json").read_text())
    assert record["version"] == "580.95.05" and record["sha256"] == archive.sha256
    assert not list((tmp_path / "var/lib/gpufleet").glob("gpufleet-fabricmanager.*")), "staging left behind"
    before = tree(tmp_path)
    rerun = run_module(install_args(tmp_path, archive, "580.95.05"), "nvidia_fabric_manager_install", check=False)
    assert not rerun["failed"] and not rerun["changed"] and rerun["files"] == [] and tree(tmp_path) == before
    # The other driver's archive replaces it, unit unchanged (the same unit file in both).
    upgraded = run_module(
        install_args(tmp_path, archives["570.124.06"], "570.124.06"), "nvidia_fabric_manager_install", check=False
    )
    assert upgraded["changed"] and not upgraded["unit_changed"]
    assert str(tmp_path / "usr/bin/nv-fabricmanager") in upgraded["files"]


def test_a_wrong_sha256_or_another_versions_archive_leaves_the_installed_one(archives: dict, tmp_path: Path) -> None:
    run_module(install_args(tmp_path, archives["580.95.05"], "580.95.05"), "nvidia_fabric_manager_install", check=False)
    before = tree(tmp_path)
    bad_sum = run_module(
        install_args(tmp_path, archives["570.124.06"], "570.124.06", sha256="0" * 64),
        "nvidia_fabric_manager_install",
        check=False,
    )
    assert bad_sum["failed"] and "expected " + "0" * 64 in bad_sum["msg"]
    # The 570 archive declared as 580's (its top directory and its binary say 570).
    wrong = run_module(
        install_args(tmp_path, archives["570.124.06"], "580.95.05"), "nvidia_fabric_manager_install", check=False
    )
    assert wrong["failed"] and "not the fabric manager archive of driver 580.95.05" in wrong["msg"]
    assert tree(tmp_path) == before


def test_drift_expects_no_fabric_manager_of_a_system_without_nvswitch(
    simgpu_machine: SimulatedMachine, tmp_path: Path
) -> None:
    spec = {
        "kind": "fabric_manager",
        "version": "580.159.04",
        "library": str(simgpu_machine.library),
        "nvswitch_devices": str(tmp_path / "none"),
    }
    # The real H200: no finding and nothing asked of systemd (the NVSwitch case runs on the lab, where systemd does).
    assert drift_stack.check_fabric_manager(spec, drift_checks.Context()) == []


def test_links_and_files_it_does_not_install_are_left_out_of_the_archive(archives: dict, tmp_path: Path) -> None:
    """NVIDIA's archive may carry the libnvfm.so link and headers: the module makes the link itself and lists the rest."""
    source = archives["580.95.05"].path
    top = "fabricmanager-linux-x86_64-580.95.05-archive"
    stream = io.BytesIO()
    with tarfile.open(source, "r:xz") as original, tarfile.open(fileobj=stream, mode="w") as repacked:
        for member in original.getmembers():
            repacked.addfile(member, original.extractfile(member) if member.isfile() else None)
        link = tarfile.TarInfo(f"{top}/lib/libnvfm.so")
        link.type, link.linkname = tarfile.SYMTYPE, "libnvfm.so.1"
        repacked.addfile(link)
        header = tarfile.TarInfo(f"{top}/include/nv_fm_agent.h")
        header.size = 3
        repacked.addfile(header, io.BytesIO(b"/**"))
    archive = tmp_path / source.name
    archive.write_bytes(lzma.compress(stream.getvalue(), format=lzma.FORMAT_XZ))
    root = tmp_path / "root"
    result = run_module(
        dict(
            install_args(root, archives["580.95.05"], "580.95.05"),
            archive=str(archive),
            sha256=hashlib.sha256(archive.read_bytes()).hexdigest(),
        ),
        "nvidia_fabric_manager_install",
        check=False,
    )
    assert not result["failed"] and result["ignored"] == ["include/nv_fm_agent.h"], result
    assert (root / "usr/lib/libnvfm.so").readlink() == Path("libnvfm.so.1")
