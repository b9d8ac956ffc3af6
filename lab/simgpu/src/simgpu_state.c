/*
 * Loads the description file into a simgpu_machine. Checking is strict (unknown keys, wrong types,
 * out-of-range numbers are errors) so that a typo in a test's description fails loudly instead of
 * silently simulating something else.
 */
#include "simgpu_state.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_json.h"

/* Descriptions are a few KB; anything this large is not one. */
#define SIMGPU_MAX_FILE_SIZE (4L * 1024 * 1024)

typedef struct {
    char *error;
    size_t error_size;
    int failed;
} loader;

typedef struct {
    const char *name;
    unsigned int flag;
} feature_name;

static const feature_name FEATURE_NAMES[] = {
    {"memory", FEATURE_MEMORY},
    {"compute_capability", FEATURE_COMPUTE_CAPABILITY},
    {"persistence_mode", FEATURE_PERSISTENCE_MODE},
    {"ecc", FEATURE_ECC},
    {"mig", FEATURE_MIG},
    {"power_limit", FEATURE_POWER_LIMIT},
    {"power_draw", FEATURE_POWER_DRAW},
    {"temperature", FEATURE_TEMPERATURE},
    {"utilization", FEATURE_UTILIZATION},
    {"performance_state", FEATURE_PERFORMANCE_STATE},
    {"compute_mode", FEATURE_COMPUTE_MODE},
    {"fan_speed", FEATURE_FAN_SPEED},
    {"retired_pages", FEATURE_RETIRED_PAGES},
    {"row_remapping", FEATURE_ROW_REMAPPING},
    {"display_active", FEATURE_DISPLAY_ACTIVE},
};

static const char *const COMPUTE_MODE_NAMES[] = {"default", "exclusive_thread", "prohibited", "exclusive_process"};

static void load_error(loader *l, const char *format, ...) {
    if (l->failed) {
        return;
    }
    l->failed = 1;
    va_list args;
    va_start(args, format);
    vsnprintf(l->error, l->error_size, format, args);
    va_end(args);
}

const char *simgpu_description_path(void) {
    const char *path = getenv(SIMGPU_DESCRIPTION_ENV);
    return (path != NULL && path[0] != '\0') ? path : SIMGPU_DEFAULT_DESCRIPTION;
}

static char *read_text_file(loader *l, const char *path) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        load_error(l, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    if (fseek(file, 0, SEEK_END) != 0) {
        load_error(l, "cannot read %s: %s", path, strerror(errno));
        fclose(file);
        return NULL;
    }
    long size = ftell(file);
    if (size < 0 || size > SIMGPU_MAX_FILE_SIZE) {
        load_error(l, "%s is not a description file (size %ld bytes)", path, size);
    } else if ((text = malloc((size_t)size + 1)) == NULL) {
        load_error(l, "out of memory reading %s", path);
    } else {
        rewind(file);
        size_t read = fread(text, 1, (size_t)size, file);
        text[read] = '\0';
        if (read != (size_t)size || memchr(text, '\0', read) != NULL) {
            load_error(l, "cannot read %s completely (or it holds NUL bytes)", path);
            free(text);
            text = NULL;
        }
    }
    fclose(file);
    return text;
}

/* Fails on any member of object whose name is not in allowed (NULL-terminated). */
static void check_keys(loader *l, const json_value *object, const char *const *allowed, const char *where) {
    for (size_t i = 0; i < object->count; i++) {
        const char *key = object->keys[i];
        int known = 0;
        for (const char *const *name = allowed; *name != NULL; name++) {
            known = known || strcmp(*name, key) == 0;
        }
        if (!known) {
            load_error(l, "%s: unknown key \"%s\"", where, key);
            return;
        }
    }
}

static const json_value *member(loader *l, const json_value *object, const char *key, json_type type,
                                 int required, const char *where) {
    const json_value *value = json_get(object, key);
    if (value == NULL || (value->type == JSON_NULL && !required)) {
        if (required) {
            load_error(l, "%s: missing \"%s\"", where, key);
        }
        return NULL;
    }
    if (value->type != type) {
        load_error(l, "%s.%s: expected %s, got %s", where, key, json_type_name(type), json_type_name(value->type));
        return NULL;
    }
    return value;
}

static void read_text(loader *l, const json_value *object, const char *key, int required, char *out,
                      const char *where) {
    const json_value *value = member(l, object, key, JSON_STRING, required, where);
    if (value == NULL) {
        return;
    }
    if (strlen(value->string) >= SIMGPU_TEXT_SIZE) {
        load_error(l, "%s.%s: longer than %d characters", where, key, SIMGPU_TEXT_SIZE - 1);
        return;
    }
    strcpy(out, value->string);
}

static void read_flag(loader *l, const json_value *object, const char *key, int *out, const char *where) {
    const json_value *value = member(l, object, key, JSON_BOOL, 0, where);
    if (value != NULL) {
        *out = value->boolean;
    }
}

/* A whole number in [0, max] from a JSON number, or a failure naming the key. */
static int whole_number(loader *l, const json_value *value, double max, unsigned long long *out,
                        const char *where, const char *key) {
    double number = value->number;
    if (number < 0 || number > max || floor(number) != number) {
        load_error(l, "%s.%s: expected a whole number from 0 to %.0f, got %g", where, key, max, number);
        return 0;
    }
    *out = (unsigned long long)number;
    return 1;
}

static void read_count(loader *l, const json_value *object, const char *key, double max, unsigned long long *out,
                       const char *where) {
    const json_value *value = member(l, object, key, JSON_NUMBER, 0, where);
    if (value != NULL) {
        whole_number(l, value, max, out, where, key);
    }
}

static void read_uint(loader *l, const json_value *object, const char *key, unsigned int *out, const char *where) {
    unsigned long long wide = *out;
    read_count(l, object, key, 4294967295.0, &wide, where);
    *out = (unsigned int)wide;
}

/* Watts in the description, milliwatts in NVML. */
static void read_watts(loader *l, const json_value *object, const char *key, unsigned int *milliwatts,
                       const char *where) {
    const json_value *value = member(l, object, key, JSON_NUMBER, 0, where);
    if (value == NULL) {
        return;
    }
    if (value->number < 0 || value->number > 100000) {
        load_error(l, "%s.%s: expected watts from 0 to 100000, got %g", where, key, value->number);
        return;
    }
    *milliwatts = (unsigned int)llround(value->number * 1000.0);
}

static void read_driver(loader *l, const json_value *driver, simgpu_machine *machine) {
    static const char *const keys[] = {"comment", "loaded", "version", "kernel_module_version",
                                       "cuda_driver_version", "nvml_version", NULL};
    check_keys(l, driver, keys, "driver");
    machine->driver_loaded = 1;
    read_flag(l, driver, "loaded", &machine->driver_loaded, "driver");
    read_text(l, driver, "version", 1, machine->driver_version, "driver");
    strcpy(machine->kernel_module_version, machine->driver_version);
    read_text(l, driver, "kernel_module_version", 0, machine->kernel_module_version, "driver");
    read_text(l, driver, "nvml_version", 1, machine->nvml_version, "driver");
    const json_value *cuda = member(l, driver, "cuda_driver_version", JSON_NUMBER, 1, "driver");
    unsigned long long cuda_version = 0;
    if (cuda != NULL && whole_number(l, cuda, 99990, &cuda_version, "driver", "cuda_driver_version")) {
        machine->cuda_driver_version = (int)cuda_version;
    }
}

static void read_pci(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    char bus_id[SIMGPU_TEXT_SIZE] = "";
    read_text(l, gpu, "pci_bus_id", 1, bus_id, where);
    unsigned int function = 0;
    char trailing = '\0';
    if (!l->failed && (sscanf(bus_id, "%x:%x:%x.%x%c", &device->pci_domain, &device->pci_bus, &device->pci_device,
                              &function, &trailing) != 4 ||
                       device->pci_bus > 0xff || device->pci_device > 0x1f || function != 0)) {
        load_error(l, "%s.pci_bus_id: expected DOMAIN:BUS:DEVICE.0 in hex (e.g. 00000000:00:06.0), got \"%s\"",
                   where, bus_id);
    }
    read_uint(l, gpu, "pci_device_id", &device->pci_device_id, where);
    read_uint(l, gpu, "pci_subsystem_id", &device->pci_subsystem_id, where);
}

static void read_compute_capability(loader *l, const json_value *gpu, struct nvmlDevice_st *device,
                                    const char *where) {
    const json_value *pair = member(l, gpu, "compute_capability", JSON_ARRAY, 1, where);
    if (pair == NULL) {
        return;
    }
    if (pair->count != 2 || pair->items[0]->type != JSON_NUMBER || pair->items[1]->type != JSON_NUMBER) {
        load_error(l, "%s.compute_capability: expected [major, minor], e.g. [9, 0]", where);
        return;
    }
    unsigned long long major = 0, minor = 0;
    if (whole_number(l, pair->items[0], 99, &major, where, "compute_capability[0]") &&
        whole_number(l, pair->items[1], 99, &minor, where, "compute_capability[1]")) {
        device->compute_major = (int)major;
        device->compute_minor = (int)minor;
    }
}

static void read_memory(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    const json_value *total = member(l, gpu, "memory_total_bytes", JSON_NUMBER, 1, where);
    /* 2^53: the largest byte count a JSON number (a double) holds exactly. */
    if (total != NULL) {
        whole_number(l, total, 9007199254740992.0, &device->memory_total, where, "memory_total_bytes");
    }
    read_count(l, gpu, "memory_used_bytes", 9007199254740992.0, &device->memory_used, where);
    read_count(l, gpu, "memory_reserved_bytes", 9007199254740992.0, &device->memory_reserved, where);
    if (!l->failed && device->memory_used + device->memory_reserved > device->memory_total) {
        load_error(l, "%s: memory_used_bytes + memory_reserved_bytes is larger than memory_total_bytes", where);
    }
}

static void read_ecc(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"comment", "enabled", "pending", "corrected_volatile", "corrected_aggregate",
                                       "uncorrected_volatile", "uncorrected_aggregate", NULL};
    const json_value *ecc = member(l, gpu, "ecc", JSON_OBJECT, 0, where);
    if (ecc == NULL) {
        return;
    }
    char context[64];
    snprintf(context, sizeof(context), "%s.ecc", where);
    check_keys(l, ecc, keys, context);
    read_flag(l, ecc, "enabled", &device->ecc_enabled, context);
    device->ecc_pending = device->ecc_enabled;
    read_flag(l, ecc, "pending", &device->ecc_pending, context);
    unsigned long long *corrected = device->ecc_counts[NVML_MEMORY_ERROR_TYPE_CORRECTED];
    unsigned long long *uncorrected = device->ecc_counts[NVML_MEMORY_ERROR_TYPE_UNCORRECTED];
    read_count(l, ecc, "corrected_volatile", 1e15, &corrected[NVML_VOLATILE_ECC], context);
    read_count(l, ecc, "corrected_aggregate", 1e15, &corrected[NVML_AGGREGATE_ECC], context);
    read_count(l, ecc, "uncorrected_volatile", 1e15, &uncorrected[NVML_VOLATILE_ECC], context);
    read_count(l, ecc, "uncorrected_aggregate", 1e15, &uncorrected[NVML_AGGREGATE_ECC], context);
}

static void read_mig(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"comment", "enabled", "pending", NULL};
    const json_value *mig = member(l, gpu, "mig", JSON_OBJECT, 0, where);
    if (mig == NULL) {
        return;
    }
    char context[64];
    snprintf(context, sizeof(context), "%s.mig", where);
    check_keys(l, mig, keys, context);
    read_flag(l, mig, "enabled", &device->mig_enabled, context);
    device->mig_pending = device->mig_enabled;
    read_flag(l, mig, "pending", &device->mig_pending, context);
}

static void read_page_list(loader *l, const json_value *pages, const char *key, struct nvmlDevice_st *device,
                           nvmlPageRetirementCause_t cause, const char *where) {
    const json_value *list = member(l, pages, key, JSON_ARRAY, 0, where);
    if (list == NULL || list->count == 0) {
        return;
    }
    device->retired_pages[cause] = calloc(list->count, sizeof(unsigned long long));
    if (device->retired_pages[cause] == NULL) {
        load_error(l, "out of memory");
        return;
    }
    for (size_t i = 0; i < list->count && !l->failed; i++) {
        if (list->items[i]->type != JSON_NUMBER) {
            load_error(l, "%s.%s: expected page addresses (numbers)", where, key);
            return;
        }
        whole_number(l, list->items[i], 9007199254740992.0, &device->retired_pages[cause][i], where, key);
    }
    device->retired_page_count[cause] = (unsigned int)list->count;
}

static void read_retired_pages(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"comment", "single_bit_ecc", "double_bit_ecc", "pending", NULL};
    const json_value *pages = member(l, gpu, "retired_pages", JSON_OBJECT, 0, where);
    if (pages == NULL) {
        return;
    }
    char context[64];
    snprintf(context, sizeof(context), "%s.retired_pages", where);
    check_keys(l, pages, keys, context);
    read_page_list(l, pages, "single_bit_ecc", device, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                   context);
    read_page_list(l, pages, "double_bit_ecc", device, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, context);
    read_flag(l, pages, "pending", &device->retired_pages_pending, context);
}

static void read_row_remapping(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"comment", "corrected_rows", "uncorrected_rows", "pending", "failure", NULL};
    const json_value *rows = member(l, gpu, "row_remapping", JSON_OBJECT, 0, where);
    if (rows == NULL) {
        return;
    }
    char context[64];
    snprintf(context, sizeof(context), "%s.row_remapping", where);
    check_keys(l, rows, keys, context);
    read_uint(l, rows, "corrected_rows", &device->remapped_rows_corrected, context);
    read_uint(l, rows, "uncorrected_rows", &device->remapped_rows_uncorrected, context);
    read_flag(l, rows, "pending", &device->row_remap_pending, context);
    read_flag(l, rows, "failure", &device->row_remap_failure, context);
}

static void read_fabric(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"comment", "state", "status", "clique_id", NULL};
    const json_value *fabric = member(l, gpu, "fabric", JSON_OBJECT, 0, where);
    if (fabric == NULL) {
        return;
    }
    char context[64];
    snprintf(context, sizeof(context), "%s.fabric", where);
    check_keys(l, fabric, keys, context);
    unsigned long long state = 0;
    read_count(l, fabric, "state", 3, &state, context);
    device->fabric_state = (unsigned int)state;
    read_uint(l, fabric, "status", &device->fabric_status, context);
    read_uint(l, fabric, "clique_id", &device->fabric_clique_id, context);
}

/* "compute_processes": [{"pid": N, "used_memory_bytes": M}, ...]; their memory counts in memory_used_bytes. */
static void read_processes(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"comment", "pid", "used_memory_bytes", NULL};
    const json_value *list = member(l, gpu, "compute_processes", JSON_ARRAY, 0, where);
    if (list == NULL) {
        return;
    }
    if (list->count > SIMGPU_MAX_PROCESSES) {
        load_error(l, "%s.compute_processes: at most %d processes", where, SIMGPU_MAX_PROCESSES);
        return;
    }
    unsigned long long total = 0;
    for (size_t i = 0; i < list->count && !l->failed; i++) {
        char context[64];
        snprintf(context, sizeof(context), "%s.compute_processes[%zu]", where, i);
        if (list->items[i]->type != JSON_OBJECT) {
            load_error(l, "%s: expected an object", context);
            return;
        }
        check_keys(l, list->items[i], keys, context);
        unsigned long long pid = 0;
        read_count(l, list->items[i], "pid", 4194304, &pid, context);
        read_count(l, list->items[i], "used_memory_bytes", 9007199254740992.0, &device->process_memory[i], context);
        device->process_pids[i] = (unsigned int)pid;
        total += device->process_memory[i];
    }
    device->process_count = (unsigned int)list->count;
    if (!l->failed && total > device->memory_used) {
        load_error(l, "%s: the compute_processes' used_memory_bytes add up to more than memory_used_bytes", where);
    }
}

static void read_not_supported(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    const json_value *list = member(l, gpu, "not_supported", JSON_ARRAY, 0, where);
    if (list == NULL) {
        return;
    }
    for (size_t i = 0; i < list->count && !l->failed; i++) {
        const json_value *item = list->items[i];
        unsigned int flag = 0;
        for (size_t f = 0; item->type == JSON_STRING && f < sizeof(FEATURE_NAMES) / sizeof(FEATURE_NAMES[0]); f++) {
            if (strcmp(FEATURE_NAMES[f].name, item->string) == 0) {
                flag = FEATURE_NAMES[f].flag;
            }
        }
        if (flag == 0) {
            load_error(l, "%s.not_supported[%zu]: not a feature name; known: memory, compute_capability, "
                          "persistence_mode, ecc, mig, power_limit, power_draw, temperature, utilization, "
                          "performance_state, compute_mode, fan_speed, retired_pages, row_remapping, display_active",
                       where, i);
            return;
        }
        device->not_supported |= flag;
    }
}

static void read_compute_mode(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    const json_value *mode = member(l, gpu, "compute_mode", JSON_STRING, 0, where);
    if (mode == NULL) {
        return;
    }
    for (int m = 0; m < 4; m++) {
        if (strcmp(COMPUTE_MODE_NAMES[m], mode->string) == 0) {
            device->compute_mode = m;
            return;
        }
    }
    load_error(l, "%s.compute_mode: expected default, exclusive_thread, prohibited or exclusive_process", where);
}

static void read_utilization(loader *l, const json_value *gpu, struct nvmlDevice_st *device, const char *where) {
    static const char *const keys[] = {"gpu", "memory", NULL};
    const json_value *utilization = member(l, gpu, "utilization_pct", JSON_OBJECT, 0, where);
    if (utilization == NULL) {
        return;
    }
    char context[64];
    snprintf(context, sizeof(context), "%s.utilization_pct", where);
    check_keys(l, utilization, keys, context);
    unsigned long long percent = 0;
    read_count(l, utilization, "gpu", 100, &percent, context);
    device->utilization_gpu = (unsigned int)percent;
    percent = 0;
    read_count(l, utilization, "memory", 100, &percent, context);
    device->utilization_memory = (unsigned int)percent;
}

static void read_gpu(loader *l, const json_value *gpu, unsigned int index, struct nvmlDevice_st *device) {
    static const char *const keys[] = {
        "comment", "name", "uuid", "pci_bus_id", "pci_device_id", "pci_subsystem_id", "compute_capability",
        "memory_total_bytes", "memory_used_bytes", "memory_reserved_bytes", "persistence_mode", "ecc", "mig",
        "power_limit_w", "power_draw_w", "temperature_c", "utilization_pct", "performance_state", "compute_mode",
        "fan_speed_pct", "display_active", "retired_pages", "row_remapping", "compute_processes", "not_supported",
        "lost", "fabric", NULL};
    char where[32];
    snprintf(where, sizeof(where), "gpus[%u]", index);
    if (gpu->type != JSON_OBJECT) {
        load_error(l, "%s: expected an object", where);
        return;
    }
    check_keys(l, gpu, keys, where);
    device->index = index;
    read_text(l, gpu, "name", 1, device->name, where);
    read_text(l, gpu, "uuid", 1, device->uuid, where);
    read_pci(l, gpu, device, where);
    read_compute_capability(l, gpu, device, where);
    read_memory(l, gpu, device, where);
    read_flag(l, gpu, "persistence_mode", &device->persistence_mode, where);
    read_ecc(l, gpu, device, where);
    read_mig(l, gpu, device, where);
    read_watts(l, gpu, "power_limit_w", &device->power_limit_mw, where);
    read_watts(l, gpu, "power_draw_w", &device->power_draw_mw, where);
    read_uint(l, gpu, "temperature_c", &device->temperature_c, where);
    read_utilization(l, gpu, device, where);
    unsigned long long pstate = 0;
    read_count(l, gpu, "performance_state", 15, &pstate, where);
    device->performance_state = (int)pstate;
    read_compute_mode(l, gpu, device, where);
    read_uint(l, gpu, "fan_speed_pct", &device->fan_speed, where);
    read_flag(l, gpu, "display_active", &device->display_active, where);
    read_retired_pages(l, gpu, device, where);
    read_row_remapping(l, gpu, device, where);
    read_fabric(l, gpu, device, where);
    read_processes(l, gpu, device, where);
    read_not_supported(l, gpu, device, where);
    read_flag(l, gpu, "lost", &device->lost, where);
}

static void read_machine(loader *l, const json_value *root, simgpu_machine *machine) {
    static const char *const keys[] = {"comment", "source", "driver", "gpus", NULL};
    if (root->type != JSON_OBJECT) {
        load_error(l, "the top level must be an object with \"driver\" and \"gpus\"");
        return;
    }
    check_keys(l, root, keys, "description");
    const json_value *driver = member(l, root, "driver", JSON_OBJECT, 1, "description");
    if (driver != NULL) {
        read_driver(l, driver, machine);
    }
    const json_value *gpus = member(l, root, "gpus", JSON_ARRAY, 1, "description");
    if (gpus == NULL) {
        return;
    }
    if (gpus->count > SIMGPU_MAX_GPUS) {
        load_error(l, "gpus: at most %d GPUs can be simulated, got %zu", SIMGPU_MAX_GPUS, gpus->count);
        return;
    }
    machine->gpu_count = (unsigned int)gpus->count;
    for (unsigned int i = 0; i < machine->gpu_count && !l->failed; i++) {
        read_gpu(l, gpus->items[i], i, &machine->gpus[i]);
    }
}

int simgpu_load(const char *path, simgpu_machine *machine, char *error, size_t error_size) {
    loader l = {error, error_size, 0};
    memset(machine, 0, sizeof(*machine));
    char *text = read_text_file(&l, path);
    if (text == NULL) {
        return 0;
    }
    char parse_error[256];
    json_value *root = json_parse(text, parse_error, sizeof(parse_error));
    free(text);
    if (root == NULL) {
        load_error(&l, "%s is not valid JSON: %s", path, parse_error);
        return 0;
    }
    read_machine(&l, root, machine);
    json_free(root);
    if (l.failed) {
        /* Prefix the path so the message stands alone on stderr; file and JSON errors above name it already. */
        char detail[512];
        snprintf(detail, sizeof(detail), "%s", error);
        snprintf(error, error_size, "%s: %s", path, detail);
        simgpu_release(machine);
        return 0;
    }
    return 1;
}

void simgpu_release(simgpu_machine *machine) {
    for (unsigned int i = 0; i < SIMGPU_MAX_GPUS; i++) {
        for (int cause = 0; cause < NVML_PAGE_RETIREMENT_CAUSE_COUNT; cause++) {
            free(machine->gpus[i].retired_pages[cause]);
            machine->gpus[i].retired_pages[cause] = NULL;
            machine->gpus[i].retired_page_count[cause] = 0;
        }
    }
    machine->gpu_count = 0;
}
