"""`gpufleet drift --html FILE`: the fleet page (gpufleet/report_html.py) parsed as HTML, hostile values in
it shown as text, the CLI writing it (and refusing a path it cannot write), and the page opened in headless
Chromium, whose screenshot must show the drifted and the ok colours."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpufleet import exit_codes
from gpufleet.cli import main
from gpufleet.commands.drift import write_page
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import FleetReport
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report_formats import write_all
from gpufleet.report_html import COLOURS, to_html

LAYERS = ["base", "toolkit", "venv", "serve", "cordon"]
HOSTILE_NODE = "<script>alert(1)</script>"
HOSTILE_VALUE = '"><img src=x>'
SYSCTL_DIFF = "--- a (declared)\n+++ a (host)\n-vm.swappiness = 1\n+vm.swappiness = 60"
UNREACHABLE = "Failed to connect to the host via ssh: Connection refused <b>"
CORDON_REASON = "fan noise </td><script>alert(2)</script> (since 2026-12-01T12:00:00Z)"
# The page's colours, written out here so that a change to the CSS fails the screenshot test.
OK_RGB, DRIFTED_RGB = (0x2E, 0x9E, 0x44), (0xE0, 0x45, 0x2B)
WINDOW = (1280, 900)


def layer(status: str, drift: list[dict] | None = None, message: str = "") -> dict:
    return {"status": status, "checked": 3, "message": message, "notes": [], "errors": [], "drift": drift or []}


def item(check: str, field: str, expected: object, actual: object, detail: str = "") -> dict:
    return {"check": check, "field": field, "expected": expected, "actual": actual, "detail": detail}


def ok_layers(*names: str) -> dict:
    return {name: layer("ok") for name in names}


def fleet_document(run_id: str = "20251129T120000-1-drift") -> dict:
    """Every node status and every layer status, and hostile values in names, values and messages."""
    nodes = {
        "lab-clean": {
            "message": "",
            "layers": {
                **ok_layers("base", "toolkit", "venv"),
                "serve": layer("not_declared", message="vllm_service_instances is empty"),
            },
        },
        "lab-drift": {
            "message": "",
            "layers": {
                "base": layer(
                    "drifted",
                    [item("file /etc/sysctl.d/90-gpufleet.conf", "content", "sha256:aaaa", "sha256:bbbb", SYSCTL_DIFF)],
                ),
                "toolkit": layer(
                    "drifted", [item("link /usr/local/cuda", "target", "/usr/local/cuda-13.0", HOSTILE_VALUE)]
                ),
                "venv": layer("ok"),
                "serve": layer("not_declared", message="vllm_service_instances is empty"),
            },
        },
        "lab-gone": {
            "message": UNREACHABLE,
            "layers": {name: layer("unreachable", message=UNREACHABLE) for name in LAYERS[:4]},
        },
        "lab-broken": {
            "message": "",
            "layers": {
                "base": layer("error", message="base: preflight refused the inventory"),
                **{name: layer("error", message="no result: the run ended") for name in LAYERS[1:4]},
            },
        },
        "lab-cordoned": {
            "message": "",
            "layers": {**ok_layers(*LAYERS[:4]), "cordon": layer("cordoned", message=CORDON_REASON)},
        },
        HOSTILE_NODE: {
            "message": "",
            "layers": {
                **ok_layers("base", "venv", "serve"),
                "toolkit": layer("drifted", [item(HOSTILE_VALUE, "version", {"cuda": "13.0"}, None)]),
            },
        },
    }
    return {
        "schema": "gpufleet-drift-report",
        "version": 1,
        "run_id": run_id,
        "started": "2025-11-29T12:00:00Z",
        "finished": "2025-11-29T12:00:41Z",
        "duration_seconds": 41.2,
        "playbook": "playbooks/drift.yml",
        "layers": LAYERS,
        "nodes": nodes,
    }


def fleet() -> FleetReport:
    return FleetReport.from_dict(fleet_document())


class Page(HTMLParser):
    """What the tests look at: every element, the table's rows, all text, text per element class."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: list[dict] = []
        self.text: list[str] = []
        self.stack: list[str] = []
        self.by_class: dict[str, list[str]] = {}
        self.open_classes: list[tuple[str, list[str]]] = []
        self.in_body = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "tbody":
            self.in_body = True
        if self.in_body and tag == "tr":
            self.rows.append({"node": "", "cells": []})
        if self.in_body and tag == "td" and self.rows:
            self.rows[-1]["cells"].append(attributes.get("class"))
        if tag not in ("br", "meta", "img", "link", "input", "hr"):
            self.stack.append(tag)
            self.open_classes.append((tag, (attributes.get("class") or "").split()))

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self.in_body = False
        while self.stack:
            self.stack.pop()
            opened, _ = self.open_classes.pop()
            if opened == tag:
                break

    def handle_data(self, data: str) -> None:
        if "style" in self.stack:
            return
        self.text.append(data)
        if self.in_body and self.stack and self.stack[-1] == "th" and self.rows:
            self.rows[-1]["node"] += data
        for _, classes in self.open_classes:
            for name in classes:
                self.by_class.setdefault(name, []).append(data)

    def joined(self) -> str:
        return "".join(self.text)

    def classed(self, name: str) -> list[str]:
        return self.by_class.get(name, [])


def test_the_table_has_a_row_per_node_and_a_cell_per_layer_in_its_status_colour() -> None:
    report = fleet()
    page = Page(to_html(report))
    assert [row["node"] for row in page.rows] == sorted(report.nodes)
    for row in page.rows:
        node = report.nodes[row["node"]]
        expected = [f"status-{node.layers[name].status}" if name in node.layers else "status-none" for name in LAYERS]
        assert row["cells"] == expected, row["node"]
    classes = Counter(cls for row in page.rows for cls in row["cells"])
    assert classes == {
        "status-ok": 11,
        "status-drifted": 3,
        "status-not_declared": 2,
        "status-unreachable": 4,
        "status-error": 4,
        "status-cordoned": 1,
        "status-none": 5,
    }
    header = [tag for tag, _ in page.tags].index("thead")
    assert [text for text in page.text[page.text.index("node") :] if text.strip()][:6] == ["node", *LAYERS]
    assert header < [tag for tag, _ in page.tags].index("tbody")


def test_the_heading_has_the_run_its_times_and_the_summary_counts() -> None:
    page = Page(to_html(fleet()))
    text = page.joined()
    assert "Run 20251129T120000-1-drift, 2025-11-29T12:00:00Z to 2025-11-29T12:00:41Z (41.2 s)" in text
    assert "".join(page.classed("summary")) == ("6 nodes1 ok2 drifted1 unreachable1 error1 cordonedexit code 3")
    assert "Not compared: lab-broken (error), lab-gone (unreachable)" in text
    # The legend names every status, each with its swatch.
    legend = "".join(page.classed("legend"))
    for label in ("ok", "drifted", "not declared", "unreachable", "error", "cordoned"):
        assert f"{label}: " in legend
    swatches = [attrs["class"] for tag, attrs in page.tags if tag == "span" and "swatch" in (attrs.get("class") or "")]
    assert len(swatches) == 6


def test_each_node_that_is_not_ok_says_why() -> None:
    page = Page(to_html(fleet()))
    drift = page.classed("drift")
    text = "".join(drift)
    assert "file /etc/sysctl.d/90-gpufleet.conf: content: sha256:aaaa → sha256:bbbb" in text
    assert f"link /usr/local/cuda: target: /usr/local/cuda-13.0 → {HOSTILE_VALUE}" in text
    assert f'{HOSTILE_VALUE}: version: {{"cuda": "13.0"}} → null' in text
    pres = [attrs for tag, attrs in page.tags if tag == "pre"]
    assert len(pres) == 1 and SYSCTL_DIFF in page.joined()
    assert "".join(page.classed("unreachable")) == f"Not reached: {UNREACHABLE}"
    assert "".join(page.classed("cordoned")) == f"Cordoned: {CORDON_REASON}"
    assert "base: error: base: preflight refused the inventory" in "".join(page.classed("error"))
    sections = [attrs["id"] for tag, attrs in page.tags if tag == "section"]
    # Numbered in the table's order (sorted names); lab-clean, the third, has none.
    assert sections == ["node-0", "node-1", "node-3", "node-4", "node-5"], "a section for each node but lab-clean"
    links = {attrs["href"] for tag, attrs in page.tags if tag == "a"}
    assert links == {f"#{section}" for section in sections}, "each node's cells that are not ok link to its section"
    assert "serve: vllm_service_instances is empty" in "".join(page.classed("not-declared"))


def test_hostile_values_are_text_and_the_page_needs_nothing_from_elsewhere() -> None:
    html = to_html(fleet())
    page = Page(html)
    tags = [tag for tag, _ in page.tags]
    assert tags.count("style") == 1
    for forbidden in ("script", "img", "link", "iframe", "object", "embed", "b", "base"):
        assert forbidden not in tags, forbidden
    for tag, attrs in page.tags:
        assert "src" not in attrs and not any(name.startswith("on") for name in attrs), (tag, attrs)
        assert (attrs.get("href") or "#").startswith("#"), (tag, attrs)
    text = page.joined()
    for hostile in (HOSTILE_NODE, HOSTILE_VALUE, UNREACHABLE, CORDON_REASON):
        assert hostile in text
    assert HOSTILE_NODE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "url(" not in html and "@import" not in html and "http" not in html.lower().replace("http-equiv", "")
    hostile_run = FleetReport.from_dict(fleet_document(run_id="</title><script>alert(3)</script>"))
    assert "script" not in [tag for tag, _ in Page(to_html(hostile_run)).tags]


def test_a_clean_fleet_has_no_node_sections() -> None:
    document = fleet_document()
    document["nodes"] = {"lab-clean": document["nodes"]["lab-clean"]}
    page = Page(to_html(FleetReport.from_dict(document)))
    assert [tag for tag, _ in page.tags].count("section") == 0
    assert "".join(page.classed("summary")) == "1 node1 ok0 drifted0 unreachable0 errorexit code 0"


# ---- the CLI -------------------------------------------------------------------------------------------------


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two stored drift runs; the newer one is the fleet above."""
    directory = tmp_path / "runs"
    older = fleet_document("20251129T110000-1-drift")
    older["nodes"] = {"lab-clean": older["nodes"]["lab-clean"]}
    for document in (older, fleet_document("20251129T120000-2-drift")):
        write_all(FleetReport.from_dict(document), directory / document["run_id"] / "drift", 0.0)
    monkeypatch.setenv("GPUFLEET_RUNS_DIR", str(directory))
    return directory


def test_since_with_html_writes_the_page_of_the_newer_stored_run(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "pages" / "fleet.html"
    page_path.parent.mkdir()
    assert main(["drift", "--since", "previous", "--html", str(page_path)]) == 0
    out = capsys.readouterr().out
    assert "  lab-drift: new node (drifted)" in out
    assert f"page of last (20251129T120000-2-drift) written to {page_path}" in out
    assert [row["node"] for row in Page(page_path.read_text()).rows] == sorted(fleet().nodes)
    assert sorted(path.name for path in page_path.parent.iterdir()) == ["fleet.html"], "no temporary file left"
    assert oct(page_path.stat().st_mode & 0o777) == "0o644"
    # --html alone: the page of the run --against names, written over the old page.
    assert main(["drift", "--html", str(page_path), "--against", "previous"]) == 0
    assert [row["node"] for row in Page(page_path.read_text()).rows] == ["lab-clean"]
    assert sorted(path.name for path in page_path.parent.iterdir()) == ["fleet.html"]


def test_write_page_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text("old")
    write_page(path, fleet())
    assert path.read_text() == to_html(fleet())
    assert [entry.name for entry in tmp_path.iterdir()] == ["page.html"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "missing/fleet.html",
            "--html {tmp}/missing/fleet.html: the directory {tmp}/missing does not exist; create "
            "it or give another path",
        ),
        ("a-file/fleet.html", "--html {tmp}/a-file/fleet.html: the directory {tmp}/a-file does not exist"),
        (
            "a-directory",
            "--html {tmp}/a-directory: is a directory; give the page's file name, e.g. {tmp}/a-directory/drift.html",
        ),
        # sysfs takes no new files, not even from root: the rename's temporary file cannot be made there.
        ("/sys/fleet.html", "--html /sys/fleet.html: "),
    ],
)
def test_a_page_path_that_cannot_be_written_is_one_clear_error(
    target: str, message: str, runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-directory").mkdir()
    # A path refused before anything is done is a usage error; one the kernel refuses when written, a failure.
    expected = 1 if target.startswith("/sys") else exit_codes.USAGE
    assert main(["drift", "--since", "previous", "--html", str(tmp_path / target)]) == expected
    captured = capsys.readouterr()
    assert captured.err.startswith("gpufleet: error: " + message.format(tmp=tmp_path)), captured.err
    assert len(captured.err.strip().splitlines()) == 1
    if not target.startswith("/sys"):
        assert "changes since" not in captured.out, "refused before anything else was done"
    else:  # root may write anywhere; the refusal comes when the page is written, from the kernel
        assert "cannot be written (permission denied)" in captured.err or "Permission denied" in captured.err
    assert not (tmp_path / "missing").exists()
    assert list((tmp_path / "a-directory").iterdir()) == []


# ---- headless Chromium -----------------------------------------------------------------------------------------


def decode_png(data: bytes) -> tuple[int, int, list[bytes], int]:
    """Width, height, unfiltered rows and bytes per pixel of an 8-bit RGB or RGBA non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat = 8, bytearray()
    chunks: dict[bytes, bytes] = {}
    while position < len(data):
        (length,), kind = struct.unpack(">I", data[position : position + 4]), data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IDAT":
            idat += body
        chunks.setdefault(kind, body)
        if kind == b"IEND":
            break
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour_type, interlace) in ((8, 2, 0), (8, 6, 0)), (depth, colour_type, interlace)
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    rows, previous = [], bytes(stride)
    for index in range(height):
        start = index * (stride + 1)
        row = unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, bpp)
        rows.append(row)
        previous = row
    return width, height, rows, bpp


def unfilter(kind: int, row: bytearray, previous: bytes, bpp: int) -> bytes:
    if kind == 1:  # Sub
        for i in range(bpp, len(row)):
            row[i] = (row[i] + row[i - bpp]) & 0xFF
    elif kind == 2:  # Up
        row = bytearray((a + b) & 0xFF for a, b in zip(row, previous))
    elif kind == 3:  # Average
        for i in range(len(row)):
            row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + previous[i]) // 2) & 0xFF
    elif kind == 4:  # Paeth
        for i in range(len(row)):
            a, b, c = (row[i - bpp], previous[i], previous[i - bpp]) if i >= bpp else (0, previous[i], 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    else:
        assert kind == 0, f"PNG filter type {kind}"
    return bytes(row)


def colour_counts(rows: list[bytes], bpp: int) -> Counter[tuple[int, int, int]]:
    counts: Counter[tuple[int, int, int]] = Counter()
    for row in rows:
        counts.update(zip(row[0::bpp], row[1::bpp], row[2::bpp]))
    return counts


def screenshot(page: Path, out: Path, profile: Path) -> subprocess.CompletedProcess[str]:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        pytest.fail(
            "chromium is not installed (Debian package `chromium`): scripts/install-deps.sh installs it, "
            "and `make test` runs that script first"
        )
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        # Without these it opens connections (refused here) to Google's services.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--screenshot={out}",
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def test_headless_chromium_shows_the_drifted_and_the_ok_cells_in_their_colours(tmp_path: Path) -> None:
    assert COLOURS["ok"] == "#%02x%02x%02x" % OK_RGB and COLOURS["drifted"] == "#%02x%02x%02x" % DRIFTED_RGB
    page, out = tmp_path / "fleet.html", tmp_path / "fleet.png"
    write_page(page, fleet())
    result = screenshot(page, out, tmp_path / "profile")
    assert result.returncode == 0 and out.is_file(), result.stderr[-2000:]
    width, height, rows, bpp = decode_png(out.read_bytes())
    assert (width, height) == WINDOW
    counts = colour_counts(rows, bpp)
    # A table cell is about 130 x 40 pixels; the page has 3 drifted cells and 11 ok ones (and a swatch of each
    # in the legend, a badge per drifted node). Ask for 2 and 8 cells' worth of the exact colours.
    cell = 100 * 30
    assert counts[DRIFTED_RGB] >= 2 * cell, f"drifted {DRIFTED_RGB}: {counts[DRIFTED_RGB]} pixels"
    assert counts[OK_RGB] >= 8 * cell, f"ok {OK_RGB}: {counts[OK_RGB]} pixels"
    assert counts[(255, 255, 255)] > width * height // 3, "the page's white background"
