# -*- coding: utf-8 -*-
"""The memory of a declared GPU, from the knowledge base's data/compat/gpu_memory.csv (issue 34): what CUDA
reports as the device's total (cudaMemGetInfo, the figure vLLM multiplies by gpu_memory_utilization), with the
product variant it belongs to and its source. Controller-only (plugin_utils); standard library only."""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass

FILENAME = "gpu_memory.csv"
COLUMNS = ("match", "variant", "memory_gib", "memory_mib_reported", "cuda_total_bytes", "status", "source")


class GpuMemoryError(ValueError):
    """No memory figure for a declared GPU: the message names the GPU and the file to add it to."""


@dataclass(frozen=True)
class GpuMemory:
    match: str
    variant: str
    cuda_total_bytes: int
    status: str
    source: str
    assumed: bool  # the declaration did not name the variant: the match's first (default) row was taken

    def describe(self) -> str:
        text = f"{self.match} {self.variant}, {self.cuda_total_bytes / (1 << 30):.2f} GiB as CUDA reports it"
        return text + (" (variant assumed: name it in gpufleet_stack.gpu to choose another)" if self.assumed else "")


def read_rows(kb_dir: str) -> list[dict[str, str]]:
    path = os.path.join(kb_dir, FILENAME)
    if not os.path.isfile(path):
        raise GpuMemoryError(f"knowledge base file {path} is missing")
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [name for name in COLUMNS if name not in (reader.fieldnames or [])]
        if missing:
            raise GpuMemoryError(f"{path} lacks column(s) {', '.join(missing)}")
        return [dict(row) for row in reader]


def _tokens(text: str) -> set[str]:
    return set(re.sub(r"[^A-Z0-9]+", " ", text.upper()).split())


def memory_of(rows: list[dict[str, str]], match: str, declared: str) -> GpuMemory:
    """The memory of the GPU gpus.csv calls `match`, declared as `declared` ("H100", "NVIDIA H100 NVL", "A100
    40GB"): the row whose variant the declaration names, else the match's first row (its default)."""
    candidates = [row for row in rows if row["match"] == match]
    if not candidates:
        raise GpuMemoryError(
            f"GPU {declared!r} has no memory figure in the knowledge base: add a sourced row for match {match!r} to "
            f"data/compat/{FILENAME}, or opt the instance out with capacity_check: false"
        )
    # The row whose variant the declaration names most of ("H100 NVL" names NVL, "H100 80GB HBM3" SXM5's 80GB and
    # HBM3); none, or a tie, takes the first of them and says the variant was assumed.
    wanted = _tokens(declared)
    scores = [len(_tokens(row["variant"]) & wanted) for row in candidates]
    best = max(scores)
    tied = [row for row, score in zip(candidates, scores, strict=True) if score == best]
    row = tied[0]
    assumed = best == 0 or len(tied) > 1
    try:
        total = int(row["cuda_total_bytes"])
    except ValueError as error:
        raise GpuMemoryError(f"data/compat/{FILENAME}: {match} {row['variant']} has no cuda_total_bytes") from error
    return GpuMemory(match, row["variant"], total, row["status"], row["source"], assumed)
