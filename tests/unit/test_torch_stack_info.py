"""torch_stack_info run for real through the ansible CLI against real venvs (CPU torch, no torch, broken extensions)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_torch_probe_venvs import (
    CUDART_SONAME,
    MISSING_TORCH_SYMBOL,
    TORCH_CPU_REQUIREMENTS,
    add_distribution,
    bare_venv,
    cached_venv,
    diagnosis_ids,
    missing_cudart_extension,
    run_module,
    site_packages,
    undefined_symbol_extension,
)

CPU_WHEEL_FIX = "install the `+cuXYZ` variant"
CPU_WHEEL_SIGNATURE = "torch.cuda.is_available() False, torch.version.cuda None"


@pytest.fixture(scope="session")
def torch_venv() -> Path:
    """A venv with the CPU torch wheel this machine has (cached; about a minute when cold)."""
    return cached_venv("torch-cpu", TORCH_CPU_REQUIREMENTS)


@pytest.fixture(scope="session")
def torch_result(torch_venv: Path) -> dict:
    returncode, result, output = run_module({"venv": str(torch_venv)})
    assert returncode == 0, output
    return result


@pytest.fixture(scope="session")
def checks_result(torch_venv: Path) -> dict:
    """One run through python= with every optional check on (each torch run costs seconds)."""
    args = {
        "python": str(torch_venv / "bin" / "python"),
        "gpu_compute": True,
        "flash_attn_kernel": True,
        "gpu_capabilities": ["9.0"],
    }
    returncode, result, output = run_module(args)
    assert returncode == 0, output
    return result


@pytest.fixture()
def empty_venv(tmp_path: Path) -> Path:
    return bare_venv(tmp_path / "venv")


def _interpreter_facts(python: Path) -> dict:
    code = (
        "import json, sys, sysconfig; print(json.dumps({'version': sys.version.split()[0], "
        "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED'))}))"
    )
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


def _only(result: dict, diagnosis_id: str) -> dict:
    matches = [item for item in result["diagnosis"] if item["id"] == diagnosis_id]
    assert len(matches) == 1, result["diagnosis"]
    return matches[0]


def test_cpu_torch_is_reported_with_its_variant(torch_result: dict, torch_venv: Path) -> None:
    torch = torch_result["torch"]
    assert torch_result["changed"] is False
    assert torch["installed"] is True and torch["import_ok"] is True
    assert torch["version"] == "2.13.0+cpu"
    assert torch["variant"] == "cpu" and torch["variant_source"] == "local version suffix"
    assert torch["cuda"] is None and torch["cudnn"] is None and torch["nccl"] is None
    assert torch["cuda_available"] is False and torch["device_count"] == 0 and torch["devices"] == []
    assert torch["arch_list"] == [] and torch["arch_covers_gpus"] is None
    assert torch["cuda_error"]["text"] == "AssertionError: Torch not compiled with CUDA enabled"
    assert torch["location"] == str(site_packages(torch_venv) / "torch")


def test_python_facts_come_from_the_venv_interpreter(torch_result: dict, torch_venv: Path) -> None:
    expected = _interpreter_facts(torch_venv / "bin" / "python")
    python = torch_result["python"]
    assert torch_result["interpreter"] == str(torch_venv / "bin" / "python")
    assert python["version"] == expected["version"]
    assert python["shared"] is expected["shared"]
    assert python["in_venv"] is True and python["prefix"] == str(torch_venv)
    assert python["site_packages"] == [str(site_packages(torch_venv))]


def test_cpu_wheel_is_diagnosed_with_its_fix(torch_result: dict) -> None:
    cpu_wheel = _only(torch_result, "cpu_wheel")
    assert cpu_wheel["signature"] == CPU_WHEEL_SIGNATURE
    assert cpu_wheel["cause"] == "CPU wheel installed"
    assert cpu_wheel["fix"] == CPU_WHEEL_FIX
    assert cpu_wheel["component"] == "torch"
    assert "torch 2.13.0+cpu" in cpu_wheel["evidence"]
    assert diagnosis_ids(torch_result) == ["cpu_wheel"]


def test_package_list_is_sorted_normalized_and_hashed(torch_result: dict) -> None:
    packages = torch_result["packages"]
    assert packages == sorted(packages)
    assert "torch==2.13.0+cpu" in packages
    assert any(entry.startswith("typing-extensions==") for entry in packages)  # typing_extensions, normalized
    expected = hashlib.sha256("\n".join(packages).encode()).hexdigest()
    assert torch_result["packages_sha256"] == expected


def test_check_mode_run_meets_expect_with_the_same_fingerprint(torch_result: dict, torch_venv: Path) -> None:
    python_minor = ".".join(torch_result["python"]["version"].split(".")[:2])
    expect = {
        "torch_version": "2.13.0",
        "torch_variant": "cpu",
        "cuda_available": False,
        "python_version": python_minor,
        "packages_sha256": torch_result["packages_sha256"],
    }
    returncode, again, output = run_module({"venv": str(torch_venv), "expect": expect}, check_mode=True)
    assert returncode == 0, output
    assert again["changed"] is False
    assert again["expect_mismatches"] == []
    assert again["packages"] == torch_result["packages"]
    assert again["packages_sha256"] == torch_result["packages_sha256"]


def test_python_argument_probes_the_same_interpreter(checks_result: dict, torch_result: dict) -> None:
    assert checks_result["torch"]["version"] == "2.13.0+cpu"
    assert checks_result["packages_sha256"] == torch_result["packages_sha256"]


def test_gpu_checks_without_cuda_say_why_they_did_not_run(checks_result: dict) -> None:
    assert checks_result["gpu_compute"] == {
        "ran": False,
        "reason": "torch.cuda.is_available() is False",
        "requested": True,
    }
    assert checks_result["flash_attn"]["installed"] is False
    assert checks_result["flash_attn"]["kernel"] == {
        "requested": True,
        "ran": False,
        "reason": "flash_attn does not import",
    }
    flash_attn = _only(checks_result, "flash_attn_unavailable")
    assert flash_attn["fix"] == "rebuild flash-attn"
    assert "flash-attn is not installed" in flash_attn["evidence"]


def test_arch_list_is_checked_against_given_capabilities(checks_result: dict) -> None:
    torch = checks_result["torch"]
    assert torch["arch_covers_gpus"] is False
    assert torch["arch_coverage"][0]["capability"] == "9.0"
    assert torch["arch_coverage"][0]["covered"] is False
    no_kernel = _only(checks_result, "no_kernel_image")
    assert no_kernel["fix"] == "matching arch list / newer wheel"
    assert "compute capability 9.0" in no_kernel["evidence"]
    assert diagnosis_ids(checks_result) == ["cpu_wheel", "no_kernel_image", "flash_attn_unavailable"]


def test_expect_lists_every_mismatch(torch_venv: Path) -> None:
    expect = {
        "torch_version": "2.11.0+cu130",
        "torch_variant": "cu130",
        "cuda_available": True,
        "python_version": "3.12",
        "vllm_version": "0.19.1",
        "flash_attn_version": "2.8.3",
        "arch_covers_gpus": True,
    }
    returncode, result, output = run_module({"venv": str(torch_venv), "expect": expect})
    assert returncode != 0
    assert result["failed"] is True
    mismatches = {item["key"]: item for item in result["expect_mismatches"]}
    assert set(mismatches) == set(expect)
    assert mismatches["torch_version"]["actual"] == "2.13.0+cpu"
    assert mismatches["torch_variant"]["actual"] == "cpu"
    assert mismatches["cuda_available"]["actual"] is False
    assert mismatches["vllm_version"]["actual"] is None
    assert mismatches["arch_covers_gpus"]["actual"] is None
    assert result["msg"].startswith("7 expectation(s) not met: ")
    for key in expect:
        assert key in result["msg"]
    # The facts come back with the failure, for the caller to report.
    assert result["torch"]["version"] == "2.13.0+cpu" and "cpu_wheel" in diagnosis_ids(result)


def test_venv_without_torch_is_reported_not_installed(empty_venv: Path) -> None:
    returncode, result, output = run_module({"venv": str(empty_venv), "gpu_compute": True})
    assert returncode == 0, output
    assert result["changed"] is False
    assert result["torch"]["installed"] is False and result["torch"]["import_ok"] is False
    assert "import_error" not in result["torch"]
    assert result["torch"]["variant"] is None
    # Keys stay present for callers that template them.
    assert result["torch"]["version"] is None and result["torch"]["arch_list"] == []
    assert result["torch"]["cuda"] is None and result["torch"]["arch_covers_gpus"] is None
    assert result["gpu_compute"]["ran"] is False and result["gpu_compute"]["reason"] == "torch does not import"
    assert result["vllm"] == {
        "installed": False,
        "distribution": None,
        "version": None,
        "import_ok": None,
        "extension_ok": None,
    }
    assert result["packages"] == []
    assert result["diagnosis"] == []


def test_missing_venv_fails_with_a_clear_message(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-venv"
    returncode, result, output = run_module({"venv": str(missing)})
    assert returncode != 0 and result["failed"] is True
    assert result["msg"] == (
        "venv %s does not exist: create it (python3 -m venv %s) or pass the path of an existing venv"
        % (missing, missing)
    )
    assert "Traceback" not in output


def test_directory_that_is_not_a_venv_fails_clearly(tmp_path: Path) -> None:
    returncode, result, output = run_module({"venv": str(tmp_path)})
    assert returncode != 0
    assert result["msg"].startswith("%s has no bin/python, so it is not a venv" % tmp_path)


def test_venv_and_python_are_exclusive(torch_venv: Path) -> None:
    returncode, result, output = run_module({"venv": str(torch_venv), "python": sys.executable})
    assert returncode != 0
    assert "mutually exclusive" in result["msg"]


def test_bad_gpu_capability_is_refused(torch_venv: Path) -> None:
    returncode, result, output = run_module({"venv": str(torch_venv), "gpu_capabilities": ["sm90"]})
    assert returncode != 0
    assert result["msg"] == "'sm90' is not a compute capability: write it as MAJOR.MINOR, e.g. 9.0 for an H100/H200"


def test_undefined_symbol_extension_is_classified(empty_venv: Path) -> None:
    package = site_packages(empty_venv) / "gpufleet_symtest"
    undefined_symbol_extension(package)
    add_distribution(empty_venv, "gpufleet-symtest", "1.0", {"gpufleet_symtest/__init__.py": ""})
    returncode, result, output = run_module({"venv": str(empty_venv), "import_check": ["gpufleet_symtest._ext"]})
    assert returncode == 0, output
    imported = result["imports"][0]
    assert imported["module"] == "gpufleet_symtest._ext" and imported["ok"] is False
    assert imported["error"]["type"] == "ImportError"
    assert imported["error"]["message"].endswith("undefined symbol: %s" % MISSING_TORCH_SYMBOL)
    undefined = _only(result, "undefined_symbol")
    assert undefined["component"] == "import gpufleet_symtest._ext"
    assert undefined["fix"] == "rebuild against the installed torch"
    assert MISSING_TORCH_SYMBOL in undefined["evidence"]
    assert "gpufleet-symtest==1.0" in result["packages"]


def test_missing_cuda_runtime_library_is_classified(empty_venv: Path, tmp_path: Path) -> None:
    package = site_packages(empty_venv) / "gpufleet_cudart_user"
    missing_cudart_extension(package, tmp_path / "build")
    (package / "__init__.py").write_text("")
    args = {"venv": str(empty_venv), "import_check": ["gpufleet_cudart_user._cudart_user"]}
    returncode, result, output = run_module(args)
    assert returncode == 0, output
    assert result["imports"][0]["error"]["message"] == (
        "%s: cannot open shared object file: No such file or directory" % CUDART_SONAME
    )
    missing = _only(result, "cuda_library_missing")
    assert missing["fix"] == "install toolkit/runtime, ld.so.conf.d"
    assert missing["component"] == "import gpufleet_cudart_user._cudart_user"


def test_a_native_crash_is_reported_with_what_was_gathered(empty_venv: Path) -> None:
    # A real SIGSEGV during an import, as a broken extension produces: the module reports, it does not fail.
    add_distribution(
        empty_venv,
        "gpufleet-crash",
        "1.0",
        {"gpufleet_crash/__init__.py": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"},
    )
    returncode, result, output = run_module({"venv": str(empty_venv), "import_check": ["gpufleet_crash"]})
    assert returncode == 0, output
    assert result["probe"]["complete"] is False
    assert result["probe"]["stopped_in"] == "imports"
    assert result["probe"]["exit"] == "killed by SIGSEGV"
    assert "gpufleet-crash==1.0" in result["packages"]  # sections before the crash are kept
    assert result["torch"]["installed"] is False
    probe = _only(result, "unclassified")
    assert probe["component"] == "probe"
    assert probe["evidence"] == "the probe stopped in section imports: killed by SIGSEGV"
    assert "[WARNING]: the probe stopped in section imports (killed by SIGSEGV)" in output


def test_a_hang_is_stopped_by_the_timeout(empty_venv: Path) -> None:
    add_distribution(
        empty_venv, "gpufleet-hang", "1.0", {"gpufleet_hang/__init__.py": "import time\ntime.sleep(120)\n"}
    )
    returncode, result, output = run_module({"venv": str(empty_venv), "import_check": ["gpufleet_hang"], "timeout": 5})
    assert returncode == 0, output
    assert result["probe"]["exit"] == "timed out after 5 s"
    assert result["probe"]["stopped_in"] == "imports"


def test_output_printed_by_imported_code_does_not_break_the_probe(empty_venv: Path) -> None:
    # vLLM logs to stdout on import; C libraries write to fd 1 directly.
    noisy = (
        "import os, sys\nprint('INFO noisy import')\nsys.stdout.flush()\nos.write(1, b'{\"section\": \"torch\"}\\n')\n"
    )
    add_distribution(empty_venv, "gpufleet-noisy", "1.0", {"gpufleet_noisy/__init__.py": noisy})
    returncode, result, output = run_module({"venv": str(empty_venv), "import_check": ["gpufleet_noisy"]})
    assert returncode == 0, output
    assert result["probe"]["complete"] is True
    assert result["imports"][0]["ok"] is True
    assert result["torch"]["installed"] is False


def test_package_drift_changes_the_fingerprint(empty_venv: Path) -> None:
    before = run_module({"venv": str(empty_venv)})[1]["packages_sha256"]
    add_distribution(empty_venv, "Gpufleet_Drift.Test", "2.0", {})
    after = run_module({"venv": str(empty_venv)})[1]
    assert after["packages"] == ["gpufleet-drift-test==2.0"]
    assert after["packages_sha256"] != before


def test_an_interpreter_too_old_for_the_probe_fails_clearly(tmp_path: Path) -> None:
    old = sorted(Path("/root/.pyenv/versions").glob("3.[67].*/bin/python3"))
    if not old:
        pytest.skip("no Python older than 3.8 on this machine")
    returncode, result, output = run_module({"python": str(old[0])})
    assert returncode != 0
    assert result["msg"].startswith("%s cannot run the probe: Python 3." % old[0])
    assert result["msg"].endswith("is too old for the probe: it needs 3.8 or newer")


def _documented_spec(options: dict) -> dict:
    spec = {}
    for name, doc in options.items():
        entry = {key: doc[key] for key in ("type", "default", "elements") if key in doc}
        if "suboptions" in doc:
            entry["options"] = _documented_spec(doc["suboptions"])
        spec[name] = entry
    return spec


def _real_spec(spec: dict) -> dict:
    real = {}
    for name, entry in spec.items():
        real[name] = {key: entry[key] for key in ("type", "default", "elements") if key in entry}
        if "options" in entry:
            real[name]["options"] = _real_spec(entry["options"])
    return real


def test_documentation_matches_the_argument_spec() -> None:
    import yaml
    from ansible_collections.gpufleet.fleet.plugins.modules import torch_stack_info as module

    documentation = yaml.safe_load(module.DOCUMENTATION)
    assert _documented_spec(documentation["options"]) == _real_spec(module.argument_spec())
    returned = yaml.safe_load(module.RETURN)
    for key in ("python", "torch", "gpu_compute", "vllm", "flash_attn", "diagnosis", "probe"):
        assert "contains" in returned[key], key
