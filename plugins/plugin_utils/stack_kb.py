# -*- coding: utf-8 -*-
"""Load the version-chain knowledge base (data/compat/*.csv) into plain, JSON-serialisable data.

Standard library only: the same loader runs in the gpufleet CLI and in action plugins on the
controller. Every table keeps the `source` column of its rows so that each fact the validator uses
can be cited.
"""

from __future__ import annotations

import csv
import os
from typing import Any

# One entry per table: file name -> the columns it must have (extra columns are kept, never required).
TABLES = {
    "gpus": (
        "gpus.csv",
        (
            "gpu",
            "match",
            "architecture",
            "compute_capability",
            "cc_status",
            "min_cuda",
            "driver_floor",
            "product_min_driver",
            "source",
        ),
    ),
    "compute_capabilities": (
        "compute_capabilities.csv",
        ("compute_capability", "sm", "architecture", "min_cuda", "source"),
    ),
    "cuda": (
        "cuda_driver.csv",
        (
            "cuda_version",
            "cuda_release",
            "min_driver",
            "min_driver_status",
            "minor_compat_min",
            "minor_compat_upper",
            "source",
        ),
    ),
    "torch": (
        "torch.csv",
        (
            "torch_version",
            "requires_python",
            "python_tags",
            "pypi_default_variant",
            "index_variants",
            "index_variant_status",
            "variants_source",
            "source",
        ),
    ),
    "torch_extra_variants": (
        "torch_extra_variants.csv",
        ("torch_version", "variant", "status", "source"),
    ),
    "torch_arch_lists": (
        "torch_arch_lists.csv",
        ("torch_version", "variant", "arch_list", "source"),
    ),
    "vllm": (
        "vllm.csv",
        (
            "distribution",
            "vllm_version",
            "requires_python",
            "wheel_python_tags",
            "torch_req",
            "torch_pin",
            "default_wheel_cuda",
            "cuda_confidence",
            "metadata_source",
            "cuda_source",
        ),
    ),
    "vllm_companions": (
        "vllm_companions.csv",
        ("distribution", "vllm_version", "companion", "requirement", "pin", "requires_python", "python_tags", "source"),
    ),
    "cuda_components": (
        "cuda_components.csv",
        ("component_version", "component", "cuda_version", "cuda_release", "source"),
    ),
    "flash_attn": (
        "flash_attn.csv",
        (
            "version",
            "requires_python",
            "build_facts",
            "nvcc_floor",
            "documented_cuda_min",
            "documented_torch_min",
            "sass_targets",
            "turing_supported",
            "source",
        ),
    ),
    "cpython": (
        "cpython.csv",
        ("version", "tarball", "sha256", "default_for_minor", "source"),
    ),
    "rules": (
        "rules.csv",
        ("rule", "statement", "source"),
    ),
}


class KnowledgeBaseError(ValueError):
    """The knowledge base directory is missing, or a table lacks a required column."""


def default_kb_dir() -> str:
    """The knowledge base that ships inside the collection (data/compat at its root); controller only, as this
    file's location means nothing inside a module's payload on a host."""
    collection_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(collection_root, "data", "compat")


def read_table(path: str, required: tuple) -> list:
    """Read one CSV file into a list of dicts; fail clearly when a required column is missing."""
    if not os.path.isfile(path):
        raise KnowledgeBaseError("knowledge base file %s is missing" % path)
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [name for name in required if name not in (reader.fieldnames or [])]
        if missing:
            raise KnowledgeBaseError("%s lacks column(s) %s" % (path, ", ".join(missing)))
        return [dict(row) for row in reader]


def load_kb(kb_dir: str) -> dict:
    """Load every table of the knowledge base; the result is plain lists of string dicts."""
    if not os.path.isdir(kb_dir):
        raise KnowledgeBaseError("knowledge base directory %s does not exist" % kb_dir)
    kb: dict[str, Any] = {"kb_dir": os.path.abspath(kb_dir)}
    for name, (filename, required) in TABLES.items():
        kb[name] = read_table(os.path.join(kb_dir, filename), required)
    return kb


def host_check_subset(kb: dict) -> dict:
    """The part of the knowledge base the on-host check needs (kept small: it travels as module args)."""
    return {
        "cuda": [
            {
                key: row[key]
                for key in (
                    "cuda_version",
                    "cuda_release",
                    "min_driver",
                    "min_driver_status",
                    "minor_compat_min",
                    "minor_compat_upper",
                    "source",
                )
            }
            for row in kb["cuda"]
        ],
        "gpus": [
            {key: row[key] for key in ("gpu", "match", "compute_capability", "cc_status", "source")}
            for row in kb["gpus"]
        ],
        "compute_capabilities": [
            {
                key: row.get(key, "")
                for key in ("compute_capability", "sm", "architecture", "min_cuda", "last_cuda_major", "source")
            }
            for row in kb["compute_capabilities"]
        ],
        "rules": kb["rules"],
    }
