"""The lab mirror: publishing files, the HTTP server on loopback, and the Debian pass-through cache rules."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.lab import mirror
from gpufleet.lab.config import LabConfig
from gpufleet.lab.mirror_server import (
    HEALTH_PATH,
    INDEX_TTL_SECONDS,
    SERVED_PATH,
    FreeBindServer,
    MirrorHandler,
    archive_relative_path,
    cache_is_fresh,
    is_immutable,
)


@pytest.fixture
def config(tmp_path: Path) -> LabConfig:
    return LabConfig(
        cache_dir=tmp_path / "cache", lab_dir=tmp_path / "lab", prefix="lab", inventory_path=tmp_path / "hosts.yml"
    )


@pytest.fixture
def server(config: LabConfig) -> Iterator[str]:
    """A real mirror server on an ephemeral loopback port; yields its base URL."""
    handler = partial(MirrorHandler, directory=str(mirror.mirror_dir(config)), apt_cache=config.apt_cache_dir)
    httpd = FreeBindServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def test_publish_copies_and_returns_the_url_path(config: LabConfig, tmp_path: Path) -> None:
    source = tmp_path / "driver.run"
    source.write_bytes(b"#!/bin/sh\necho hi\n")
    assert mirror.publish(source, "runfiles/driver.run", config) == "/runfiles/driver.run"
    assert (config.mirror_dir / "runfiles/driver.run").read_bytes() == source.read_bytes()
    assert mirror.publish(source, config=config) == "/driver.run"
    assert sorted(p.name for p in (config.mirror_dir / "runfiles").iterdir()) == ["driver.run"]


@pytest.mark.parametrize("name", ["../escape", "/abs/path", "debian/pool/x.deb", "debian-security/x"])
def test_publish_refuses_names_outside_the_mirror(config: LabConfig, tmp_path: Path, name: str) -> None:
    source = tmp_path / "f"
    source.write_text("x")
    with pytest.raises(GpufleetError, match="cannot publish"):
        mirror.publish(source, name, config)


def test_publish_of_a_missing_file_is_an_error(config: LabConfig, tmp_path: Path) -> None:
    with pytest.raises(GpufleetError, match="not a file"):
        mirror.publish(tmp_path / "missing", config=config)


def test_server_serves_published_files_and_health(config: LabConfig, server: str, tmp_path: Path) -> None:
    source = tmp_path / "model.bin"
    source.write_bytes(os.urandom(4096))
    path = mirror.publish(source, "models/tiny/model.bin", config)
    assert get(server + path) == source.read_bytes()
    assert get(server + HEALTH_PATH) == b"ok\n"
    assert mirror.health_check("127.0.0.1", int(server.rsplit(":", 1)[1]))


def test_the_mirror_counts_the_bytes_it_sends_per_file(config: LabConfig, server: str, tmp_path: Path) -> None:
    """What a fleet costs the mirror per artifact (issue 37: one copy per rack behind rack caches)."""
    source = tmp_path / "model.tar.gz"
    source.write_bytes(os.urandom(10_000))
    path = mirror.publish(source, "models/tiny model.tar.gz", config)
    before = json.loads(get(server + SERVED_PATH))
    get(server + "/models/tiny%20model.tar.gz?sha256=" + "0" * 64)
    get(server + "/models/tiny%20model.tar.gz")
    head = urllib.request.Request(server + "/models/tiny%20model.tar.gz", method="HEAD")
    urllib.request.urlopen(head, timeout=5).close()
    served = json.loads(get(server + SERVED_PATH))
    assert served[path] - before.get(path, 0) == 20_000  # two bodies; a HEAD sends none, a query is the same file


def test_pass_through_serves_a_cached_package_without_upstream(config: LabConfig, server: str) -> None:
    cached = config.apt_cache_dir / "debian/pool/main/j/jq/jq_1.6-2.1+deb12u3_amd64.deb"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"a cached package")
    # apt percent-encodes "+": both spellings hit the same cache entry.
    assert get(server + "/debian/pool/main/j/jq/jq_1.6-2.1%2bdeb12u3_amd64.deb") == b"a cached package"
    assert get(server + "/debian/pool/main/j/jq/jq_1.6-2.1+deb12u3_amd64.deb") == b"a cached package"


def test_head_of_a_cached_package_gives_its_length(config: LabConfig, server: str) -> None:
    cached = config.apt_cache_dir / "debian/pool/main/a/a/a_1_amd64.deb"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"12345")
    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    connection.request("HEAD", "/debian/pool/main/a/a/a_1_amd64.deb")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Length") == "5"
    assert response.read() == b""


def test_traversal_out_of_the_mirror_is_refused(config: LabConfig, server: str) -> None:
    (config.cache_dir / "secret").write_text("nope")
    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    connection.request("GET", "/../secret")
    response = connection.getresponse()
    assert response.status == 404 and b"nope" not in response.read()


@pytest.mark.parametrize(
    ("url_path", "expected"),
    [
        ("/debian/pool/main/j/jq/jq_1.6_amd64.deb", "debian/pool/main/j/jq/jq_1.6_amd64.deb"),
        ("/debian-security/dists/bookworm-security/InRelease", "debian-security/dists/bookworm-security/InRelease"),
        ("/debian/dists/bookworm/Release?x=1", "debian/dists/bookworm/Release"),
        ("/debian/../etc/passwd", None),
        ("/debian/%2e%2e/etc/passwd", None),
        ("/debian/./dists", None),
        ("/debian//dists", None),
        ("/debian/", None),
        ("/ubuntu/dists/noble/Release", None),
        ("/runfiles/x.run", None),
        ("/debian/pool/a b.deb", None),
    ],
)
def test_archive_paths(url_path: str, expected: str | None) -> None:
    assert archive_relative_path(url_path) == expected


def test_packages_are_cached_forever_indexes_for_a_while(tmp_path: Path) -> None:
    package = "debian/pool/main/j/jq/jq_1.6_amd64.deb"
    index = "debian/dists/bookworm/InRelease"
    assert is_immutable(package) and is_immutable("debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/ab")
    assert not is_immutable(index)
    old = tmp_path / "old"
    old.write_text("x")
    past = time.time() - INDEX_TTL_SECONDS - 5
    os.utime(old, (past, past))
    now = time.time()
    assert cache_is_fresh(old, package, now)
    assert not cache_is_fresh(old, index, now)
    assert not cache_is_fresh(tmp_path / "missing", package, now)
    fresh = tmp_path / "fresh"
    fresh.write_text("x")
    assert cache_is_fresh(fresh, index, now)


def test_status_without_a_mirror(config: LabConfig) -> None:
    current = mirror.status(config)
    assert not current.running and not current.healthy and current.addresses == ()
