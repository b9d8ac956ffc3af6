# -*- coding: utf-8 -*-
"""Filter unsafe_values: inventory values that must not reach a unit file, an environment file or an nginx
directive as they are — the one check the roles' preflights share (issue 12: a newline added a directive)."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Iterator

DOCUMENTATION = r"""
name: unsafe_values
short_description: What is wrong with inventory values that are written into units, env files or directives
description:
  - Walks mappings and lists and returns one message per string (value or mapping key) that holds a control
    character (a newline ends a systemd or nginx line, so it would add a directive), or that does not match
    of a character the path's character class does not allow.
  - A message names the value's path (a list item that has a C(name) is named by it, C(instances[main].env.X))
    and the offending character with its position; never the value itself, so secrets can be checked too.
positional: allowed
options:
  _input:
    description: Variable name -> its value.
    type: dict
    required: true
  allowed:
    description:
      - Path pattern (a regular expression matched in full against a string's path; the keys of the mapping at
        PATH have the path C(PATH{})) -> a character class (C([A-Za-z0-9_])) every character of the string found
        there must belong to; such a string must not be empty either.
    type: dict
    default: {}
"""

EXAMPLES = r"""
problems: >-
  {{ {'vllm_service_instances': vllm_service_instances}
     | unsafe_values({'vllm_service_instances\\[[^]]*\\]\\.env\\{\\}': '[A-Za-z0-9_]'}) }}
"""

RETURN = r"""
_value:
  description: One message per offending string; empty when every value is safe.
  type: list
  elements: str
"""

KEYS = "{}"


def describe(character: str) -> str:
    """U+000A (LINE FEED): the code point and its name, readable whatever the character is."""
    unnamed = {"\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\t": "TAB", "\0": "NUL"}
    name = unicodedata.name(character, "") or unnamed.get(character, "control character")
    return "U+%04X (%s)" % (ord(character), name)


def walk(value: Any, path: str) -> Iterator[tuple[str, str, bool]]:
    """(path, string, is_key) for every string under value; key paths end in KEYS."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + KEYS, str(key), True
            yield from walk(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            name = item.get("name") if isinstance(item, dict) else None
            # An item is named by its name, unless that name is itself what is wrong.
            label = name if isinstance(name, str) and name.isprintable() and name else index
            yield from walk(item, f"{path}[{label}]")
    elif isinstance(value, str):
        yield path, value, False


def problem(path: str, text: str, allowed: dict[str, str], is_key: bool) -> str | None:
    where = f"a key of {path[: -len(KEYS)]}" if is_key else path
    classes = [character_class for path_pattern, character_class in allowed.items() if re.fullmatch(path_pattern, path)]
    for position, character in enumerate(text):
        if unicodedata.category(character) == "Cc":
            return f"{where} has {describe(character)} at character {position + 1}"
        for character_class in classes:
            if not re.fullmatch(character_class, character):
                return f"{where} has {describe(character)} at character {position + 1}, not one of {character_class}"
    if not text and classes:
        return f"{where} is empty"
    return None


def unsafe_values(values: dict, allowed: dict | None = None) -> list[str]:
    found = []
    for name, value in values.items():
        for path, text, is_key in walk(value, str(name)):
            message = problem(path, text, allowed or {}, is_key)
            if message:
                found.append(message)
    return found


class FilterModule(object):
    def filters(self):
        return {"unsafe_values": unsafe_values}
