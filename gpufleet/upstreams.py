"""Where each mirrored file comes from: data/mirror/upstreams.csv, one row per kind of file (its name pattern, its
upstream URL pattern with a cited real example, and whether the upstream publishes a checksum). Read by `gpufleet
mirror sync` to fetch and by `gpufleet plan` to say which pins nothing upstream can confirm.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet import PROJECT_ROOT

UPSTREAMS_FILE = PROJECT_ROOT / "data" / "mirror" / "upstreams.csv"


@dataclass(frozen=True)
class Upstream:
    """One row of data/mirror/upstreams.csv."""

    kind: str
    mirror_dir: str
    name_pattern: str
    base_url: str
    path_pattern: str
    checksum_kind: str  # none | redistrib_json | simple_index
    checksum_path_pattern: str
    checksum_note: str
    source_url: str
    example_name: str
    example_url: str
    example_seen_at: str
    retrieved: str

    def fields(self, name: str) -> dict[str, str] | None:
        match = re.match(self.name_pattern, name)
        if match is None:
            return None
        fields = dict(match.groupdict(), name=name)
        if "project" in fields:
            # PEP 503's normalized name: the project page's path on an index.
            fields["project"] = re.sub(r"[-_.]+", "-", fields["project"]).lower()
        return fields

    def url(self, name: str, base: str) -> str:
        return _join(base, self.path_pattern.format(**(self.fields(name) or {})))

    def checksum_url(self, name: str, base: str) -> str:
        return _join(base, self.checksum_path_pattern.format(**(self.fields(name) or {})))


def _join(base: str, path: str) -> str:
    return f"{base.rstrip('/')}/{path}"


def load_upstreams(path: Path = UPSTREAMS_FILE) -> list[Upstream]:
    with path.open(newline="") as handle:
        return [Upstream(**row) for row in csv.DictReader(handle)]


def upstream_of(name: str, upstreams: list[Upstream]) -> Upstream | None:
    """The row whose name pattern the file name matches, if any."""
    return next((row for row in upstreams if row.fields(name) is not None), None)
