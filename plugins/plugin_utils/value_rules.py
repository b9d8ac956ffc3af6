# -*- coding: utf-8 -*-
"""Rules for the role variables that reach a file, a unit, a command or Python code: one mechanism for every role.

Each role declares its options in meta/argument_specs.yml (types, choices) and, in meta/value_rules.yml, the rule
every string under an option must satisfy: option path -> rule name (RULES below). The action plugin
role_values applies both on the controller before any host changes; tests/unit/test_value_rules.py enumerates
every option of every role and feeds it hostile values.

Paths in meta/value_rules.yml: OPTION, OPTION[] (each list item), OPTION{} (each mapping key), OPTION.FIELD (a
field of a mapping), OPTION.* (any field); they combine (`vllm_service_instances[].env{}`). A rule name ending
in `?` also allows the empty string. Whatever its rule, no string anywhere may hold a control or line-separator
character (a newline ends a systemd, nginx or environment line and would add a directive) or be longer than
MAX_LENGTH; a message names the value's path and the character's position, never the value (secrets are checked
too). Controller-only (plugin_utils: never shipped to nodes); stdlib only.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable, Iterator, NamedTuple

MAX_LENGTH = 4096
PLAIN_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
# Control characters, and the Unicode line and paragraph separators some parsers also end a line at.
FORBIDDEN_CATEGORIES = ("Cc", "Zl", "Zp")


def _no_dot_dot(text: str) -> str | None:
    return "has a .. component" if ".." in re.split(r"[/?#]", text) else None


def _hub_name(text: str) -> str | None:
    return "has .. or --" if ".." in text or "--" in text else None


def _compiles(text: str) -> str | None:
    try:
        re.compile(text)
    except re.error as error:
        return "is not a regular expression (%s)" % error
    return None


class Rule(NamedTuple):
    pattern: str
    describe: str
    check: Callable[[str], str | None] | None = None
    # Text written as a whole file's content (a PEM certificate) may hold line breaks, and be longer.
    lines: bool = False
    max_length: int = MAX_LENGTH


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = r"%s(?:\.%s)*" % (_LABEL, _LABEL)
_IP = r"[0-9A-Fa-f:.]*[0-9A-Fa-f](?:%[A-Za-z0-9]+)?"
_SYSCALL = r"@?[a-z0-9_-]+(?::[A-Za-z0-9_]+)?"
_ARCH = r"[0-9]+\.[0-9]+[af]?(?:\+PTX)?"

RULES: dict[str, Rule] = {
    "name": Rule(
        r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", "a name: letters, digits, . _ -, starting with a letter or digit"
    ),
    "instance_name": Rule(
        r"[a-z0-9][a-z0-9_-]{0,63}", "an instance name: a-z 0-9 _ -, starting with a letter or digit"
    ),
    "user": Rule(r"[a-z_][a-z0-9_-]{0,31}", "a Unix user or group name: a-z 0-9 _ -"),
    "package": Rule(r"[a-z0-9][a-z0-9+.-]*(?:=[A-Za-z0-9.+:~-]+)?", "a Debian package name, optionally =VERSION"),
    "pip_name": Rule(r"[A-Za-z0-9][A-Za-z0-9._-]*", "a Python distribution name"),
    "module": Rule(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", "a dotted Python module name"),
    "version": Rule(r"[0-9A-Za-z][0-9A-Za-z.+_!-]{0,63}", "a version: letters, digits, . + _ ! -"),
    "sha256": Rule(r"[0-9a-f]{64}", "a sha256: 64 lowercase hexadecimal digits"),
    "path": Rule(
        r"/[A-Za-z0-9._+@/-]*", "an absolute path of letters, digits, . _ + @ - and no .. component", _no_dot_dot
    ),
    "controller_path": Rule(r"[A-Za-z0-9._+@/~-]+", "a path on the controller: letters, digits, . _ + @ ~ / -"),
    "url": Rule(
        r"(?:https?|file)://[A-Za-z0-9._~:/?#@%+=,!*-]+",
        "an http(s):// or file:// URL of letters, digits and . _ ~ : / ? # @ % + = , ! * - (percent-encode the rest)",
        _no_dot_dot,
    ),
    "host": Rule(r"%s|%s" % (_HOSTNAME, _IP), "a host name or an IP address"),
    "address": Rule(
        r"(?:%s)(?:/[0-9]{1,3})?|localhost|any|link-local|multicast" % _IP,
        "an IP address or network (10.0.0.0/8), or localhost, any, link-local, multicast",
    ),
    "server_name": Rule(r"[A-Za-z0-9*_.-]+", "a server name: letters, digits, * _ . -"),
    "ifname": Rule(r"[A-Za-z0-9_.:-]{1,15}", "a network interface name"),
    "unit": Rule(
        r"[A-Za-z0-9:_.@\\-]+\.(?:service|socket|target|mount|device|path|timer|slice|scope)",
        "a systemd unit name with its suffix (nvidia-persistenced.service)",
    ),
    "unit_key": Rule(r"[A-Z][A-Za-z0-9]*", "a systemd directive name (MemoryMax)"),
    "device_allow": Rule(
        r"(?:/dev/[A-Za-z0-9_./-]+|(?:char|block)-[A-Za-z0-9_*-]+)(?: [rwm]{1,3})?",
        "a DeviceAllow= entry: /dev/PATH or char-NAME, then r, w, m",
    ),
    "syscall_set": Rule(r"~?%s(?: %s)*" % (_SYSCALL, _SYSCALL), "a SystemCallFilter= entry: [~]@group or names"),
    "memory_size": Rule(
        r"[0-9]+(?:\.[0-9]+)?[KMGTPE]?|[0-9]{1,3}(?:\.[0-9]+)?%|infinity|auto",
        "a systemd memory size (512M, 64G, 80%), infinity or auto",
    ),
    "memlock": Rule(r"[0-9]+[KMGTPE]?|infinity", "a size (64M) or infinity"),
    "limit": Rule(r"[0-9]+|unlimited|infinity", "a number, unlimited or infinity"),
    "sysctl_key": Rule(r"[a-z0-9_]+(?:[./][A-Za-z0-9_-]+)+", "a kernel setting name (vm.swappiness)"),
    "sysctl_value": Rule(
        r"[A-Za-z0-9_.:,/% -]{1,255}", "a kernel setting value: letters, digits, _ . : , / % - and spaces"
    ),
    "env_name": Rule(
        r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name: A-Z a-z 0-9 _, not starting with a digit"
    ),
    "secret": Rule(r"[A-Za-z0-9._~+/=:-]{1,1024}", "a key or token: letters, digits, . _ ~ + / = : -"),
    "mode": Rule(r"0?[0-7]{3,4}", "a file mode in octal (0644)"),
    "number": Rule(r"-?[0-9]+(?:\.[0-9]+)?", "a number"),
    "bool": Rule(r"True|False|true|false|yes|no", "true or false"),
    "option": Rule(
        r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*(?:=[A-Za-z0-9_./+,:@%=-]*)?",
        "a command-line option: -x, --name or --name=VALUE of letters, digits, _ . / + , : @ % = -",
    ),
    "arch_list": Rule(r"%s(?:[ ;]%s)*" % (_ARCH, _ARCH), "CUDA architectures (8.0;9.0+PTX)"),
    "regex": Rule(r"[^\n]+", "a regular expression", _compiles),
    "journal_or_path": Rule(r"journal|/[A-Za-z0-9._+@/-]*", "journal or an absolute path", _no_dot_dot),
    "model": Rule(
        r"[A-Za-z0-9_./@+:-]+",
        "a model path or name: letters, digits, _ . / @ + : - and no .. component",
        _no_dot_dot,
    ),
    "location": Rule(r"/[A-Za-z0-9._~/-]*", "a URL path: / then letters, digits, . _ ~ / -", _no_dot_dot),
    # The Hub's repository names: letters, digits, . _ -, no .. or -- (it refuses those), at most 96 characters.
    "hf_repo": Rule(
        r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}",
        "a Hugging Face repository: OWNER/NAME of letters, digits, . _ -",
        _hub_name,
    ),
    # A branch or tag moves, and the tarball packed from it with it: only a full commit id is a revision.
    "commit": Rule(r"[0-9a-f]{40}", "a commit id: 40 lowercase hexadecimal digits"),
    "nginx_size": Rule(r"[0-9]+[kKmMgG]?", "an nginx size (16m)"),
    "nginx_time": Rule(r"[0-9]+(?:ms|s|m|h|d)?", "an nginx time (600s)"),
    "nginx_rate": Rule(r"[0-9]+r/[sm]", "a request rate (20r/s)"),
    "header": Rule(r"[A-Za-z0-9-]+", "an HTTP header name"),
    "ciphers": Rule(r"[A-Za-z0-9!+@:_.=-]+", "an OpenSSL cipher list"),
    "word": Rule(r"[A-Za-z0-9_.-]+", "a word: letters, digits, _ . -"),
    "pem": Rule(
        r"(?:-----BEGIN [A-Z0-9 ]+-----\r?\n(?:[A-Za-z0-9+/=:, -]*\r?\n)*-----END [A-Z0-9 ]+-----\s*)+",
        "PEM text: -----BEGIN ...----- blocks",
        lines=True,
        max_length=65536,
    ),
    # Free text: any printable characters. Only for values that are quoted or encoded where they are rendered
    # (systemd_quote, env_line, to_json, a module argument); test_value_rules.py holds every such use to that.
    "text": Rule(r".*", "printable text"),
}


# The characters a rule allows at all, where one class says it: the first other character is named in the
# message (U+003B (SEMICOLON) at character 3), which says more than the rule's description alone.
CHARACTERS: dict[str, str] = {
    "name": r"[A-Za-z0-9._-]",
    "instance_name": r"[a-z0-9_-]",
    "user": r"[a-z0-9_-]",
    "package": r"[a-z0-9+.:=~-]",
    "pip_name": r"[A-Za-z0-9._-]",
    "module": r"[A-Za-z0-9_.]",
    "version": r"[0-9A-Za-z.+_!-]",
    "sha256": r"[0-9a-f]",
    "path": r"[A-Za-z0-9._+@/-]",
    "controller_path": r"[A-Za-z0-9._+@/~-]",
    "url": r"[A-Za-z0-9._~:/?#@%+=,!*-]",
    "host": r"[A-Za-z0-9.:%-]",
    "address": r"[A-Za-z0-9.:%/-]",
    "server_name": r"[A-Za-z0-9*_.-]",
    "env_name": r"[A-Za-z0-9_]",
    "unit_key": r"[A-Za-z0-9]",
    "secret": r"[A-Za-z0-9._~+/=:-]",
    "sysctl_key": r"[A-Za-z0-9_./-]",
    "sysctl_value": r"[A-Za-z0-9_.:,/% -]",
    "option": r"[A-Za-z0-9_./+,:@%=-]",
    "model": r"[A-Za-z0-9_./@+:-]",
    "location": r"[A-Za-z0-9._~/-]",
    "hf_repo": r"[A-Za-z0-9._/-]",
    "commit": r"[0-9a-f]",
    "header": r"[A-Za-z0-9-]",
    "ciphers": r"[A-Za-z0-9!+@:_.=-]",
    "word": r"[A-Za-z0-9_.-]",
}


class Problem(NamedTuple):
    variable: str
    path: str
    message: str
    rule: str

    def __str__(self) -> str:
        return "%s %s (rule %s)" % (self.path, self.message, self.rule)


def describe(character: str) -> str:
    """U+000A (LINE FEED): the code point and its name, readable whatever the character is."""
    unnamed = {"\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\t": "TAB", "\0": "NUL"}
    name = unicodedata.name(character, "") or unnamed.get(character, "control character")
    return "U+%04X (%s)" % (ord(character), name)


def parse_rule_path(text: str) -> tuple[str, ...]:
    """`a[].env{}` -> ('a', '[]', '.env', '{}'): the option, then one segment per step."""
    match = re.match(r"[A-Za-z0-9_]+", text)
    if not match:
        raise ValueError("rule path %r does not start with an option name" % text)
    segments, rest = [match.group(0)], text[match.end() :]
    for step in re.finditer(r"\[\]|\{\}|\.(?:\*|[A-Za-z0-9_]+)|(.)", rest):
        if step.group(1) is not None:
            raise ValueError("rule path %r: unexpected %r" % (text, step.group(1)))
        segments.append(step.group(0))
    return tuple(segments)


def leaves(value: Any, path: tuple[str, ...], label: str) -> Iterator[tuple[tuple[str, ...], str, str]]:
    """(rule segments, readable path, text) for every string, number and mapping key under value.

    A list item with a plain `name` is labelled by it (instances[main].port); any other name, by its index.
    A key is named by its mapping only: it may be what is wrong."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + ("{}",), "a key of " + label, str(key)
            yield from leaves(item, path + ("." + str(key),), "%s.%s" % (label, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            name = item.get("name") if isinstance(item, dict) else None
            readable = name if isinstance(name, str) and re.fullmatch(PLAIN_NAME, name) else index
            yield from leaves(item, path + ("[]",), "%s[%s]" % (label, readable))
    elif value is not None:
        yield path, label, str(value)


def _matches(rule: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if len(rule) != len(path):
        return False
    return all(want == got or (want == ".*" and got.startswith(".")) for want, got in zip(rule, path))


def rule_for(path: tuple[str, ...], rules: dict[tuple[str, ...], str]) -> str | None:
    """The rule name of the most specific rule path matching path (a field named beats `.*`)."""
    found = [(rule.count(".*"), name) for rule, name in rules.items() if _matches(rule, path)]
    return min(found)[1] if found else None


def check_text(text: str, rule_name: str | None) -> str | None:
    """What is wrong with one string under its rule, without quoting it; None when it passes."""
    rule = RULES[rule_name.rstrip("?")] if rule_name else None
    line_breaks = "\r\n" if rule and rule.lines else ""
    for position, character in enumerate(text):
        if unicodedata.category(character) in FORBIDDEN_CATEGORIES and character not in line_breaks:
            return "has %s at character %d" % (describe(character), position + 1)
    limit = rule.max_length if rule else MAX_LENGTH
    if len(text) > limit:
        return "is %d characters long, more than %d" % (len(text), limit)
    if rule_name is None or rule is None:
        return None
    optional = rule_name.endswith("?")
    if text == "":
        return None if optional else "is empty; it must be %s" % rule.describe
    if not re.fullmatch(rule.pattern, text, flags=re.DOTALL):
        characters = CHARACTERS.get(rule_name.rstrip("?"), "")
        for position, character in enumerate(text if characters else ""):
            if not re.fullmatch(characters, character):
                return "has %s at character %d; it must be %s" % (describe(character), position + 1, rule.describe)
        return "must be %s" % rule.describe
    wrong = rule.check(text) if rule.check else None
    return "%s; it must be %s" % (wrong, rule.describe) if wrong else None


def problems(values: dict[str, Any], rules: dict[str, str]) -> list[Problem]:
    """One Problem per string under values (variable name -> value) that breaks its rule or the common checks."""
    parsed = {parse_rule_path(path): name for path, name in rules.items()}
    found = []
    for variable, value in values.items():
        for path, label, text in leaves(value, (variable,), variable):
            rule = rule_for(path, parsed)
            message = check_text(text, rule)
            if message:
                found.append(Problem(variable, label, message, rule or "printable, at most %d characters" % MAX_LENGTH))
    return found
