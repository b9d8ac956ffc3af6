# -*- coding: utf-8 -*-
"""The knowledge base (stack_kb.py's tables, passed as plain data) indexed for the lookups the links need, and
GPU entries (a model name or a compute capability) resolved to their rows.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_report import Report
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_versions import (
    major_minor,
    parse_compute_capability,
    version_key,
)


class KbIndex(object):
    """Indexes the knowledge base rows for the lookups the links need."""

    def __init__(self, kb: dict):
        self.kb = kb
        self.cuda = kb.get("cuda", [])
        self.ccs = dict((row["compute_capability"], row) for row in kb.get("compute_capabilities", []))
        self.torch = dict((row["torch_version"], row) for row in kb.get("torch", []))
        self.vllm = dict(((row["distribution"], row["vllm_version"]), row) for row in kb.get("vllm", []))
        self.flash_attn = dict((row["version"], row) for row in kb.get("flash_attn", []))
        self.rules = dict((row["rule"], row) for row in kb.get("rules", []))
        self.companions: dict[tuple[str, str], list[dict]] = {}
        for row in kb.get("vllm_companions", []):
            if row["pin"]:
                self.companions.setdefault((row["distribution"], row["vllm_version"]), []).append(row)
        # A component version can ship in more than one release (cudart 13.0.96 in 13.0.2 and 13.0.3) and be the
        # version of more than one component (cudart and nvcc 12.1.105): every row is kept, oldest release first.
        self.components: dict[str, list[dict]] = {}
        for row in sorted(kb.get("cuda_components", []), key=lambda row: version_key(row["cuda_version"])):
            self.components.setdefault(row["component_version"], []).append(row)
        self.gpus = kb.get("gpus", [])
        # Per-platform wheels and each vLLM release's installability (wheel_platforms.csv, vllm_installability.csv);
        # None when the knowledge base given has no such table: the validator then says it could not check.
        self.wheel_platforms = (
            dict(((row["distribution"], row["version"], row["arch"]), row) for row in kb["wheel_platforms"])
            if "wheel_platforms" in kb
            else None
        )
        self.installability = (
            dict(((row["distribution"], row["vllm_version"], row["arch"]), row) for row in kb["vllm_installability"])
            if "vllm_installability" in kb
            else None
        )

    def rule(self, report: Report, name: str) -> None:
        row = self.rules.get(name)
        if row:
            report.fact("rule:" + name, row["statement"], row["source"])

    def cuda_rows(self, version: str) -> list:
        """Rows for an exact toolkit version (13.0.2) or every release of a major.minor (13.0)."""
        if version.count(".") >= 2:
            return [row for row in self.cuda if row["cuda_version"] == version]
        return sorted(
            (row for row in self.cuda if major_minor(row["cuda_version"]) == version),
            key=lambda row: version_key(row["cuda_version"]),
        )

    def component_releases(self, version: str) -> list:
        """The toolkit releases (cuda_driver.csv version strings, oldest first) that ship a component version."""
        releases: list[str] = []
        for row in self.components.get(version, []):
            if row["cuda_version"] not in releases:
                releases.append(row["cuda_version"])
        return releases

    def name_component(self, version: str) -> str:
        """What a component version is, with the toolkit release and runfile of each release that ships it:
        'CUDA Runtime (cudart) inside CUDA 12.1 Update 1 (toolkit 12.1.1, runfile cuda_12.1.1_530.30.02_linux.run)
        and of CUDA NVCC inside CUDA 12.1 Update 1 (...)'; '' when cuda_components.csv does not know it."""
        by_component: dict[str, list[str]] = {}
        for row in self.components.get(version, []):
            by_component.setdefault(row["component"], []).append(self._release_text(row))
        return " and of ".join(
            "%s inside %s" % (component, ", ".join(releases)) for component, releases in by_component.items()
        )

    def _release_text(self, row: dict) -> str:
        """'CUDA 12.1 Update 1 (toolkit 12.1.1, runfile cuda_12.1.1_530.30.02_linux.run)'; the runfile only where
        cuda_driver.csv names one."""
        rows = self.cuda_rows(row["cuda_version"])
        runfile = rows[0].get("runfile", "") if rows else ""
        return "%s (toolkit %s%s)" % (
            row["cuda_release"],
            row["cuda_version"],
            ", runfile %s" % runfile if runfile else "",
        )

    def resolve_gpu(self, name: str):
        """A GPU entry -> {'label', 'cc', 'row' (gpus.csv or None), 'cc_row'} or None when unknown."""
        cc = parse_compute_capability(name)
        if cc is not None:
            cc_row = self.ccs.get(cc)
            return (
                None
                if cc_row is None
                else {"label": "compute capability %s" % cc, "cc": cc, "row": None, "cc_row": cc_row}
            )
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
            value = value[len(prefix) :]
    return value
