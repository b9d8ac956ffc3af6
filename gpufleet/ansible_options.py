"""What of Ansible's own conventions a gpufleet command passes through to every playbook it runs.

Flags: every command that runs a playbook takes ansible-playbook's `-e`, `-u`, `--private-key`, `-f` and the vault
flags with the same spelling. `-e @FILE` goes to ansible-playbook as given; `-e key=value` and `-e JSON` are read
here as Ansible reads them and join the run's variables file, never its recorded command line (ansible-runner
keeps that in the run's records: a secret given with -e must not land there), so they beat @FILEs whatever the
order. gpufleet's own variables win where both name one.

Settings: the operator's Ansible configuration is respected. When the operator has one (ANSIBLE_CONFIG, an
ansible.cfg where gpufleet is run, ~/.ansible.cfg or /etc/ansible/ansible.cfg: Ansible's own search order), it is
the run's configuration, and the project's ansible.cfg supplies, as environment variables, only what it does not
set; ANSIBLE_* variables in the environment beat both. Only the collection's and the roles' paths are gpufleet's
own (a copy installed elsewhere must not stand in for this one).
"""

from __future__ import annotations

import argparse
import configparser
import getpass
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet import PROJECT_ROOT
from gpufleet.errors import UsageError

PROJECT_CONFIG = PROJECT_ROOT / "ansible.cfg"
# The environment variable of each setting of the project's ansible.cfg (section, key), from Ansible's
# configuration reference. A unit test keeps this table and the file in step.
SETTING_VARIABLES = {
    ("defaults", "collections_path"): "ANSIBLE_COLLECTIONS_PATH",
    ("defaults", "roles_path"): "ANSIBLE_ROLES_PATH",
    ("defaults", "interpreter_python"): "ANSIBLE_PYTHON_INTERPRETER",
    ("defaults", "inject_facts_as_vars"): "ANSIBLE_INJECT_FACT_VARS",
    ("defaults", "gathering"): "ANSIBLE_GATHERING",
    ("defaults", "stdout_callback"): "ANSIBLE_STDOUT_CALLBACK",
    ("defaults", "callback_result_format"): "ANSIBLE_CALLBACK_RESULT_FORMAT",
    ("defaults", "forks"): "ANSIBLE_FORKS",
    ("defaults", "timeout"): "ANSIBLE_TIMEOUT",
    ("defaults", "retry_files_enabled"): "ANSIBLE_RETRY_FILES_ENABLED",
    ("ssh_connection", "pipelining"): "ANSIBLE_PIPELINING",
}
# Paths of the project's configuration that are gpufleet's own: always the checkout's.
OWN_SETTINGS = {("defaults", "collections_path"), ("defaults", "roles_path")}
VAULT_PROMPT = r"Vault password.*:\s*?$"


@dataclass(frozen=True)
class AnsibleOptions:
    """ansible-playbook's flags as the operator gave them."""

    inline_vars: dict[str, Any] = field(default_factory=dict, repr=False)
    var_files: tuple[str, ...] = ()
    user: str | None = None
    private_key: str | None = None
    forks: int | None = None
    vault_password_files: tuple[str, ...] = ()
    vault_password: str = field(default="", repr=False)

    def cmdline(self) -> list[str]:
        """The flags for ansible-playbook, in its spelling."""
        args: list[str] = []
        for path in self.var_files:
            args += ["--extra-vars", f"@{path}"]
        if self.user:
            args += ["--user", self.user]
        if self.private_key:
            args += ["--private-key", self.private_key]
        if self.forks:
            args += ["--forks", str(self.forks)]
        for path in self.vault_password_files:
            args += ["--vault-password-file", path]
        if self.vault_password:
            args.append("--ask-vault-pass")
        return args

    def cmdline_text(self) -> str:
        return shlex.join(self.cmdline())

    def passwords(self) -> dict[str, str]:
        """ansible-runner's answers to ansible-playbook's prompts (the vault password asked for once)."""
        return {VAULT_PROMPT: self.vault_password} if self.vault_password else {}


_current = AnsibleOptions()
# Ansible's words for true, as its `bool` filter reads a string.
TRUE_WORDS = ("true", "yes", "on", "1", "y", "t")


def all_or_nothing(options: AnsibleOptions) -> bool:
    """Whether the operator asked, with `-e gpufleet_any_errors_fatal=true`, that one node's failure stops all."""
    return str(options.inline_vars.get("gpufleet_any_errors_fatal", False)).strip().lower() in TRUE_WORDS


def current_options() -> AnsibleOptions:
    """The options of the command being run (none outside one)."""
    return _current


@contextmanager
def passed_through(options: AnsibleOptions) -> Iterator[None]:
    """Every playbook run inside the block gets `options`."""
    global _current
    saved, _current = _current, options
    try:
        yield
    finally:
        _current = saved


def add_ansible_flags(parser: argparse.ArgumentParser) -> None:
    """ansible-playbook's flags for a command that runs playbooks."""
    group = parser.add_argument_group("Ansible", "passed to ansible-playbook as given")
    group.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="variables over the inventory's: key=value, JSON or @FILE (repeatable)",
    )
    group.add_argument("-u", "--user", help="connect as this user")
    group.add_argument("--private-key", "--key-file", dest="private_key", metavar="FILE", help="the SSH key to use")
    group.add_argument("-f", "--forks", type=_forks, help="how many hosts at once (the project's default: 16)")
    vault = group.add_mutually_exclusive_group()
    vault.add_argument(
        "--vault-password-file",
        "--vault-pass-file",
        dest="vault_password_files",
        action="append",
        default=[],
        metavar="FILE",
        help="the vault password file (repeatable)",
    )
    vault.add_argument("-J", "--ask-vault-pass", action="store_true", help="ask for the vault password once")


def _forks(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"give how many hosts at once, a number >= 1 (got {text!r})")
    return int(text)


def options_from(args: argparse.Namespace) -> AnsibleOptions:
    """The options a parsed command line gives; asks for the vault password now with --ask-vault-pass."""
    if not hasattr(args, "extra_vars"):
        return AnsibleOptions()
    for path in args.vault_password_files:
        if not Path(path).exists():
            raise UsageError(f"--vault-password-file {path} does not exist; give the file that holds the password")
    password = getpass.getpass("Vault password: ") if args.ask_vault_pass else ""
    if args.ask_vault_pass and not password:
        raise UsageError("--ask-vault-pass: no password given")
    return AnsibleOptions(
        inline_vars=inline_vars(args.extra_vars),
        var_files=tuple(item[1:] for item in args.extra_vars if item.startswith("@")),
        user=args.user,
        private_key=args.private_key,
        forks=args.forks,
        vault_password_files=tuple(args.vault_password_files),
        vault_password=password,
    )


def inline_vars(items: list[str]) -> dict[str, Any]:
    """The -e values given inline, merged in order, read as ansible-playbook reads them (key=value, or YAML/JSON
    starting with { or [); UsageError for what it would refuse."""
    import yaml
    from ansible.parsing.splitter import parse_kv

    merged: dict[str, Any] = {}
    for item in items:
        if not item or item.startswith("@"):
            continue
        if item[0] in "/.":
            raise UsageError(f"-e {item[:60]}: a file of variables is given as -e @{item[:60]}")
        try:
            value = yaml.safe_load(item) if item[0] in "[{" else parse_kv(item)
        except yaml.YAMLError as error:
            raise UsageError(f"-e {item[:60]}: not YAML or JSON ({str(error).splitlines()[0]})") from None
        if not isinstance(value, dict):
            raise UsageError(f"-e {item[:60]}: give key=value, a mapping in JSON or YAML, or @FILE")
        merged.update(value)
    return merged


def operator_config(environ: dict[str, str], cwd: Path) -> Path | None:
    """The configuration Ansible itself would read for the operator, unless it is the project's own."""
    if environ.get("ANSIBLE_CONFIG"):
        path = Path(environ["ANSIBLE_CONFIG"]).expanduser()
        if not path.is_file():
            raise UsageError(f"ANSIBLE_CONFIG={path} is no file; point it at your ansible.cfg or unset it")
        return path if path.resolve() != PROJECT_CONFIG.resolve() else None
    home = environ.get("HOME")
    candidates = [
        cwd / "ansible.cfg",
        *([Path(home) / ".ansible.cfg"] if home else []),
        Path("/etc/ansible/ansible.cfg"),
    ]
    for path in candidates:
        if path.is_file():
            return path if path.resolve() != PROJECT_CONFIG.resolve() else None
    return None


def read_config(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    try:
        parser.read(path)
    except configparser.Error as error:
        raise UsageError(f"{path} does not parse: {str(error).splitlines()[0]}; fix it") from None
    return parser


def settings_environment(environ: dict[str, str], cwd: Path, collections_dir: Path) -> dict[str, str]:
    """The environment that layers the project's settings under the operator's (see the module's text)."""
    project = read_config(PROJECT_CONFIG)
    own = {
        "ANSIBLE_COLLECTIONS_PATH": str(collections_dir),
        "ANSIBLE_ROLES_PATH": str(PROJECT_ROOT / "roles"),
    }
    config = operator_config(environ, cwd)
    if config is None:
        return {"ANSIBLE_CONFIG": str(PROJECT_CONFIG), **own}
    theirs = read_config(config)
    layered = {
        variable: project.get(section, key)
        for (section, key), variable in SETTING_VARIABLES.items()
        if (section, key) not in OWN_SETTINGS
        and project.has_option(section, key)
        and not _sets(theirs, section, key)
        and variable not in environ
    }
    return {"ANSIBLE_CONFIG": str(config.absolute()), **layered, **own}


def _sets(config: configparser.ConfigParser, section: str, key: str) -> bool:
    # Ansible reads the SSH settings from [ssh_connection] and, for some, [connection] too.
    sections = (section, "connection") if section == "ssh_connection" else (section,)
    return any(config.has_option(name, key) for name in sections)
