"""The drift check kinds (plugins/module_utils/drift_checks.py and drift_stack.py) against real state on the
controller: files in a temporary tree, the dpkg database, accounts, ldconfig, a loopback HTTP server, the
simulated NVML library, a real venv with real wheels installed by pip, a model tarball staged as
model_store stages it, and real interpreters."""

from __future__ import annotations

import http.server
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.simgpu import SimulatedMachine

from ansible_collections.gpufleet.fleet.plugins.module_utils import drift_checks, drift_stack, pip_lock

sys.path.insert(0, str(Path(__file__).parent))
from wheel_factory import make_wheel, sha256  # noqa: E402

drift_checks.register(drift_stack.KINDS)


def run(checks: list[dict], **context: object) -> dict:
    return drift_checks.run_checks(drift_checks.validate(checks), drift_checks.Context(**context))


def fields(result: dict) -> list[tuple[str, str, object, object]]:
    return [(item["check"], item["field"], item["expected"], item["actual"]) for item in result["drift"]]


# ---- files -------------------------------------------------------------------------------------------


def test_a_file_with_the_declared_content_and_mode_matches(tmp_path: Path) -> None:
    path = tmp_path / "90-gpufleet.conf"
    path.write_text("vm.swappiness = 1\n")
    path.chmod(0o644)
    result = run(
        [
            {
                "kind": "file",
                "path": str(path),
                "content": "vm.swappiness = 1\n",
                "owner": "root",
                "group": "root",
                "mode": "0644",
            }
        ]
    )
    assert result == {"status": "ok", "drift": [], "errors": [], "checked": 1, "notes": []}


def test_an_edited_file_is_drift_with_digests_and_a_diff(tmp_path: Path) -> None:
    path = tmp_path / "90-gpufleet.conf"
    path.write_text("vm.swappiness = 60\n")
    path.chmod(0o600)
    result = run([{"kind": "file", "path": str(path), "content": "vm.swappiness = 1\n", "mode": "0644"}])
    assert result["status"] == "drifted"
    (mode, content) = result["drift"]
    assert (mode["field"], mode["expected"], mode["actual"]) == ("mode", "0644", "0600")
    assert content["field"] == "content"
    assert content["expected"].startswith("sha256:") and content["expected"] != content["actual"]
    assert "-vm.swappiness = 1" in content["detail"] and "+vm.swappiness = 60" in content["detail"]


def test_a_secret_file_shows_digests_only(tmp_path: Path) -> None:
    path = tmp_path / "main.env"
    path.write_text('VLLM_API_KEY="stolen"\n')
    result = run([{"kind": "file", "path": str(path), "content": 'VLLM_API_KEY="declared"\n', "show_diff": False}])
    assert result["drift"][0]["detail"] == "" and "stolen" not in json.dumps(result)


def test_a_file_by_sha256_missing_files_links_and_absent_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"\x00\x01")
    (tmp_path / "cuda-12.8").mkdir()
    (tmp_path / "cuda").symlink_to(tmp_path / "cuda-12.8")
    (tmp_path / "stray").write_text("x")
    result = run(
        [
            {"kind": "file", "path": str(data), "sha256": sha256(data)},
            {"kind": "file", "path": str(tmp_path / "cuda.conf"), "content": "/usr/local/cuda/lib64\n"},
            {"kind": "link", "path": str(tmp_path / "cuda"), "target": str(tmp_path / "cuda-13.0")},
            {"kind": "link", "path": str(tmp_path / "data"), "target": "/x"},
            {"kind": "absent", "path": str(tmp_path / "stray")},
            {"kind": "directory", "path": str(data), "mode": "0755"},
            {"kind": "file", "path": str(tmp_path / "never"), "content": "x", "applies": False},
        ]
    )
    assert result["checked"] == 6
    assert fields(result) == [
        (f"file {tmp_path}/cuda.conf", "exists", "present", "absent"),
        (f"link {tmp_path}/cuda", "target", f"{tmp_path}/cuda-13.0", f"{tmp_path}/cuda-12.8"),
        (f"link {tmp_path}/data", "target", "/x", "a regular file, not a link"),
        (f"path {tmp_path}/stray", "exists", "absent", "regular file"),
        (f"directory {data}", "type", "directory", "regular file"),
    ]


def test_an_unknown_kind_is_a_spec_error_naming_the_known_ones() -> None:
    with pytest.raises(drift_checks.SpecError, match="unknown kind 'files'.*known kinds: absent, directory"):
        drift_checks.validate([{"kind": "files", "path": "/"}])
    with pytest.raises(drift_checks.SpecError, match="check link needs target"):
        run([{"kind": "link", "path": "/"}])


# ---- packages, accounts, services, endpoints ---------------------------------------------------


def test_packages_from_the_real_dpkg_database() -> None:
    result = run([{"kind": "packages", "names": ["dpkg", "gpufleet-no-such-package"]}])
    assert fields(result) == [("package gpufleet-no-such-package", "installed", "installed", "not installed")]


def test_held_packages_from_a_dpkg_status_file(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(
        "Package: linux-image-6.1.0-9-amd64\nStatus: hold ok installed\nVersion: 1\n\n"
        "Package: linux-headers-6.1.0-9-amd64\nStatus: install ok installed\nVersion: 1\n\n"
        "Package: linux-image-6.1.0-7-amd64\nStatus: deinstall ok config-files\nVersion: 1\n"
    )
    result = run(
        [
            {"kind": "held", "pattern": "^linux-(image|headers)-"},
            {"kind": "packages", "names": ["linux-image-6.1.0-9-amd64"], "held": True},
        ],
        dpkg_status=str(status),
    )
    assert fields(result) == [("package linux-headers-6.1.0-9-amd64", "selection", "hold", "install")]


def test_an_account_with_another_shell() -> None:
    result = run(
        [
            {"kind": "user", "name": "root", "group": "root", "home": "/root", "shell": "/usr/sbin/nologin"},
            {"kind": "user", "name": "gpufleet-nobody"},
        ]
    )
    assert fields(result) == [
        ("user root", "shell", "/usr/sbin/nologin", "/bin/bash"),
        ("user gpufleet-nobody", "exists", "present", "absent"),
    ]


def test_a_service_that_cannot_be_read_is_an_error_not_drift() -> None:
    # The controller's PID 1 is not systemd: systemctl cannot answer (on a node it can, see the lab tests).
    result = run([{"kind": "service", "name": "systemd-timesyncd", "enabled": True}])
    assert result["status"] == "error" and result["drift"] == []
    assert result["errors"][0]["message"].startswith("systemctl show systemd-timesyncd.service failed")


@pytest.fixture
def health_server() -> Iterator[str]:
    """A loopback HTTP server: /health answers 200, /sick 503."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_endpoints_healthy_sick_and_closed(health_server: str) -> None:
    closed = health_server.rsplit(":", 1)[0] + ":1"
    result = run(
        [
            {"kind": "http", "url": f"{health_server}/health"},
            {"kind": "http", "url": f"{health_server}/sick"},
            {"kind": "http", "url": f"{closed}/health", "timeout": 2},
        ]
    )
    assert fields(result)[0] == (f"endpoint {health_server}/sick", "status", 200, 503)
    assert fields(result)[1][3].startswith("no answer")


@pytest.fixture
def tls_health_server(tmp_path: Path) -> Iterator[str]:
    """The same handler behind TLS with a self-signed certificate for another name (as a node's proxy on loopback)."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=lab-1",
            "-keyout",
            str(tmp_path / "key.pem"),
            "-out",
            str(tmp_path / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_tls_endpoint_on_loopback_with_and_without_certificate_checks(tls_health_server: str) -> None:
    url = f"{tls_health_server}/health"
    assert run([{"kind": "http", "url": url, "validate_certs": False}])["status"] == "ok"
    (finding,) = run([{"kind": "http", "url": url}])["drift"]
    assert "CERTIFICATE_VERIFY_FAILED" in finding["actual"]


# ---- loader cache and interpreters (real ldconfig, real Pythons) -----------------------------------


def test_the_loader_cache_holds_the_systems_libraries_and_not_an_unconfigured_directory(tmp_path: Path) -> None:
    library = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    (tmp_path / "libcudart.so.13").symlink_to(library)
    result = run(
        [
            {"kind": "ld_cache", "directory": "/usr/lib/x86_64-linux-gnu"},
            {"kind": "ld_cache", "directory": str(tmp_path)},
        ]
    )
    assert fields(result) == [
        (f"loader cache for {tmp_path}", "libraries", "in the cache (ldconfig)", "none of them in the cache")
    ]


def test_a_cpython_build_is_probed_with_its_own_interpreter(tmp_path: Path) -> None:
    # A pyenv-like root whose 3.11.2 is the controller's Debian build (shared, 3.11.2, no --disable-test-modules).
    version = subprocess.run(
        ["/usr/bin/python3.11", "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    bin_dir = tmp_path / "versions" / version / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3.11").symlink_to("/usr/bin/python3.11")
    spec = {"kind": "pythons", "pyenv_root": str(tmp_path), "enable_shared": True}
    matching = run([{**spec, "versions": [{"version": version}]}])
    assert matching["status"] == "ok", matching
    wrong = run([{**spec, "versions": [{"version": version, "configure_opts": ["--with-lto"]}, {"version": "3.12.9"}]}])
    assert [item["actual"] for item in wrong["drift"]] == ["built without --with-lto", "not installed"]


# ---- driver and GPUs through the simulated NVML library ---------------------------------------


def test_driver_loaded_through_nvml_but_not_installed_on_this_controller(simgpu_machine: SimulatedMachine) -> None:
    library = str(simgpu_machine.library)
    result = run([{"kind": "driver", "version": "580.159.04", "library": library}])
    assert fields(result) == [("NVIDIA driver", "installed", "580.159.04", "not installed")]
    simgpu_machine.ctl("driver-version", "570.133.20", "--cuda", "12080")
    result = run([{"kind": "driver", "version": "580.159.04", "library": library}])
    assert ("NVIDIA driver", "loaded", "580.159.04", "570.133.20") in fields(result)


def test_gpu_health_names_the_gpu_and_the_error_count(simgpu_machine: SimulatedMachine) -> None:
    spec = {
        "kind": "gpus",
        "library": str(simgpu_machine.library),
        "expect": {"ecc_errors": 0, "persistence": True, "gpu_count": 1},
    }
    assert run([spec])["status"] == "ok"
    simgpu_machine.ctl("ecc-errors", "--gpu", "0", "12")
    simgpu_machine.ctl("persistence", "off")
    uuid = simgpu_machine.read()["gpus"][0]["uuid"]
    assert sorted(fields(run([spec]))) == [
        (f"GPU 0 ({uuid})", "ecc_errors", 0, 12),
        (f"GPU 0 ({uuid})", "persistence", True, False),
    ]
    simgpu_machine.ctl("driver", "unload")
    (item,) = run([spec])["drift"]
    assert (item["check"], item["field"], item["expected"]) == ("GPUs", "driver", "usable through NVML")


# ---- the venv, against a real venv and real wheels -----------------------------------------------


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    for name, version in (
        ("demo-app", "1.0"),
        ("demo-lib", "2.0"),
        ("demo-lib", "2.1"),
        ("torchvision", "0.1"),
        ("hand-installed", "9.9"),
    ):
        make_wheel(directory, name, version)
    return directory


def pip_install(venv: Path, wheels: Path, *requirements: str) -> None:
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--find-links",
            str(wheels),
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
        check=True,
    )


def test_a_venv_against_its_lock(tmp_path: Path, wheels: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3.11", "-m", "venv", str(venv)], check=True)
    pip_install(venv, wheels, "demo-app==1.0", "demo-lib==2.0")
    lock = pip_lock.format_lock(
        {"stack": "demo"},
        [
            pip_lock.LockEntry("demo-app", "1.0", (sha256(wheels / "demo_app-1.0-py3-none-any.whl"),)),
            pip_lock.LockEntry("demo-lib", "2.0", (sha256(wheels / "demo_lib-2.0-py3-none-any.whl"),)),
        ],
    )
    (venv / "gpufleet.lock").write_text(lock)
    spec = {
        "kind": "venv",
        "path": str(venv),
        "lock": lock.rstrip("\n"),
        "remove": ["torchvision"],
        "python": "/usr/bin/python3.11",
        "allow_extra": ["gpufleet-kernel-demo"],
    }
    assert run([spec])["status"] == "ok"

    pip_install(venv, wheels, "demo-lib==2.1", "torchvision==0.1", "hand-installed==9.9")
    label = f"venv {venv}"
    assert fields(run([spec])) == [
        (label, "package demo-lib", "2.0", "2.1"),
        (label, "package torchvision", "absent (declared for removal)", "0.1"),
        (label, "package hand-installed", "absent (not in the lock)", "9.9"),
    ]
    (venv / "gpufleet.lock").unlink()
    other = run([{**spec, "python": "/opt/pyenv/versions/3.11.2/bin/python3.11"}])
    assert [(item["field"], item["actual"]) for item in other["drift"][3:]] == [
        ("installed lock", "absent"),
        ("interpreter", "/usr/bin"),
    ]


def test_kernels_report_the_version_and_a_venv_without_torch(tmp_path: Path, wheels: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3.11", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    info = site / "gpufleet_kernel_demo-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpufleet-kernel-demo\nVersion: 0.1.0\n")
    package = {"name": "gpufleet-kernel-demo", "version": "0.1.0", "sha256": "0" * 64, "requires_cuda": False}
    result = run(
        [
            {
                "kind": "kernels",
                "venv": str(venv),
                "packages": [package, {**package, "name": "flash-attn", "version": "2.8.3"}],
            }
        ]
    )
    (first, second) = fields(result)
    assert first[:3] == (f"kernel gpufleet-kernel-demo in {venv}", "build key", "a key for this venv")
    assert "torch is not importable in the venv" in first[3]
    assert second == (f"kernel flash-attn in {venv}", "version", "2.8.3", "not installed")


# ---- models, staged the way model_store stages them ---------------------------------------------


def make_model(tmp_path: Path) -> tuple[Path, str, dict]:
    """A tarball of a tiny model, and its version staged under a model root with marker and originals."""
    files = {
        "tiny/config.json": b'{"hidden_size": 128}',
        "tiny/generation_config.json": b'{"temperature": 0.7}',
        "tiny/model.safetensors": os.urandom(4096),
        "tiny/tokenizer.json": b'{"v": 1}',
    }
    archive = tmp_path / "cache" / "tiny.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    digest = sha256(archive)
    (tmp_path / "cache" / digest).mkdir()
    archive = archive.rename(tmp_path / "cache" / digest / "tiny.tar.gz")
    root = tmp_path / "models"
    version = root / f"tiny-{digest[:16]}"
    (version / ".gpufleet-original").mkdir(parents=True)
    for name, data in files.items():
        (version / name.split("/", 1)[1]).write_bytes(data)
    for name in ("config.json", "generation_config.json"):
        (version / ".gpufleet-original" / name).write_bytes(files[f"tiny/{name}"])
    (version / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    (version / ".gpufleet-model.json").write_text(json.dumps({"name": "tiny", "sha256": digest}))
    (root / "tiny").symlink_to(version)
    model = {
        "name": "tiny",
        "sha256": digest,
        "url": "http://mirror/models/tiny.tar.gz",
        "strip_components": 1,
        "generation_config_overrides": {"temperature": 0.0},
    }
    return root, str(tmp_path / "cache"), model


def test_a_staged_model_matches_its_tarball_and_overrides(tmp_path: Path) -> None:
    root, cache, model = make_model(tmp_path)
    spec = {
        "kind": "models",
        "root": str(root),
        "models": [model],
        "archive_cache": cache,
        "version_dirs": {"tiny": str(root / f"tiny-{model['sha256'][:16]}")},
    }
    assert run([spec])["status"] == "ok"

    version = root / f"tiny-{model['sha256'][:16]}"
    (version / "model.safetensors").write_bytes(b"corrupted")
    (version / "generation_config.json").write_text(json.dumps({"temperature": 0.9}))
    (version / "notes.txt").write_text("left by someone")
    drift = run([spec])["drift"]
    assert [(item["field"], item["expected"], item["actual"]) for item in drift[1:]] == [
        ("file notes.txt", "absent (not in the tarball)", "present"),
        ("generation_config.json", '{"temperature": 0.0}', '{"temperature": 0.9}'),
    ]
    assert drift[0]["field"] == "file model.safetensors" and drift[0]["expected"] != drift[0]["actual"]


def test_a_model_whose_tarball_left_the_node_is_noted_not_hashed(tmp_path: Path) -> None:
    root, cache, model = make_model(tmp_path)
    version_dirs = {"tiny": str(root / f"tiny-{model['sha256'][:16]}")}
    result = run(
        [
            {
                "kind": "models",
                "root": str(root),
                "models": [model],
                "archive_cache": str(tmp_path / "gone"),
                "version_dirs": version_dirs,
            }
        ]
    )
    assert result["status"] == "ok"
    assert result["notes"] == [
        f"model tiny: files not compared, the verified tarball {tmp_path}/gone/"
        f"{model['sha256']}/tiny.tar.gz is no longer on the node"
    ]
    (root / "tiny").unlink()
    (root / "tiny").symlink_to(root / "elsewhere")
    assert fields(run([{"kind": "models", "root": str(root), "models": [model], "version_dirs": version_dirs}]))[0] == (
        "model tiny",
        "link",
        f"{root}/tiny-{model['sha256'][:16]}",
        f"{root}/elsewhere",
    )
