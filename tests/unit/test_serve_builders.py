"""The serving layer's lab builders: the reproducible model tarball and its pin, the lab CA and host certificates."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from cryptography import x509

from gpufleet import PROJECT_ROOT

BUILDERS = PROJECT_ROOT / "lab" / "builders"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BUILDERS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


tiny_model = load("make_tiny_model")
lab_certs = load("make_lab_certs")


# --- the tiny model --------------------------------------------------------------------------------------------


def _model_dir(root: Path, mtime: int) -> Path:
    directory = root / "model"
    (directory / "sub").mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("b.txt", "b"), ("sub/a.txt", "a")):
        path = directory / name
        path.write_text(text)
        os.utime(path, (mtime, mtime))
    return directory


def test_tarball_bytes_depend_only_on_the_files(tmp_path: Path) -> None:
    first, second = tmp_path / "1.tar.gz", tmp_path / "2.tar.gz"
    tiny_model.write_reproducible_tarball(_model_dir(tmp_path / "x", 1000), first)
    tiny_model.write_reproducible_tarball(_model_dir(tmp_path / "y", 2_000_000), second)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as archive:
        members = archive.getmembers()
    assert [m.name for m in members] == ["b.txt", "config.json", "sub/a.txt"]
    assert {(m.mtime, m.uid, m.mode) for m in members} == {(0, 0, 0o644)}
    assert gzip.open(first).read()  # a valid gzip stream


def test_the_pin_is_read_from_the_lab_inventory() -> None:
    mirror_path, sha256 = tiny_model.load_pin()
    declared = yaml.safe_load((PROJECT_ROOT / "inventories/lab/group_vars/all/model.yml").read_text())
    entry = next(m for m in declared["model_store_models"] if m["name"] == "tiny-qwen2")
    assert mirror_path == "models/tiny-qwen2.tar.gz" and sha256 == entry["sha256"]


def test_build_key_changes_with_the_pinned_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    key = tiny_model.build_key()
    monkeypatch.setattr(tiny_model, "BUILDER_REQUIREMENTS", (*tiny_model.BUILDER_REQUIREMENTS, "extra==1"))
    assert tiny_model.build_key() != key and len(key) == 16


def test_a_tarball_that_differs_from_the_pin_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "other.tar.gz"
    tiny_model.write_reproducible_tarball(_model_dir(tmp_path, 0), fake)
    monkeypatch.setattr(tiny_model, "cached_tarball", lambda: fake)
    assert tiny_model.main(["--check"]) == 1
    error = capsys.readouterr().err
    assert f"has sha256 {hashlib.sha256(fake.read_bytes()).hexdigest()}" in error
    assert "nothing was published" in error


# --- the lab certificates --------------------------------------------------------------------------------------


def _inventory(path: Path, addresses: dict[str, str]) -> Path:
    hosts = {name: {"ansible_host": address} for name, address in addresses.items()}
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    return path


def _run_certs(inventory: Path, cache: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(BUILDERS / "make_lab_certs.py"), "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUFLEET_CACHE": str(cache)},
        check=True,
    )
    return result.stdout


def test_certificates_are_issued_once_and_verify_against_the_ca(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "hosts.yml", {"lab-1": "10.9.0.2", "lab-2": "10.9.0.6"})
    first = _run_certs(inventory, tmp_path)
    assert "CA" in first and "made" in first and "lab-1: issued for lab-1, 10.9.0.2" in first
    tls = tmp_path / "lab-tls"
    assert oct(tls.stat().st_mode & 0o777) == "0o700"
    assert oct((tls / "lab-1.key").stat().st_mode & 0o777) == "0o600"
    assert _run_certs(inventory, tmp_path).splitlines()[1:] == ["lab-1: kept", "lab-2: kept"]
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tls / "ca.crt"), str(tls / "lab-2.crt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    leaf = x509.load_pem_x509_certificates((tls / "lab-2.crt").read_bytes())[0]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["lab-2"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.9.0.6"]


def test_a_host_with_a_new_address_gets_a_new_certificate(tmp_path: Path) -> None:
    _run_certs(_inventory(tmp_path / "hosts.yml", {"lab-1": "10.9.0.2"}), tmp_path)
    before = (tmp_path / "lab-tls" / "lab-1.crt").read_bytes()
    output = _run_certs(_inventory(tmp_path / "hosts.yml", {"lab-1": "10.9.1.2"}), tmp_path)
    assert "CA" in output and "kept" in output.splitlines()[0]
    assert "lab-1: issued for lab-1, 10.9.1.2" in output
    assert (tmp_path / "lab-tls" / "lab-1.crt").read_bytes() != before
