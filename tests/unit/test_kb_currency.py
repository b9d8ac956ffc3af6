"""Knowledge base, round three (issue 36 part 5): the refresh keeps the README's "How current each table is" itself.

data/compat/currency.csv is the one place the refresh records when each table was brought up to date and what it
covers; the README's table is written from it. These tests fail when the README and currency.csv disagree, when a
PyPI-fed row no longer describes its table, and when the tables are older than the stored PyPI answers the tests
replay (tests/fixtures/compat_refresh/*-project.json, read on 2026-12-06: vllm's newest release was 0.34.0, torch's
2.15.0, flash-attn's 2.8.3.post2).
"""

from __future__ import annotations

import json
import shutil

import pytest
from packaging.version import Version

from gpufleet import PROJECT_ROOT, compat_refresh

KB_DIR = PROJECT_ROOT / "data" / "compat"
STORED = PROJECT_ROOT / "tests" / "fixtures" / "compat_refresh"
VERSION_COLUMN = {"vllm": ("vllm.csv", "vllm_version"), "torch": ("torch.csv", "torch_version")}
VERSION_COLUMN["flash-attn"] = ("flash_attn.csv", "version")


def currency():
    return compat_refresh.read_csv(KB_DIR / "currency.csv")


def test_the_readme_table_is_written_from_currency_csv():
    readme = (KB_DIR / "README.md").read_text(encoding="utf-8")
    assert compat_refresh.render_currency(currency()) in readme
    assert compat_refresh.readme_with_currency(readme, currency()) == readme


@pytest.mark.parametrize("table", compat_refresh.PYPI_FED)
def test_each_pypi_fed_row_describes_its_table(table):
    rows = {row["table"]: row for row in currency()}
    assert table in rows, "currency.csv has no row for %s" % table
    assert rows[table]["covers"] == compat_refresh.covers(table, compat_refresh.read_csv(KB_DIR / table))
    assert rows[table]["current_as_of"] in rows[table]["source"]


@pytest.mark.parametrize("name", sorted(VERSION_COLUMN))
def test_the_tables_are_not_older_than_the_replayed_index(name):
    """The newest final release the stored index answer lists is in the table (the refresh was run and written)."""
    listed = json.loads((STORED / f"{name}-project.json").read_text(encoding="utf-8"))["release_names"]
    newest = max((Version(item) for item in listed if not Version(item).is_prerelease), default=None)
    table, column = VERSION_COLUMN[name]
    rows = compat_refresh.read_csv(KB_DIR / table)
    if name == "vllm":
        rows = [row for row in rows if row["distribution"] == "vllm"]
    have = max(Version(row[column]) for row in rows)
    assert have >= newest, "%s is at %s but the index listed %s: run scripts/refresh_compat.py all --write" % (
        table,
        have,
        newest,
    )


def test_the_platform_tables_cover_every_release_of_the_tables():
    platforms = {
        (row["distribution"], row["version"], row["arch"])
        for row in compat_refresh.read_csv(KB_DIR / "wheel_platforms.csv")
    }
    installs = {
        (row["distribution"], row["vllm_version"], row["arch"])
        for row in compat_refresh.read_csv(KB_DIR / "vllm_installability.csv")
    }
    for row in compat_refresh.read_csv(KB_DIR / "vllm.csv"):
        for arch in compat_refresh.ARCHES:
            assert (row["distribution"], row["vllm_version"], arch) in platforms
            assert (row["distribution"], row["vllm_version"], arch) in installs
    for row in compat_refresh.read_csv(KB_DIR / "torch.csv"):
        assert ("torch", row["torch_version"], "aarch64") in platforms
    for row in compat_refresh.read_csv(KB_DIR / "vllm_companions.csv"):
        if row["pin"]:
            assert (row["companion"], row["pin"], "x86_64") in platforms, row


def test_writing_the_currency_brings_the_refreshed_rows_to_the_day(tmp_path):
    kb = tmp_path / "kb"
    shutil.copytree(KB_DIR, kb)
    results = [
        compat_refresh.RefreshResult("vllm.csv", compat_refresh.read_csv(kb / "vllm.csv"), ["vllm/9.9.9: new row"]),
        compat_refresh.RefreshResult("torch.csv", compat_refresh.read_csv(kb / "torch.csv"), []),
    ]
    compat_refresh.write_currency(kb, results, "2027-01-02", "refresh_compat.py all --write")
    rows = {row["table"]: row for row in compat_refresh.read_csv(kb / "currency.csv")}
    assert rows["vllm.csv"]["current_as_of"] == "2027-01-02"
    assert rows["vllm.csv"]["source"] == "`refresh_compat.py all --write` on 2027-01-02: added 1 (vllm/9.9.9)"
    assert rows["torch.csv"]["source"].endswith("on 2027-01-02: no change")
    assert rows["cuda_driver.csv"] == {row["table"]: row for row in currency()}["cuda_driver.csv"], "hand rows kept"
    readme = (kb / "README.md").read_text(encoding="utf-8")
    assert "| `vllm.csv` | 2027-01-02: vllm 0.4.0-" in readme
    assert readme.count(compat_refresh.CURRENCY_BEGIN) == 1


def test_a_readme_without_the_markers_is_refused():
    with pytest.raises(compat_refresh.RefreshError):
        compat_refresh.readme_with_currency("# no table here\n", currency())
