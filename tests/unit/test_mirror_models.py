"""Models in `gpufleet mirror sync`: fetched by the official huggingface_hub client from a loopback stand-in of the
Hub, packed into the tarball model_store unpacks, the same bytes every time.

The stand-in answers what huggingface_hub 2.4's snapshot_download calls for a commit revision (read from its
source: _snapshot_download.py, file_download.py, hf_api.py): `GET /api/models/{repo}/tree/{commit}?recursive=...`
(the revision listing; a commit needs no /revision call), then per file `HEAD /{repo}/resolve/{commit}/{path}`
(X-Repo-Commit, ETag, Content-Length; for an LFS file a 302 to another host with X-Linked-Etag and
X-Linked-Size, as the Hub redirects to its CDN) and the GET of the file or of the redirect's target. The "CDN" is
a second server on 127.0.0.2; nothing here reaches beyond the loopback network.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from ansible_collections.gpufleet.fleet.plugins.filter.gpufleet_mirror import mirror_models
from ansible_collections.gpufleet.fleet.plugins.modules.archive_members import screen

from gpufleet import PROJECT_ROOT, exit_codes, mirror_models as models_sync, mirror_sync
from gpufleet.errors import GpufleetError
from gpufleet.fleet_plan import HostPlan
from gpufleet.mirror_models import ModelNeeded, TreeFile
from gpufleet.mirror_sync import Needs

REPO = "gpufleet-test/tiny-model"
COMMIT = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c"
OTHER_COMMIT = "0" * 39 + "1"
TOKEN = "hf_testtoken_never_printed_0123456789"
LFS_FILES = {"model.safetensors"}


def tiny_model() -> dict[str, bytes]:
    """A small model's repository: config, a safetensors-shaped weight file (LFS on the Hub), tokenizer files."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": [64, 64], "data_offsets": [0, 8192]}}).encode()
    weights = len(header).to_bytes(8, "little") + header + bytes(range(256)) * 32
    return {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "config.json": json.dumps({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64}, indent=2).encode(),
        "generation_config.json": b'{"temperature": 0.7}\n',
        "model.safetensors": weights,
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}).encode(),
        "tokenizer_config.json": b'{"eos_token": "<|im_end|>"}\n',
        "extra/README.txt": b"a nested file\n",
    }


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HubStandIn:
    """The Hub's endpoints snapshot_download uses, for repos held in memory, and an LFS "CDN" on 127.0.0.2."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {REPO: {COMMIT: tiny_model()}}
        self.gated: set[str] = set()
        self.tampered: dict[str, bytes] = {}  # LFS sha256 -> other bytes the CDN sends instead
        self.requests: list[dict[str, Any]] = []
        hub = self

        class Hub(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hub.answer(self, body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                hub.answer(self, body=False)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        class Cdn(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hub.record(self, "cdn")
                oid = urlsplit(self.path).path.rsplit("/", 1)[-1]
                data = hub.lfs_blob(oid)
                if data is None:
                    self.send_error(404)
                    return
                hub.send(self, 200, {"Content-Length": str(len(data))}, data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
        self.cdn = ThreadingHTTPServer(("127.0.0.2", 0), Cdn)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.cdn_base = f"http://127.0.0.2:{self.cdn.server_address[1]}"
        for server in (self.server, self.cdn):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.server, self.cdn):
            server.shutdown()
            server.server_close()

    # what the stand-in holds

    def lfs_blob(self, oid: str) -> bytes | None:
        if oid in self.tampered:
            return self.tampered[oid]
        for revisions in self.repos.values():
            for files in revisions.values():
                for path, data in files.items():
                    if path in LFS_FILES and sha(data) == oid:
                        return data
        return None

    def tree(self, files: dict[str, bytes]) -> list[dict[str, Any]]:
        entries = []
        for path, data in sorted(files.items()):
            entry: dict[str, Any] = {"type": "file", "oid": git_blob(data), "size": len(data), "path": path}
            if path in LFS_FILES:
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha(data)}\nsize {len(data)}\n"
                entry["oid"] = git_blob(pointer.encode())
                entry["lfs"] = {"oid": sha(data), "size": len(data), "pointerSize": len(pointer)}
            entries.append(entry)
        return entries

    # answering

    def record(self, handler: BaseHTTPRequestHandler, server: str) -> None:
        self.requests.append(
            {
                "server": server,
                "method": handler.command,
                "path": unquote(urlsplit(handler.path).path),
                "authorization": handler.headers.get("Authorization"),
            }
        )

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        if body and handler.command != "HEAD":
            handler.wfile.write(body)

    def error(self, handler: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        """The Hub's error shape: the status, X-Error-Code and X-Error-Message, and a JSON body."""
        body = json.dumps({"error": message}).encode()
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        self.send(handler, status, {**headers, "Content-Length": str(len(body))}, body)

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        self.record(handler, "hub")
        path = unquote(urlsplit(handler.path).path)
        if path.startswith("/api/models/"):
            owner, name, kind, revision = path[len("/api/models/") :].split("/")[:4]
            repo, filename = f"{owner}/{name}", ""
        else:
            owner, name, kind, revision, *rest = path.lstrip("/").split("/")
            repo, filename = f"{owner}/{name}", "/".join(rest)
        if repo not in self.repos:
            self.error(handler, 401, "RepoNotFound", "Repository not found")
            return
        if repo in self.gated and handler.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.error(handler, 403, "GatedRepo", "Access to model is restricted: you must have access to it")
            return
        files = self.repos[repo].get(revision)
        if files is None:
            self.error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if kind == "tree":
            listing = json.dumps(self.tree(files)).encode()
            self.send(handler, 200, {"Content-Type": "application/json", "Content-Length": str(len(listing))}, listing)
            return
        if kind != "resolve" or filename not in files:
            self.error(handler, 404, "EntryNotFound", f"{filename} does not exist on {revision}")
            return
        data = files[filename]
        headers = {"X-Repo-Commit": revision, "Accept-Ranges": "bytes"}
        if filename in LFS_FILES:
            # The Hub redirects an LFS file to its CDN (another host, which the client reaches without the token).
            location = f"{self.cdn_base}/lfs/{sha(data)}"
            headers |= {
                "Location": location,
                "X-Linked-Etag": f'"{sha(data)}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{git_blob(data)}"',
                "Content-Length": "0",
            }
            self.send(handler, 302, headers)
            return
        headers |= {"ETag": f'"{git_blob(data)}"', "Content-Length": str(len(data))}
        self.send(handler, 200, headers, data if body else b"")

    def hub_requests(self) -> list[dict[str, Any]]:
        return [request for request in self.requests if request["server"] == "hub"]


@pytest.fixture(autouse=True)
def isolated_hub_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No telemetry, not offline, a throwaway HF_HOME and no token or endpoint of the machine running the tests,
    no proxies: the client reaches the stand-in on the loopback address only."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    # The client read these when it was first imported: point them at the throwaway home too.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))


@pytest.fixture
def hub() -> Iterator[HubStandIn]:
    server = HubStandIn()
    yield server
    server.close()


def model(sha256: str = "", revision: str = COMMIT, path: str = "models/tiny.tar.gz") -> ModelNeeded:
    return ModelNeeded(path, ("tiny",), REPO, revision, sha256, placeholder=not sha256)


def run_sync(hub: HubStandIn, mirror: Path, *models: ModelNeeded) -> tuple[mirror_sync.SyncReport, list[str]]:
    lines: list[str] = []
    report = mirror_sync.sync(Needs(models=list(models)), mirror, [], {"model": hub.base}, say=lines.append)
    return report, lines


def extract_as_model_store(tarball: Path, into: Path) -> None:
    """What the role does with a tarball (tasks/stage.yml): screen its members (module archive_members, links
    refused, strip_components 0), then unpack it with GNU tar, as ansible.builtin.unarchive does."""
    screen(str(tarball), 0, "refuse")
    into.mkdir()
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(into)], check=True)


# --- sync ----------------------------------------------------------------------------------------------------


def test_a_sync_fetches_the_revision_with_the_hub_client_and_packs_it(hub: HubStandIn, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    report, lines = run_sync(hub, mirror, model())
    tarball = mirror / "models" / "tiny.tar.gz"
    assert tarball.is_file() and not list(mirror.rglob("*.partial"))
    # The staging directory (the client's files and its cache) goes once the tarball is packed.
    assert not (mirror / models_sync.STAGING_DIR).exists()
    entry = json.loads((mirror / "manifest.json").read_text())["files"]["models/tiny.tar.gz"]
    assert entry["url"] == f"{hub.base}/{REPO}/tree/{COMMIT}"
    assert entry["sha256"] == sha(tarball.read_bytes()) and entry["size"] == tarball.stat().st_size
    assert entry["checksum_source"].startswith(f"huggingface revision {COMMIT}: every file checked against")
    # The client's own requests: the tree listing, a HEAD per file, the LFS file from the "CDN" without the token.
    paths = [(request["server"], request["method"], request["path"]) for request in hub.requests]
    assert ("hub", "GET", f"/api/models/{REPO}/tree/{COMMIT}") in paths
    assert ("hub", "HEAD", f"/{REPO}/resolve/{COMMIT}/config.json") in paths
    assert ("hub", "GET", f"/{REPO}/resolve/{COMMIT}/extra/README.txt") in paths
    assert sum(server == "cdn" for server, _, _ in paths) == 1
    assert any(line.startswith("[1/1] models/tiny.tar.gz: packed from") for line in lines)
    # No pin in the inventory: the sha256 to write is reported, with the revision it was packed from.
    assert report.model_pins == [("tiny", entry["sha256"], f"{REPO}@{COMMIT}")]
    assert f'  tiny: sha256: "{entry["sha256"]}"  # packed from {REPO}@{COMMIT}' in report.render()


def test_the_tarball_unpacks_as_model_store_unpacks_it(hub: HubStandIn, tmp_path: Path) -> None:
    run_sync(hub, tmp_path / "mirror", model())
    tarball = tmp_path / "mirror" / "models" / "tiny.tar.gz"
    extract_as_model_store(tarball, tmp_path / "staged")
    expected = tiny_model()
    unpacked = {
        path.relative_to(tmp_path / "staged").as_posix(): path.read_bytes()
        for path in (tmp_path / "staged").rglob("*")
        if path.is_file()
    }
    assert unpacked == expected  # the repository's files at the top: strip_components 0, as the role defaults
    with tarfile.open(tarball) as archive:
        members = archive.getmembers()
    assert [member.name for member in members] == sorted(expected)
    assert {(m.type, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
        (tarfile.REGTYPE, 0o644, 0, 0, 0, "", "")
    }
    raw = tarball.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\0\0\0\0"  # gzip, mtime 0
    assert gzip.decompress(raw)  # a valid gzip stream, CRC and size included
    subprocess.run(["gzip", "-t", str(tarball)], check=True)


def test_the_same_revision_packs_to_the_same_sha256(hub: HubStandIn, tmp_path: Path) -> None:
    first, _ = run_sync(hub, tmp_path / "one", model())
    second, _ = run_sync(hub, tmp_path / "two", model())
    assert first.downloaded[0].entry.sha256 == second.downloaded[0].entry.sha256
    # Nor do the fetched files' mtimes, modes or the order they were written in change the bytes.
    files = tiny_model()
    tree = [TreeFile(path, len(data), git_blob(data)) for path, data in files.items()]
    digests = set()
    for run, order in enumerate((sorted(files), sorted(files, reverse=True))):
        root = tmp_path / f"root-{run}"
        for index, path in enumerate(order):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(files[path])
            os.chmod(root / path, 0o600 if run else 0o664)
            os.utime(root / path, (1_000_000 + index * 7919, 1_000_000 + index * 7919))
        with (tmp_path / f"packed-{run}.tar.gz").open("wb") as out:
            digest, size = models_sync.pack(list(reversed(tree)) if run else tree, root, out)
        assert size == (tmp_path / f"packed-{run}.tar.gz").stat().st_size
        digests.add(digest)
    assert len(digests) == 1


def test_a_second_sync_does_not_contact_the_hub(hub: HubStandIn, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    run_sync(hub, mirror, model())
    before = len(hub.requests)
    report, lines = run_sync(hub, mirror, model())
    assert len(hub.requests) == before
    assert not report.downloaded and len(report.present) == 1
    assert "nothing downloaded: 1 of 1 already present" in report.render()
    assert any("present, sha256 checked against huggingface revision" in line for line in lines)


def test_a_bandwidth_limit_bounds_the_hub_clients_downloads(hub: HubStandIn, tmp_path: Path) -> None:
    size = sum(len(data) for data in tiny_model().values())
    started = time.monotonic()
    run_sync(hub, tmp_path / "free", model())
    free = time.monotonic() - started
    started = time.monotonic()
    mirror_sync.sync(Needs(models=[model()]), tmp_path / "limited", [], {"model": hub.base}, limit_rate=size // 2)
    limited = time.monotonic() - started  # two seconds' worth of the files' bytes
    assert limited >= 1.5 and limited > free, (free, limited)
    assert (tmp_path / "limited" / "models" / "tiny.tar.gz").read_bytes() == (
        tmp_path / "free" / "models" / "tiny.tar.gz"
    ).read_bytes()
    from huggingface_hub import constants

    assert not constants.HF_HUB_DISABLE_XET  # put back after the sync


def test_a_pinned_tarball_already_there_is_kept_without_the_hub(hub: HubStandIn, tmp_path: Path) -> None:
    first, _ = run_sync(hub, tmp_path / "mirror", model())
    pinned = first.downloaded[0].entry.sha256
    (tmp_path / "mirror" / "manifest.json").unlink()  # a lost manifest: the pin alone vouches for the file
    before = len(hub.requests)
    report, _ = run_sync(hub, tmp_path / "mirror", model(sha256=pinned))
    assert len(hub.requests) == before and len(report.present) == 1 and not report.model_pins
    entry = json.loads((tmp_path / "mirror" / "manifest.json").read_text())["files"]["models/tiny.tar.gz"]
    assert entry["sha256"] == pinned and entry["checksum_source"] == models_sync.PIN_SOURCE


def test_another_revision_is_packed_again(hub: HubStandIn, tmp_path: Path) -> None:
    hub.repos[REPO][OTHER_COMMIT] = {**tiny_model(), "config.json": b'{"hidden_size": 128}'}
    mirror = tmp_path / "mirror"
    first, _ = run_sync(hub, mirror, model())
    second, _ = run_sync(hub, mirror, model(revision=OTHER_COMMIT))
    assert len(second.downloaded) == 1 and second.downloaded[0].entry.sha256 != first.downloaded[0].entry.sha256


# --- bad input -----------------------------------------------------------------------------------------------


def test_a_revision_that_does_not_exist_is_one_line_naming_the_model_and_the_fix(
    hub: HubStandIn, tmp_path: Path
) -> None:
    with pytest.raises(GpufleetError) as raised:
        run_sync(hub, tmp_path / "mirror", model(revision=OTHER_COMMIT))
    failure = str(raised.value).splitlines()[1:]
    assert failure == [
        f"models/tiny.tar.gz (model tiny): {REPO} on {hub.base} has no revision {OTHER_COMMIT}: hf_revision must "
        "be a commit of that repository (copy the full commit id from its history), or correct hf_repo"
    ]
    assert not (tmp_path / "mirror" / "models" / "tiny.tar.gz").exists()


def test_a_repository_that_does_not_exist_names_hf_repo_and_the_token(hub: HubStandIn, tmp_path: Path) -> None:
    missing = ModelNeeded("models/tiny.tar.gz", ("tiny",), "gpufleet-test/no-such-model", COMMIT)
    with pytest.raises(GpufleetError, match=r"gpufleet-test/no-such-model on .* cannot be found: check hf_repo"):
        run_sync(hub, tmp_path / "mirror", missing)


def test_a_pinned_sha256_mismatch_is_refused_and_the_old_tarball_kept(hub: HubStandIn, tmp_path: Path) -> None:
    target = tmp_path / "mirror" / "models" / "tiny.tar.gz"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"the tarball the mirror held before")
    wrong = "1" * 64
    with pytest.raises(GpufleetError) as raised:
        run_sync(hub, tmp_path / "mirror", model(sha256=wrong))
    (line,) = str(raised.value).splitlines()[1:]
    assert "packs to sha256 " in line and f"but the inventory pins {wrong}: refused (the mirror keeps" in line
    assert target.read_bytes() == b"the tarball the mirror held before"
    assert not list(target.parent.glob("*.partial"))


def test_a_hub_file_that_is_not_the_revisions_is_refused(hub: HubStandIn, tmp_path: Path) -> None:
    weights = tiny_model()["model.safetensors"]
    hub.tampered[sha(weights)] = bytes(len(weights))  # the right size, other bytes
    with pytest.raises(GpufleetError, match=r"model.safetensors: has sha256 [0-9a-f]{64}, the revision's LFS") as e:
        run_sync(hub, tmp_path / "mirror", model())
    assert "nothing replaced" in str(e.value)
    assert not (tmp_path / "mirror" / "models" / "tiny.tar.gz").exists()
    # The refused file is gone from staging, the others stay: a good upstream then completes the sync.
    del hub.tampered[sha(weights)]
    report, _ = run_sync(hub, tmp_path / "mirror", model())
    assert len(report.downloaded) == 1


def test_a_gated_model_is_fetched_with_hf_token_which_never_leaves_the_hub_nor_is_printed(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.gated.add(REPO)
    with pytest.raises(GpufleetError, match="is gated: accept its terms on the Hub with the account whose token"):
        run_sync(hub, tmp_path / "mirror", model())
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    report, lines = run_sync(hub, tmp_path / "mirror", model())
    assert len(report.downloaded) == 1
    assert TOKEN not in "\n".join(lines) + report.render() + (tmp_path / "mirror" / "manifest.json").read_text()
    cdn = [request for request in hub.requests if request["server"] == "cdn"]
    assert cdn and all(request["authorization"] is None for request in cdn)


def test_hf_hub_offline_is_named_instead_of_a_cache_miss(hub: HubStandIn, tmp_path: Path, monkeypatch: Any) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(GpufleetError, match="HF_HUB_OFFLINE is set, so the Hub's client refuses to fetch"):
        run_sync(hub, tmp_path / "mirror", model())
    assert not hub.requests


# --- what the inventory declares -----------------------------------------------------------------------------


def declared(**fields: Any) -> dict[str, Any]:
    entry = {"name": "tiny", "url": "https://mirror.example.internal/gpufleet/models/tiny.tar.gz", "sha256": "0" * 64}
    return mirror_models([{**entry, **fields}])[0]


def test_the_preflight_filter_keeps_what_sync_reads_without_credentials() -> None:
    (entry,) = mirror_models(
        [
            {
                "name": "tiny",
                "url": "https://user:secret@mirror.example.internal/m/tiny.tar.gz?X-Amz-Signature=abc",
                "sha256": "A" * 64,
                "hf_repo": REPO,
                "hf_revision": COMMIT.upper(),
                "config_overrides": {"max_position_embeddings": 8192},
            },
            "not a mapping",
        ]
    )
    assert entry == {
        "name": "tiny",
        "sha256": "a" * 64,
        "source": "url",
        "url": "https://mirror.example.internal/m/tiny.tar.gz",
        "hf_repo": REPO,
        "hf_revision": COMMIT,
        "strip_components": "0",
    }


def test_models_come_from_the_plans_declarations_one_tarball_per_url() -> None:
    mirror_url = "https://mirror.example.internal/gpufleet"
    lab_like = [
        declared(hf_repo=REPO, hf_revision=COMMIT),
        declared(name="tiny-greedy", hf_repo=REPO, hf_revision=COMMIT),
    ]
    others = [
        declared(name="by-hand"),
        mirror_models(
            [{"name": "on-nfs", "shared_path": "/mnt/models/tiny.tar.gz", "hf_repo": REPO, "hf_revision": COMMIT}]
        )[0],
        declared(name="a-branch", hf_repo=REPO, hf_revision="main"),
    ]
    plan = HostPlan("n1", True, "", {"chain": {}, "stack": {}, "artifacts": [], "warnings": []})
    plan.models = {"mirror_url": mirror_url, "models": lab_like + others}
    needs = mirror_sync.needs_from_plans([plan])
    assert needs.models == [ModelNeeded("models/tiny.tar.gz", ("tiny", "tiny-greedy"), REPO, COMMIT, "", True)]
    assert needs.models_not_synced == [
        "model a-branch: not synced: hf_revision 'main' is not a commit: write the revision's full 40-hex commit id "
        "(a branch or tag moves, and the tarball's sha256 with it)",
        "model by-hand: not synced: declare hf_repo and hf_revision (a commit) to sync it",
        "model on-nfs: not synced: its tarball does not come from the mirror (it declares path or shared_path): "
        'declare url: "{{ gpufleet_mirror_url }}/models/on-nfs.tar.gz" to sync it',
    ]
    # Two revisions for one tarball cannot both be right.
    plan.models["models"] = [lab_like[0], declared(name="tiny-greedy", hf_repo=REPO, hf_revision=OTHER_COMMIT)]
    with pytest.raises(GpufleetError, match="share this tarball but declare") as raised:
        mirror_sync.needs_from_plans([plan])
    assert raised.value.exit_code == exit_codes.FOUND


def test_a_model_without_a_revision_is_one_line_and_not_a_failure(hub: HubStandIn, tmp_path: Path) -> None:
    needs = Needs(
        models_not_synced=["model by-hand: not synced: declare hf_repo and hf_revision (a commit) to sync it"]
    )
    report = mirror_sync.sync(needs, tmp_path / "mirror", [], {"model": hub.base}, say=lambda line: None)
    assert report.render().splitlines()[0] == needs.models_not_synced[0] and not report.failures


def test_the_example_inventorys_models_declare_a_commit_each() -> None:
    variables = yaml.safe_load((PROJECT_ROOT / "inventories/example/group_vars/all/main.yml").read_text())
    for entry in variables["model_store_models"]:
        assert models_sync.why_not_synced(mirror_models([entry])[0], "models/x.tar.gz") == "", entry["name"]


def test_diff_of_an_inventory_through_the_command_lists_its_model_tarball(tmp_path: Path) -> None:
    """The preflight run records the declarations (playbooks/preflight.yml, filter mirror_models) and the command
    reads them back from its events."""
    from unit.test_mirror_sync import gpufleet, write_inventory

    placeholders = {"NVIDIA-Linux-x86_64-580.95.05.run": "0" * 64, "pyenv-2.6.30.tar.gz": "0" * 64}
    inventory = write_inventory(tmp_path / "inventory", "580.95.05", placeholders)
    variables = yaml.safe_load((tmp_path / "inventory" / "group_vars" / "all.yml").read_text())
    variables["model_store_models"] = [
        {
            "name": "tiny",
            "url": "{{ gpufleet_mirror_url }}/models/tiny.tar.gz",
            "sha256": "2" * 64,
            "hf_repo": REPO,
            "hf_revision": COMMIT,
        }
    ]
    (tmp_path / "inventory" / "group_vars" / "all.yml").write_text(yaml.safe_dump(variables))
    (tmp_path / "mirror").mkdir()
    result = gpufleet("mirror", "diff", "-i", str(inventory), "--to", str(tmp_path / "mirror"))
    assert result.returncode == exit_codes.FOUND, result.stdout + result.stderr
    assert f"add        models/tiny.tar.gz  (model; sha256 {'2' * 64})" in result.stdout
