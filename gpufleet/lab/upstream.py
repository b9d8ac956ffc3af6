"""The lab's upstream: NVIDIA's, python.org's and GitHub's download paths served on loopback from what the lab's
builders made, so the lab mirror is filled by `gpufleet mirror sync` as an operator's is (issue 35).

The builders (lab/runfiles/build.py, lab/builders/python_stack.py) stage their files in
${GPUFLEET_CACHE}/lab-upstream in the mirror's layout (nvidia/, python/, pyenv/, sdists/). `fill_mirror` serves each
staged file at the path its upstream has (data/mirror/upstreams.csv, the table sync reads) and runs mirror sync's
own code for the lab inventory against it: every file the inventory's stacks need is downloaded, checked against
its pin and recorded in the mirror's manifest.json. Staged files that no lab stack declares (the upgrade targets
and fabric manager archives some lab tests install, the stand-in kernel sdist, the pins file) are published as they
are, as an operator would put a file in the mirror by hand.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufleet import mirror_sync
from gpufleet.digests import sha256_file
from gpufleet.lab import mirror
from gpufleet.lab.config import LabConfig, load_config
from gpufleet.upstreams import Upstream, load_upstreams

Say = Callable[[str], None]
RANGE = re.compile(r"^bytes=(\d+)-$")


def upstream_dir(config: LabConfig | None = None) -> Path:
    """Where the builders stage what the lab's upstream serves (created if missing)."""
    path = (config or load_config()).cache_dir / "lab-upstream"
    path.mkdir(parents=True, exist_ok=True)
    return path


def stage(source: Path, name: str, config: LabConfig | None = None) -> Path:
    """Copies a builder's file into the lab's upstream as NAME (its path in the mirror's layout)."""
    return mirror.place(source, upstream_dir(config), name)


def routes(root: Path, upstreams: list[Upstream]) -> dict[str, Path]:
    """URL path -> staged file, for every staged file an upstream row names (its kind is the first path segment,
    so each kind's base URL is http://HOST:PORT/KIND)."""
    table: dict[str, Path] = {}
    for path in sorted(p for p in root.glob("*/*") if p.is_file()):
        row = next(
            (row for row in upstreams if row.mirror_dir == path.parent.name and row.fields(path.name) is not None),
            None,
        )
        if row is not None and row.checksum_kind == "none":
            table[urlsplit(row.url(path.name, f"/{row.kind}")).path] = path
    return table


class UpstreamStandIn:
    """A loopback server of the staged files at their upstream paths, with Range requests (sync resumes with
    them); it records each request's path and Range header."""

    def __init__(self, root: Path, upstreams: list[Upstream] | None = None) -> None:
        self.upstreams = upstreams if upstreams is not None else load_upstreams()
        self.routes = routes(root, self.upstreams)
        self.requests: list[tuple[str, str]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
                stand_in.requests.append((self.path, self.headers.get("Range", "")))
                path = stand_in.routes.get(urlsplit(self.path).path)
                if path is None:
                    self.send_error(404)
                    return
                data = path.read_bytes()
                start = RANGE.match(self.headers.get("Range", ""))
                offset = int(start.group(1)) if start else 0
                if offset >= len(data) > 0:
                    self.send_error(416)
                    return
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {offset}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - offset))
                self.end_headers()
                self.wfile.write(data[offset:])

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def overrides(self) -> dict[str, str]:
        """--upstream-override of every kind served here."""
        return {row.kind: f"{self.base}/{row.kind}" for row in self.upstreams if row.checksum_kind == "none"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fill_mirror(config: LabConfig | None = None, say: Say = print) -> mirror_sync.SyncReport | None:
    """The lab mirror filled from the lab's upstream: mirror sync for what the lab inventory declares, the rest of
    the staged files published as they are. Without a lab inventory yet (`gpufleet lab up` writes it) every staged
    file is published as it is, and sync runs with the next builder after the lab is up."""
    config = config or load_config()
    root = upstream_dir(config)
    target = mirror.mirror_dir(config)
    report = None
    if config.inventory_path.is_file():
        stand_in = UpstreamStandIn(root)
        try:
            needs = mirror_sync.needs_of_inventory(config.inventory_path)
            staged = {str(path.relative_to(root)) for path in stand_in.routes.values()}
            waiting = [needed.path for needed in needs.files if needed.path not in staged]
            needs.files = [needed for needed in needs.files if needed.path in staged]
            needs.models, needs.models_not_synced, needs.venvs = [], [], []  # the lab's model is built, not fetched
            report = mirror_sync.sync(needs, target, overrides=stand_in.overrides(), say=say)
            say(report.render())
            for relative in waiting:
                say(f"{relative}: not staged yet in {root}: its builder stages it, and the next fill syncs it")
        finally:
            stand_in.close()
    synced = set(report_paths(report))
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = str(path.relative_to(root))
        published = target / relative
        if relative not in synced and not (published.is_file() and sha256_file(published) == sha256_file(path)):
            mirror.place(path, target, relative)
            say(f"{relative}: published as it is (no lab stack declares it for mirror sync)")
    return report


def report_paths(report: mirror_sync.SyncReport | None) -> list[str]:
    if report is None:
        return []
    return [outcome.path for outcome in report.downloaded + report.present]
