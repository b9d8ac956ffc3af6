"""One run split over N processes or controllers, as AWX's job slicing splits a job (issue 37): `gpufleet provision
--slice K/N` runs on the K-th of N slices of the targeted nodes, and `gpufleet report` joins the slices' --json
documents into one report.

A slice is every N-th node of the targeted nodes sorted by name, starting with the K-th: the same inventory and
--limit give every controller the same slices, the slices are disjoint and together they are every node, and each
holds about 1/N of every group (round-robin, not contiguous ranges: a rack or GPU class is spread over the slices,
so no slice is the whole of one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.errors import UsageError

SLICE_PATTERN = re.compile(r"([0-9]+)/([0-9]+)")


@dataclass(frozen=True)
class Slice:
    index: int  # 1..count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def of(self, nodes: list[str]) -> list[str]:
        """This slice of `nodes` (sorted by name first); UsageError when it is empty."""
        chosen = sorted(nodes)[self.index - 1 :: self.count]
        if not chosen:
            raise UsageError(
                f"--slice {self}: {len(nodes)} node(s) make no slice {self.index} of {self.count}; "
                f"slice them {len(nodes)} ways at most"
            )
        return chosen


def parse(text: str) -> Slice:
    """`K/N` with 1 <= K <= N; UsageError with the form otherwise."""
    match = SLICE_PATTERN.fullmatch(text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise UsageError(f"--slice {text}: give K/N, slice K of N with 1 <= K <= N (2/4: the second of four)")
    return Slice(int(match.group(1)), int(match.group(2)))
