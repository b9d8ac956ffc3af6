"""What the NVIDIA driver reports about a machine and its GPUs, read through NVML (libnvidia-ml.so.1).

Standard library only (ctypes): this file is shipped to targets with the modules that use it.

`read_gpu_state()` returns the driver's versions and one flat dict per GPU. A field the GPU does not
support is None and named in the GPU's `unsupported` list; any other per-field failure is None and
explained in its `errors` dict. Failures of the whole driver raise one of three exception classes,
each with a message that names the fix: NvmlLibraryNotFound, NvmlDriverNotLoaded, NvmlVersionMismatch.

`check_expectations()` compares such a report with an `expect` dict and lists every mismatch.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import nvml_cuda_version

LIBRARY_NAME = "libnvidia-ml.so.1"

# nvmlReturn_t values (nvml.h).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

RETURN_CODE_NAMES = {
    0: "NVML_SUCCESS",
    1: "NVML_ERROR_UNINITIALIZED",
    2: "NVML_ERROR_INVALID_ARGUMENT",
    3: "NVML_ERROR_NOT_SUPPORTED",
    4: "NVML_ERROR_NO_PERMISSION",
    5: "NVML_ERROR_ALREADY_INITIALIZED",
    6: "NVML_ERROR_NOT_FOUND",
    7: "NVML_ERROR_INSUFFICIENT_SIZE",
    8: "NVML_ERROR_INSUFFICIENT_POWER",
    9: "NVML_ERROR_DRIVER_NOT_LOADED",
    10: "NVML_ERROR_TIMEOUT",
    11: "NVML_ERROR_IRQ_ISSUE",
    12: "NVML_ERROR_LIBRARY_NOT_FOUND",
    13: "NVML_ERROR_FUNCTION_NOT_FOUND",
    14: "NVML_ERROR_CORRUPTED_INFOROM",
    15: "NVML_ERROR_GPU_IS_LOST",
    16: "NVML_ERROR_RESET_REQUIRED",
    17: "NVML_ERROR_OPERATING_SYSTEM",
    18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    19: "NVML_ERROR_IN_USE",
    20: "NVML_ERROR_MEMORY",
    21: "NVML_ERROR_NO_DATA",
    999: "NVML_ERROR_UNKNOWN",
}

# Enum values passed in (nvml.h).
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

# Event types (nvml.h's nvmlEventType*): a bit mask for nvmlDeviceRegisterEvents. An XID's eventData is its number.
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
EVENT_NAMES = {
    EVENT_SINGLE_BIT_ECC: "single_bit_ecc",
    EVENT_DOUBLE_BIT_ECC: "double_bit_ecc",
    EVENT_XID_CRITICAL: "xid",
}

# Buffer sizes nvml.h guarantees to be large enough.
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80

MIB = 1024 * 1024


class _PciInfo(ctypes.Structure):
    """nvmlPciInfo_t, as filled by nvmlDeviceGetPciInfo_v3."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class _Memory(ctypes.Structure):
    """nvmlMemory_t (version 1), in bytes."""

    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t, in bytes: `used` excludes the driver's reserved memory (nvidia-smi's "used")."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (the layout nvmlDeviceGetComputeRunningProcesses_v3 fills); memory in bytes."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t: the GPU's NVLink fabric as an NVSwitch system's fabric manager set it up."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class _EventData(ctypes.Structure):
    """nvmlEventData_t, as nvmlEventSetWait_v2 fills it."""

    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


# nvmlGpuFabricState_t. A GPU outside an NVSwitch system answers not_supported (the H200 of
# tests/fixtures/h200-real/fabric_and_kernel_log.txt did, with NVML_SUCCESS); on an HGX board the state is
# not_started until nvidia-fabricmanager has trained the fabric, then completed.
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")


# usedGpuMemory when NVML cannot tell (nvml.h's NVML_VALUE_NOT_AVAILABLE, as unsigned long long).
NVML_VALUE_NOT_AVAILABLE_ULL = 2**64 - 1

# NVML_STRUCT_VERSION(Memory, 2): the struct's size in the low bits, its version in the top byte.
_MEMORY_V2_VERSION = ctypes.sizeof(_MemoryV2) | (2 << 24)

_uint_p = ctypes.POINTER(ctypes.c_uint)
_int_p = ctypes.POINTER(ctypes.c_int)
_ull_p = ctypes.POINTER(ctypes.c_ulonglong)
_device = ctypes.c_void_p

# Argument types of every entry point used: ctypes then checks each call against nvml.h's prototype.
_PROTOTYPES: dict[str, list[Any]] = {
    "nvmlInit_v2": [],
    "nvmlShutdown": [],
    "nvmlSystemGetDriverVersion": [ctypes.c_char_p, ctypes.c_uint],
    "nvmlSystemGetNVMLVersion": [ctypes.c_char_p, ctypes.c_uint],
    "nvmlSystemGetCudaDriverVersion": [_int_p],
    "nvmlDeviceGetCount_v2": [_uint_p],
    "nvmlDeviceGetHandleByIndex_v2": [ctypes.c_uint, ctypes.POINTER(_device)],
    "nvmlDeviceGetName": [_device, ctypes.c_char_p, ctypes.c_uint],
    "nvmlDeviceGetUUID": [_device, ctypes.c_char_p, ctypes.c_uint],
    "nvmlDeviceGetPciInfo_v3": [_device, ctypes.POINTER(_PciInfo)],
    "nvmlDeviceGetCudaComputeCapability": [_device, _int_p, _int_p],
    "nvmlDeviceGetMemoryInfo": [_device, ctypes.POINTER(_Memory)],
    "nvmlDeviceGetMemoryInfo_v2": [_device, ctypes.POINTER(_MemoryV2)],
    "nvmlDeviceGetPersistenceMode": [_device, _uint_p],
    "nvmlDeviceGetEccMode": [_device, _uint_p, _uint_p],
    "nvmlDeviceGetTotalEccErrors": [_device, ctypes.c_uint, ctypes.c_uint, _ull_p],
    "nvmlDeviceGetMigMode": [_device, _uint_p, _uint_p],
    "nvmlDeviceGetPowerManagementLimit": [_device, _uint_p],
    "nvmlDeviceGetPowerUsage": [_device, _uint_p],
    "nvmlDeviceGetTemperature": [_device, ctypes.c_uint, _uint_p],
    "nvmlDeviceGetRetiredPages": [_device, ctypes.c_uint, _uint_p, _ull_p],
    "nvmlDeviceGetRetiredPagesPendingStatus": [_device, _uint_p],
    "nvmlDeviceGetRemappedRows": [_device, _uint_p, _uint_p, _uint_p, _uint_p],
    "nvmlDeviceGetComputeRunningProcesses_v3": [_device, _uint_p, ctypes.POINTER(_ProcessInfo)],
    "nvmlDeviceGetGpuFabricInfo": [_device, ctypes.POINTER(_GpuFabricInfo)],
    "nvmlDeviceGetSupportedEventTypes": [_device, _ull_p],
    "nvmlEventSetCreate": [ctypes.POINTER(ctypes.c_void_p)],
    "nvmlDeviceRegisterEvents": [_device, ctypes.c_ulonglong, ctypes.c_void_p],
    "nvmlEventSetWait_v2": [ctypes.c_void_p, ctypes.POINTER(_EventData), ctypes.c_uint],
    "nvmlEventSetFree": [ctypes.c_void_p],
}


class NvmlError(Exception):
    """An NVML call failed. `code` is the nvmlReturn_t (None when no call was made)."""

    def __init__(self, message: str, code: int | None = None, function: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.function = function


class NvmlLibraryNotFound(NvmlError):
    """libnvidia-ml.so.1 could not be loaded: the driver's user-space part is not installed."""


class NvmlDriverNotLoaded(NvmlError):
    """NVML loaded but cannot reach the kernel module (nvidia-smi: "couldn't communicate with the driver")."""


class NvmlVersionMismatch(NvmlError):
    """The user-space libraries and the loaded kernel module are different driver versions."""


class _NotSupported(Exception):
    """The GPU or this driver's NVML does not offer a query (NOT_SUPPORTED or a missing entry point)."""


class _GpuLost(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


def code_name(code: int) -> str:
    """NVML's symbolic name for a return code, e.g. NVML_ERROR_NOT_SUPPORTED."""
    return RETURN_CODE_NAMES.get(code, "NVML_ERROR_%d" % code)


def load_library(path: str | None = None) -> ctypes.CDLL:
    """Loads libnvidia-ml.so.1 from the loader path, or from `path` when given."""
    target = path or LIBRARY_NAME
    try:
        return ctypes.CDLL(target)
    except OSError as error:
        where = "at %s" % path if path else "on the loader path"
        raise NvmlLibraryNotFound(
            "cannot load %s %s (%s): the NVIDIA driver's user-space libraries are not installed. "
            "Fix: install the NVIDIA driver (its installer puts %s in the library path, then run ldconfig), "
            "or pass library=/path/to/%s." % (LIBRARY_NAME, where, error, LIBRARY_NAME, LIBRARY_NAME)
        ) from error


def _init_error(code: int, library: str) -> NvmlError:
    """The exception for a failed nvmlInit, with the fix for the usual cause."""
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return NvmlDriverNotLoaded(
            "NVML (%s) cannot communicate with the NVIDIA driver (NVML_ERROR_DRIVER_NOT_LOADED; nvidia-smi says "
            '"couldn\'t communicate with the NVIDIA driver"): the nvidia kernel module is not loaded, usually '
            "because the kernel changed without DKMS or nouveau holds the GPU. Fix: rebuild the module for the "
            "running kernel (DKMS), blacklist nouveau, and reboot." % library,
            code,
            "nvmlInit_v2",
        )
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return NvmlVersionMismatch(
            "Failed to initialize NVML (%s): Driver/library version mismatch (NVML_ERROR_LIB_RM_VERSION_MISMATCH): "
            "the driver's user-space libraries were updated while the old kernel module is still loaded. "
            "Fix: reboot the node, or unload and reload the nvidia kernel modules." % library,
            code,
            "nvmlInit_v2",
        )
    return NvmlError("nvmlInit_v2 failed in %s: %s" % (library, code_name(code)), code, "nvmlInit_v2")


class Nvml:
    """An initialised NVML session: `with Nvml() as nvml: nvml.driver_version()`."""

    def __init__(self, library_path: str | None = None) -> None:
        self.library_path = library_path
        self._lib = load_library(library_path)
        self._functions: dict[str, Any] = {}

    def __enter__(self) -> "Nvml":
        code = self._function("nvmlInit_v2")()
        if code != NVML_SUCCESS:
            raise _init_error(code, self.library_path or LIBRARY_NAME)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._function("nvmlShutdown")()

    def _function(self, name: str) -> Any:
        """The entry point `name` with its prototype set; AttributeError when this NVML lacks it."""
        if name not in self._functions:
            function = getattr(self._lib, name)
            function.argtypes = _PROTOTYPES[name]
            function.restype = ctypes.c_int
            self._functions[name] = function
        return self._functions[name]

    def call(self, name: str, *args: Any) -> None:
        """Calls an entry point; raises _NotSupported, _GpuLost or NvmlError unless it succeeds."""
        try:
            function = self._function(name)
        except AttributeError:
            raise _NotSupported(name) from None
        code = function(*args)
        if code == NVML_SUCCESS:
            return
        if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
            raise _NotSupported(name)
        if code == NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost(name)
        raise NvmlError("%s failed: %s" % (name, code_name(code)), code, name)

    def _text(self, name: str, size: int, *leading: Any) -> str:
        buffer = ctypes.create_string_buffer(size)
        self.call(name, *leading, buffer, size)
        return buffer.value.decode("utf-8", "replace")

    def driver_version(self) -> str:
        return self._text("nvmlSystemGetDriverVersion", NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE)

    def nvml_version(self) -> str:
        return self._text("nvmlSystemGetNVMLVersion", NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE)

    def cuda_driver_version(self) -> str:
        """The highest CUDA version the driver runs, as "major.minor" (NVML gives 1000*major + 10*minor)."""
        version = ctypes.c_int()
        self.call("nvmlSystemGetCudaDriverVersion", ctypes.byref(version))
        return nvml_cuda_version(version.value)

    def device_count(self) -> int:
        count = ctypes.c_uint()
        self.call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        return count.value

    def compute_processes(self, index: int) -> list[dict[str, Any]]:
        """Processes with a CUDA context on GPU `index`: pid and used memory (None where NVML cannot tell)."""
        handle = _device()
        self.call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
        capacity = 16
        while True:
            infos = (_ProcessInfo * capacity)()
            count = ctypes.c_uint(capacity)
            try:
                self.call("nvmlDeviceGetComputeRunningProcesses_v3", handle, ctypes.byref(count), infos)
            except NvmlError as error:
                # More processes than room: NVML set the count; processes may start meanwhile, so add room.
                if error.code != NVML_ERROR_INSUFFICIENT_SIZE:
                    raise
                capacity = count.value + 16
                continue
            return [
                {
                    "pid": info.pid,
                    "used_memory_bytes": None
                    if info.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ULL
                    else info.usedGpuMemory,
                }
                for info in infos[: count.value]
            ]

    def fabric(self, index: int) -> dict[str, Any]:
        """GPU `index`'s fabric: state (FABRIC_STATES) and the status NVML gives for it; not_supported when this
        NVML has no fabric query."""
        handle = _device()
        self.call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
        info = _GpuFabricInfo()
        try:
            self.call("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))
        except _NotSupported:
            return {"index": index, "state": "not_supported", "status": None}
        state = FABRIC_STATES[info.state] if info.state < len(FABRIC_STATES) else "state %d" % info.state
        return {"index": index, "state": state, "status": code_name(info.status)}

    def device(self, index: int) -> dict[str, Any]:
        """The state of GPU `index` (see GPU_FIELDS); a lost GPU has lost=True and the rest None."""
        return _DeviceReader(self, index).read()

    def watch_events(self, wanted: int) -> "EventWatch":
        """An event set with every GPU registered for the `wanted` types it supports (see EventWatch)."""
        return EventWatch(self, wanted)


class EventWatch:
    """NVML events of every GPU, as they happen: `wait(ms)` returns the next one or None after the timeout.

    Each GPU is registered for the wanted types it supports; `registered` says which, `unwatched` which GPUs could
    not be (lost, or no such event): those must be watched another way (the kernel log)."""

    def __init__(self, nvml: Nvml, wanted: int) -> None:
        self.nvml = nvml
        self._set = ctypes.c_void_p()
        nvml.call("nvmlEventSetCreate", ctypes.byref(self._set))
        self._open = True
        self.registered: dict[int, int] = {}
        self.unwatched: dict[int, str] = {}
        self._gpus: dict[int, dict[str, Any]] = {}
        for index in range(nvml.device_count()):
            self._register(index, wanted)

    def _register(self, index: int, wanted: int) -> None:
        handle = _device()
        supported = ctypes.c_ulonglong()
        try:
            self.nvml.call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
            uuid = self.nvml._text("nvmlDeviceGetUUID", NVML_DEVICE_UUID_V2_BUFFER_SIZE, handle)
            self.nvml.call("nvmlDeviceGetSupportedEventTypes", handle, ctypes.byref(supported))
            types = wanted & supported.value
            if not types:
                raise _NotSupported("nvmlDeviceRegisterEvents")
            self.nvml.call("nvmlDeviceRegisterEvents", handle, types, self._set)
        except _GpuLost:
            self.unwatched[index] = "lost"
            return
        except (_NotSupported, NvmlError) as error:
            self.unwatched[index] = "events not supported (%s)" % (error,)
            return
        self.registered[index] = types
        self._gpus[int(handle.value or 0)] = {"index": index, "uuid": uuid}

    def wait(self, timeout_ms: int) -> dict[str, Any] | None:
        """The next event: {index, uuid, type (EVENT_NAMES), data}; None when none came within the timeout."""
        data = _EventData()
        code = self.nvml._function("nvmlEventSetWait_v2")(self._set, ctypes.byref(data), timeout_ms)
        if code == NVML_ERROR_TIMEOUT:
            return None
        if code != NVML_SUCCESS:
            raise NvmlError("nvmlEventSetWait_v2 failed: %s" % code_name(code), code, "nvmlEventSetWait_v2")
        gpu = self._gpus.get(int(data.device or 0), {"index": None, "uuid": None})
        kind = EVENT_NAMES.get(data.eventType, "type 0x%x" % data.eventType)
        return {"index": gpu["index"], "uuid": gpu["uuid"], "type": kind, "data": int(data.eventData)}

    def close(self) -> None:
        if self._open:
            self.nvml.call("nvmlEventSetFree", self._set)
            self._open = False


# Every key of a GPU dict except index, lost, unsupported and errors; in report order.
GPU_FIELDS = (
    "name",
    "uuid",
    "pci_bus_id",
    "compute_capability",
    "memory_total_bytes",
    "memory_total_mib",
    "memory_used_bytes",
    "memory_used_mib",
    "memory_reserved_bytes",
    "memory_reserved_mib",
    "persistence_mode",
    "ecc_mode",
    "ecc_mode_pending",
    "ecc_errors_uncorrected_volatile",
    "ecc_errors_uncorrected_aggregate",
    "mig_mode",
    "mig_mode_pending",
    "power_limit_w",
    "power_draw_w",
    "temperature_c",
    "retired_pages_single_bit_ecc",
    "retired_pages_double_bit_ecc",
    "retired_pages_pending",
    "remapped_rows_corrected",
    "remapped_rows_uncorrected",
    "row_remap_pending",
    "row_remap_failure",
)


class _DeviceReader:
    """Reads one GPU field group at a time, so one unsupported query costs only its own fields."""

    def __init__(self, nvml: Nvml, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = _device()
        self.gpu: dict[str, Any] = {"index": index, "lost": False}
        self.gpu.update({field: None for field in GPU_FIELDS})
        self.gpu["unsupported"] = []
        self.gpu["errors"] = {}

    def read(self) -> dict[str, Any]:
        try:
            self.nvml.call("nvmlDeviceGetHandleByIndex_v2", self.index, ctypes.byref(self.handle))
            for fields, query in self._queries():
                self._read_group(fields, query)
        except _GpuLost as lost:
            self.gpu["lost"] = True
            self.gpu["errors"]["gpu"] = "GPU is lost (NVML_ERROR_GPU_IS_LOST from %s)" % lost
        return self.gpu

    def _queries(self) -> list[tuple[tuple[str, ...], Callable[[], dict[str, Any]]]]:
        return [
            (("name",), self._name),
            (("uuid",), self._uuid),
            (("pci_bus_id",), self._pci),
            (("compute_capability",), self._compute_capability),
            (
                (
                    "memory_total_bytes",
                    "memory_total_mib",
                    "memory_used_bytes",
                    "memory_used_mib",
                    "memory_reserved_bytes",
                    "memory_reserved_mib",
                ),
                self._memory,
            ),
            (("persistence_mode",), self._persistence),
            (("ecc_mode", "ecc_mode_pending"), self._ecc_mode),
            (("ecc_errors_uncorrected_volatile",), lambda: self._ecc_errors(NVML_VOLATILE_ECC)),
            (("ecc_errors_uncorrected_aggregate",), lambda: self._ecc_errors(NVML_AGGREGATE_ECC)),
            (("mig_mode", "mig_mode_pending"), self._mig),
            (("power_limit_w",), self._power_limit),
            (("power_draw_w",), self._power_draw),
            (("temperature_c",), self._temperature),
            (("retired_pages_single_bit_ecc", "retired_pages_double_bit_ecc"), self._retired_pages),
            (("retired_pages_pending",), self._retired_pages_pending),
            (
                ("remapped_rows_corrected", "remapped_rows_uncorrected", "row_remap_pending", "row_remap_failure"),
                self._remapped_rows,
            ),
        ]

    def _read_group(self, fields: tuple[str, ...], query: Callable[[], dict[str, Any]]) -> None:
        try:
            values = query()
        except _NotSupported:
            self.gpu["unsupported"].extend(fields)
        except NvmlError as error:
            for field in fields:
                self.gpu["errors"][field] = str(error)
        else:
            self.gpu.update(values)

    def _uint(self, name: str, *extra: Any) -> int:
        value = ctypes.c_uint()
        self.nvml.call(name, self.handle, *extra, ctypes.byref(value))
        return value.value

    def _name(self) -> dict[str, Any]:
        return {"name": self.nvml._text("nvmlDeviceGetName", NVML_DEVICE_NAME_V2_BUFFER_SIZE, self.handle)}

    def _uuid(self) -> dict[str, Any]:
        return {"uuid": self.nvml._text("nvmlDeviceGetUUID", NVML_DEVICE_UUID_V2_BUFFER_SIZE, self.handle)}

    def _pci(self) -> dict[str, Any]:
        info = _PciInfo()
        self.nvml.call("nvmlDeviceGetPciInfo_v3", self.handle, ctypes.byref(info))
        return {"pci_bus_id": info.busId.decode("ascii", "replace")}

    def _compute_capability(self) -> dict[str, Any]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.nvml.call("nvmlDeviceGetCudaComputeCapability", self.handle, ctypes.byref(major), ctypes.byref(minor))
        return {"compute_capability": "%d.%d" % (major.value, minor.value)}

    def _memory(self) -> dict[str, Any]:
        try:
            memory: _MemoryV2 | _Memory = _MemoryV2(version=_MEMORY_V2_VERSION)
            self.nvml.call("nvmlDeviceGetMemoryInfo_v2", self.handle, ctypes.byref(memory))
            reserved: dict[str, Any] = {
                "memory_reserved_bytes": memory.reserved,
                "memory_reserved_mib": memory.reserved // MIB,
            }
        except _NotSupported:
            # An NVML without version 2: "used" then includes the reserved memory, which is not given apart.
            memory = _Memory()
            self.nvml.call("nvmlDeviceGetMemoryInfo", self.handle, ctypes.byref(memory))
            reserved = {}
            self.gpu["unsupported"].extend(("memory_reserved_bytes", "memory_reserved_mib"))
        return {
            "memory_total_bytes": memory.total,
            "memory_total_mib": memory.total // MIB,
            "memory_used_bytes": memory.used,
            "memory_used_mib": memory.used // MIB,
            **reserved,
        }

    def _persistence(self) -> dict[str, Any]:
        return {"persistence_mode": self._uint("nvmlDeviceGetPersistenceMode") == 1}

    def _ecc_mode(self) -> dict[str, Any]:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self.nvml.call("nvmlDeviceGetEccMode", self.handle, ctypes.byref(current), ctypes.byref(pending))
        return {"ecc_mode": current.value == 1, "ecc_mode_pending": pending.value == 1}

    def _ecc_errors(self, counter: int) -> dict[str, Any]:
        count = ctypes.c_ulonglong()
        self.nvml.call(
            "nvmlDeviceGetTotalEccErrors",
            self.handle,
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            counter,
            ctypes.byref(count),
        )
        key = "ecc_errors_uncorrected_volatile" if counter == NVML_VOLATILE_ECC else "ecc_errors_uncorrected_aggregate"
        return {key: count.value}

    def _mig(self) -> dict[str, Any]:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self.nvml.call("nvmlDeviceGetMigMode", self.handle, ctypes.byref(current), ctypes.byref(pending))
        return {"mig_mode": current.value == 1, "mig_mode_pending": pending.value == 1}

    def _power_limit(self) -> dict[str, Any]:
        return {"power_limit_w": self._uint("nvmlDeviceGetPowerManagementLimit") / 1000.0}

    def _power_draw(self) -> dict[str, Any]:
        return {"power_draw_w": self._uint("nvmlDeviceGetPowerUsage") / 1000.0}

    def _temperature(self) -> dict[str, Any]:
        return {"temperature_c": self._uint("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)}

    def _retired_page_count(self, cause: int) -> int:
        # A zero-sized buffer asks for the count only: NVML answers INSUFFICIENT_SIZE with the count set.
        count = ctypes.c_uint(0)
        try:
            self.nvml.call("nvmlDeviceGetRetiredPages", self.handle, cause, ctypes.byref(count), None)
        except NvmlError as error:
            if error.code != NVML_ERROR_INSUFFICIENT_SIZE:
                raise
        return count.value

    def _retired_pages(self) -> dict[str, Any]:
        return {
            "retired_pages_single_bit_ecc": self._retired_page_count(
                NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            ),
            "retired_pages_double_bit_ecc": self._retired_page_count(NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        }

    def _retired_pages_pending(self) -> dict[str, Any]:
        return {"retired_pages_pending": self._uint("nvmlDeviceGetRetiredPagesPendingStatus") == 1}

    def _remapped_rows(self) -> dict[str, Any]:
        corrected, uncorrected, pending, failure = (ctypes.c_uint() for dummy in range(4))
        self.nvml.call(
            "nvmlDeviceGetRemappedRows",
            self.handle,
            ctypes.byref(corrected),
            ctypes.byref(uncorrected),
            ctypes.byref(pending),
            ctypes.byref(failure),
        )
        return {
            "remapped_rows_corrected": corrected.value,
            "remapped_rows_uncorrected": uncorrected.value,
            "row_remap_pending": pending.value != 0,
            "row_remap_failure": failure.value != 0,
        }


def read_gpu_state(library_path: str | None = None) -> dict[str, Any]:
    """The driver's versions and every GPU's state, in one NVML session."""
    with Nvml(library_path) as nvml:
        count = nvml.device_count()
        return {
            "driver_version": nvml.driver_version(),
            "cuda_driver_version": nvml.cuda_driver_version(),
            "nvml_version": nvml.nvml_version(),
            "gpu_count": count,
            "gpus": [nvml.device(index) for index in range(count)],
        }


def read_fabric(library_path: str | None = None) -> dict[str, Any]:
    """The driver's version and each GPU's fabric; nvswitch is whether any GPU sits on an NVSwitch fabric."""
    with Nvml(library_path) as nvml:
        gpus = [nvml.fabric(index) for index in range(nvml.device_count())]
        return {
            "driver_version": nvml.driver_version(),
            "gpus": gpus,
            "nvswitch": any(gpu["state"] != "not_supported" for gpu in gpus),
        }


def loaded_driver_state(kernel_version: str | None, library_path: str | None = None) -> tuple[str, str | None]:
    """(state, version) of the loaded driver: NVML first (what CUDA sees), else the version the kernel reports.

    state is one of loaded, not_loaded, mismatch (libraries newer or older than the loaded module), no_library
    (no NVML to ask and no kernel_version). kernel_version is what /proc or /sys says, read by the caller.
    Other NVML errors are raised.
    """
    try:
        with Nvml(library_path) as nvml:
            return "loaded", nvml.driver_version()
    except NvmlVersionMismatch:
        return "mismatch", kernel_version
    except NvmlDriverNotLoaded:
        return "not_loaded", None
    except NvmlLibraryNotFound:
        return ("loaded", kernel_version) if kernel_version else ("no_library", None)


# ---- expectations --------------------------------------------------------------------------------

EXPECT_KEYS = (
    "driver_version",
    "driver_min",
    "cuda_driver_min",
    "gpu_count",
    "model",
    "min_memory_mib",
    "compute_capability",
    "persistence",
    "ecc",
    "mig",
    "ecc_errors",
    "ecc_errors_aggregate",
    "retired_pages_pending",
    "row_remap_pending",
    "row_remap_failure",
)
_VERSION_KEYS = ("driver_min", "cuda_driver_min", "compute_capability")
_COUNT_KEYS = ("gpu_count", "min_memory_mib", "ecc_errors", "ecc_errors_aggregate")


def version_tuple(version: str) -> tuple[int, ...]:
    """ "580.159.04" -> (580, 159, 4); ValueError when a part is not a number."""
    return tuple(int(part) for part in str(version).strip().split("."))


def expectation_errors(expect: dict[str, Any]) -> list[str]:
    """What is wrong with an expect dict (unknown keys, versions that are not numbers, negative counts)."""
    problems = []
    for key, value in expect.items():
        if value is None:
            continue
        if key not in EXPECT_KEYS:
            problems.append("unknown key %r (known: %s)" % (key, ", ".join(EXPECT_KEYS)))
        elif key in _VERSION_KEYS:
            try:
                version_tuple(value)
            except ValueError:
                problems.append("%s=%r is not a version like 12.8" % (key, value))
        elif key in _COUNT_KEYS and int(value) < 0:
            problems.append("%s=%r must not be negative" % (key, value))
    return problems


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _mismatch(gpu: dict[str, Any] | None, field: str, expected: Any, actual: Any, problem: str) -> dict[str, Any]:
    """One mismatch as data plus the sentence an operator reads."""
    if gpu is None:
        message = problem
        index, uuid = None, None
    else:
        index, uuid = gpu["index"], gpu.get("uuid")
        message = "GPU %d (%s): %s" % (index, uuid or "uuid unknown", problem)
    return {"gpu": index, "uuid": uuid, "field": field, "expected": expected, "actual": actual, "message": message}


def _check_system(report: dict[str, Any], expect: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    driver = report["driver_version"]
    wanted = expect.get("driver_version")
    if wanted is not None and str(wanted) != driver:
        found.append(
            _mismatch(None, "driver_version", str(wanted), driver, "driver %s, expected %s" % (driver, wanted))
        )
    wanted = expect.get("driver_min")
    if wanted is not None and version_tuple(driver) < version_tuple(wanted):
        found.append(
            _mismatch(
                None, "driver_min", str(wanted), driver, "driver %s is older than the required %s" % (driver, wanted)
            )
        )
    cuda = report["cuda_driver_version"]
    wanted = expect.get("cuda_driver_min")
    if wanted is not None and version_tuple(cuda) < version_tuple(wanted):
        found.append(
            _mismatch(
                None,
                "cuda_driver_min",
                str(wanted),
                cuda,
                "the driver runs CUDA up to %s, expected at least %s" % (cuda, wanted),
            )
        )
    wanted = expect.get("gpu_count")
    if wanted is not None and int(wanted) != report["gpu_count"]:
        found.append(
            _mismatch(
                None,
                "gpu_count",
                int(wanted),
                report["gpu_count"],
                "%d GPUs found, expected %d" % (report["gpu_count"], int(wanted)),
            )
        )
    return found


# What each per-GPU expectation reads from the GPU dict, and how a mismatch names it.
_EXPECT_FIELD = {
    "model": ("name", "model"),
    "min_memory_mib": ("memory_total_mib", "memory size"),
    "compute_capability": ("compute_capability", "compute capability"),
    "persistence": ("persistence_mode", "persistence mode"),
    "ecc": ("ecc_mode", "ECC mode"),
    "mig": ("mig_mode", "MIG mode"),
    "ecc_errors": ("ecc_errors_uncorrected_volatile", "uncorrectable volatile ECC error count"),
    "ecc_errors_aggregate": ("ecc_errors_uncorrected_aggregate", "uncorrectable aggregate ECC error count"),
    "retired_pages_pending": ("retired_pages_pending", "retired pages pending"),
    "row_remap_pending": ("row_remap_pending", "row remapping pending"),
    "row_remap_failure": ("row_remap_failure", "row remapping failed"),
}

# "Nothing pending / no failure" holds on a GPU without the mechanism: there is nothing to be pending.
_HOLDS_WHEN_UNSUPPORTED = ("retired_pages_pending", "row_remap_pending", "row_remap_failure")


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _expected_phrase(key: str, wanted: Any) -> str:
    if key in ("ecc_errors", "ecc_errors_aggregate"):
        return "at most %d" % int(wanted)
    if key == "min_memory_mib":
        return "at least %d MiB" % int(wanted)
    if key in ("persistence", "ecc", "mig"):
        return _on_off(wanted)
    if key in _HOLDS_WHEN_UNSUPPORTED:
        return _yes_no(wanted)
    return str(wanted)


def _unavailable(gpu: dict[str, Any], field: str) -> str | None:
    """Why `field` has no value on this GPU, or None when it has one."""
    if field in gpu["unsupported"]:
        if field.startswith("ecc_errors") and gpu["ecc_mode"] is False:
            return "not counted while ECC is off"
        return "not supported by this GPU"
    if field in gpu["errors"]:
        return "unreadable (%s)" % gpu["errors"][field]
    return None


def _model_matches(name: str, wanted: str) -> bool:
    """ "H200" and "NVIDIA H200" both match the name "NVIDIA H200"."""
    return wanted.strip().lower() in name.lower()


def _holds(key: str, wanted: Any, actual: Any) -> bool:
    """Whether a per-GPU expectation holds for a known value."""
    if key == "model":
        return _model_matches(actual, str(wanted))
    if key == "min_memory_mib":
        return actual >= int(wanted)
    if key == "compute_capability":
        return version_tuple(actual) == version_tuple(wanted)
    if key in ("ecc_errors", "ecc_errors_aggregate"):
        return actual <= int(wanted)
    return bool(actual) == bool(wanted)


def _problem(key: str, wanted: Any, actual: Any) -> str:
    """The sentence for a per-GPU expectation that does not hold."""
    expected = _expected_phrase(key, wanted)
    if key == "model":
        return "model is %r, expected %r" % (actual, str(wanted))
    if key == "min_memory_mib":
        return "%d MiB of memory, expected %s" % (actual, expected)
    if key == "compute_capability":
        return "compute capability %s, expected %s" % (actual, wanted)
    if key in ("persistence", "ecc", "mig"):
        return "%s is %s, expected %s" % (_EXPECT_FIELD[key][1], _on_off(actual), expected)
    if key in ("ecc_errors", "ecc_errors_aggregate"):
        counter = "volatile" if key == "ecc_errors" else "aggregate"
        return "%d uncorrectable %s ECC errors, expected %s" % (actual, counter, expected)
    consequence = {
        "retired_pages_pending": " (a reboot or GPU reset retires them)",
        "row_remap_pending": " (a GPU reset applies it)",
        "row_remap_failure": " (the GPU needs service)",
    }[key]
    return "%s: %s%s, expected %s" % (_EXPECT_FIELD[key][1], _yes_no(actual), consequence, expected)


def _check_gpu(gpu: dict[str, Any], expect: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for key, (field, label) in _EXPECT_FIELD.items():
        wanted = expect.get(key)
        if wanted is None:
            continue
        reason = _unavailable(gpu, field)
        if reason is None:
            if not _holds(key, wanted, gpu[field]):
                found.append(_mismatch(gpu, key, wanted, gpu[field], _problem(key, wanted, gpu[field])))
        elif not (key in _HOLDS_WHEN_UNSUPPORTED and not wanted and field in gpu["unsupported"]):
            problem = "%s %s, expected %s" % (label, reason, _expected_phrase(key, wanted))
            found.append(_mismatch(gpu, key, wanted, None, problem))
    return found


def check_expectations(report: dict[str, Any], expect: dict[str, Any]) -> list[dict[str, Any]]:
    """Every way `report` (from read_gpu_state) differs from `expect`; empty when it matches.

    Keys of expect are EXPECT_KEYS; None values are ignored. Whenever anything is expected, a lost GPU
    is a mismatch: nothing about it can be confirmed.
    """
    wanted = {key: value for key, value in expect.items() if value is not None}
    if not wanted:
        return []
    found = _check_system(report, wanted)
    for gpu in report["gpus"]:
        if gpu["lost"]:
            found.append(
                _mismatch(
                    gpu,
                    "lost",
                    "present",
                    "lost",
                    "GPU is lost (fell off the bus); reboot the node, then reseat or replace the GPU if it stays lost",
                )
            )
            continue
        found.extend(_check_gpu(gpu, wanted))
    return found
