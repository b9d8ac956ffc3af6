/*
 * The part of NVML's public ABI that the simulated library implements: return codes, enums, buffer
 * sizes and struct layouts as nvml.h declares them, written out here so the simulator builds without
 * NVIDIA's headers. Values and layouts must stay identical to nvml.h: callers (our ctypes binding,
 * nvidia-ml-py, anything linked against the real library) pass these structs by pointer.
 */
#ifndef GPUFLEET_SIMGPU_NVML_ABI_H
#define GPUFLEET_SIMGPU_NVML_ABI_H

#define NVML_EXPORT __attribute__((visibility("default")))

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_ENABLED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

typedef enum nvmlTemperatureSensors_enum {
    NVML_TEMPERATURE_GPU = 0
} nvmlTemperatureSensors_t;

typedef enum nvmlMemoryErrorType_enum {
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1,
    NVML_MEMORY_ERROR_TYPE_COUNT
} nvmlMemoryErrorType_t;

typedef enum nvmlEccCounterType_enum {
    NVML_VOLATILE_ECC = 0,
    NVML_AGGREGATE_ECC = 1,
    NVML_ECC_COUNTER_TYPE_COUNT
} nvmlEccCounterType_t;

typedef enum nvmlPageRetirementCause_enum {
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1,
    NVML_PAGE_RETIREMENT_CAUSE_COUNT
} nvmlPageRetirementCause_t;

typedef enum nvmlComputeMode_enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
} nvmlComputeMode_t;

/* P0 (maximum performance) .. P15 (minimum); 32 means unknown. */
typedef enum nvmlPStates_enum {
    NVML_PSTATE_0 = 0,
    NVML_PSTATE_15 = 15,
    NVML_PSTATE_UNKNOWN = 32
} nvmlPstates_t;

#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE 80

typedef struct nvmlDevice_st *nvmlDevice_t;

/* Filled by nvmlDeviceGetPciInfo_v3. */
typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;    /* device id in the upper 16 bits, vendor id in the lower */
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* Filled by nvmlDeviceGetMemoryInfo (version 1 of the struct), in bytes: "used" includes reserved memory. */
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* Versioned structs carry their size and version in the first field, as nvml.h's NVML_STRUCT_VERSION. */
#define NVML_STRUCT_VERSION(data, ver) (unsigned int)(sizeof(nvml##data##_v##ver##_t) | (ver << 24U))

/* Filled by nvmlDeviceGetMemoryInfo_v2, in bytes: "used" excludes what the driver reserves. */
typedef struct nvmlMemory_v2_st {
    unsigned int version;        /* must be nvmlMemory_v2 */
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

/* Filled by nvmlDeviceGetComputeRunningProcesses_v3 (nvml.h's nvmlProcessInfo_t, the v2 layout): one entry
 * per process with a CUDA context on the GPU, its memory in bytes or NVML_VALUE_NOT_AVAILABLE. */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;      /* NVML_VALUE_NOT_AVAILABLE (as unsigned int) outside MIG */
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_VALUE_NOT_AVAILABLE (-1)

/* Filled by nvmlDeviceGetUtilizationRates, in percent. */
typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* Filled by nvmlDeviceGetGpuFabricInfo (nvml.h's nvmlGpuFabricInfo_t): the GPU's NVLink fabric as the
 * NVSwitch system's fabric manager set it up. A GPU outside an NVSwitch system answers NVML_SUCCESS with state
 * NVML_GPU_FABRIC_STATE_NOT_SUPPORTED (so did the H200 of tests/fixtures/h200-real/fabric_and_kernel_log.txt). */
#define NVML_GPU_FABRIC_UUID_LEN 16
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0
#define NVML_GPU_FABRIC_STATE_COMPLETED 3
typedef unsigned char nvmlGpuFabricState_t;
typedef struct nvmlGpuFabricInfo_st {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

/* Events (nvml.h): nvmlDeviceRegisterEvents takes a mask of these, nvmlEventSetWait_v2 fills nvmlEventData_t.
 * For an XID, eventData is the XID number. */
#define nvmlEventTypeSingleBitEccError 0x0000000000000001LL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002LL
#define nvmlEventTypePState 0x0000000000000004LL
#define nvmlEventTypeXidCriticalError 0x0000000000000008LL
#define nvmlEventTypeClock 0x0000000000000010LL

typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;      /* NVML_VALUE_NOT_AVAILABLE outside MIG */
    unsigned int computeInstanceId;
} nvmlEventData_t;

#endif
