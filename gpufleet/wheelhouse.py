"""The wheelhouse: resolve a stack once on the controller, lock it with hashes, fill the mirror.

Nodes never resolve versions: `gpufleet wheelhouse build` resolves the stack's requirements for the
nodes' platform and Python (pip's --dry-run --report with --platform/--python-version/--only-binary),
writes a lock of `name==version --hash=sha256:...` lines, downloads every wheel once into a cache keyed
by content (${GPUFLEET_CACHE}/wheels/<sha256>/<file>), and publishes them with an index page under
<mirror>/wheels/<stack id>/, where the inference_venv role installs from with --require-hashes.

An existing lock made from the same stack declaration is reused as is (no resolution, the same versions
on every run); `--upgrade` resolves again.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import yaml

from gpufleet import compat
from gpufleet.digests import sha256_file
from gpufleet.errors import GpufleetError

STACK_VARIABLE = "inference_venv_stack"
DEFAULT_INDEX_URL = "https://pypi.org/simple"
LOCK_RECORD_NAME = "requirements.lock"
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_PLATFORM_RE = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$")
_PYTHON_RE = re.compile(r"^3\.\d{1,2}$")
# The legacy manylinux names and the glibc they stand for (PEP 600).
_LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}


# The lock parser and writer shipped to nodes with the pip_lock module: the controller and the nodes share one
# implementation.
pip_lock = compat.load_module_util("pip_lock")


@dataclass(frozen=True)
class StackSpec:
    """What a stack's venv holds and for which nodes: the input of a lock."""

    id: str
    python: str
    platform: str
    requirements: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    index_url: str = DEFAULT_INDEX_URL
    torch_index_url: str = ""
    find_links: tuple[str, ...] = ()

    def digest(self) -> str:
        """sha256 of the declaration; a lock records it so a changed declaration is noticed."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "python": self.python,
            "platform": self.platform,
            "requirements": list(self.requirements),
            "exclude": sorted(self.exclude),
            "index_url": self.index_url,
            "torch_index_url": self.torch_index_url,
            "find_links": list(self.find_links),
        }


def _string_list(value: Any, key: str, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GpufleetError(f"{source}: {key} must be a list of strings, got {value!r}")
    return tuple(value)


def spec_from_mapping(data: Any, source: str) -> StackSpec:
    """Validates a stack declaration (the inference_venv_stack variable); names the bad key and the fix."""
    if not isinstance(data, dict):
        raise GpufleetError(f"{source}: the stack must be a mapping with id, python, platform and requirements")
    missing = [key for key in ("id", "python", "platform", "requirements") if not data.get(key)]
    if missing:
        raise GpufleetError(
            f"{source}: the stack lacks {', '.join(missing)}; "
            "declare id, python (e.g. '3.11'), platform (e.g. manylinux_2_36_x86_64), requirements"
        )
    if not isinstance(data["python"], str):
        # YAML reads 3.10 as the float 3.1: only a quoted version is unambiguous.
        raise GpufleetError(f"{source}: python must be a quoted MAJOR.MINOR string like '3.11', got {data['python']!r}")
    unknown = sorted(set(data) - set(StackSpec.__dataclass_fields__))
    if unknown:
        raise GpufleetError(f"{source}: unknown stack keys {', '.join(unknown)}")
    spec = StackSpec(
        id=str(data["id"]),
        python=str(data["python"]),
        platform=str(data["platform"]),
        requirements=_string_list(data["requirements"], "requirements", source),
        exclude=_string_list(data.get("exclude"), "exclude", source),
        index_url=str(data.get("index_url") or DEFAULT_INDEX_URL),
        torch_index_url=str(data.get("torch_index_url") or ""),
        find_links=_string_list(data.get("find_links"), "find_links", source),
    )
    if not _ID_RE.match(spec.id):
        raise GpufleetError(f"{source}: stack id {spec.id!r} must be lowercase letters, digits, '.', '_' or '-'")
    if not _PYTHON_RE.match(spec.python):
        raise GpufleetError(f"{source}: python {spec.python!r} must be MAJOR.MINOR, e.g. '3.11' (quote it in YAML)")
    platform_tags(spec.platform, source)
    for requirement in spec.requirements:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?\s*(==|>=|<=|~=|!=|<|>)", requirement):
            raise GpufleetError(f"{source}: requirement {requirement!r} has no version; pin it like vllm==0.11.0")
    return spec


def platform_tags(platform: str, source: str = "stack") -> list[str]:
    """Every manylinux tag a node of that glibc accepts, newest first: pip does not expand --platform itself."""
    match = _PLATFORM_RE.match(platform)
    if not match:
        raise GpufleetError(
            f"{source}: platform {platform!r} must look like manylinux_2_36_x86_64 (the nodes' glibc and architecture)"
        )
    major, minor, arch = int(match.group(1)), int(match.group(2)), match.group(3)
    # manylinux starts at glibc 2.5 on x86_64 and at 2.17 on aarch64.
    oldest = 17 if arch == "aarch64" else 5
    if major != 2 or minor < oldest:
        raise GpufleetError(f"{source}: platform {platform!r} names a glibc manylinux does not cover")
    tags = []
    for glibc_minor in range(minor, oldest - 1, -1):
        tags.append(f"manylinux_2_{glibc_minor}_{arch}")
        legacy = _LEGACY_MANYLINUX.get((2, glibc_minor))
        if legacy and (arch == "x86_64" or glibc_minor == 17):
            tags.append(f"{legacy}_{arch}")
    return tags


def load_stack_file(path: Path) -> StackSpec:
    """A YAML file holding the stack, at top level or under inference_venv_stack."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise GpufleetError(f"stack file {path} does not exist") from None
    except yaml.YAMLError as error:
        raise GpufleetError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if isinstance(data, dict) and STACK_VARIABLE in data:
        data = data[STACK_VARIABLE]
    return spec_from_mapping(data, str(path))


def stacks_from_inventory(inventory: Path) -> list[StackSpec]:
    """The distinct stacks the inventory's hosts declare (group_vars per GPU class may differ)."""
    if not inventory.exists():
        raise GpufleetError(f"inventory {inventory} does not exist; for the lab, run `gpufleet lab up` first")
    command = [_ansible_tool("ansible-inventory"), "-i", str(inventory), "--list"]
    process = subprocess.run(command, capture_output=True, text=True, check=False)
    if process.returncode != 0:
        raise GpufleetError(f"ansible-inventory cannot read {inventory}: {process.stderr.strip()[-300:]}")
    hostvars = json.loads(process.stdout).get("_meta", {}).get("hostvars", {})
    stacks: dict[str, StackSpec] = {}
    for host, variables in sorted(hostvars.items()):
        declaration = declared_venv(variables, f"{inventory} (host {host})")
        if declaration is None:
            continue
        spec = spec_from_mapping(declaration, f"{inventory} (host {host})")
        if spec.id in stacks and stacks[spec.id] != spec:
            raise GpufleetError(f"{inventory}: two different stacks are both called {spec.id!r}; give each its own id")
        stacks[spec.id] = spec
    if not stacks:
        raise GpufleetError(
            f"no host of {inventory} declares gpufleet_stack; declare it in group_vars "
            "(or pass --stack FILE); for the lab, run `gpufleet lab up` first"
        )
    return list(stacks.values())


def declared_venv(variables: dict[str, Any], source: str) -> dict[str, Any] | None:
    """A host's venv declaration: the one the inference_venv role derives from gpufleet_stack (validated
    first, as the role's lookup does) and inference_venv_stack_options, or an explicit inference_venv_stack."""
    if STACK_VARIABLE in variables:
        return variables[STACK_VARIABLE]
    if "gpufleet_stack" not in variables:
        return None
    spec = compat.stack_spec()
    try:
        stack = spec.normalize_stack(variables["gpufleet_stack"])
    except spec.StackError as error:
        raise GpufleetError(f"{source}: gpufleet_stack is invalid: {error}") from None
    declared = (variables.get("inference_venv_stack_options") or {}).get("platform")
    if stack.get("platform") is None and declared:
        # The platform the wheelhouse is declared for is the one its wheels are checked for.
        stack = dict(stack, platform=str(declared))
    report = compat.stack_declared().validate_stack(stack, compat.load_knowledge_base())
    if report["errors"]:
        raise GpufleetError(
            f"{source}: the declared stack is not compatible: "
            + " | ".join(f"[{item['link']}] {item['message']}" for item in report["errors"])
        )
    return compat.load_plugin_util("stack_artifacts").venv(stack, variables.get("inference_venv_stack_options") or {})


def _ansible_tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def default_lock_path(base_dir: Path, spec: StackSpec) -> Path:
    return base_dir / "locks" / f"{spec.id}.lock"


def cache_root() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


# --- resolution -------------------------------------------------------------------------------------------


# The projects PyTorch's index is the source of: nothing else is taken from it. pip merges an --extra-index-url with
# the main index and takes the highest version of any name from either (the torchtriton attack of December 2022),
# so PyTorch's index is read only through these projects' own pages (as --find-links), and every other name comes
# from the main index alone.
TORCH_INDEX_PROJECTS = ("torch", "torchvision", "torchaudio", "triton", "pytorch-triton")


def pip_target_args(spec: StackSpec) -> list[str]:
    """pip options that make it pick wheels for the nodes, not for the controller, each project from its source."""
    args = ["--python-version", spec.python, "--implementation", "cp", "--only-binary=:all:"]
    for tag in platform_tags(spec.platform, spec.id):
        args += ["--platform", tag]
    args += ["--index-url", spec.index_url]
    for project in TORCH_INDEX_PROJECTS if spec.torch_index_url else ():
        args += ["--find-links", f"{spec.torch_index_url.rstrip('/')}/{project}/"]
    for link in spec.find_links:
        args += ["--find-links", link]
    return args


@dataclass(frozen=True)
class Resolution:
    """Lock entries and the projects whose wheels came from PyTorch's index (the rest from the main index)."""

    entries: list[Any]
    from_torch_index: frozenset[str] = frozenset()


def resolve(spec: StackSpec, keep: list[Any] | None = None) -> Resolution:
    """Resolves the requirements for the nodes' platform; returns lock entries minus the excluded projects.
    `keep` (entries of a previous lock) become constraints: what they pin stays at its version."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-resolve-") as tmp:
        report_path = Path(tmp) / "report.json"
        constraints: list[str] = []
        if keep:
            constraints_path = Path(tmp) / "constraints.txt"
            constraints_path.write_text("".join(f"{entry.name}=={entry.version}\n" for entry in keep))
            constraints = ["--constraint", str(constraints_path)]
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report_path),
            "--target",
            str(Path(tmp) / "t"),
            *pip_target_args(spec),
            *constraints,
            *spec.requirements,
        ]
        process = subprocess.run(command, capture_output=True, text=True, check=False)
        if process.returncode != 0:
            errors = [
                line for line in process.stderr.splitlines() if line.startswith("ERROR")
            ] or process.stderr.strip().splitlines()[-5:]
            raise GpufleetError(
                f"stack {spec.id}: pip cannot resolve {' '.join(spec.requirements)} for "
                f"python {spec.python} on {spec.platform}: {' / '.join(errors)}"
            )
        report = json.loads(report_path.read_text())
    return Resolution(entries_from_report(report, spec), from_torch_index(report, spec))


def entries_from_report(report: dict[str, Any], spec: StackSpec) -> list[Any]:
    """Lock entries from pip's installation report (PEP 691/710 fields), dropping excluded projects."""
    excluded = {pip_lock.canonical_name(name) for name in spec.exclude}
    entries = []
    for item in report.get("install", []):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if pip_lock.canonical_name(name) in excluded:
            continue
        info = item.get("download_info", {})
        digest = _report_sha256(info)
        if not digest:
            raise GpufleetError(
                f"stack {spec.id}: pip reported no sha256 for {name}=={version} ({info.get('url')}); "
                "use an index that publishes hashes"
            )
        filename = info.get("url", "").rsplit("/", 1)[-1].split("#", 1)[0]
        entries.append(pip_lock.LockEntry(name, version, (digest,), unquote(filename)))
    return entries


def from_torch_index(report: dict[str, Any], spec: StackSpec) -> frozenset[str]:
    """The projects pip took from PyTorch's index: their wheel's URL is under it (or on its host, where the main
    index is elsewhere: the index's pages may link wheels by another path of the same host)."""
    if not spec.torch_index_url:
        return frozenset()
    torch_index = urlsplit(spec.torch_index_url)
    other_host = torch_index.netloc != urlsplit(spec.index_url).netloc
    names = set()
    for item in report.get("install", []):
        url = item.get("download_info", {}).get("url", "")
        if url.startswith(spec.torch_index_url.rstrip("/") + "/") or (
            other_host and torch_index.netloc and urlsplit(url).netloc == torch_index.netloc
        ):
            names.add(pip_lock.canonical_name(item["metadata"]["name"]))
    return frozenset(names)


def source_changes(previous: Any, current: Any) -> list[str]:
    """What the new lock takes from another index than the lock it replaces (both written with their sources):
    a torch that PyTorch's index no longer offers at the pinned version comes from the main index, another build."""
    if TORCH_INDEX_HEADER not in previous.header or TORCH_INDEX_HEADER not in current.header:
        return []
    before, after = (set(lock.header[TORCH_INDEX_HEADER].split()) - {"-"} for lock in (previous, current))
    pinned = set(previous.by_name()) & set(current.by_name())
    return [
        f"source changed: {name} now comes from "
        + (
            "PyTorch's index (the previous lock took it from the main index)"
            if name in after
            else "the main index (the previous lock took it from PyTorch's index): check it is the build you want"
        )
        for name in sorted((before ^ after) & pinned)
    ]


def _report_sha256(info: dict[str, Any]) -> str:
    archive = info.get("archive_info", {})
    hashes = archive.get("hashes") or {}
    if "sha256" in hashes:
        return str(hashes["sha256"])
    legacy = str(archive.get("hash", ""))
    return legacy.split("=", 1)[1] if legacy.startswith("sha256=") else ""


# The lock's header line naming what came from PyTorch's index (written when the stack names that index).
TORCH_INDEX_HEADER = "from-torch-index"


def lock_header(spec: StackSpec, from_torch_index: frozenset[str] = frozenset()) -> dict[str, str]:
    header = {
        "stack": spec.id,
        "spec-sha256": spec.digest(),
        "python": spec.python,
        "platform": spec.platform,
        "requirements": " ".join(spec.requirements),
        "excluded": " ".join(sorted(spec.exclude)) or "-",
    }
    if spec.torch_index_url:
        header[TORCH_INDEX_HEADER] = " ".join(sorted(from_torch_index)) or "-"
    header["generated-by"] = "gpufleet wheelhouse build (edit the stack, not this file)"
    return header


def write_lock(path: Path, spec: StackSpec, resolution: Resolution) -> None:
    text = pip_lock.format_lock(lock_header(spec, resolution.from_torch_index), resolution.entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.part")
    partial.write_text(text)
    os.replace(partial, path)


def read_lock(path: Path) -> Any:
    try:
        return pip_lock.parse_lock(path.read_text())
    except pip_lock.LockError as error:
        raise GpufleetError(f"{path}: {error}; rebuild it with `gpufleet wheelhouse build --upgrade`") from None


# --- the content-keyed cache --------------------------------------------------------------------------------


def cached_file(cache: Path, entry: Any) -> Path | None:
    """The cached wheel for an entry (any of its hashes), or None."""
    for digest in entry.hashes:
        directory = cache / digest
        if directory.is_dir():
            files = [p for p in directory.iterdir() if p.suffix == ".whl"]
            if files:
                return files[0]
    return None


def cached_wheel(cache: Path, entry: Any) -> Path:
    """The cached wheel of an entry that download_missing has already fetched."""
    source = cached_file(cache, entry)
    assert source is not None, "download_missing fills the cache first"
    return source


def store_in_cache(cache: Path, wheel: Path) -> Path:
    """Moves a downloaded wheel to cache/<sha256>/<name>, computing the sha256 from its bytes."""
    digest = sha256_file(wheel)
    target = cache / digest / wheel.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(wheel), target)
    return target


def download_missing(spec: StackSpec, entries: list[Any], cache: Path, say: Callable[[str], None] = print) -> int:
    """pip download (hash-checked) of every entry the cache lacks, saying each file as it lands (which, how big,
    how many of how many); returns how many were downloaded."""
    missing = [entry for entry in entries if cached_file(cache, entry) is None]
    if not missing:
        return 0
    say(f"stack {spec.id}: downloading {len(missing)} of {len(entries)} wheels (the others are cached)")
    with tempfile.TemporaryDirectory(prefix="gpufleet-download-", dir=_tmp_dir(cache)) as tmp:
        subset = Path(tmp) / "missing.lock"
        subset.write_text(pip_lock.format_lock({"stack": spec.id}, missing))
        target = Path(tmp) / "wheels"
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--require-hashes",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--dest",
            str(target),
            *pip_target_args(spec),
            "-r",
            str(subset),
        ]
        returncode, errors = _run_saying_saved(command, target, len(missing), say)
        if returncode != 0:
            lines = errors.strip().splitlines()
            raise GpufleetError(f"stack {spec.id}: downloading {len(missing)} wheels failed: {' / '.join(lines[-4:])}")
        for wheel in sorted(target.glob("*.whl")):
            store_in_cache(cache, wheel)
    still = [entry.requirement() for entry in missing if cached_file(cache, entry) is None]
    if still:
        raise GpufleetError(f"stack {spec.id}: pip downloaded no file with the pinned sha256 for {', '.join(still)}")
    return len(missing)


# pip download's line for each file it wrote ("Saved ./wheels/torch-2.13.0-....whl").
SAVED_LINE = re.compile(r"^Saved (.+\.whl)$")


def _run_saying_saved(command: list[str], target: Path, count: int, say: Callable[[str], None]) -> tuple[int, str]:
    """Runs pip, saying each wheel it saves with its size and the bytes so far; returns (exit status, stderr)."""
    done, total = 0, 0
    with tempfile.TemporaryFile(mode="w+") as errors:
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                saved = SAVED_LINE.match(line.strip())
                if not saved:
                    continue
                wheel = target / Path(saved.group(1)).name
                size = wheel.stat().st_size if wheel.exists() else 0
                done, total = done + 1, total + size
                say(f"  [{done}/{count}] {wheel.name} {size / 1e6:.1f} MB ({total / 1e9:.2f} GB so far)")
        errors.seek(0)
        return process.returncode, errors.read()


def _tmp_dir(cache: Path) -> Path:
    """Downloads land next to the cache so moving them in is a rename, not a copy."""
    path = cache / ".tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- publishing -----------------------------------------------------------------------------------------


def index_page(spec: StackSpec, files: list[tuple[str, str]]) -> str:
    """A find-links page: one link per wheel with its sha256 in the fragment, which pip checks."""
    links = "\n".join(f'<a href="{quote(name)}#sha256={digest}">{html.escape(name)}</a><br/>' for name, digest in files)
    return (
        f"<!DOCTYPE html>\n<html><head><title>gpufleet wheelhouse {html.escape(spec.id)}</title></head>"
        f"<body>\n{links}\n</body></html>\n"
    )


def _link_or_copy(source: Path, target: Path) -> None:
    partial = target.with_name(f".{target.name}.part")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:
        shutil.copyfile(source, partial)
        os.chmod(partial, 0o644)
    os.replace(partial, target)


def publish(spec: StackSpec, entries: list[Any], cache: Path, mirror_dir: Path, lock_path: Path) -> Path:
    """Fills mirror/wheels/<id>/ with exactly the locked wheels (hard links into the cache), index and lock."""
    directory = mirror_dir / "wheels" / spec.id
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for entry in entries:
        source = cached_wheel(cache, entry)
        target = directory / source.name
        # A file that is not the cached inode (replaced or altered on the mirror) is put back.
        if not (target.exists() and os.path.samefile(source, target)):
            _link_or_copy(source, target)
        files.append((source.name, source.parent.name))
    wanted = {name for name, _ in files} | {"index.html", LOCK_RECORD_NAME}
    for stale in directory.iterdir():
        if stale.name not in wanted and stale.is_file():
            stale.unlink()
    (directory / ".index.html.part").write_text(index_page(spec, sorted(files)))
    os.replace(directory / ".index.html.part", directory / "index.html")
    shutil.copyfile(lock_path, directory / f".{LOCK_RECORD_NAME}.part")
    os.replace(directory / f".{LOCK_RECORD_NAME}.part", directory / LOCK_RECORD_NAME)
    return directory


# --- the whole build ----------------------------------------------------------------------------------------


@dataclass
class BuildReport:
    spec: StackSpec
    lock_path: Path
    lock_action: str
    packages: int = 0
    downloaded: int = 0
    total_bytes: int = 0
    published: Path | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [
            f"stack {self.spec.id}: lock {self.lock_path} ({self.lock_action}, {self.packages} packages)",
            f"  wheels: {self.packages - self.downloaded} from the cache, {self.downloaded} downloaded, "
            f"{self.total_bytes / 1e9:.2f} GB",
        ]
        if self.published:
            lines.append(f"  mirror: {self.published}/ (index.html, {LOCK_RECORD_NAME})")
        lines += [f"  {note}" for note in self.notes]
        lines.append(f"  done in {self.seconds:.1f} s")
        return "\n".join(lines)


def build(
    spec: StackSpec,
    lock_path: Path,
    mirror_dir: Path | None,
    upgrade: bool = False,
    cache: Path | None = None,
    say: Callable[[str], None] = print,
) -> BuildReport:
    """Lock (reused when the declaration is unchanged), download what the cache lacks, publish."""
    started = time.monotonic()
    cache = cache or cache_root() / "wheels"
    entries, action, changes = _lock_entries(spec, lock_path, upgrade, say)
    report = BuildReport(spec, lock_path, action, packages=len(entries), notes=changes)
    report.downloaded = download_missing(spec, entries, cache, say)
    report.total_bytes = sum(cached_wheel(cache, entry).stat().st_size for entry in entries)
    if mirror_dir is not None:
        report.published = publish(spec, entries, cache, mirror_dir, lock_path)
    else:
        report.notes.append("no mirror filled (--no-mirror): nodes install from the index the inventory names")
    report.seconds = time.monotonic() - started
    return report


def _lock_entries(
    spec: StackSpec, lock_path: Path, upgrade: bool, say: Callable[[str], None] = print
) -> tuple[list[Any], str, list[str]]:
    """The lock's entries, how they were had, and which projects now come from another index than before."""
    replaced = read_lock(lock_path) if lock_path.exists() else None
    previous = None if upgrade else replaced
    if previous is not None and previous.header.get("spec-sha256") == spec.digest():
        return previous.entries, "reused", []
    started = time.monotonic()
    say(
        f"stack {spec.id}: resolving {len(spec.requirements)} requirements for python {spec.python} on "
        f"{spec.platform} (pip reads each candidate's metadata: minutes for a GPU stack)"
    )
    if previous is not None:
        resolution, action = _resolve_keeping(spec, previous.entries)
    else:
        action = "resolved" if replaced is None else "re-resolved (--upgrade)"
        resolution = resolve(spec)
    say(f"stack {spec.id}: {len(resolution.entries)} packages resolved in {time.monotonic() - started:.0f} s")
    write_lock(lock_path, spec, resolution)
    written = read_lock(lock_path)
    return written.entries, action, source_changes(replaced, written) if replaced is not None else []


def _resolve_keeping(spec: StackSpec, previous: list[Any]) -> tuple[Resolution, str]:
    """A changed declaration keeps the previous lock's versions where they still fit, so adding one
    requirement (Ray for a cluster) adds its wheels without moving the rest; when they no longer fit
    (a new vLLM pins another torch) it is resolved afresh, as --upgrade would."""
    try:
        return resolve(spec, keep=previous), "re-resolved: the stack declaration changed (previous pins kept)"
    except GpufleetError:
        return resolve(spec), "re-resolved: the stack declaration changed (previous pins conflict: resolved afresh)"
