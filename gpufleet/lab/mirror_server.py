"""The lab artifact mirror: serves the mirror directory and passes Debian's archive through a cache.

Run as `python -m gpufleet.lab.mirror_server --root DIR --apt-cache DIR --bind ADDR [--bind ADDR ...] --port N --pid-file FILE`.
Paths under /debian/ and /debian-security/ are fetched from deb.debian.org once and kept in the apt cache
(packages forever, index files for a few minutes); every other path is a file under the mirror directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpufleet.lab.procs import write_pid_file

UPSTREAM = "http://deb.debian.org"
PASS_THROUGH_ROOTS = ("debian", "debian-security")
HEALTH_PATH = "/_gpufleet/health"
# Bytes of each mirror file sent since the server started, by URL path (a JSON object): what a fleet costs the
# mirror per artifact (a rack cache in front of it should make that one copy per rack).
SERVED_PATH = "/_gpufleet/served"
# Release files and package lists change; re-fetch them after this long. Packages never change.
INDEX_TTL_SECONDS = 600
UPSTREAM_TIMEOUT_SECONDS = 60
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._~+:/-]*$")


def archive_relative_path(url_path: str) -> str | None:
    """The archive path ("debian/pool/...") for a pass-through request, or None for a mirror-dir path."""
    # Cache under the decoded name: apt asks for "a%2bb.deb", other clients for "a+b.deb".
    path = urllib.parse.unquote(url_path.split("?", 1)[0])
    parts = path.lstrip("/").split("/")
    if not _SAFE_PATH.match(path) or any(part in ("", ".", "..") for part in parts):
        return None
    if parts[0] not in PASS_THROUGH_ROOTS or len(parts) < 2:
        return None
    return "/".join(parts)


def mirror_file(root: Path, url_path: str) -> Path | None:
    """The regular file under `root` a request names (a directory's index.html), or None.

    None for a path that is not UTF-8, holds NUL or other control characters or a "." / ".." segment, names
    nothing, or leads, through a symlink anywhere on the way, outside the mirror directory.
    """
    try:
        path = urllib.parse.unquote(url_path.split("?", 1)[0].split("#", 1)[0], errors="strict")
    except UnicodeDecodeError:
        return None
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        return None
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        return None
    real_root = root.resolve()
    target = real_root.joinpath(*parts).resolve()
    if target != real_root and real_root not in target.parents:
        return None
    if target.is_dir():
        target = (target / "index.html").resolve()
        if real_root not in target.parents:
            return None
    return target if target.is_file() else None


def is_immutable(relative: str) -> bool:
    """Packages and by-hash index files never change under the same name; everything else may."""
    return "/pool/" in relative or "/by-hash/" in relative


def cache_is_fresh(path: Path, relative: str, now: float) -> bool:
    if not path.is_file():
        return False
    return is_immutable(relative) or now - path.stat().st_mtime < INDEX_TTL_SECONDS


def fetch_upstream(relative: str, destination: Path) -> int:
    """Downloads UPSTREAM/relative into destination atomically; returns the HTTP status."""
    request = urllib.request.Request(
        f"{UPSTREAM}/{urllib.parse.quote(relative)}", headers={"User-Agent": "gpufleet-lab-mirror"}
    )
    try:
        with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_SECONDS) as response:
            destination.parent.mkdir(parents=True, exist_ok=True)
            partial_path = destination.with_name(f".{destination.name}.{threading.get_ident()}.part")
            with partial_path.open("wb") as handle:
                shutil.copyfileobj(response, handle, 1 << 20)
            os.replace(partial_path, destination)
            return 200
    except urllib.error.HTTPError as error:
        return error.code


class ServedBytes:
    """Bytes sent per mirror path, counted by every request thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = {}

    def add(self, path: str, count: int) -> None:
        with self._lock:
            self._bytes[path] = self._bytes.get(path, 0) + count

    def as_json(self) -> bytes:
        with self._lock:
            return json.dumps(self._bytes, sort_keys=True).encode() + b"\n"


SERVED = ServedBytes()


class MirrorHandler(SimpleHTTPRequestHandler):
    """Files from the mirror directory, plus the cached pass-through of Debian's archive."""

    apt_cache: Path
    server_version = "gpufleet-lab-mirror"

    def __init__(self, *args, apt_cache: Path, **kwargs) -> None:
        self.apt_cache = apt_cache
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
        self.handle_request(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self.handle_request(send_body=False)

    def handle_request(self, send_body: bool) -> None:
        if self.path == HEALTH_PATH:
            self.send_bytes(b"ok\n", send_body)
            return
        if self.path == SERVED_PATH:
            self.send_bytes(SERVED.as_json(), send_body)
            return
        relative = archive_relative_path(self.path)
        if relative is not None:
            self.pass_through(relative, send_body)
            return
        self.serve_mirror_file(send_body)

    def serve_mirror_file(self, send_body: bool) -> None:
        """A file of the mirror directory; never a listing, never a file outside it."""
        target = mirror_file(Path(self.directory), self.path)
        if target is None:
            self.send_error(404)
            return
        path_part = self.path.split("?", 1)[0]
        if target.name == "index.html" and not path_part.endswith(("/", "/index.html")):
            # Relative links in an index (pip's simple pages) resolve against a URL ending in "/".
            self.send_response(301)
            self.send_header("Location", path_part + "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        sent = self.send_file(target, send_body, self.guess_type(str(target)))
        SERVED.add(urllib.parse.unquote(path_part), sent)

    def pass_through(self, relative: str, send_body: bool) -> None:
        cached = self.apt_cache / relative
        if not cache_is_fresh(cached, relative, time.time()):
            try:
                status = fetch_upstream(relative, cached)
            except (urllib.error.URLError, OSError) as error:
                # Upstream unreachable: a stale index is better than none.
                status = 200 if cached.is_file() else 502
                self.log_message("upstream error for %s: %s", relative, error)
            if status != 200:
                self.send_error(status)
                return
        self.send_file(cached, send_body)

    def send_file(self, path: Path, send_body: bool, content_type: str = "application/octet-stream") -> int:
        """Sends the file (its headers only without send_body); the bytes of its body sent."""
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(size))
            self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
            self.end_headers()
            if not send_body:
                return 0
            shutil.copyfileobj(handle, self.wfile, 1 << 20)
            return size

    def send_bytes(self, body: bytes, send_body: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)


class FreeBindServer(ThreadingHTTPServer):
    """Binds even before the address exists, so a host re-created later is served without a restart."""

    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        super().server_bind()


def serve(root: Path, apt_cache: Path, addresses: Sequence[str], port: int) -> None:
    handler = partial(MirrorHandler, directory=str(root), apt_cache=apt_cache)
    servers = [FreeBindServer((address, port), handler) for address in addresses]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"mirror serving {root} on {', '.join(addresses)} port {port}", flush=True)
    while not stop.wait(1):
        pass
    for server in servers:
        server.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--apt-cache", required=True, type=Path)
    parser.add_argument("--bind", required=True, action="append", dest="addresses")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--pid-file", required=True, type=Path)
    args = parser.parse_args(argv)
    write_pid_file(args.pid_file, os.getpid())
    args.root.mkdir(parents=True, exist_ok=True)
    args.apt_cache.mkdir(parents=True, exist_ok=True)
    serve(args.root, args.apt_cache, args.addresses, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
