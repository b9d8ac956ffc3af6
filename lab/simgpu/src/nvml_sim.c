/*
 * libnvidia-ml.so.1 for machines without a GPU: the NVML entry points gpufleet uses, with NVML's
 * names, signatures and return codes, answering from the description file (simgpu_state.h).
 *
 * The description is read at nvmlInit, as the real library probes the driver at init: a state switch
 * (simgpuctl) takes effect at the caller's next init, i.e. the next nvidia-smi or module run.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

#include "nvml_abi.h"
#include "simgpu_state.h"

static simgpu_machine machine;
static unsigned int init_count;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- initialisation -------------------------------------------------------------------------- */

static nvmlReturn_t initialise(void) {
    pthread_mutex_lock(&init_lock);
    nvmlReturn_t status = NVML_SUCCESS;
    if (init_count > 0) {
        init_count++;
        pthread_mutex_unlock(&init_lock);
        return NVML_SUCCESS;
    }
    char error[768];
    if (!simgpu_load(simgpu_description_path(), &machine, error, sizeof(error))) {
        /* The real library has no way to say "bad description"; tell the operator on stderr. */
        fprintf(stderr, "gpufleet-simgpu: %s\n", error);
        status = NVML_ERROR_UNKNOWN;
    } else if (!machine.driver_loaded) {
        status = NVML_ERROR_DRIVER_NOT_LOADED;
    } else if (strcmp(machine.driver_version, machine.kernel_module_version) != 0) {
        status = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    if (status == NVML_SUCCESS) {
        init_count = 1;
    } else {
        simgpu_release(&machine);
    }
    pthread_mutex_unlock(&init_lock);
    return status;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) { return initialise(); }

NVML_EXPORT nvmlReturn_t nvmlInit(void) { return initialise(); }

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for a simulated driver */
    return initialise();
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&init_lock);
    nvmlReturn_t status = NVML_SUCCESS;
    if (init_count == 0) {
        status = NVML_ERROR_UNINITIALIZED;
    } else if (--init_count == 0) {
        simgpu_release(&machine);
    }
    pthread_mutex_unlock(&init_lock);
    return status;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---- shared checks --------------------------------------------------------------------------- */

static int is_our_device(nvmlDevice_t device) {
    return device != NULL && device >= machine.gpus && device < machine.gpus + machine.gpu_count;
}

/* Status every device query starts with: initialised, a real handle, GPU on the bus, feature present. */
static nvmlReturn_t check_device(nvmlDevice_t device, unsigned int feature) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!is_our_device(device)) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (device->lost) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (device->not_supported & feature) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

#define REQUIRE_DEVICE(device, feature)                        \
    do {                                                       \
        nvmlReturn_t check_status = check_device(device, feature); \
        if (check_status != NVML_SUCCESS) {                    \
            return check_status;                               \
        }                                                      \
    } while (0)

#define REQUIRE_POINTER(pointer)                 \
    do {                                         \
        if ((pointer) == NULL) {                 \
            return NVML_ERROR_INVALID_ARGUMENT;  \
        }                                        \
    } while (0)

static nvmlReturn_t copy_text(const char *text, char *buffer, unsigned int length) {
    REQUIRE_POINTER(buffer);
    if (strlen(text) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    strcpy(buffer, text);
    return NVML_SUCCESS;
}

/* ---- system queries -------------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return copy_text(machine.driver_version, version, length);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    return copy_text(machine.nvml_version, version, length);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cuda_driver_version) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    REQUIRE_POINTER(cuda_driver_version);
    *cuda_driver_version = machine.cuda_driver_version;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cuda_driver_version) {
    return nvmlSystemGetCudaDriverVersion(cuda_driver_version);
}

/* ---- device enumeration ---------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *device_count) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    REQUIRE_POINTER(device_count);
    *device_count = machine.gpu_count;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *device_count) { return nvmlDeviceGetCount_v2(device_count); }

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    REQUIRE_POINTER(device);
    if (index >= machine.gpu_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* A GPU that fell off the bus is still counted, but no handle can be had for it. */
    if (machine.gpus[index].lost) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    *device = &machine.gpus[index];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    REQUIRE_POINTER(uuid);
    REQUIRE_POINTER(device);
    for (unsigned int i = 0; i < machine.gpu_count; i++) {
        if (strcmp(machine.gpus[i].uuid, uuid) == 0) {
            return nvmlDeviceGetHandleByIndex_v2(i, device);
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_DEVICE(device, 0);
    REQUIRE_POINTER(index);
    *index = device->index;
    return NVML_SUCCESS;
}

/* ---- identity -------------------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_DEVICE(device, 0);
    return copy_text(device->name, name, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_DEVICE(device, 0);
    return copy_text(device->uuid, uuid, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    REQUIRE_DEVICE(device, 0);
    REQUIRE_POINTER(pci);
    memset(pci, 0, sizeof(*pci));
    pci->domain = device->pci_domain;
    pci->bus = device->pci_bus;
    pci->device = device->pci_device;
    pci->pciDeviceId = device->pci_device_id;
    pci->pciSubSystemId = device->pci_subsystem_id;
    /* Formats as nvml.h defines them (NVML_DEVICE_PCI_BUS_ID_FMT and _LEGACY_FMT). */
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", device->pci_domain, device->pci_bus,
             device->pci_device);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", device->pci_domain & 0xffff,
             device->pci_bus, device->pci_device);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    REQUIRE_DEVICE(device, FEATURE_COMPUTE_CAPABILITY);
    REQUIRE_POINTER(major);
    REQUIRE_POINTER(minor);
    *major = device->compute_major;
    *minor = device->compute_minor;
    return NVML_SUCCESS;
}

/* ---- memory and modes ------------------------------------------------------------------------ */

/* Version 1 counts the driver's reserved memory as used; version 2 reports it apart (as nvidia-smi shows). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_DEVICE(device, FEATURE_MEMORY);
    REQUIRE_POINTER(memory);
    memory->total = device->memory_total;
    memory->used = device->memory_used + device->memory_reserved;
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_DEVICE(device, FEATURE_MEMORY);
    REQUIRE_POINTER(memory);
    if (memory->version != nvmlMemory_v2) {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    memory->total = device->memory_total;
    memory->reserved = device->memory_reserved;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_used - device->memory_reserved;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    REQUIRE_DEVICE(device, FEATURE_PERSISTENCE_MODE);
    REQUIRE_POINTER(mode);
    *mode = device->persistence_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                              nvmlEnableState_t *pending) {
    REQUIRE_DEVICE(device, FEATURE_ECC);
    REQUIRE_POINTER(current);
    REQUIRE_POINTER(pending);
    *current = device->ecc_enabled ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = device->ecc_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t error_type,
                                                     nvmlEccCounterType_t counter_type,
                                                     unsigned long long *ecc_counts) {
    REQUIRE_DEVICE(device, FEATURE_ECC);
    REQUIRE_POINTER(ecc_counts);
    if ((unsigned int)error_type >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned int)counter_type >= NVML_ECC_COUNTER_TYPE_COUNT) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* Counters exist only while ECC is on; with it off nvidia-smi shows N/A. */
    if (!device->ecc_enabled) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *ecc_counts = device->ecc_counts[error_type][counter_type];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    REQUIRE_DEVICE(device, FEATURE_MIG);
    REQUIRE_POINTER(current);
    REQUIRE_POINTER(pending);
    *current = device->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pending = device->mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    REQUIRE_DEVICE(device, FEATURE_COMPUTE_MODE);
    REQUIRE_POINTER(mode);
    *mode = (nvmlComputeMode_t)device->compute_mode;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *active) {
    REQUIRE_DEVICE(device, FEATURE_DISPLAY_ACTIVE);
    REQUIRE_POINTER(active);
    *active = device->display_active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- power, thermals, activity --------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    REQUIRE_DEVICE(device, FEATURE_POWER_LIMIT);
    REQUIRE_POINTER(limit_mw);
    *limit_mw = device->power_limit_mw;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    return nvmlDeviceGetPowerManagementLimit(device, limit_mw);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power_mw) {
    REQUIRE_DEVICE(device, FEATURE_POWER_DRAW);
    REQUIRE_POINTER(power_mw);
    *power_mw = device->power_draw_mw;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                                  unsigned int *temperature) {
    REQUIRE_DEVICE(device, FEATURE_TEMPERATURE);
    REQUIRE_POINTER(temperature);
    if (sensor != NVML_TEMPERATURE_GPU) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *temperature = device->temperature_c;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    REQUIRE_DEVICE(device, FEATURE_UTILIZATION);
    REQUIRE_POINTER(utilization);
    utilization->gpu = device->utilization_gpu;
    utilization->memory = device->utilization_memory;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    REQUIRE_DEVICE(device, FEATURE_FAN_SPEED);
    REQUIRE_POINTER(speed);
    *speed = device->fan_speed;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *state) {
    REQUIRE_DEVICE(device, FEATURE_PERFORMANCE_STATE);
    REQUIRE_POINTER(state);
    *state = (nvmlPstates_t)device->performance_state;
    return NVML_SUCCESS;
}

/* ---- processes ------------------------------------------------------------------------------- */

/* As in NVML: *info_count is the buffer's capacity in, the number of processes out; a buffer too small
 * (or none, to ask for the count) gives NVML_ERROR_INSUFFICIENT_SIZE with the count set. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *info_count,
                                                                 nvmlProcessInfo_t *infos) {
    REQUIRE_DEVICE(device, 0);
    REQUIRE_POINTER(info_count);
    unsigned int available = device->process_count;
    if (*info_count < available || (available > 0 && infos == NULL)) {
        *info_count = available;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < available; i++) {
        infos[i].pid = device->process_pids[i];
        infos[i].usedGpuMemory = device->process_memory[i];
        infos[i].gpuInstanceId = (unsigned int)NVML_VALUE_NOT_AVAILABLE;
        infos[i].computeInstanceId = (unsigned int)NVML_VALUE_NOT_AVAILABLE;
    }
    *info_count = available;
    return NVML_SUCCESS;
}

/* ---- memory health: page retirement (pre-Ampere) and row remapping (Ampere and newer) ---------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                   unsigned int *page_count, unsigned long long *addresses) {
    REQUIRE_DEVICE(device, FEATURE_RETIRED_PAGES);
    REQUIRE_POINTER(page_count);
    if ((unsigned int)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned int available = device->retired_page_count[cause];
    /* As in NVML: *page_count is the buffer's capacity in, the number of pages out. */
    if (*page_count < available || (available > 0 && addresses == NULL)) {
        *page_count = available;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < available; i++) {
        addresses[i] = device->retired_pages[cause][i];
    }
    *page_count = available;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *pending) {
    REQUIRE_DEVICE(device, FEATURE_RETIRED_PAGES);
    REQUIRE_POINTER(pending);
    *pending = device->retired_pages_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected_rows,
                                                   unsigned int *uncorrected_rows, unsigned int *is_pending,
                                                   unsigned int *failure_occurred) {
    REQUIRE_DEVICE(device, FEATURE_ROW_REMAPPING);
    REQUIRE_POINTER(corrected_rows);
    REQUIRE_POINTER(uncorrected_rows);
    REQUIRE_POINTER(is_pending);
    REQUIRE_POINTER(failure_occurred);
    *corrected_rows = device->remapped_rows_corrected;
    *uncorrected_rows = device->remapped_rows_uncorrected;
    *is_pending = (unsigned int)device->row_remap_pending;
    *failure_occurred = (unsigned int)device->row_remap_failure;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    REQUIRE_DEVICE(device, 0);
    REQUIRE_POINTER(info);
    memset(info, 0, sizeof(*info));
    info->status = (nvmlReturn_t)device->fabric_status;
    info->cliqueId = device->fabric_clique_id;
    info->state = (nvmlGpuFabricState_t)device->fabric_state;
    return NVML_SUCCESS;
}

/* ---- events ---------------------------------------------------------------------------------- *
 * The driver's event queue is a file here ($GPUFLEET_SIMGPU_EVENTS, default below) that simgpuctl appends
 * one line per event to: "GPU-UUID EVENT_TYPE EVENT_DATA" (decimal). A set delivers the events appended after
 * it was created, to the devices and types registered in it, as NVML delivers what happens after
 * registration; a wait with nothing to deliver sleeps until its timeout and returns NVML_ERROR_TIMEOUT. */

#define SIMGPU_EVENTS_ENV "GPUFLEET_SIMGPU_EVENTS"
#define SIMGPU_DEFAULT_EVENTS "/var/log/gpufleet-simgpu/nvml-events"
#define SIMGPU_EVENT_POLL_MS 20U

struct nvmlEventSet_st {
    unsigned long long registered[SIMGPU_MAX_GPUS]; /* event types per device index */
    long offset;                                    /* bytes of the queue file already read */
};

static const char *events_path(void) {
    const char *path = getenv(SIMGPU_EVENTS_ENV);
    return (path != NULL && path[0] != '\0') ? path : SIMGPU_DEFAULT_EVENTS;
}

static long events_size(void) {
    struct stat status;
    return stat(events_path(), &status) == 0 ? (long)status.st_size : 0L;
}

static unsigned long long supported_events(nvmlDevice_t device) {
    unsigned long long types = (unsigned long long)nvmlEventTypeXidCriticalError;
    if (device->ecc_enabled && !(device->not_supported & FEATURE_ECC)) {
        types |= (unsigned long long)(nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError);
    }
    return types;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *event_types) {
    REQUIRE_DEVICE(device, 0);
    REQUIRE_POINTER(event_types);
    *event_types = supported_events(device);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    REQUIRE_POINTER(set);
    struct nvmlEventSet_st *created = calloc(1, sizeof(*created));
    if (created == NULL) {
        return NVML_ERROR_MEMORY;
    }
    created->offset = events_size();
    *set = created;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long event_types,
                                                  nvmlEventSet_t set) {
    REQUIRE_DEVICE(device, 0);
    REQUIRE_POINTER(set);
    if (event_types & ~supported_events(device)) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    set->registered[device->index] |= event_types;
    return NVML_SUCCESS;
}

/* The next queued event for the set, if any: 1 and data filled, or 0. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    FILE *queue = fopen(events_path(), "r");
    if (queue == NULL) {
        return 0;
    }
    if (events_size() < set->offset) {
        set->offset = 0; /* the queue was emptied (simgpuctl reset) */
    }
    int found = 0;
    char line[256];
    if (fseek(queue, set->offset, SEEK_SET) == 0) {
        while (!found && fgets(line, sizeof(line), queue) != NULL) {
            size_t length = strlen(line);
            if (length == 0 || line[length - 1] != '\n') {
                break; /* a line still being written: read it next time */
            }
            set->offset += (long)length;
            char uuid[SIMGPU_TEXT_SIZE];
            unsigned long long type, value;
            if (sscanf(line, "%95s %llu %llu", uuid, &type, &value) != 3) {
                continue;
            }
            for (unsigned int i = 0; i < machine.gpu_count; i++) {
                if (strcmp(machine.gpus[i].uuid, uuid) == 0 && (set->registered[i] & type)) {
                    data->device = &machine.gpus[i];
                    data->eventType = type;
                    data->eventData = value;
                    data->gpuInstanceId = (unsigned int)NVML_VALUE_NOT_AVAILABLE;
                    data->computeInstanceId = (unsigned int)NVML_VALUE_NOT_AVAILABLE;
                    found = 1;
                    break;
                }
            }
        }
    }
    fclose(queue);
    return found;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    REQUIRE_POINTER(set);
    REQUIRE_POINTER(data);
    unsigned int waited = 0;
    for (;;) {
        if (next_event(set, data)) {
            return NVML_SUCCESS;
        }
        if (waited >= timeout_ms) {
            return NVML_ERROR_TIMEOUT;
        }
        unsigned int step = timeout_ms - waited < SIMGPU_EVENT_POLL_MS ? timeout_ms - waited : SIMGPU_EVENT_POLL_MS;
        struct timespec pause = {0, (long)step * 1000000L};
        nanosleep(&pause, NULL);
        waited += step;
    }
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    REQUIRE_POINTER(set);
    free(set);
    return NVML_SUCCESS;
}
