# -*- coding: utf-8 -*-
"""Filter vllm_flags_overridden: which of an instance's extra_args would override a flag the role sets or a
hardening setting (issue 29, L7): argparse keeps the last of a repeated option, so `--host 0.0.0.0` in extra_args
moves the listener, `--trust-remote-code` runs the model's code although trust_remote_code is false."""

from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_flags_overridden
short_description: The refused vLLM flags an instance's extra_args hold
description:
  - "Returns one line per instance whose extra_args name a refused flag (C(--flag) or C(--flag=VALUE)), each such
    flag with why, never the flag's value (C(--api-key=KEY)). vLLM's parser reads C(_) as C(-) and takes any
    unambiguous prefix of a flag, so C(--trust_remote_code) and C(--trust-remote) count as C(--trust-remote-code)."
options:
  _input:
    description: The instances (each a mapping with C(name) and C(extra_args)).
    type: list
    elements: dict
    required: true
  refused:
    description: The refused flags, each with its leading C(--) -> why it is refused.
    type: dict
    required: true
"""

EXAMPLES = r"""
overridden: "{{ instances | gpufleet.fleet.vllm_flags_overridden({'--host': 'the listener stays behind the proxy'}) }}"
"""

RETURN = r"""
_value:
  description: "C(vllm@NAME: extra_args may not hold FLAG (WHY); ...) for each instance that names one."
  type: list
  elements: str
"""

MINIMUM_PREFIX = 4  # "--x": shorter prefixes are ambiguous for argparse anyway


def overridden_flags(extra_args: list, refused: dict) -> list[str]:
    """FLAG (WHY) for each refused flag the arguments name, in their order."""
    found = []
    for argument in extra_args:
        text = str(argument)
        if not text.startswith("--"):
            continue
        name = text.split("=", 1)[0].replace("_", "-")
        for flag, why in refused.items():
            if name == flag or (len(name) >= MINIMUM_PREFIX and flag.startswith(name)):
                found.append("%s (%s)" % (flag, why))
    return found


def vllm_flags_overridden(instances: list, refused: dict) -> list[str]:
    lines = []
    for instance in instances:
        flags = overridden_flags(instance.get("extra_args") or [], refused)
        if flags:
            lines.append("vllm@%s: extra_args may not hold %s." % (instance.get("name"), "; ".join(flags)))
    return lines


class FilterModule(object):
    def filters(self):
        return {"vllm_flags_overridden": vllm_flags_overridden}
