"""Every role variable that reaches a file, a unit, a command or Python code is checked by one mechanism driven by
the roles' declarations (issue 29, item 1): meta/argument_specs.yml (types, choices) and meta/value_rules.yml (what
each string may be, plugins/plugin_utils/value_rules.py), applied by the action plugin role_values.

The options are enumerated from the argument specs, never listed here: a new option without a rule fails
test_every_option_has_a_rule, and every rule of every role is fed hostile values.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.preflight_checks import role_options, role_rules
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import value_rules
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.value_rules import RULES, parse_rule_path, problems

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(path.parent.parent.name for path in REPO.glob("roles/*/meta/argument_specs.yml"))

# What an operator's inventory could hold by mistake or by malice, by what it would do where rendered.
HOSTILE = {
    "newline": "64G\nExecStartPre=+/bin/sh -c id",
    "carriage return": "a\rb",
    "NUL": "a\0b",
    "line separator": "a\u2028b",
    "command substitution": "x$(id>/tmp/p)",
    "backticks": "x`id`",
    "parent directory": "/var/lib/../../etc/shadow",
    "ten thousand characters": "a" * 10_000,
    "a unit section header": "[Service]",
    "non-ASCII": "mod\u00e8le",
    "a shell pipe": "|/bin/sh -c id",
}
# What a rule lets through on purpose. Free text and regular expressions (matched against unit names, never run)
# are refused only for control characters and length: they are quoted or encoded where they are rendered
# (test_free_text_is_rendered_quoted proves it for the unit and the environment file). A controller path may
# climb (../certs/node.pem); a kernel setting may be a path; a key may hold dots and slashes.
FREE = set(HOSTILE) - {"newline", "carriage return", "NUL", "line separator", "ten thousand characters"}
CLIMBS = {"parent directory"}
ACCEPTED = {"text": FREE, "regex": FREE, "controller_path": CLIMBS, "sysctl_value": CLIMBS, "secret": CLIMBS}


# A value every rule accepts; also the field name used where a rule path says `.*`.
TYPICAL = {
    "name": "tiny-qwen2",
    "instance_name": "main",
    "user": "vllm",
    "package": "linux-headers-6.1.0-27-amd64",
    "pip_name": "flash_attn",
    "module": "flash_attn.ops",
    "version": "2.8.3+cu128torch2.7",
    "sha256": "0" * 64,
    "path": "/var/lib/gpufleet/models",
    "controller_path": "../certs/node.pem",
    "url": "https://mirror.example:8443/wheels/a%20b.whl?x=1#sha256=00",
    "host": "10.0.0.1",
    "address": "10.0.0.0/8",
    "server_name": "*.example.org",
    "ifname": "eth0",
    "unit": "nvidia-persistenced.service",
    "unit_key": "MemoryMax",
    "device_allow": "char-nvidia-uvm rw",
    "syscall_set": "~@privileged @mount",
    "memory_size": "64G",
    "memlock": "infinity",
    "limit": "unlimited",
    "sysctl_key": "net.ipv4.tcp_keepalive_time",
    "sysctl_value": "4096 87380 6291456",
    "env_name": "HF_HUB_OFFLINE",
    "secret": "sk-0123456789abcdef",
    "mode": "0644",
    "number": "0.9",
    "bool": "True",
    "option": "--kernel-source-path=/usr/src/linux-headers-6.1",
    "arch_list": "8.0;9.0+PTX",
    "regex": "^vllm@.+\\.service$",
    "journal_or_path": "journal",
    "model": "Qwen/Qwen2-0.5B-Instruct",
    "location": "/v1/",
    "hf_repo": "Qwen/Qwen2.5-7B-Instruct",
    "commit": "a09a35458c702b33eeacc393d103063234e8bc28",
    "nginx_size": "16m",
    "nginx_time": "600s",
    "nginx_rate": "20r/s",
    "header": "X-Forwarded-For",
    "ciphers": "ECDHE-RSA-AES128-GCM-SHA256:!aNULL",
    "word": "if_needed",
    "pem": "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n",
    "text": "draining for the 2026-12 upgrade (ticket #42) $HOME `x`",
}


class VaultTolerantLoader(yaml.SafeLoader):
    """Reads inventory files with !vault values (as a placeholder secret)."""


VaultTolerantLoader.add_constructor("!vault", lambda loader, node: "vaulted-secret-value")


def required_rule_paths(name: str, spec: dict) -> set[str]:
    """The rule paths an option needs: each place a string can sit under it."""
    kind, elements, nested = spec.get("type", "str"), spec.get("elements"), spec.get("options")
    if isinstance(spec.get("choices"), list):
        return set()  # the argument spec's choices say it all
    if kind in ("str", "path", "raw"):
        return {name}
    if kind == "list" and elements in ("str", "path"):
        return {name + "[]"}
    if kind in ("dict", "list") and nested:
        step = name + ("[]." if kind == "list" else ".")
        return set().union(*(required_rule_paths(step + field, option) for field, option in nested.items()))
    if kind == "dict":
        return {name + "{}", name + ".*"}
    if kind == "list" and elements == "dict":
        return {name + "[]{}", name + "[].*"}
    return set()


@pytest.mark.parametrize("role", ROLES)
def test_every_option_has_a_rule(role: str) -> None:
    rules = role_rules(role)
    missing = sorted(
        path
        for name, spec in role_options(role).items()
        for path in required_rule_paths(name, spec)
        if path not in rules
    )
    assert missing == [], f"roles/{role}/meta/value_rules.yml: no rule for {missing}"


@pytest.mark.parametrize("role", ROLES)
def test_every_rule_names_an_option_and_a_known_rule(role: str) -> None:
    options = role_options(role)
    for path, rule in role_rules(role).items():
        assert parse_rule_path(path)[0] in options, f"{role}: rule {path} for an option the role does not declare"
        assert rule.rstrip("?") in RULES, f"{role}: rule {path}: unknown rule {rule}"


def role_defaults(role: str) -> dict[str, Any]:
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    # A templated default is checked where the action plugin renders it (its inputs have their own rules).
    return {name: value for name, value in defaults.items() if "{{" not in str(value)}


def inventory_values() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(REPO.glob("inventories/*/group_vars/**/*.yml")) + sorted(
        REPO.glob("inventories/*/host_vars/**/*.yml")
    ):
        values = yaml.load(path.read_text(), Loader=VaultTolerantLoader)
        if isinstance(values, dict):  # not a whole vault-encrypted file
            found.append((str(path.relative_to(REPO)), values))
    return found


@pytest.mark.parametrize("role", ROLES)
def test_the_defaults_and_the_shipped_inventories_pass(role: str) -> None:
    options, rules = role_options(role), role_rules(role)
    assert [str(item) for item in problems(role_defaults(role), rules)] == []
    for where, values in inventory_values():
        ours = {name: value for name, value in values.items() if name in options and "{{" not in str(value)}
        assert [str(item) for item in problems(ours, rules)] == [], where


def place(prefix: str, rest: tuple[str, ...], text: str, rules: dict[str, str]) -> Any:
    """The smallest value at rule path `prefix` that holds text where `prefix + rest` points."""
    if not rest:
        return text
    step, deeper = rest[0], rest[1:]
    if step == "[]":
        return [place(prefix + step, deeper, text, rules)]
    if step == "{}":
        return {text: "v"}
    # Any field: one whose name the mapping's key rule accepts.
    field = TYPICAL[rules.get(prefix + "{}", "name").rstrip("?")] if step == ".*" else step[1:]
    return {field: place(prefix + step, deeper, text, rules)}


def fuzz_cases() -> list[tuple[str, str, str, str]]:
    return [
        (role, path, rule, label)
        for role in ROLES
        for path, rule in sorted(role_rules(role).items())
        for label in HOSTILE
    ]


@pytest.mark.parametrize(("role", "path", "rule", "label"), fuzz_cases())
def test_every_rule_refuses_hostile_values(role: str, path: str, rule: str, label: str) -> None:
    segments = parse_rule_path(path)
    rules = role_rules(role)
    found = problems({segments[0]: place(segments[0], segments[1:], HOSTILE[label], rules)}, rules)
    if label in ACCEPTED.get(rule.rstrip("?"), set()):
        assert found == []
        return
    assert len(found) == 1, f"{role}: {path} ({rule}) took {label}"
    assert found[0].variable == segments[0]
    assert "\n" not in str(found[0]) and HOSTILE[label] not in str(found[0]), "one line, never the value"


def test_the_reproduced_findings_are_refused_with_one_line() -> None:
    assert [
        str(item)
        for item in problems({"vllm_service_memory_max": "64G\nExecStartPre=+/bin/sh"}, role_rules("vllm_service"))
    ] == ["vllm_service_memory_max has U+000A (LINE FEED) at character 4 (rule memory_size?)"]
    sysctl = problems({"base_sysctl": {"kernel.core_pattern": "|/bin/sh -c id"}}, role_rules("base"))
    assert [str(item) for item in sysctl] == [
        "base_sysctl.kernel.core_pattern has U+007C (VERTICAL LINE) at character 1; it must be a kernel setting "
        "value: letters, digits, _ . : , / % - and spaces (rule sysctl_value)"
    ]
    url = "https://mirror/python/Python-3.12.7.tgz?$(id>/tmp/p)#.tgz"
    pyenv = problems({"pyenv_python_versions": [{"version": "3.12.7", "url": url}]}, role_rules("pyenv_python"))
    assert [item.path for item in pyenv] == ["pyenv_python_versions[0].url"]
    ray = problems({"ray_cluster_node_address": "10.0.0.1\n"}, role_rules("ray_cluster"))
    assert [str(item) for item in ray] == [
        "ray_cluster_node_address has U+000A (LINE FEED) at character 9 (rule host?)"
    ]


def test_model_names_cannot_name_the_store_or_a_staging_directory() -> None:
    for name in (".", "..", ".staging-other", "-x"):
        found = problems({"model_store_models": [{"name": name}]}, role_rules("model_store"))
        assert len(found) == 1, name


def test_a_key_is_named_as_a_key_and_an_item_by_its_name() -> None:
    found = problems(
        {"vllm_service_instances": [{"name": "main", "env": {"BAD KEY": "v"}, "port": "80 80"}]},
        role_rules("vllm_service"),
    )
    assert [str(item) for item in found] == [
        "a key of vllm_service_instances[main].env has U+0020 (SPACE) at character 4; it must be an environment "
        "variable name: A-Z a-z 0-9 _, not starting with a digit (rule env_name)",
        "vllm_service_instances[main].port must be a number (rule number)",
    ]


def test_every_rule_accepts_a_typical_value() -> None:
    assert sorted(TYPICAL) == sorted(RULES), "a typical value for every rule"
    assert {name: value_rules.check_text(text, name) for name, text in TYPICAL.items()} == dict.fromkeys(RULES)


def systemd_words(line: str) -> list[str]:
    """The words of a unit's command line as systemd reads them: double-quoted, backslash escapes, %% and $$."""
    words = re.findall(r'"((?:[^"\\]|\\.)*)"', line)
    return [re.sub(r"\\(.)", r"\1", word).replace("%%", "%").replace("$$", "$") for word in words]


def env_values(text: str) -> dict[str, str]:
    """An environment file's KEY="VALUE" lines as systemd reads double-quoted values (\\" and \\\\ escaped)."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', line)
        if match:
            found[match.group(1)] = re.sub(r"\\(.)", r"\1", match.group(2))
    return found


def test_free_text_is_rendered_quoted() -> None:
    """Every printable hostile value the `text` rule lets through, in an instance's extra_args and environment,
    comes back from the rendered drop-in and environment file as itself: one argument, one variable, no new line
    or directive."""
    from test_vllm_service_devices import ENV_TEMPLATE, FIRST, INSTANCE, ROLE, render

    free = [HOSTILE[label] for label in sorted(FREE)] + ['quote " and backslash \\ and %h and $HOME and ${X}']
    instance = {**INSTANCE, "extra_args": free, "env": {f"FREE_{index}": text for index, text in enumerate(free)}}
    dropin = render(
        ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.d" / "gpufleet.conf.j2",
        vllm_service_instances=[instance],
        vllm_service_instance=FIRST,
        ansible_facts={"memtotal_mb": 24000},
    )
    exec_lines = [line for line in dropin.splitlines() if line.startswith("ExecStart=")]
    assert exec_lines[0] == "ExecStart=" and len(exec_lines) == 2
    assert systemd_words(exec_lines[1])[-len(free) :] == free
    assert not any(line.startswith("[") for line in dropin.splitlines()[1:] if line != "[Service]")
    env = render(ENV_TEMPLATE, vllm_service_instances=[instance], vllm_service_instance=FIRST)
    assert {key: value for key, value in env_values(env).items() if key.startswith("FREE_")} == instance["env"]
