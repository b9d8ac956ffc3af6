"""`gpufleet mirror sync`: every artifact the declared stacks install, fetched from its upstream into the mirror.

What the mirror needs is what `gpufleet plan -i` lists (gpufleet.fleet_plan runs preflight's checks; this module only
reads its artifacts). Where each file comes from is data/mirror/upstreams.csv: per kind, a file-name pattern, an
upstream URL pattern with a cited real example, and whether the upstream publishes a checksum. Each file is
checked against the strongest checksum available: the plan's (the inventory's pin or the knowledge base's), else
the one the upstream publishes, else the first download's, recorded as such. A file that fails its check never
reaches the mirror: downloads go to NAME.partial beside the target (resumed with a Range request), are hashed,
synced and renamed into place.

Wheels are the wheelhouse's (`gpufleet wheelhouse build`), named in the output; models declared with a Hugging Face
revision are fetched with the Hub's own client and packed deterministically (gpufleet.mirror_models).
"""

from __future__ import annotations

import errno
import html.parser
import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

from gpufleet import __version__, exit_codes, fleet_plan, mirror_manifest, mirror_models
from gpufleet.upstreams import Upstream, load_upstreams
from gpufleet.digests import sha256_file
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.mirror_manifest import PARTIAL_SUFFIX, TRUST_ON_FIRST_DOWNLOAD, Entry, Manifest
from gpufleet.mirror_models import MODEL_KIND, ModelFailure, ModelNeeded

CHUNK = 64 * 1024
TIMEOUT_SECONDS = 60.0
# A driver runfile's architecture -> the one NVIDIA's fabric manager archives are named by.
FABRIC_MANAGER_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
Say = Callable[[str], None]


class ArtifactFailure(GpufleetError):
    """One artifact could not be placed in the mirror: the line names it, what happened and the fix."""


# --- where each file comes from ------------------------------------------------------------------------------


def parse_overrides(items: Iterable[str], upstreams: list[Upstream]) -> dict[str, str]:
    """--upstream-override KIND=BASEURL, each kind one of the table's, or model (a Hugging Face Hub endpoint)."""
    kinds = sorted({row.kind for row in upstreams} | {MODEL_KIND})
    overrides: dict[str, str] = {}
    for item in items:
        kind, _, base = item.partition("=")
        if kind not in kinds or not re.match(r"^(https?|file)://\S+$", base):
            raise UsageError(
                f"--upstream-override {item!r}: give KIND=BASEURL, KIND one of {', '.join(kinds)} and BASEURL an "
                "http(s):// URL that serves the same paths as the upstream"
            )
        overrides[kind] = base
    return overrides


# --- what the mirror needs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Needed:
    """One file the mirror must hold, as the plan lists it."""

    path: str  # under the mirror root, e.g. nvidia/cuda_13.0.2_580.95.05_linux.run
    layer: str
    sha256: str  # "" where the plan has none to check against (a placeholder pin, fabric manager)
    sha256_source: str
    placeholder: bool = False
    index_url: str = ""  # sdists: the index the venv declares ("" = the wheelhouse's main index)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class Needs:
    files: list[Needed] = field(default_factory=list)
    models: list[ModelNeeded] = field(default_factory=list)  # each tarball packed from a Hugging Face revision
    models_not_synced: list[str] = field(default_factory=list)  # one line per declared model left alone, and why
    venvs: list[str] = field(default_factory=list)  # each venv id the wheelhouse fills


def mirror_path(url: str) -> str:
    """An artifact's place under the mirror root, from its mirror URL: stack_artifacts' layout is one directory
    (MIRROR_DIRS) and the file name, so the URL's last two segments."""
    return "/".join(urlsplit(url).path.rstrip("/").split("/")[-2:])


def needs_from_plans(plans: list[fleet_plan.HostPlan], fabric_manager: bool = False) -> Needs:
    """The files, models and venvs of every validated host; a host whose stack fails validation fails the sync
    with plan's own message (exit 2, as `gpufleet plan`)."""
    failed = [plan for plan in plans if not plan.ok]
    if failed:
        raise GpufleetError(
            "the inventory's stacks are not compatible, so what the mirror needs is not known: "
            + " | ".join(f"{plan.host}: {plan.message}" for plan in failed)
            + " (`gpufleet plan -i INVENTORY` lists every broken link and its fix)",
            exit_codes.FOUND,
        )
    needs = Needs()
    by_path: dict[str, Needed] = {}
    for item in fleet_plan.classes(plans):
        index_url = str(item.chain.get("venv", {}).get("index_url") or "")
        for artifact in item.artifacts:
            add_needed(by_path, artifact_needed(artifact, index_url), item.hosts)
        if fabric_manager:
            for needed in list(by_path.values()):
                extra = fabric_manager_needed(needed)
                if extra is not None:
                    add_needed(by_path, extra, item.hosts)
        venv_id = str(item.chain.get("venv", {}).get("id") or "")
        if venv_id and venv_id not in needs.venvs:
            needs.venvs.append(venv_id)
    needs.files = sorted(by_path.values(), key=lambda needed: needed.path)
    declared = mirror_models.declared_models([plan.models for plan in plans])
    needs.models, needs.models_not_synced = declared.needed, declared.not_synced
    return needs


def artifact_needed(artifact: dict[str, Any], index_url: str) -> Needed:
    sha256 = str(artifact["sha256"]).lower()
    placeholder = sha256 == fleet_plan.PLACEHOLDER_SHA256
    path = mirror_path(str(artifact["url"]))
    return Needed(
        path=path,
        layer=str(artifact["layer"]),
        sha256="" if placeholder else sha256,
        sha256_source=str(artifact["sha256_source"]),
        placeholder=placeholder,
        index_url=index_url if path.startswith("sdists/") else "",
    )


def fabric_manager_needed(driver: Needed) -> Needed | None:
    """NVSwitch systems' fabric manager of exactly a driver's version (the role resolves it only on such a node,
    so the plan does not list it): its sha256 comes from NVIDIA's redistrib JSON."""
    match = re.match(r"^nvidia/NVIDIA-Linux-(x86_64|aarch64)-([0-9.]+)\.run$", driver.path)
    if match is None:
        return None
    arch, version = FABRIC_MANAGER_ARCH[match.group(1)], match.group(2)
    return Needed(f"nvidia/fabricmanager-linux-{arch}-{version}-archive.tar.xz", "driver", "", "")


def add_needed(by_path: dict[str, Needed], needed: Needed, hosts: list[str]) -> None:
    known = by_path.get(needed.path)
    if known is not None and known.sha256 and needed.sha256 and known.sha256 != needed.sha256:
        raise GpufleetError(
            f"{needed.path}: the inventory's hosts pin two sha256 for one file ({known.sha256} from "
            f"{known.sha256_source}; {needed.sha256} from {needed.sha256_source}, hosts {', '.join(hosts)}): "
            "one file has one sha256, so pin it once in group_vars/all",
            exit_codes.FOUND,
        )
    if known is None or (needed.sha256 and not known.sha256):
        by_path[needed.path] = needed


def needs_of_inventory(
    inventory: Path, limit: str | None = None, envvars: dict[str, str] | None = None, fabric_manager: bool = False
) -> Needs:
    return needs_from_plans(fleet_plan.plan_inventory(inventory, limit, envvars), fabric_manager)


# --- fetching ------------------------------------------------------------------------------------------------


class RateLimit:
    """A bandwidth limit shared by every download: each chunk waits for its share of bytes per second."""

    def __init__(self, bytes_per_second: int) -> None:
        self.rate = float(bytes_per_second)
        self.lock = threading.Lock()
        self.free_at = 0.0

    def take(self, count: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.free_at = max(self.free_at, now) + count / self.rate
            wait = self.free_at - now
        time.sleep(wait)


def build_opener() -> urllib.request.OpenerDirector:
    """urllib with the proxies of the environment (http_proxy, https_proxy, no_proxy), read now."""
    return urllib.request.build_opener(urllib.request.ProxyHandler())


def _write_chunk(out: Any, chunk: bytes) -> None:
    out.write(chunk)


@dataclass
class Outcome:
    path: str
    downloaded: bool
    entry: Entry
    size: int
    seconds: float
    note: str = ""


@dataclass
class SyncReport:
    mirror: Path
    total: int = 0
    downloaded: list[Outcome] = field(default_factory=list)
    present: list[Outcome] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    pins: list[tuple[str, str, str]] = field(default_factory=list)  # name, sha256, where it came from
    model_pins: list[tuple[str, str, str]] = field(default_factory=list)  # model names, sha256, revision
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        fetched = sum(item.size for item in self.downloaded)
        lines = list(self.notes)
        if self.pins:
            lines.append(
                "the inventory has no real sha256 for these (a placeholder, or none for fabric manager): "
                "write them in gpufleet_artifact_sha256:"
            )
            lines += [f'  {name}: "{sha256}"  # {source}' for name, sha256, source in self.pins]
        if self.model_pins:
            lines.append(
                "the inventory pins no real sha256 for these model tarballs (a placeholder, or none): write each as "
                "the sha256 of its model_store_models entries:"
            )
            lines += [
                f'  {names}: sha256: "{sha256}"  # packed from {source}' for names, sha256, source in self.model_pins
            ]
        if self.downloaded:
            lines.append(
                f"mirror {self.mirror}: {len(self.downloaded)} downloaded ({human(fetched)}), "
                f"{len(self.present)} already present, {len(self.failures)} failed, of {self.total}"
            )
        else:
            lines.append(
                f"mirror {self.mirror}: nothing downloaded: {len(self.present)} of {self.total} already present "
                f"and verified, {len(self.failures)} failed"
            )
        return "\n".join(lines)


class Syncer:
    """Fills one mirror directory; each artifact's failure is collected, the others go on."""

    def __init__(
        self,
        mirror: Path,
        upstreams: list[Upstream],
        overrides: dict[str, str] | None = None,
        limit_rate: int = 0,
        say: Say = print,
    ) -> None:
        self.mirror = mirror
        self.upstreams = upstreams
        self.overrides = overrides or {}
        self.limit = RateLimit(limit_rate)
        self.say = say
        self.opener = build_opener()
        self.manifest = mirror_manifest.load(mirror)
        self.lock = threading.Lock()

    # where

    def upstream_of(self, needed: Needed) -> tuple[Upstream, str]:
        directory = needed.path.split("/", 1)[0]
        for row in self.upstreams:
            if row.mirror_dir == directory and row.fields(needed.name) is not None:
                return row, self.base_of(row, needed)
        raise ArtifactFailure(
            f"{needed.path}: no upstream pattern matches this file: add its row (pattern, URL, cited example) to "
            "data/mirror/upstreams.csv, or put the file in the mirror by hand"
        )

    def base_of(self, row: Upstream, needed: Needed) -> str:
        if row.kind in self.overrides:
            return self.overrides[row.kind]
        if "{index_url}" in row.base_url:
            from gpufleet.wheelhouse import DEFAULT_INDEX_URL  # the wheelhouse's own main index, named once there

            return row.base_url.replace("{index_url}", needed.index_url or DEFAULT_INDEX_URL)
        return row.base_url

    # one artifact

    def sync_one(self, needed: Needed) -> Outcome:
        started = time.monotonic()
        row, base = self.upstream_of(needed)
        url = row.url(needed.name, base)
        target = self.mirror / needed.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file():
            # Checked before any request: a mirror that is complete syncs without reaching any upstream.
            present = self.present(needed, target, url, started)
            if present is not None:
                return present
        published, url, origin = self.published(row, needed, base, url)
        if needed.sha256 and published and published != needed.sha256:
            raise ArtifactFailure(
                f"{needed.path}: {needed.sha256_source} says sha256 {needed.sha256} but the upstream publishes "
                f"{published} ({row.checksum_note}): one of them is wrong; check the pin against the vendor before "
                "syncing again"
            )
        expected, source = (
            (needed.sha256, needed.sha256_source) if needed.sha256 else (published, f"upstream ({origin})")
        )
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        size = self.download(needed, url, partial)
        actual = sha256_file(partial)
        if expected and actual != expected:
            partial.unlink(missing_ok=True)
            kept = "the mirror keeps its previous file" if target.exists() else "the mirror holds no copy"
            raise ArtifactFailure(
                f"{needed.path}: the download from {url} has sha256 {actual}, but {source} says {expected}: "
                f"refused ({kept}; the partial download was deleted). The upstream file changed or was tampered "
                "with: check it with the vendor, then correct the pin or the upstream"
            )
        if not expected:
            source = TRUST_ON_FIRST_DOWNLOAD
        install(partial, target)
        entry = Entry(needed.path, url, size, actual, source, mirror_manifest.now_utc())
        self.record(entry)
        return Outcome(needed.path, True, entry, size, time.monotonic() - started)

    def present(self, needed: Needed, target: Path, url: str, started: float) -> Outcome | None:
        """The file already there, when it checks out against the plan's sha256, else against the manifest's
        record of how it was fetched; None when it must be fetched (again)."""
        recorded = self.manifest.entries.get(needed.path)
        actual = sha256_file(target)
        if needed.sha256:
            if actual != needed.sha256:
                self.say(
                    f"{needed.path}: the mirror's file has sha256 {actual}, not {needed.sha256}: fetching it again"
                )
                return None
            source = needed.sha256_source
        elif recorded is not None and recorded.sha256 == actual:
            source = recorded.checksum_source
        else:
            return None
        kept = recorded if recorded is not None and recorded.sha256 == actual else None
        entry = Entry(
            needed.path,
            kept.url if kept else url,
            target.stat().st_size,
            actual,
            source,
            # A file found in place (by hand, or a lost manifest) dates from its own mtime.
            kept.fetched_at if kept else mirror_manifest.stamp(target.stat().st_mtime),
        )
        if entry != recorded:
            self.record(entry)
        return Outcome(needed.path, False, entry, entry.size, time.monotonic() - started)

    def record(self, entry: Entry) -> None:
        with self.lock:
            self.manifest.record(entry)
            mirror_manifest.save(self.mirror, self.manifest)

    # published checksums

    def published(self, row: Upstream, needed: Needed, base: str, url: str) -> tuple[str, str, str]:
        """(the sha256 the upstream publishes or "", the URL to download from, where that sha256 was read)."""
        checksum_url = row.checksum_url(needed.name, base)
        if row.checksum_kind == "redistrib_json" and not needed.sha256:
            return self.redistrib_sha256(needed, checksum_url), url, checksum_url
        if row.checksum_kind == "simple_index":
            sha256, file_url = self.simple_index_file(needed, checksum_url)
            return sha256, file_url, f"{checksum_url} #sha256"
        return "", url, ""

    def redistrib_sha256(self, needed: Needed, manifest_url: str) -> str:
        document = json.loads(self.read_small(needed, manifest_url))
        for component in document.values():
            if not isinstance(component, dict):
                continue
            for platform in component.values():
                if isinstance(platform, dict) and str(platform.get("relative_path", "")).endswith("/" + needed.name):
                    return str(platform.get("sha256", "")).lower()
        raise ArtifactFailure(
            f"{needed.path}: NVIDIA's {manifest_url} lists no {needed.name}: this driver has no such archive; "
            "check the driver version, or leave --fabric-manager out for fleets without NVSwitch"
        )

    def simple_index_file(self, needed: Needed, page_url: str) -> tuple[str, str]:
        links = SimpleLinks()
        links.feed(self.read_small(needed, page_url).decode("utf-8", "replace"))
        for href, text in links.links:
            file_url, fragment = urldefrag(urljoin(page_url, href))
            if text.strip() == needed.name or file_url.rsplit("/", 1)[-1] == needed.name:
                sha256 = fragment[len("sha256=") :].lower() if fragment.startswith("sha256=") else ""
                return sha256, file_url
        raise ArtifactFailure(
            f"{needed.path}: the index page {page_url} lists no {needed.name}: the release has no sdist there; "
            "check the version, or the venv's index_url"
        )

    def read_small(self, needed: Needed, url: str) -> bytes:
        try:
            with self.opener.open(self.request(url), timeout=TIMEOUT_SECONDS) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raise ArtifactFailure(
                f"{needed.path}: {url} answered {error.code} {error.reason}{fix_of(error.code)}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise ArtifactFailure(unreachable(needed, url, error)) from None

    # the download

    @staticmethod
    def request(url: str, offset: int = 0) -> urllib.request.Request:
        headers = {"User-Agent": f"gpufleet/{__version__} (mirror sync)"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        return urllib.request.Request(url, headers=headers)

    def download(self, needed: Needed, url: str, partial: Path) -> int:
        """Fetches url into partial, resuming what a previous run left there; returns the file's size."""
        offset = partial.stat().st_size if partial.exists() else 0
        try:
            response = self.opener.open(self.request(url, offset), timeout=TIMEOUT_SECONDS)
        except urllib.error.HTTPError as error:
            if error.code == 416 and offset:
                partial.unlink()  # the partial is longer than the file: start again
                return self.download(needed, url, partial)
            raise ArtifactFailure(
                f"{needed.path}: {url} answered {error.code} {error.reason}{fix_of(error.code)}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise ArtifactFailure(unreachable(needed, url, error)) from None
        with response:
            resumed = bool(offset) and response.status == 206 and content_range_start(response) == offset
            if offset and not resumed:
                self.say(f"{needed.path}: the upstream ignored the Range request: downloading it from the start")
                offset = 0
            elif resumed:
                self.say(f"{needed.path}: resuming at {human(offset)}")
            length = response.headers.get("Content-Length")
            received = self.copy(needed, response, partial, "ab" if resumed else "wb")
        if length is not None and received != int(length):
            raise ArtifactFailure(
                f"{needed.path}: {url} sent {received} of its {int(length)} bytes (the connection ended early): "
                "refused; the partial file is kept and the next `gpufleet mirror sync` resumes it"
            )
        return offset + received

    def copy(self, needed: Needed, response: Any, partial: Path, mode: str) -> int:
        received = 0
        try:
            with partial.open(mode) as out:
                while True:
                    try:
                        chunk = response.read(CHUNK)
                    except (http.client.IncompleteRead, ConnectionError, TimeoutError):
                        break  # counted as the short read it is, below
                    if not chunk:
                        break
                    self.limit.take(len(chunk))
                    _write_chunk(out, chunk)
                    received += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise ArtifactFailure(
                    f"{needed.path}: the disk of {self.mirror} is full after {human(received)} of this file: free "
                    "space there (or sync --to another disk), then sync again; the partial file is kept and resumed"
                ) from None
            raise ArtifactFailure(f"{needed.path}: cannot write {partial}: {error}") from None
        return received


def install(partial: Path, target: Path) -> None:
    """The verified download takes the target's name in one rename, once on disk (it was synced when written)."""
    os.replace(partial, target)
    mirror_manifest.fsync_directory(target.parent)


def content_range_start(response: Any) -> int:
    match = re.match(r"^bytes (\d+)-", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else -1


def fix_of(code: int) -> str:
    if code == 404:
        return (
            ": the upstream has no such file; check the version in the inventory's stack, or the kind's URL pattern "
            "in data/mirror/upstreams.csv (or the --upstream-override base)"
        )
    if code in (401, 403):
        return ": the upstream refuses it; a proxy may need credentials (http_proxy/https_proxy)"
    return ": try again later; if it persists, point the kind at a copy with --upstream-override KIND=BASEURL"


def unreachable(needed: Needed, url: str, error: Exception) -> str:
    reason = getattr(error, "reason", error)
    proxies = ", ".join(f"{scheme}_proxy={value}" for scheme, value in urllib.request.getproxies().items())
    return (
        f"{needed.path}: cannot reach {url}: {reason} (proxies from the environment: {proxies or 'none'}); fix the "
        "network or the proxy settings, or point the kind at a reachable copy with --upstream-override KIND=BASEURL"
    )


class SimpleLinks(html.parser.HTMLParser):
    """The anchors of a PEP 503 project page: (href, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href") or "", []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text)))
            self._href = None


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


# --- the whole sync ------------------------------------------------------------------------------------------


def sync(
    needs: Needs,
    mirror: Path,
    upstreams: list[Upstream] | None = None,
    overrides: dict[str, str] | None = None,
    jobs: int = 4,
    limit_rate: int = 0,
    say: Say = print,
) -> SyncReport:
    """Fills the mirror with every needed file, `jobs` at a time, then packs each model (the Hub's client fetches
    its files `jobs` at a time); raises once all ran when any failed."""
    mirror.mkdir(parents=True, exist_ok=True)
    syncer = Syncer(mirror, upstreams if upstreams is not None else load_upstreams(), overrides, limit_rate, say)
    report = SyncReport(mirror, total=len(needs.files) + len(needs.models))
    report.notes += [
        f"venv {venv}: wheels are the wheelhouse's: `gpufleet wheelhouse build -i INVENTORY --mirror-dir {mirror}`"
        for venv in needs.venvs
    ]
    report.notes += needs.models_not_synced
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="mirror-sync") as pool:
        futures = {pool.submit(syncer.sync_one, needed): needed for needed in needs.files}
        for future in as_completed(futures):
            needed = futures[future]
            done += 1
            try:
                outcome = future.result()
            except ArtifactFailure as failure:
                report.failures.append(str(failure))
                say(f"[{done}/{report.total}] FAILED {failure}")
                continue
            (report.downloaded if outcome.downloaded else report.present).append(outcome)
            say(progress_line(done, report, outcome))
            if needed.placeholder or not needed.sha256_source:
                report.pins.append((needed.name, outcome.entry.sha256, source_text(outcome.entry)))
    report.pins.sort()
    done = sync_models(needs.models, syncer, overrides or {}, jobs, report, done)
    if report.failures:
        raise GpufleetError(
            f"mirror sync: {len(report.failures)} of {report.total} file(s) not placed in {mirror} (the others are, "
            "and the manifest lists them):\n" + "\n".join(report.failures)
        )
    return report


def sync_models(
    models: list[ModelNeeded], syncer: Syncer, overrides: dict[str, str], jobs: int, report: SyncReport, done: int
) -> int:
    """Each model in turn (the Hub's client parallelises within one); a failure is collected like a file's."""
    throttle = syncer.limit.take if syncer.limit.rate > 0 else None
    packer = mirror_models.ModelSyncer(syncer.mirror, overrides, jobs, syncer.say, throttle)
    for model in models:
        done += 1
        try:
            outcome = packer.sync_one(model, syncer.manifest)
        except ModelFailure as failure:
            report.failures.append(str(failure))
            syncer.say(f"[{done}/{report.total}] FAILED {failure}")
            continue
        if outcome.entry != syncer.manifest.entries.get(outcome.path):
            syncer.record(outcome.entry)
        result = Outcome(outcome.path, outcome.packed, outcome.entry, outcome.entry.size, outcome.seconds)
        (report.downloaded if outcome.packed else report.present).append(result)
        fetched = human(sum(item.size for item in report.downloaded))
        what = (
            f"packed from {model.hf_repo}@{model.hf_revision} ({outcome.fetched_files} files) in "
            f"{outcome.seconds:.1f} s, {human(outcome.entry.size)}, sha256 {outcome.entry.sha256}"
            if outcome.packed
            else f"present, sha256 checked against {outcome.entry.checksum_source}"
        )
        syncer.say(f"[{done}/{report.total}] {outcome.path}: {what} ({fetched} fetched so far)")
        if not model.sha256:
            report.model_pins.append(
                (", ".join(model.names), outcome.entry.sha256, f"{model.hf_repo}@{model.hf_revision}")
            )
    return done


def progress_line(done: int, report: SyncReport, outcome: Outcome) -> str:
    fetched = sum(item.size for item in report.downloaded)
    if outcome.downloaded:
        what = f"downloaded {human(outcome.size)} in {outcome.seconds:.1f} s, sha256 checked against {source_text(outcome.entry)}"
    else:
        what = f"present, sha256 checked against {source_text(outcome.entry)}"
    return f"[{done}/{report.total}] {outcome.path}: {what} ({human(fetched)} fetched so far)"


def source_text(entry: Entry) -> str:
    if entry.checksum_source == TRUST_ON_FIRST_DOWNLOAD:
        return f"nothing: {TRUST_ON_FIRST_DOWNLOAD} from {entry.url}"
    return entry.checksum_source


# --- what a changed declaration would change -----------------------------------------------------------------


@dataclass
class DiffReport:
    against: str
    add: list[Needed] = field(default_factory=list)
    replace: list[tuple[Needed, str]] = field(default_factory=list)  # needed, the sha256 there now
    unneeded: list[str] = field(default_factory=list)
    unchanged: int = 0

    @property
    def empty(self) -> bool:
        return not self.add and not self.replace and not self.unneeded

    def render(self) -> str:
        lines = [f"against {self.against}:"]
        lines += [
            f"  add        {item.path}  ({item.layer}; sha256 {item.sha256 or 'not known yet'})" for item in self.add
        ]
        lines += [
            f"  replace    {item.path}  (sha256 {was} there, {item.sha256} declared by {item.sha256_source})"
            for item, was in self.replace
        ]
        lines += [f"  no longer needed {path}" for path in self.unneeded]
        lines.append(
            f"{len(self.add)} to add, {len(self.replace)} to replace, {len(self.unneeded)} no longer needed, "
            f"{self.unchanged} unchanged"
        )
        return "\n".join(lines)


def diff(old: dict[str, str], new: Needs, against: str) -> DiffReport:
    """What the new declaration adds, replaces and no longer needs, against {path: sha256} of a mirror's manifest
    or of another declaration's needs."""
    report = DiffReport(against)
    wanted = {needed.path: needed for needed in new.files + model_files(new.models)}
    for path, needed in sorted(wanted.items()):
        if path not in old:
            report.add.append(needed)
        elif needed.sha256 and old[path] and old[path] != needed.sha256:
            report.replace.append((needed, old[path]))
        else:
            report.unchanged += 1
    report.unneeded = sorted(path for path in old if path not in wanted)
    return report


def manifest_files(manifest: Manifest) -> dict[str, str]:
    return {path: entry.sha256 for path, entry in manifest.entries.items()}


def needs_files(needs: Needs) -> dict[str, str]:
    return {needed.path: needed.sha256 for needed in needs.files + model_files(needs.models)}


def model_files(models: list[ModelNeeded]) -> list[Needed]:
    """Model tarballs as diff counts them: a path and the inventory's pin."""
    return [Needed(model.path, "model", model.sha256, mirror_models.PIN_SOURCE, model.placeholder) for model in models]
