"""Every changelog fragment is what antsibull-changelog reads: a mapping of known sections to lists of strings.
A colon followed by a space inside a plain YAML scalar turns an entry into a mapping, which the changelog tool
and galaxy-importer's lint refuse; found when `make release-check` first ran galaxy-importer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FRAGMENTS = sorted((REPO / "changelogs" / "fragments").glob("*.yml"))
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


def test_the_version_galaxy_yml_names_is_released_or_has_fragments() -> None:
    """A release (`antsibull-changelog release`) moves the fragments into changelogs/changelog.yaml and
    CHANGELOG.rst; galaxy.yml's version is either released there, or the next one, with fragments waiting."""
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    releases = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    assert version in releases or FRAGMENTS, f"galaxy.yml names {version}: neither released nor any fragment"
    for name, release in releases.items():
        for section, entries in release.get("changes", {}).items():
            assert section in SECTIONS and (isinstance(entries, str) or all(isinstance(e, str) for e in entries))
        assert f"v{name}\n" in (REPO / "CHANGELOG.rst").read_text(), f"CHANGELOG.rst lacks release {name}"
