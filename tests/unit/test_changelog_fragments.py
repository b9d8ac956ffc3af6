"""Every changelog fragment is what antsibull-changelog reads: a mapping of known sections to lists of strings.
A colon followed by a space inside a plain YAML scalar turns an entry into a mapping, which the changelog tool
and galaxy-importer's lint refuse; found when `make release-check` first ran galaxy-importer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

FRAGMENTS = sorted((Path(__file__).resolve().parents[2] / "changelogs" / "fragments").glob("*.yml"))
# antsibull-changelog's default sections.
SECTIONS = {
    "release_summary",
    "breaking_changes",
    "major_changes",
    "minor_changes",
    "removed_features",
    "deprecated_features",
    "security_fixes",
    "bugfixes",
    "known_issues",
    "trivial",
}


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=[path.name for path in FRAGMENTS])
def test_each_fragment_is_sections_of_plain_entries(fragment: Path) -> None:
    data = yaml.safe_load(fragment.read_text())
    assert isinstance(data, dict) and data, f"{fragment.name}: a mapping of sections"
    assert set(data) <= SECTIONS, f"{fragment.name}: unknown sections {sorted(set(data) - SECTIONS)}"
    for section, entries in data.items():
        assert isinstance(entries, list) and entries, f"{fragment.name}: {section} is a list"
        for entry in entries:
            assert isinstance(entry, str), f"{fragment.name}: {section} has an entry that is not text: {entry!r}"
