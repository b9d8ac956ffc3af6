"""The compile caches of an instance: the key that decides which nodes may share them (a changed wheel, option or
model architecture changes it; the node's own port, name or CPU binding do not), the archive that packs the same
on any node, and the install that refuses a corrupt, truncated or foreign archive and leaves the home's caches as
they were."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import compile_cache, drift_checks
from ansible_collections.gpufleet.fleet.plugins.module_utils.compile_cache import CompileCacheError

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile\n"


def make_venv(root: Path, wheels: dict[str, str]) -> Path:
    venv = root / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /opt/python/bin\nversion = 3.11.10\n")
    for name, version in wheels.items():
        (site / f"{name}-{version}.dist-info").mkdir()
    return venv


def make_model(root: Path, config: dict[str, Any]) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    venv = make_venv(tmp_path, {"torch": "2.9.1+cpu", "vllm": "0.32.0", "triton": "3.5.1"})
    model = make_model(tmp_path, {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64})
    instance = {
        "name": "main",
        "model": str(model),
        "port": 8000,
        "served_model_name": "tiny",
        "gpus": [0],
        "dtype": "bfloat16",
        "max_model_len": 512,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"},
    }
    return {"venv": str(venv), "instance": instance, "root": tmp_path}


HOME = "/var/cache/private/vllm/main"


def key(
    node: dict[str, Any], gpus: list[dict[str, Any]] | None = None, cpuinfo: str = CPUINFO, home: str = HOME
) -> str:
    return compile_cache.cache_key(
        compile_cache.key_components(node["venv"], node["instance"], gpus or [], cpuinfo, home)
    )


def test_the_key_changes_with_a_wheel_an_option_or_the_architecture(node: dict[str, Any]) -> None:
    base = key(node)
    assert key(node) == base

    changed_option = dict(node, instance={**node["instance"], "max_model_len": 1024})
    assert key(changed_option) != base
    compile_env = dict(node, instance={**node["instance"], "env": {"VLLM_USE_AOT_COMPILE": "0"}})
    assert key(compile_env) != base
    two_gpus = dict(node, instance={**node["instance"], "gpus": [0, 1]})
    assert key(two_gpus) != base
    assert key(node, gpus=[{"name": "NVIDIA H200", "compute_capability": "9.0"}]) != base
    assert key(node, cpuinfo="flags\t: fpu sse2 avx avx2\n") != base
    # vLLM's compile-cache hash and flashinfer's ninja files hold the home's path (another instance's home).
    assert key(node, home="/var/cache/private/vllm/second") != base
    other_compiler = compile_cache.key_components(
        node["venv"], node["instance"], [], CPUINFO, HOME, {"cc": "gcc (Debian 14.2.0-19) 14.2.0"}
    )
    assert compile_cache.cache_key(other_compiler) != base

    other = node["root"] / "other"
    other.mkdir()
    newer_vllm = dict(node, venv=str(make_venv(other, {"torch": "2.9.1+cpu", "vllm": "0.32.1", "triton": "3.5.1"})))
    assert key(newer_vllm) != base
    (Path(node["instance"]["model"]) / "config.json").write_text(json.dumps({"hidden_size": 128}))
    assert key(node) != base


def test_what_only_places_an_instance_on_its_node_leaves_the_key_alone(node: dict[str, Any]) -> None:
    base = key(node)
    elsewhere = {
        **node["instance"],
        "name": "second",
        "port": 8001,
        "served_model_name": "other",
        "gpus": [3],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "1", "VLLM_API_KEY": "secret"},
    }
    assert key(dict(node, instance=elsewhere)) == base
    # New weights of the same architecture compile to the same graphs.
    (Path(node["instance"]["model"]) / "model.safetensors").write_bytes(b"other weights")
    assert key(node) == base
    assert "secret" not in json.dumps(compile_cache.key_components(node["venv"], elsewhere, [], CPUINFO, HOME))


def test_a_venv_with_nothing_installed_cannot_be_keyed(tmp_path: Path) -> None:
    venv = make_venv(tmp_path, {})
    with pytest.raises(CompileCacheError, match="no installed distribution found in .*is it the inference venv"):
        compile_cache.distributions(str(venv))


def fill_home(home: Path, text: str) -> None:
    for name in ("vllm/torch_compile_cache/ab/rank_0_0/backbone", "torchinductor/xy", "flashinfer/jit"):
        (home / ".cache" / name).mkdir(parents=True, exist_ok=True)
        (home / ".cache" / name / "artifact").write_text(f"{name}: {text}")
    (home / ".cache" / "pip").mkdir(exist_ok=True)
    (home / ".cache" / "pip" / "unrelated").write_text("not a compile cache")


def test_packing_the_same_caches_gives_the_same_bytes_and_an_install_puts_them_in_place(tmp_path: Path) -> None:
    built, other, fresh = tmp_path / "built", tmp_path / "other", tmp_path / "fresh"
    for home in (built, other):
        fill_home(home, "compiled")
        os.utime(home / ".cache" / "torchinductor" / "xy" / "artifact", (1, 1))
    components = {"any": "thing"}
    first = compile_cache.pack(str(built), "k1", components, str(tmp_path / "a.tar"))
    second = compile_cache.pack(str(other), "k1", components, str(tmp_path / "b.tar"))
    assert first["sha256"] == second["sha256"]
    assert first["directories"] == ["vllm", "torchinductor", "flashinfer"]
    with tarfile.open(tmp_path / "a.tar") as tar:
        names = tar.getnames()
    assert names[0] == compile_cache.KEY_MEMBER and not any("pip" in name for name in names)

    # The node that packed holds that key's caches: a later start there installs nothing.
    assert compile_cache.read_marker(str(built)) == {
        "key": "k1",
        "sha256": first["sha256"],
        "directories": first["directories"],
    }
    fresh.mkdir()
    assert compile_cache.install(str(tmp_path / "a.tar"), first["sha256"], "k1", str(fresh)) == first["directories"]
    assert (fresh / ".cache" / "flashinfer" / "jit" / "artifact").read_text() == "flashinfer/jit: compiled"
    assert compile_cache.read_marker(str(fresh)) == {
        "key": "k1",
        "sha256": first["sha256"],
        "directories": first["directories"],
    }
    assert compile_cache.present_directories(str(fresh)) == first["directories"]


@pytest.mark.parametrize("damage", ["tampered", "truncated", "foreign key"])
def test_a_corrupt_or_foreign_archive_is_refused_and_the_home_keeps_its_caches(tmp_path: Path, damage: str) -> None:
    built, home = tmp_path / "built", tmp_path / "home"
    fill_home(built, "shipped")
    fill_home(home, "own")
    archive = tmp_path / "cache.tar"
    packed = compile_cache.pack(str(built), "k1", {}, str(archive))
    data = archive.read_bytes()
    if damage == "tampered":
        archive.write_bytes(data.replace(b"flashinfer/jit: shipped", b"flashinfer/jit: evil!!"))
        message = "has sha256 .*, not the .* recorded when it was built"
        sha256, wanted = packed["sha256"], "k1"
    elif damage == "truncated":
        archive.write_bytes(data[: len(data) // 2])
        message = "corrupt or truncated"
        sha256, wanted = packed["sha256"], "k1"
    else:
        message = "was built for key k1, not this instance's k2"
        sha256, wanted = packed["sha256"], "k2"

    with pytest.raises(CompileCacheError, match=message):
        compile_cache.install(str(archive), sha256, wanted, str(home))
    assert (home / ".cache" / "flashinfer" / "jit" / "artifact").read_text() == "flashinfer/jit: own"
    assert compile_cache.read_marker(str(home)) is None


def test_an_archive_that_reaches_outside_the_cache_layout_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    record = json.dumps({"key": "k1"}).encode()
    outside = tmp_path / "outside"
    outside.write_text("x")
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo(compile_cache.KEY_MEMBER)
        info.size = len(record)
        tar.addfile(info, io.BytesIO(record))
        tar.add(outside, arcname="cache/../../etc/cron.d/evil")
    home = tmp_path / "home"
    home.mkdir()
    sha256 = compile_cache.sha256_file(str(archive))

    with pytest.raises(CompileCacheError, match="outside the cache layout"):
        compile_cache.install(str(archive), sha256, "k1", str(home))
    assert not (tmp_path / "etc").exists()


# flashinfer's JIT layout: one build directory per kernel, a ninja file naming sources in the venv and a header
# dependency ninja learns from the compiler (deps = gcc, kept in .ninja_deps).
JIT_NINJA = """ninja_required_version = 1.3
rule compile
  command = cc -MMD -MF $out.d -fPIC -I{include} -c $in -o $out
  depfile = $out.d
  deps = gcc
rule link
  command = cc -shared $in -o $out
build sampling.o: compile {source}
build sampling.so: link sampling.o
default sampling.so
"""


def ninja_plan(build_dir: Path) -> str:
    """What ninja would do in BUILD_DIR, and why (-n: nothing is run)."""
    result = subprocess.run(
        ["ninja", "-C", str(build_dir), "-n", "-d", "explain"], capture_output=True, text=True, check=True
    )
    return result.stdout + result.stderr


def test_a_shipped_jit_cache_is_up_to_date_for_ninja_on_a_node_whose_venv_is_newer(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "flashinfer" / "data"
    (venv / "include").mkdir(parents=True)
    (venv / "csrc").mkdir()
    (venv / "include" / "sampling.h").write_text("int top_p(int);\n")
    (venv / "csrc" / "sampling.c").write_text('#include "sampling.h"\nint top_p(int x) { return x + 1; }\n')
    home = tmp_path / "home"
    build_dir = home / ".cache" / "flashinfer" / "0.6.14" / "90" / "cached_ops" / "sampling"
    build_dir.mkdir(parents=True)
    (build_dir / "build.ninja").write_text(
        JIT_NINJA.format(include=venv / "include", source=venv / "csrc" / "sampling.c")
    )
    subprocess.run(["ninja", "-C", str(build_dir)], capture_output=True, check=True)
    assert "no work to do" in ninja_plan(build_dir)
    archive = tmp_path / "cache.tar"
    packed = compile_cache.pack(str(home), "k1", {}, str(archive))

    # A second node: the same home path, empty, and a venv that pip installed after the cache was built (pip gives
    # every file the time it was installed).
    shutil.move(home, tmp_path / "built")
    home.mkdir()
    installed = time.time_ns()
    for path in venv.rglob("*"):
        os.utime(path, ns=(installed, installed))
    compile_cache.install(str(archive), packed["sha256"], "k1", str(home))

    plan = ninja_plan(build_dir)
    assert "no work to do" in plan, plan
    assert (build_dir / "sampling.so").is_file()


@pytest.fixture(autouse=True)
def compile_cache_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """drift_probe registers the kind in its own process; here only for the test, not for the next ones."""
    monkeypatch.setattr(drift_checks, "KINDS", {**drift_checks.KINDS, **compile_cache.KINDS})


def drift_notes(node: dict[str, Any], home: Path, published: list[str]) -> dict[str, Any]:
    """drift_probe's compile_cache check for one instance, run as the serve layer runs it (this machine's cc)."""
    spec = {
        "kind": "compile_cache",
        "venv": node["venv"],
        "instances": {"main": {"instance": node["instance"], "home": str(home)}},
        "published": published,
    }
    return drift_checks.run_checks(drift_checks.validate([spec]), drift_checks.Context())


def node_key(node: dict[str, Any], home: Path) -> str:
    return compile_cache.cache_key(
        compile_cache.node_key_components(node["venv"], node["instance"], str(home), drift_checks.run_process)
    )


def test_drift_notes_which_compile_caches_an_instance_uses_and_never_calls_it_drift(
    node: dict[str, Any], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    fill_home(home, "own")
    current = node_key(node, home)

    cold = drift_notes(node, home, [])
    assert (cold["status"], cold["drift"], cold["errors"]) == ("ok", [], [])
    assert cold["notes"] == [
        f"vllm@main: no shipped compile cache, its own caches (vllm, torchinductor, flashinfer); key {current}: "
        "the controller does not hold them yet"
    ]

    packed = compile_cache.pack(str(home), current, {}, str(tmp_path / "cache.tar"))
    assert drift_notes(node, home, [current])["notes"] == [
        f"vllm@main: compile caches of key {current} (archive sha256 {packed['sha256'][:16]}...)"
    ]

    # A newer wheel in the venv: another key, which the controller holds; the home still has the old one's caches.
    site = next(Path(node["venv"]).glob("lib/python*/site-packages"))
    (site / "vllm-0.32.0.dist-info").rename(site / "vllm-0.32.1.dist-info")
    newer = node_key(node, home)
    changed = drift_notes(node, home, [current, newer])
    assert changed["drift"] == []
    assert changed["notes"] == [
        f"vllm@main: compile caches of key {current} (archive sha256 {packed['sha256'][:16]}...), but this node's key "
        f"is now {newer} (its wheels, options or model changed): vLLM compiles again at its next start unless the "
        f"caches of {newer} are installed first (the role installs them before it restarts the instance; the "
        "controller holds them)"
    ]


def test_drift_notes_an_instance_whose_caches_cannot_be_keyed(node: dict[str, Any], tmp_path: Path) -> None:
    (Path(node["instance"]["model"]) / "config.json").unlink()
    result = drift_notes(node, tmp_path / "home", [])
    assert result["drift"] == [] and result["errors"] == []
    assert result["notes"] == [
        f"vllm@main: compile caches not keyed: cannot read {node['instance']['model']}/config.json: "
        "No such file or directory; is the model staged?"
    ]
