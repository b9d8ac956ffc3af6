"""The lab mirror's file serving against a real server on loopback: no listings, nothing outside its root
through a symlink, and an answer (not a dead connection) for NUL and other odd bytes in a path."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gpufleet.lab.mirror_server import FreeBindServer, MirrorHandler, mirror_file


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "mirror"
    (root / "runfiles").mkdir(parents=True)
    (root / "runfiles" / "driver.run").write_bytes(b"#!/bin/sh\n")
    (root / "simple" / "vllm").mkdir(parents=True)
    (root / "simple" / "vllm" / "index.html").write_text('<a href="vllm-1.whl">vllm-1.whl</a>\n')
    (tmp_path / "secret").write_text("controller secret\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "key").write_text("controller key\n")
    return root


@pytest.fixture
def server(root: Path, tmp_path: Path) -> Iterator[tuple[str, int]]:
    handler = partial(MirrorHandler, directory=str(root), apt_cache=tmp_path / "apt")
    httpd = FreeBindServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield "127.0.0.1", httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def get(server: tuple[str, int], path: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(*server, timeout=5)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def raw_request(server: tuple[str, int], request_line: bytes) -> bytes:
    """Sends a request line as bytes (http.client refuses control characters) and returns the answer."""
    with socket.create_connection(server, timeout=5) as connection:
        connection.sendall(request_line + b"\r\nHost: mirror\r\n\r\n")
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_files_and_indexes_are_served(server: tuple[str, int]) -> None:
    assert get(server, "/runfiles/driver.run")[::2] == (200, b"#!/bin/sh\n")
    status, headers, body = get(server, "/simple/vllm/")
    assert status == 200 and headers["Content-Type"] == "text/html" and b"vllm-1.whl" in body
    status, headers, _ = get(server, "/simple/vllm")
    assert status == 301 and headers["Location"] == "/simple/vllm/"


@pytest.mark.parametrize("path", ["/", "/runfiles/", "/runfiles", "/simple/"])
def test_directories_are_not_listed(server: tuple[str, int], path: str) -> None:
    status, _, body = get(server, path)
    assert status == 404 and b"driver.run" not in body and b"vllm" not in body


def test_symlinks_out_of_the_root_are_not_followed(server: tuple[str, int], root: Path, tmp_path: Path) -> None:
    (root / "runfiles" / "planted").symlink_to(tmp_path / "secret")
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "runfiles" / "same.run").symlink_to(root / "runfiles" / "driver.run")
    for path in ("/runfiles/planted", "/escape/key", "/escape/"):
        status, _, body = get(server, path)
        assert status == 404 and b"controller" not in body, path
    # A link that stays inside the mirror is an ordinary file of it.
    assert get(server, "/runfiles/same.run")[0] == 200


@pytest.mark.parametrize(
    "line",
    [
        b"GET /runfiles/driver.run%00 HTTP/1.0",
        b"GET /run\x00files HTTP/1.0",
        b"GET /%ff%fe HTTP/1.0",
        b"GET /\xff\xfe HTTP/1.0",
        b"GET /a%0d%0aX: y HTTP/1.0",
        b"GET /%2e%2e/secret HTTP/1.0",
        b"GET /runfiles/%2e%2e/%2e%2e/secret HTTP/1.0",
    ],
)
def test_odd_bytes_get_an_answer_and_the_server_goes_on(server: tuple[str, int], line: bytes) -> None:
    answer = raw_request(server, line)
    assert answer.split(b" ", 2)[1] in (b"400", b"404"), answer[:200]
    assert b"controller" not in answer
    assert get(server, "/runfiles/driver.run")[0] == 200


def test_mirror_file_names_only_files_under_the_root(root: Path, tmp_path: Path) -> None:
    (root / "link").symlink_to(tmp_path)
    assert mirror_file(root, "/runfiles/driver.run?x=1") == (root / "runfiles" / "driver.run").resolve()
    assert mirror_file(root, "/simple/vllm/") == (root / "simple" / "vllm" / "index.html").resolve()
    for path in ("/link/secret", "/runfiles/", "/runfiles/driver.run%00", "/%ff", "/missing", "/../secret"):
        assert mirror_file(root, path) is None, path
