"""The simulated libnvidia-ml.so.1 at the C ABI: return codes, struct layouts, buffer rules, description checks.

These call the library through raw ctypes, as any NVML client would, without our binding in between.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import simgpu

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED = 0, 1, 2, 3
INSUFFICIENT_SIZE, DRIVER_NOT_LOADED, GPU_IS_LOST, MISMATCH, UNKNOWN = 7, 9, 15, 18, 999


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


@pytest.fixture
def lib(simgpu_machine: simgpu.SimulatedMachine) -> ctypes.CDLL:
    return ctypes.CDLL(str(simgpu_machine.library))


@pytest.fixture
def session(lib: ctypes.CDLL):
    """An initialised NVML session on the library, shut down afterwards."""
    assert lib.nvmlInit_v2() == SUCCESS
    yield lib
    assert lib.nvmlShutdown() == SUCCESS


def handle(lib: ctypes.CDLL, index: int = 0) -> ctypes.c_void_p:
    device = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) == SUCCESS
    return device


def test_exports_the_nvml_entry_points_only(simgpu_library: Path) -> None:
    result = subprocess.run(
        ["nm", "-D", "--defined-only", str(simgpu_library)], capture_output=True, text=True, check=True
    )
    symbols = {line.split()[-1] for line in result.stdout.splitlines() if " T " in line}
    assert all(symbol.startswith("nvml") for symbol in symbols), symbols - {s for s in symbols if s[:4] == "nvml"}
    for name in (
        "nvmlInit_v2",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetMigMode",
    ):
        assert name in symbols


def test_soname_is_libnvidia_ml_so_1(simgpu_library: Path) -> None:
    result = subprocess.run(["objdump", "-p", str(simgpu_library)], capture_output=True, text=True, check=True)
    assert "SONAME               libnvidia-ml.so.1" in result.stdout


def test_calls_before_init_are_uninitialized(lib: ctypes.CDLL) -> None:
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED
    assert lib.nvmlShutdown() == UNINITIALIZED


def test_init_is_reference_counted(lib: ctypes.CDLL) -> None:
    count = ctypes.c_uint()
    assert lib.nvmlInit_v2() == SUCCESS and lib.nvmlInit() == SUCCESS
    assert lib.nvmlShutdown() == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 1
    assert lib.nvmlShutdown() == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED


def test_error_strings(lib: ctypes.CDLL) -> None:
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(NOT_SUPPORTED) == b"Not Supported"
    assert lib.nvmlErrorString(GPU_IS_LOST) == b"GPU is lost"
    assert lib.nvmlErrorString(DRIVER_NOT_LOADED) == b"Driver Not Loaded"
    assert lib.nvmlErrorString(12345) == b"Unknown Error"


def test_short_buffers_get_insufficient_size(session: ctypes.CDLL) -> None:
    buffer = ctypes.create_string_buffer(80)
    assert session.nvmlSystemGetDriverVersion(buffer, 10) == INSUFFICIENT_SIZE  # "580.159.04" needs 11
    assert session.nvmlSystemGetDriverVersion(buffer, 11) == SUCCESS and buffer.value == b"580.159.04"
    assert session.nvmlDeviceGetName(handle(session), buffer, 5) == INSUFFICIENT_SIZE


def test_bad_arguments(session: ctypes.CDLL) -> None:
    device = ctypes.c_void_p()
    assert session.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(device)) == INVALID_ARGUMENT
    value = ctypes.c_uint()
    assert session.nvmlDeviceGetTemperature(handle(session), 7, ctypes.byref(value)) == INVALID_ARGUMENT
    bogus = ctypes.c_void_p(12345)
    assert session.nvmlDeviceGetTemperature(bogus, 0, ctypes.byref(value)) == INVALID_ARGUMENT
    assert session.nvmlDeviceGetPowerUsage(handle(session), None) == INVALID_ARGUMENT


def test_pci_info_layout_and_formats(session: ctypes.CDLL) -> None:
    assert ctypes.sizeof(PciInfo) == 68  # 16 + 5 * 4 + 32, as nvml.h lays it out
    info = PciInfo()
    assert session.nvmlDeviceGetPciInfo_v3(handle(session), ctypes.byref(info)) == SUCCESS
    assert info.busId == b"00000000:00:06.0" and info.busIdLegacy == b"0000:00:06.0"
    assert (info.domain, info.bus, info.device) == (0, 0, 6)


class MemoryV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def test_memory_v1_counts_reserved_as_used_and_v2_reports_it_apart(session: ctypes.CDLL) -> None:
    device = handle(session)
    v1 = MemoryV1()
    assert session.nvmlDeviceGetMemoryInfo(device, ctypes.byref(v1)) == SUCCESS
    assert (v1.total, v1.used, v1.free) == (150754820096, 644939776, 150754820096 - 644939776)
    assert ctypes.sizeof(MemoryV2) == 40
    v2 = MemoryV2(version=40 | 2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)
    assert session.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(v2)) == SUCCESS
    assert (v2.total, v2.reserved, v2.used, v2.free) == (150754820096, 644939776, 0, 150754820096 - 644939776)
    stale = MemoryV2(version=1)
    assert session.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(stale)) == 25  # ARGUMENT_VERSION_MISMATCH


def test_handle_by_uuid(session: ctypes.CDLL) -> None:
    device = ctypes.c_void_p()
    assert session.nvmlDeviceGetHandleByUUID(b"GPU-1757f6d0-d02c-d95a-c569-55d572b0340a", ctypes.byref(device)) == 0
    assert device.value == handle(session).value
    assert session.nvmlDeviceGetHandleByUUID(b"GPU-nope", ctypes.byref(device)) == 6  # NVML_ERROR_NOT_FOUND


def test_retired_pages_size_query(simgpu_machine: simgpu.SimulatedMachine, lib: ctypes.CDLL) -> None:
    simgpu_machine.ctl("retired-pages", "--double-bit", "3")
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        device, count = handle(lib), ctypes.c_uint(0)
        assert lib.nvmlDeviceGetRetiredPages(device, 1, ctypes.byref(count), None) == INSUFFICIENT_SIZE
        assert count.value == 3
        addresses = (ctypes.c_ulonglong * 3)()
        assert lib.nvmlDeviceGetRetiredPages(device, 1, ctypes.byref(count), addresses) == SUCCESS
        assert list(addresses) == [0x800000, 0x801000, 0x802000]
        count.value = 0
        assert lib.nvmlDeviceGetRetiredPages(device, 0, ctypes.byref(count), None) == SUCCESS and count.value == 0
    finally:
        lib.nvmlShutdown()


def test_lost_gpu_has_no_handle(simgpu_machine: simgpu.SimulatedMachine, lib: ctypes.CDLL) -> None:
    simgpu_machine.ctl("gpu-count", "2")
    simgpu_machine.ctl("lose", "--gpu", "1")
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        count, device = ctypes.c_uint(), ctypes.c_void_p()
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 2
        assert lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(device)) == GPU_IS_LOST
    finally:
        lib.nvmlShutdown()


@pytest.mark.parametrize(
    ("switch", "code"), [(("driver", "unload"), DRIVER_NOT_LOADED), (("mismatch", "570.133.20"), MISMATCH)]
)
def test_init_failures(
    simgpu_machine: simgpu.SimulatedMachine, lib: ctypes.CDLL, switch: tuple[str, ...], code: int
) -> None:
    simgpu_machine.ctl(*switch)
    assert lib.nvmlInit_v2() == code
    assert lib.nvmlShutdown() == UNINITIALIZED


def init_in_subprocess(library: Path, description: Path) -> subprocess.CompletedProcess[str]:
    """nvmlInit_v2 in a fresh process, so the library's stderr can be read."""
    code = f"import ctypes; print(ctypes.CDLL({str(library)!r}).nvmlInit_v2())"
    env = {**os.environ, simgpu.DESCRIPTION_ENV: str(description)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)


def edited(description: dict, path: str, value: object) -> dict:
    """A copy of the description with the value at a dotted path replaced (or removed when value is None)."""
    copy = json.loads(json.dumps(description))
    node = copy
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is None:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    return copy


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("gpus.0.bogus", 1, 'gpus[0]: unknown key "bogus"'),
        ("gpus.0.name", None, 'gpus[0]: missing "name"'),
        ("gpus.0.name", 42, "gpus[0].name: expected a string, got a number"),
        ("gpus.0.memory_used_bytes", 10**15, "memory_used_bytes + memory_reserved_bytes is larger than memory_total"),
        ("gpus.0.temperature_c", -3, "gpus[0].temperature_c: expected a whole number"),
        ("gpus.0.pci_bus_id", "0:0:6", "gpus[0].pci_bus_id: expected DOMAIN:BUS:DEVICE.0"),
        ("gpus.0.compute_capability", [9], "expected [major, minor]"),
        ("gpus.0.not_supported", ["warp_drive"], "gpus[0].not_supported[0]: not a feature name"),
        ("gpus.0.compute_mode", "shared", "gpus[0].compute_mode: expected default"),
        ("driver.cuda_driver_version", "13.0", "driver.cuda_driver_version: expected a number, got a string"),
        ("driver", None, 'description: missing "driver"'),
    ],
)
def test_bad_descriptions_fail_init_with_a_reason(
    simgpu_library: Path, tmp_path: Path, path: str, value: object, error: str
) -> None:
    description = tmp_path / "gpus.json"
    default = json.loads(simgpu.DEFAULT_DESCRIPTION.read_text())
    description.write_text(json.dumps(edited(default, path, value)))
    result = init_in_subprocess(simgpu_library, description)
    assert result.stdout.strip() == str(UNKNOWN)
    assert result.stderr.startswith(f"gpufleet-simgpu: {description}: ")
    assert error in result.stderr


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"driver": ', "is not valid JSON: line 1: unexpected end of file"),
        ('{"a": 1,\n "a": 2}', 'line 2: duplicate member "a"'),
        ('{"a": "tab\there"}', "control character inside a string"),
        ("[1, 2] x", "unexpected text after the end of the document"),
        ("[" * 100 + "]" * 100, "nested deeper than 64 levels"),
        ('{"a": +1}', "unexpected character '+'"),
    ],
)
def test_malformed_json_is_reported_with_its_line(simgpu_library: Path, tmp_path: Path, text: str, error: str) -> None:
    description = tmp_path / "gpus.json"
    description.write_text(text)
    result = init_in_subprocess(simgpu_library, description)
    assert result.stdout.strip() == str(UNKNOWN)
    assert error in result.stderr


def test_missing_description_names_the_file(simgpu_library: Path, tmp_path: Path) -> None:
    result = init_in_subprocess(simgpu_library, tmp_path / "absent.json")
    assert result.stdout.strip() == str(UNKNOWN)
    assert f"cannot open {tmp_path / 'absent.json'}: No such file or directory" in result.stderr


def test_json_escapes_and_unicode(simgpu_machine: simgpu.SimulatedMachine, lib: ctypes.CDLL) -> None:
    description = simgpu_machine.read()
    description["gpus"][0]["name"] = 'NVIDIA "H200" \\ Gr\u00fc\u00dfe \U0001f680'
    # json.dumps escapes non-ASCII as \\uXXXX (with a surrogate pair for the rocket): the C reader decodes them.
    simgpu_machine.description.write_text(json.dumps(description))
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        buffer = ctypes.create_string_buffer(96)
        assert lib.nvmlDeviceGetName(handle(lib), buffer, 96) == SUCCESS
        assert buffer.value.decode() == 'NVIDIA "H200" \\ Gr\u00fc\u00dfe \U0001f680'
    finally:
        lib.nvmlShutdown()


def test_build_is_cached_by_source_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_CACHE", str(tmp_path))
    first = simgpu.build_library()
    assert first == tmp_path / "simgpu" / simgpu.sources_digest() / "libnvidia-ml.so.1"
    stamp = first.stat().st_mtime_ns
    assert simgpu.build_library() == first and first.stat().st_mtime_ns == stamp
    assert [path.name for path in first.parent.iterdir()] == ["libnvidia-ml.so.1"]  # no partial builds left
