"""Ansible's own conventions through gpufleet (issue 30): the operator's configuration layered over the
project's, ansible-playbook's flags passed as given, and one table of exit codes shared by the CLI and README."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT, exit_codes
from gpufleet.ansible_options import (
    PROJECT_CONFIG,
    SETTING_VARIABLES,
    AnsibleOptions,
    inline_vars,
    options_from,
    read_config,
    settings_environment,
)
from gpufleet.cli import build_parser
from gpufleet.errors import UsageError

EXAMPLE = PROJECT_ROOT / "inventories" / "example"
COLLECTIONS = PROJECT_ROOT / "collections"


def test_every_setting_of_the_projects_config_has_its_variable() -> None:
    project = read_config(PROJECT_CONFIG)
    settings = {(section, key) for section in project.sections() for key in project[section]}
    assert settings == set(SETTING_VARIABLES)


def test_without_a_config_of_the_operators_the_projects_is_used(tmp_path: Path) -> None:
    environment = settings_environment({"HOME": str(tmp_path)}, PROJECT_ROOT, COLLECTIONS)
    assert environment == {
        "ANSIBLE_CONFIG": str(PROJECT_CONFIG),
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_ROLES_PATH": str(PROJECT_ROOT / "roles"),
    }


@pytest.mark.parametrize("where", ["ANSIBLE_CONFIG", "cwd", "home"])
def test_the_operators_config_is_the_runs_and_the_project_fills_only_what_it_leaves(tmp_path: Path, where: str) -> None:
    config = tmp_path / ("ansible.cfg" if where != "home" else ".ansible.cfg")
    config.write_text("[defaults]\nforks = 50\nroles_path = /elsewhere\n[connection]\npipelining = false\n")
    environ = {"HOME": str(tmp_path), "ANSIBLE_TIMEOUT": "60"}
    if where == "ANSIBLE_CONFIG":
        environ["ANSIBLE_CONFIG"] = str(config)
    # Run from the checkout, its ansible.cfg comes first, for gpufleet as for Ansible: the home case runs elsewhere.
    cwd = tmp_path if where == "cwd" else tmp_path / "elsewhere"
    environment = settings_environment(environ, cwd, COLLECTIONS)
    assert environment["ANSIBLE_CONFIG"] == str(config)
    # Theirs: forks and pipelining (in the file), timeout (their environment, which Ansible reads over any file).
    assert not {"ANSIBLE_FORKS", "ANSIBLE_PIPELINING", "ANSIBLE_TIMEOUT"} & set(environment)
    # The project's, where they say nothing; the collection's and the roles' paths always gpufleet's own.
    assert environment["ANSIBLE_INJECT_FACT_VARS"] == "false"
    assert environment["ANSIBLE_ROLES_PATH"] == str(PROJECT_ROOT / "roles")
    assert environment["ANSIBLE_COLLECTIONS_PATH"] == str(COLLECTIONS)


def test_an_ansible_config_that_is_no_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"ANSIBLE_CONFIG=.*/nowhere.cfg is no file; point it at your ansible.cfg"):
        settings_environment({"ANSIBLE_CONFIG": str(tmp_path / "nowhere.cfg")}, PROJECT_ROOT, COLLECTIONS)


def test_a_vault_password_file_in_the_operators_config_is_used(tmp_path: Path) -> None:
    """The review's case: vault_password_file in the operator's ansible.cfg was ignored (ANSIBLE_CONFIG forced)."""
    config = tmp_path / "ansible.cfg"
    config.write_text(f"[defaults]\nvault_password_file = {EXAMPLE / 'example-vault-password'}\n")
    environment = {name: value for name, value in os.environ.items() if name != "ANSIBLE_VAULT_PASSWORD_FILE"}
    result = subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), "plan", "-i", str(EXAMPLE), "--limit", "h200"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**environment, "ANSIBLE_CONFIG": str(config), "GPUFLEET_RUNS_DIR": str(tmp_path / "runs")},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_playbooks_flags_are_parsed_and_passed_in_its_spelling() -> None:
    for command in (["provision"], ["drift"], ["rebuild", "--limit", "n"], ["upgrade"], ["doctor", "--limit", "n"]):
        arguments = [*command, "-i", "h.yml", "-e", "a=1 b='x y'", "-e", "@v.yml", "-e", '{"a": 2, "c": [1]}']
        args = build_parser().parse_args([*arguments, "-u", "ops", "--private-key", "k", "-f", "4"])
        options = options_from(args)
        assert options.cmdline() == ["--extra-vars", "@v.yml", "--user", "ops", "--private-key", "k", "--forks", "4"]
        assert options.inline_vars == {"a": 2, "b": "x y", "c": [1]}
    options = AnsibleOptions(vault_password_files=("p",), vault_password="s3cret")
    assert options.cmdline() == ["--vault-password-file", "p", "--ask-vault-pass"]
    assert "s3cret" not in repr(options) and list(options.passwords().values()) == ["s3cret"]


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("./vars.yml", "-e ./vars.yml: a file of variables is given as -e @./vars.yml"),
        ("[1, 2]", "-e [1, 2]: give key=value, a mapping in JSON or YAML, or @FILE"),
        ("{a: [", "-e {a: [: not YAML or JSON"),
    ],
)
def test_extra_vars_ansible_would_refuse_are_refused_first(item: str, said: str) -> None:
    with pytest.raises(UsageError) as refused:
        inline_vars([item])
    assert str(refused.value).startswith(said)


def test_the_readme_holds_the_clis_table_of_exit_codes() -> None:
    assert exit_codes.markdown() in (PROJECT_ROOT / "README.md").read_text()
    help_text = subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert " ".join(exit_codes.help_text().split()) in " ".join(help_text.split())


def test_version_names_ansible_core_and_the_collection() -> None:
    from ansible.release import __version__ as ansible_version

    lines = subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert lines[0].startswith("gpufleet ") and lines[1] == f"ansible-core {ansible_version}"
    collection = Path(lines[2].removeprefix("collection gpufleet.fleet at "))
    assert (collection / "galaxy.yml").is_file() and collection.resolve() == PROJECT_ROOT.resolve()
