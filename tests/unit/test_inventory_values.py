"""Inventory values that reach unit files, environment files and nginx directives are refused before any host
is touched when they hold a character that would change what is written (issue 12, item 8): a newline would
add a directive. The filter unsafe_values is tested directly; the preflights of vllm_service and
inference_proxy run for real through ansible-playbook against this machine (connection local, nothing written).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.filter.gpufleet_inventory import unsafe_values

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
    "inference_proxy_tls_cert": "CERT",
    "inference_proxy_tls_key": "KEY",
    "inference_proxy_api_keys": ["client-one-0123456789abcdef"],
    "inference_proxy_metrics_token": "metrics-token-0123456789",
    "inference_proxy_backends": [{"name": "main", "port": 8000}],
    "inference_proxy_backend_api_key": "vllm-own-key-0123456789abcdef",
}


def test_a_newline_anywhere_is_named_with_its_path_and_position() -> None:
    values = {"vllm_service_instances": [{"name": "main", "model": "/m\nExecStartPre=/bin/sh", "env": {"A": "x\r"}}]}
    assert unsafe_values(values) == [
        "vllm_service_instances[main].model has U+000A (LINE FEED) at character 3",
        "vllm_service_instances[main].env.A has U+000D (CARRIAGE RETURN) at character 2",
    ]


def test_keys_and_character_classes() -> None:
    allowed = {r"x\.env\{\}": "[A-Za-z0-9_]", r"x\.name": "[a-z]"}
    assert unsafe_values({"x": {"env": {"GOOD_1": "v", "BAD KEY": "v"}, "name": ""}}, allowed) == [
        "a key of x.env has U+0020 (SPACE) at character 4, not one of [A-Za-z0-9_]",
        "x.name is empty",
    ]
    # An item whose name is what is wrong is named by its index; numbers and booleans are not strings.
    assert unsafe_values({"l": [{"name": "a\n", "port": 8000, "on": True}]}) == [
        "l[0].name has U+000A (LINE FEED) at character 2"
    ]


def test_the_message_never_holds_the_value() -> None:
    (message,) = unsafe_values({"k": SECRET + "\n"})
    assert SECRET not in message


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
            "a key of vllm_service_instances[main].unit_overrides has U+003D (EQUALS SIGN) at character 5",
        ),
        ({"env": {"A=B": "1"}}, "a key of vllm_service_instances[main].env has U+003D (EQUALS SIGN)"),
        ({"env": {"A": "1\nVLLM_API_KEY=x"}}, "vllm_service_instances[main].env.A has U+000A (LINE FEED)"),
        ({"api_key": SECRET + "\nHF_TOKEN=x"}, "vllm_service_instances[main].api_key has U+000A (LINE FEED)"),
    ],
)
def test_vllm_service_refuses_values_that_add_a_line(tmp_path: Path, instance: dict, message: str) -> None:
    rc, output = run_preflight(tmp_path, "vllm_service", {"vllm_service_instances": [{**INSTANCE, **instance}]})
    assert rc == 2, output
    assert f"vllm_service on localhost: {message}" in " ".join(output.split())
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
    assert "Refuse values that would add a line" in output and "vllm_service on localhost:" not in output, output


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
    assert f"inference_proxy on localhost: {message}" in " ".join(output.split())
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
    assert f"flash_attn on localhost: {message}" in " ".join(output.split())


def test_flash_attn_passes_its_checks_with_sane_values(tmp_path: Path) -> None:
    rc, output = run_preflight(
        tmp_path, "flash_attn", {"flash_attn_packages": [KERNEL_PACKAGE], "flash_attn_venv": str(tmp_path / "no-venv")}
    )
    assert rc == 0 and "flash_attn on localhost:" not in output, output
