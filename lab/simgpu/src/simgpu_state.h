/* The simulated machine: driver state and GPUs, loaded from the JSON description file. */
#ifndef GPUFLEET_SIMGPU_STATE_H
#define GPUFLEET_SIMGPU_STATE_H

#include <stddef.h>

#include "nvml_abi.h"

#define SIMGPU_DEFAULT_DESCRIPTION "/etc/gpufleet-simgpu/gpus.json"
#define SIMGPU_DESCRIPTION_ENV "GPUFLEET_SIMGPU_CONFIG"
#define SIMGPU_MAX_GPUS 64
#define SIMGPU_TEXT_SIZE 96
#define SIMGPU_MAX_PROCESSES 64

/* Queries a description can mark as not supported (the "not_supported" list of a GPU). */
enum simgpu_feature {
    FEATURE_MEMORY = 1 << 0,
    FEATURE_COMPUTE_CAPABILITY = 1 << 1,
    FEATURE_PERSISTENCE_MODE = 1 << 2,
    FEATURE_ECC = 1 << 3,
    FEATURE_MIG = 1 << 4,
    FEATURE_POWER_LIMIT = 1 << 5,
    FEATURE_POWER_DRAW = 1 << 6,
    FEATURE_TEMPERATURE = 1 << 7,
    FEATURE_UTILIZATION = 1 << 8,
    FEATURE_PERFORMANCE_STATE = 1 << 9,
    FEATURE_COMPUTE_MODE = 1 << 10,
    FEATURE_FAN_SPEED = 1 << 11,
    FEATURE_RETIRED_PAGES = 1 << 12,
    FEATURE_ROW_REMAPPING = 1 << 13,
    FEATURE_DISPLAY_ACTIVE = 1 << 14
};

struct nvmlDevice_st {
    unsigned int index;
    int lost;
    unsigned int not_supported; /* bit set of enum simgpu_feature */
    char name[SIMGPU_TEXT_SIZE];
    char uuid[SIMGPU_TEXT_SIZE];
    unsigned int pci_domain, pci_bus, pci_device;
    unsigned int pci_device_id, pci_subsystem_id;
    int compute_major, compute_minor;
    unsigned long long memory_total, memory_used, memory_reserved;
    int persistence_mode;
    int ecc_enabled, ecc_pending;
    unsigned long long ecc_counts[NVML_MEMORY_ERROR_TYPE_COUNT][NVML_ECC_COUNTER_TYPE_COUNT];
    int mig_enabled, mig_pending;
    unsigned int power_limit_mw, power_draw_mw;
    unsigned int temperature_c;
    unsigned int utilization_gpu, utilization_memory;
    int performance_state;
    int compute_mode;
    unsigned int fan_speed;
    int display_active;
    unsigned long long *retired_pages[NVML_PAGE_RETIREMENT_CAUSE_COUNT];
    unsigned int retired_page_count[NVML_PAGE_RETIREMENT_CAUSE_COUNT];
    int retired_pages_pending;
    unsigned int remapped_rows_corrected, remapped_rows_uncorrected;
    int row_remap_pending, row_remap_failure;
    /* "fabric": {"state": nvmlGpuFabricState_t, "status": nvmlReturn_t, "clique_id": N}; 0s outside NVSwitch. */
    unsigned int fabric_state, fabric_status, fabric_clique_id;
    /* Processes with a CUDA context on the GPU ("compute_processes"): pid and memory in bytes. */
    unsigned int process_count;
    unsigned int process_pids[SIMGPU_MAX_PROCESSES];
    unsigned long long process_memory[SIMGPU_MAX_PROCESSES];
};

typedef struct {
    int driver_loaded;
    char driver_version[SIMGPU_TEXT_SIZE];          /* the user-space libraries (this library) */
    char kernel_module_version[SIMGPU_TEXT_SIZE];   /* the loaded kernel module; differs => mismatch */
    int cuda_driver_version;                        /* 1000 * major + 10 * minor, e.g. 13000 */
    char nvml_version[SIMGPU_TEXT_SIZE];
    unsigned int gpu_count;
    struct nvmlDevice_st gpus[SIMGPU_MAX_GPUS];
} simgpu_machine;

/* Path of the description file: $GPUFLEET_SIMGPU_CONFIG or the default. */
const char *simgpu_description_path(void);

/* Reads and checks the description; on failure returns 0 and explains why in error. */
int simgpu_load(const char *path, simgpu_machine *machine, char *error, size_t error_size);

void simgpu_release(simgpu_machine *machine);

#endif
