# -*- coding: utf-8 -*-
"""The version vocabulary of a GPU software stack: PEP 440 ordering and specifiers (drivers and toolkits too),
torch variants and their CUDA, and the capability and nvcc facts as the stack checks compare them.

Standard library only, Python 3.8+: the controller and the hosts (stack_host_check) run this same file.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import compute_capability, nvcc_release

# PEP 440 public versions (release, pre, post, dev) with an optional local part; the on-host module cannot
# import `packaging`, so ordering is done here and tested against packaging.version on the controller.
VERSION_RE = re.compile(
    r"^v?(\d+(?:\.\d+)*)"
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:-(\d+)|[-_.]?(?:post|rev|r)[-_.]?(\d*))?"
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"
    r"(?:\+([0-9A-Za-z.]+))?$",
    re.IGNORECASE | re.ASCII,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
VARIANT_RE = re.compile(r"^(?:cu(\d{3,4})|cpu)$", re.ASCII)
_SPEC_RE = re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+]*)$", re.ASCII)


def _parse(text: str) -> re.Match[str]:
    """The VERSION_RE match of a version; ValueError for text that is not one."""
    match = VERSION_RE.match(str(text).strip())
    if not match:
        raise ValueError("not a version: %r" % (text,))
    return match


def version_key(text: str) -> tuple:
    """A PEP 440 sort key: 0.10.0.dev1 < 0.10.0rc1 < 0.10.0 < 0.10.0+cpu < 0.10.0.post1 < 0.10.1;
    also for drivers and toolkits (580.159.04, 13.0.2), where only the release part is present."""
    match = _parse(text)
    release, pre, pre_n, post_implicit, post_n, dev, dev_n = match.groups()[:7]
    numbers = [int(part) for part in release.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()  # 1.0 == 1.0.0
    has_post = post_implicit is not None or post_n is not None
    post = int(post_implicit or post_n or 0) if has_post else -1
    if pre:
        pre_key = (_PRE_RANK[pre.lower()], int(pre_n or 0))
    elif dev and not has_post:
        pre_key = (-1, 0)  # 1.0.dev0 sorts before 1.0a1
    else:
        pre_key = (3, 0)
    dev_key = (0, int(dev_n or 0)) if dev else (1, 0)
    return (tuple(numbers), pre_key, post, dev_key, _local_key(match.group(8)))


def _local_key(local) -> tuple:
    """PEP 440: a local part sorts after none; numeric segments compare as numbers, above text ones."""
    if not local:
        return ()
    return tuple((1, int(part), "") if part.isdigit() else (0, 0, part.lower()) for part in re.split(r"[._-]", local))


def _is_pre_or_post(text: str, operator: str) -> bool:
    """For '<': a pre-release (or dev release) of its release; for '>': a post-release."""
    key = version_key(text)
    return key[1] != (3, 0) or key[3] != (1, 0) if operator == "<" else key[2] >= 0


def _release(text: str) -> list:
    """'2.13.0rc1' -> [2, 13, 0]."""
    return [int(part) for part in _parse(text).group(1).split(".")]


def base_version(text: str) -> str:
    """2.13.0+cpu -> 2.13.0."""
    return str(text).split("+", 1)[0]


def local_tag(text: str) -> str:
    """2.13.0+cpu -> cpu; 2.13.0 -> ''."""
    parts = str(text).split("+", 1)
    return parts[1] if len(parts) == 2 else ""


def major_minor(text: str) -> str:
    """13.0.2 -> 13.0."""
    parts = str(text).split(".")
    return ".".join(parts[:2])


def specifier_allows(specifier: str, version: str) -> bool:
    """True when `version` satisfies a simple PEP 440 specifier set such as '<3.15,>=3.10'."""
    for clause in [part.strip() for part in specifier.split(",") if part.strip()]:
        match = _SPEC_RE.match(clause)
        if not match:
            raise ValueError("unsupported version specifier %r" % clause)
        operator, bound = match.groups()
        if not _clause_allows(operator, bound, version):
            return False
    return True


def _clause_allows(operator: str, bound: str, version: str) -> bool:
    if bound.endswith(".*"):
        prefix = bound[:-2]
        same = version == prefix or version.startswith(prefix + ".")
        return same if operator == "==" else not same
    if "+" not in bound:
        version = base_version(version)  # a specifier without a local part ignores the candidate's
    have, want = version_key(version), version_key(bound)
    if (
        operator in ("<", ">")
        and have[0] == want[0]
        and _is_pre_or_post(version, operator)
        and not _is_pre_or_post(bound, operator)
    ):
        return False  # PEP 440: <3.15 excludes 3.15.0rc1, >2.8 excludes 2.8.post1
    if operator == "~=":
        # ~=X.Y means >=X.Y, ==X.*; ~=X.Y.Z means >=X.Y.Z, ==X.Y.*
        release_prefix = _release(bound)[:-1]
        return have >= want and _release(version)[: len(release_prefix)] == release_prefix
    return {
        "==": have == want,
        "!=": have != want,
        ">=": have >= want,
        "<=": have <= want,
        ">": have > want,
        "<": have < want,
    }[operator]


def variant_cuda(variant: str):
    """cu130 -> '13.0', cu118 -> '11.8', cpu -> None."""
    match = VARIANT_RE.match(variant)
    if not match:
        raise ValueError("not a torch variant: %r" % variant)
    digits = match.group(1)
    if digits is None:
        return None
    return "%d.%s" % (int(digits[:-1]), digits[-1])


def cuda_variant(cuda: str) -> str:
    """'13.0' -> cu130."""
    major, minor = major_minor(cuda).split(".")
    return "cu%s%s" % (major, minor)


def parse_compute_capability(text: str):
    """'9.0', 'sm_90', 'compute_120' or [9, 0] -> '9.0'; None when it is not a compute capability."""
    if isinstance(text, (list, tuple)) and len(text) == 2:
        return "%d.%d" % (int(text[0]), int(text[1]))
    capability = compute_capability(str(text).lower(), ptx=True)
    return None if capability is None else "%d.%d" % capability


def parse_nvcc_release(text: str):
    """The fact as `nvcc --version` prints it, or already reduced to a version ('13.0.88') -> '13.0'."""
    match = re.match(r"^V?(\d+\.\d+)(?:\.\d+)*$", str(text).strip())
    return nvcc_release(str(text)) or (match.group(1) if match else None)


def cc_tuple(cc: str) -> tuple:
    major, minor = cc.split(".")
    return int(major), int(minor)
