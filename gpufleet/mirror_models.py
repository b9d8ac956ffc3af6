"""Models in `gpufleet mirror sync`: a declared Hugging Face revision, fetched with the Hub's own client and packed
into the tarball model_store unpacks, the same bytes every time.

A model is synced when its model_store_models entry names `hf_repo` (owner/name) and `hf_revision` (a commit: a
branch moves, and the tarball's sha256 with it) and takes its tarball from the mirror (`url`). The files are
fetched by `huggingface_hub.snapshot_download` into a staging directory beside the mirror's files (kept until the
tarball is packed, so an interrupted fetch resumes), each is checked against the revision's tree listing (the
sha256 of LFS files, the git blob id of the others), and they are packed in one pass into NAME.tar.gz.partial:
sorted members at the top of the archive (model_store unpacks with strip_components 0), mode 0644, owner 0:0 with
no names, mtime 0, then gzip with stored blocks (weights hardly compress, and deflate's output varies with the zlib
build, which would change the sha256 from one controller to the next). A tarball that fails the inventory's pin
never replaces the mirror's file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import struct
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpufleet import __version__, exit_codes, mirror_manifest
from gpufleet.digests import sha256_file
from gpufleet.errors import GpufleetError
from gpufleet.fleet_plan import PLACEHOLDER_SHA256
from gpufleet.mirror_manifest import PARTIAL_SUFFIX, Entry

MODEL_KIND = "model"  # --upstream-override model=BASEURL: another Hub endpoint (HF_ENDPOINT's)
STAGING_DIR = ".gpufleet-staging"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
PIN_SOURCE = "inventory (model_store_models sha256)"
CHUNK = 1024 * 1024
Say = Callable[[str], None]
Throttle = Callable[[int], None]  # waits until COUNT more bytes fit the bandwidth limit (mirror_sync.RateLimit.take)


class ModelFailure(GpufleetError):
    """One model could not be placed in the mirror: the line names it, what happened and the fix."""


# --- what the inventory declares -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelNeeded:
    """One model tarball the mirror must hold, packed from a Hugging Face revision."""

    path: str  # under the mirror root, e.g. models/qwen2.5-7b-instruct.tar.gz
    names: tuple[str, ...]  # the model_store_models entries that stage it
    hf_repo: str
    hf_revision: str
    sha256: str = ""  # the inventory's pin; "" for none or the placeholder
    placeholder: bool = False

    @property
    def label(self) -> str:
        return "model " + ", ".join(self.names)

    def source_url(self, endpoint: str) -> str:
        return f"{endpoint.rstrip('/')}/{self.hf_repo}/tree/{self.hf_revision}"


@dataclass
class DeclaredModels:
    needed: list[ModelNeeded] = field(default_factory=list)
    not_synced: list[str] = field(default_factory=list)  # one line per model mirror sync leaves alone, and why


def tarball_path(url: str, mirror_url: str) -> str:
    """The tarball's place under the mirror root: its URL below gpufleet_mirror_url, else (another server) the
    last two segments, the convention of every other artifact."""
    base = mirror_url.rstrip("/") + "/"
    if mirror_url and url.startswith(base):
        return url[len(base) :]
    return "/".join(url.rstrip("/").split("/")[-2:])


def why_not_synced(model: dict[str, Any], path: str) -> str:
    """ "" when mirror sync can pack this declaration, else the reason and the fix."""
    if not model.get("hf_repo") or not model.get("hf_revision"):
        return "declare hf_repo and hf_revision (a commit) to sync it"
    if not REPO_ID.match(str(model["hf_repo"])) or ".." in str(model["hf_repo"]):
        return f"hf_repo {model['hf_repo']!r} is not OWNER/NAME of a Hugging Face repository"
    if not COMMIT.match(str(model["hf_revision"])):
        return (
            f"hf_revision {model['hf_revision']!r} is not a commit: write the revision's full 40-hex commit id (a "
            "branch or tag moves, and the tarball's sha256 with it)"
        )
    if model.get("source") != "url":
        return (
            "its tarball does not come from the mirror (it declares path or shared_path): declare "
            f'url: "{{{{ gpufleet_mirror_url }}}}/models/{model["name"]}.tar.gz" to sync it'
        )
    if str(model.get("strip_components") or "0") != "0":
        return "mirror sync packs the files at the top of the tarball: remove its strip_components to sync it"
    parts = path.split("/")
    if not path.endswith((".tar.gz", ".tgz")) or ".." in parts or "" in parts:
        return f"its url names {path!r}; mirror sync writes a gzip tarball: name it NAME.tar.gz under the mirror"
    return ""


def declared_models(host_models: list[dict[str, Any]]) -> DeclaredModels:
    """The tarballs to pack, from each host's {mirror_url, models} (playbooks/preflight.yml); several entries may
    share one tarball (the lab's two instances of one model), but not with two revisions or two pins."""
    declared = DeclaredModels()
    by_path: dict[str, ModelNeeded] = {}
    skipped: dict[str, str] = {}
    for host in host_models:
        mirror_url = str(host.get("mirror_url") or "")
        for model in host.get("models") or []:
            name = str(model.get("name", ""))
            path = tarball_path(str(model.get("url") or ""), mirror_url)
            reason = why_not_synced(model, path)
            if reason:
                skipped.setdefault(name, reason)
                continue
            add_model(by_path, model_needed(model, path))
    declared.needed = sorted(by_path.values(), key=lambda model: model.path)
    synced = {name for model in declared.needed for name in model.names}
    declared.not_synced = [
        f"model {name}: not synced: {reason}" for name, reason in sorted(skipped.items()) if name not in synced
    ]
    return declared


def model_needed(model: dict[str, Any], path: str) -> ModelNeeded:
    sha256 = str(model.get("sha256") or "").lower()
    placeholder = sha256 == PLACEHOLDER_SHA256
    return ModelNeeded(
        path=path,
        names=(str(model["name"]),),
        hf_repo=str(model["hf_repo"]),
        hf_revision=str(model["hf_revision"]).lower(),
        sha256="" if placeholder or not re.match(r"^[0-9a-f]{64}$", sha256) else sha256,
        placeholder=placeholder,
    )


def add_model(by_path: dict[str, ModelNeeded], model: ModelNeeded) -> None:
    known = by_path.get(model.path)
    if known is None:
        by_path[model.path] = model
        return
    if (known.hf_repo, known.hf_revision) != (model.hf_repo, model.hf_revision) or (
        known.sha256 and model.sha256 and known.sha256 != model.sha256
    ):
        raise GpufleetError(
            f"{model.path}: {known.label} and {model.label} share this tarball but declare "
            f"{known.hf_repo}@{known.hf_revision} (sha256 {known.sha256 or 'not pinned'}) and "
            f"{model.hf_repo}@{model.hf_revision} (sha256 {model.sha256 or 'not pinned'}): one tarball is one "
            "revision, so give them one declaration (or two urls)",
            exit_codes.FOUND,
        )
    names = known.names + tuple(name for name in model.names if name not in known.names)
    by_path[model.path] = ModelNeeded(
        model.path,
        names,
        known.hf_repo,
        known.hf_revision,
        known.sha256 or model.sha256,
        known.placeholder or model.placeholder,
    )


# --- the deterministic tarball -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeFile:
    """One file of the revision as the Hub's tree listing gives it."""

    path: str
    size: int
    blob_id: str  # git's blob sha1 of the file (of its LFS pointer, for an LFS file)
    lfs_sha256: str = ""  # the content's sha256, for an LFS file


class StoredGzip:
    """A gzip stream of stored (uncompressed) deflate blocks, each 65535 bytes but the last: the bytes depend on
    the content alone, not on a zlib build; its sha256 and size are counted as it is written."""

    HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, mtime 0, no extra flags, OS unknown
    BLOCK = 0xFFFF

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.size = 0
        self.crc = 0
        self.length = 0
        self.pending = bytearray()
        self._emit(self.HEADER)

    def write(self, data: bytes) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.length += len(data)
        self.pending += data
        while len(self.pending) > self.BLOCK:
            self._block(bytes(self.pending[: self.BLOCK]), final=False)
            del self.pending[: self.BLOCK]
        return len(data)

    def finish(self) -> None:
        self._block(bytes(self.pending), final=True)
        self.pending.clear()
        self._emit(struct.pack("<II", self.crc & 0xFFFFFFFF, self.length & 0xFFFFFFFF))

    def _block(self, data: bytes, final: bool) -> None:
        # BFINAL and BTYPE 00 (stored) in the first byte; the block is byte-aligned, then LEN and its complement.
        self._emit(bytes([1 if final else 0]) + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data)

    def _emit(self, data: bytes) -> None:
        self.out.write(data)
        self.digest.update(data)
        self.size += len(data)


class CheckedReader:
    """A file read into the tarball, hashed on the way: sha256, and git's blob sha1."""

    def __init__(self, handle: IO[bytes], size: int) -> None:
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.blob = hashlib.sha1(b"blob %d\0" % size)  # git's object id

    def read(self, count: int = -1) -> bytes:
        data = self.handle.read(count)
        self.sha256.update(data)
        self.blob.update(data)
        return data


class PackError(Exception):
    """A file of the snapshot is not the one the revision's tree lists."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def member_name(path: str) -> str:
    """A tree path as a member name model_store's archive check accepts (no absolute path, no .. component)."""
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise PackError(path, "is not a plain relative path; refused as a tarball member")
    return path


def pack(files: list[TreeFile], root: Path, out: IO[bytes]) -> tuple[str, int]:
    """Writes the tarball of `files` (read under root, each checked against the tree) to out; (sha256, size)."""
    stream = StoredGzip(out)
    # typeshed's stream protocol wants close() too; tarfile never closes a file object it was handed.
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as archive:  # type: ignore[call-overload]
        for item in sorted(files, key=lambda tree_file: tree_file.path):
            source = root / item.path
            if not source.is_file() or source.is_symlink():
                raise PackError(item.path, "is missing from the fetched snapshot")
            if source.stat().st_size != item.size:
                raise PackError(item.path, f"has {source.stat().st_size} bytes, the revision's tree says {item.size}")
            info = tarfile.TarInfo(member_name(item.path))
            info.size, info.mode, info.mtime, info.type = item.size, 0o644, 0, tarfile.REGTYPE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with source.open("rb") as handle:
                reader = CheckedReader(handle, item.size)
                archive.addfile(info, reader)
            check_file(item, reader)
    stream.finish()
    return stream.digest.hexdigest(), stream.size


def check_file(item: TreeFile, reader: CheckedReader) -> None:
    if item.lfs_sha256:
        actual = reader.sha256.hexdigest()
        if actual != item.lfs_sha256:
            raise PackError(item.path, f"has sha256 {actual}, the revision's LFS pointer says {item.lfs_sha256}")
    elif item.blob_id:
        actual = reader.blob.hexdigest()
        if actual != item.blob_id:
            raise PackError(item.path, f"has git blob id {actual}, the revision's tree says {item.blob_id}")


# --- fetching with huggingface_hub ---------------------------------------------------------------------------


def hub_endpoint(overrides: dict[str, str]) -> str:
    """--upstream-override model=BASEURL, else HF_ENDPOINT as the client reads it, else the Hub's own."""
    if MODEL_KIND in overrides:
        return overrides[MODEL_KIND].rstrip("/")
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def tree_files(model: ModelNeeded, endpoint: str) -> list[TreeFile]:
    """The revision's files as the Hub lists them (one request, or one per page of a large tree)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, library_name="gpufleet", library_version=__version__)
    return [
        TreeFile(item.path, int(item.size), str(item.blob_id), str(item.lfs.sha256) if item.lfs else "")
        for item in api.list_repo_tree(model.hf_repo, revision=model.hf_revision, recursive=True)
        if isinstance(item, RepoFile)
    ]


def fetch_snapshot(model: ModelNeeded, endpoint: str, staging: Path, jobs: int) -> Path:
    """The revision's files under staging/files, fetched by the Hub's client (which skips the files a previous,
    interrupted sync completed); its cache stays in staging too, never in the operator's HF_HOME."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # one line per model is ours to print; the client's bars would interleave with them
    files = staging / "files"
    snapshot_download(
        model.hf_repo,
        revision=model.hf_revision,
        local_dir=files,
        cache_dir=staging / "hf-cache",
        endpoint=endpoint,
        max_workers=max(1, jobs),
        library_name="gpufleet",
        library_version=__version__,
    )
    return files


@contextmanager
def hub_bandwidth(throttle: Throttle | None) -> Iterator[None]:
    """--limit-rate for the Hub's client: every body it streams takes its share of the one limit of the sync,
    through a client of its own (set_client_factory). Xet's transfers run outside that client and cannot be
    bounded, so they are turned off while a limit is set and the files come over HTTP."""
    if throttle is None:
        yield
        return
    take: Throttle = throttle
    import httpx2
    from huggingface_hub import constants, set_client_factory
    from huggingface_hub.utils._http import default_client_factory  # the client's own hooks, redirects, timeouts

    class ThrottledStream(httpx2.SyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.inner:
                take(len(chunk))
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class ThrottledClient(httpx2.Client):
        def send(self, request: Any, **kwargs: Any) -> Any:
            response = super().send(request, **kwargs)
            if kwargs.get("stream"):  # downloads stream; an unstreamed answer was read whole inside send
                response.stream = ThrottledStream(response.stream)
            return response

    def throttled_client() -> Any:
        default = default_client_factory()
        client = ThrottledClient(event_hooks=default.event_hooks, follow_redirects=True, timeout=None)
        default.close()
        return client

    xet_disabled = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = True
    set_client_factory(throttled_client)
    try:
        yield
    finally:
        set_client_factory(default_client_factory)
        constants.HF_HUB_DISABLE_XET = xet_disabled


def hub_failure(model: ModelNeeded, endpoint: str, error: Exception) -> ModelFailure:
    """The client's error as one line naming the model and the fix (never the token, which it does not print)."""
    from huggingface_hub import errors

    where = f"{model.hf_repo} on {endpoint}"
    if isinstance(error, errors.RevisionNotFoundError):
        fix = (
            f"has no revision {model.hf_revision}: hf_revision must be a commit of that repository (copy the full "
            "commit id from its history), or correct hf_repo"
        )
    elif isinstance(error, errors.GatedRepoError):
        fix = "is gated: accept its terms on the Hub with the account whose token is in HF_TOKEN, then sync again"
    elif isinstance(error, errors.RepositoryNotFoundError):
        fix = (
            "cannot be found: check hf_repo; a private or gated repository also answers so without a token: set "
            "HF_TOKEN to a token that may read it"
        )
    elif isinstance(error, errors.RemoteEntryNotFoundError):
        fix = "lists a file it does not serve: sync again later; if it persists, the revision is damaged on the Hub"
    elif isinstance(error, errors.HfHubHTTPError):
        fix = (
            f"answered {error.response.status_code}: try again later; if it persists, point models at a reachable "
            "copy with --upstream-override model=BASEURL (or HF_ENDPOINT)"
        )
    else:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        fix = (
            f"cannot be fetched ({type(error).__name__}: {reason}); fix the network or the proxy settings "
            "(http_proxy/https_proxy), or point models at a reachable copy with --upstream-override model=BASEURL"
        )
    return ModelFailure(f"{model.path} ({model.label}): {where} {fix}")


# --- one model into the mirror -------------------------------------------------------------------------------


@dataclass
class ModelOutcome:
    path: str
    packed: bool
    entry: Entry
    seconds: float
    fetched_files: int = 0


class ModelSyncer:
    """Packs each declared model into one mirror directory; a failure names the model, the others go on."""

    def __init__(
        self, mirror: Path, overrides: dict[str, str], jobs: int, say: Say, throttle: Throttle | None = None
    ) -> None:
        self.mirror = mirror
        self.overrides = overrides
        self.jobs = jobs
        self.say = say
        self.throttle = throttle

    def staging_of(self, model: ModelNeeded) -> Path:
        return self.mirror / STAGING_DIR / "models" / f"{model.hf_repo.replace('/', '--')}--{model.hf_revision}"

    def sync_one(self, model: ModelNeeded, manifest: mirror_manifest.Manifest) -> ModelOutcome:
        started = time.monotonic()
        target = self.mirror / model.path
        if target.is_file():
            # Before any request: a complete mirror syncs without reaching the Hub.
            present = self.present(model, target, manifest, started)
            if present is not None:
                return present
        from huggingface_hub import constants

        if constants.is_offline_mode():
            raise ModelFailure(
                f"{model.path} ({model.label}): HF_HUB_OFFLINE is set, so the Hub's client refuses to fetch "
                f"{model.hf_repo}: unset it for mirror sync"
            )
        endpoint = hub_endpoint(self.overrides)
        staging = self.staging_of(model)
        try:
            files = tree_files(model, endpoint)
            self.say(
                f"{model.path}: fetching {model.hf_repo}@{model.hf_revision} from {endpoint} ({len(files)} files, "
                f"{sum(item.size for item in files)} bytes) with huggingface_hub"
            )
            with hub_bandwidth(self.throttle):
                root = fetch_snapshot(model, endpoint, staging, self.jobs)
        except ModelFailure:
            raise
        except Exception as error:  # the client's errors, httpx2's and OSError's: each named below
            if isinstance(error, OSError) and error.errno == errno.ENOSPC:
                raise ModelFailure(
                    f"{model.path} ({model.label}): the disk of {self.mirror} is full while fetching "
                    f"{model.hf_repo}: free space there (a model needs its size twice while it is packed), then "
                    "sync again; the files fetched so far are kept and not fetched again"
                ) from None
            raise hub_failure(model, endpoint, error) from None
        target.parent.mkdir(parents=True, exist_ok=True)
        sha256, size = self.pack_into(model, files, root, target)
        source = self.checksum_source(model)
        entry = Entry(model.path, model.source_url(endpoint), size, sha256, source, mirror_manifest.now_utc())
        shutil.rmtree(staging, ignore_errors=True)
        self.cleanup_staging()
        return ModelOutcome(model.path, True, entry, time.monotonic() - started, len(files))

    def pack_into(self, model: ModelNeeded, files: list[TreeFile], root: Path, target: Path) -> tuple[str, int]:
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        try:
            with partial.open("wb") as out:
                sha256, size = pack(files, root, out)
                out.flush()
                os.fsync(out.fileno())
        except PackError as error:
            partial.unlink(missing_ok=True)
            # The next sync fetches that file again; the others stay.
            (root / error.path).unlink(missing_ok=True)
            raise ModelFailure(
                f"{model.path} ({model.label}): {error} of {model.hf_repo}@{model.hf_revision}: refused, nothing "
                "replaced; the file was deleted from the staging directory and the next sync fetches it again"
            ) from None
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise ModelFailure(f"{model.path} ({model.label}): cannot write {partial}: {error}") from None
        if model.sha256 and sha256 != model.sha256:
            partial.unlink(missing_ok=True)
            kept = "the mirror keeps its previous file" if target.exists() else "the mirror holds no copy"
            raise ModelFailure(
                f"{model.path} ({model.label}): {model.hf_repo}@{model.hf_revision} packs to sha256 {sha256}, but "
                f"the inventory pins {model.sha256}: refused ({kept}). The pin is of another tarball (packed by hand, "
                "or of another revision): check hf_revision, then write the sha256 mirror sync reports"
            )
        os.replace(partial, target)
        mirror_manifest.fsync_directory(target.parent)
        return sha256, size

    def checksum_source(self, model: ModelNeeded) -> str:
        packed = (
            f"huggingface revision {model.hf_revision}: every file checked against the revision's tree (sha256 of "
            "LFS files, git blob id of the others), packed deterministically by gpufleet"
        )
        return f"{PIN_SOURCE}; {packed}" if model.sha256 else packed

    def present(
        self, model: ModelNeeded, target: Path, manifest: mirror_manifest.Manifest, started: float
    ) -> ModelOutcome | None:
        """The tarball already there, when it is the pinned one, or the one the manifest says this revision packed
        to; None when it must be packed (again)."""
        recorded = manifest.entries.get(model.path)
        actual = sha256_file(target)
        packed_here = (
            recorded is not None
            and recorded.sha256 == actual
            and recorded.url.endswith(f"/{model.hf_repo}/tree/{model.hf_revision}")
        )
        if model.sha256 and actual != model.sha256:
            self.say(f"{model.path}: the mirror's file has sha256 {actual}, not {model.sha256}: packing it again")
            return None
        if recorded is not None and packed_here:
            entry = Entry(
                model.path, recorded.url, recorded.size, actual, self.checksum_source(model), recorded.fetched_at
            )
        elif model.sha256:
            # The pinned file, placed by hand or with a lost manifest: dated by its own mtime.
            entry = Entry(
                model.path,
                model.source_url(hub_endpoint(self.overrides)),
                target.stat().st_size,
                actual,
                PIN_SOURCE,
                mirror_manifest.stamp(target.stat().st_mtime),
            )
        else:
            return None
        return ModelOutcome(model.path, False, entry, time.monotonic() - started)

    def cleanup_staging(self) -> None:
        """The staging directories are removed once empty, so a complete mirror has none left."""
        for directory in (self.mirror / STAGING_DIR / "models", self.mirror / STAGING_DIR):
            try:
                directory.rmdir()
            except OSError:
                return
