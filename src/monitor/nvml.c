/*
 * nvml.c -- NVML through dlopen: libnvidia-ml.so.1 is looked up when a reading is asked for, so that
 * gpumem builds and runs where there is no driver, and says why its GPU rows are empty. Only plain
 * types cross the boundary (NVML's structs are two to four integers, declared here as NVML
 * documents them), and every entry point is checked before use.
 *
 * The processes on a GPU (for the out-of-memory report's "other processes" cause) come from
 * nvmlDeviceGetComputeRunningProcesses: its _v2 form, whose entry is {pid, used memory, GPU instance,
 * compute instance} in every NVML that has it, else the original form {pid, used memory}. The later _v3
 * form is not used: its entry's layout changed between NVML releases.
 */
#include "monitor/nvml.h"

#include "base/error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct nvml_memory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvml_memory;

typedef struct nvml_process_v1 {
    unsigned int pid;
    unsigned long long used_memory;
} nvml_process_v1;

typedef struct nvml_process_v2 {
    unsigned int pid;
    unsigned long long used_memory;
    unsigned int gpu_instance;
    unsigned int compute_instance;
} nvml_process_v2;

typedef struct nvml_utilization {
    unsigned int gpu;
    unsigned int memory;
} nvml_utilization;

typedef int (*nvml_init_fn)(void);
typedef int (*nvml_count_fn)(unsigned int *);
typedef int (*nvml_handle_fn)(unsigned int, void **);
typedef int (*nvml_memory_fn)(void *, nvml_memory *);
typedef int (*nvml_utilization_fn)(void *, nvml_utilization *);
typedef int (*nvml_temperature_fn)(void *, int, unsigned int *);
typedef int (*nvml_name_fn)(void *, char *, unsigned int);
typedef const char *(*nvml_error_fn)(int);
typedef int (*nvml_handle_by_bus_fn)(const char *, void **);
typedef int (*nvml_processes_fn)(void *, unsigned int *, void *);
typedef int (*nvml_driver_version_fn)(char *, unsigned int);
typedef int (*nvml_cuda_version_fn)(int *);
typedef int (*nvml_mode_fn)(void *, int *);
typedef int (*nvml_modes_fn)(void *, int *, int *);
typedef int (*nvml_unsigned_fn)(void *, unsigned int *);

static struct {
    nvml_count_fn count;
    nvml_handle_fn handle;
    nvml_memory_fn memory;
    nvml_utilization_fn utilization;
    nvml_temperature_fn temperature;
    nvml_name_fn name;
    nvml_error_fn error;
    nvml_handle_by_bus_fn handle_by_bus;
    nvml_processes_fn processes_v2;
    nvml_processes_fn processes_v1;
    nvml_driver_version_fn driver_version;
    nvml_cuda_version_fn cuda_version;
    nvml_mode_fn persistence_mode;
    nvml_modes_fn ecc_mode, mig_mode;
    nvml_unsigned_fn pcie_generation, pcie_max_generation, pcie_width, pcie_max_width;
    char failure[256];
} nvml;

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void load_nvml(void)
{
    void *library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(nvml.failure, sizeof nvml.failure, "NVML is not available: %s", dlerror());
        return;
    }
    nvml_init_fn init = (nvml_init_fn)dlsym(library, "nvmlInit_v2");
    nvml.count = (nvml_count_fn)dlsym(library, "nvmlDeviceGetCount_v2");
    nvml.handle = (nvml_handle_fn)dlsym(library, "nvmlDeviceGetHandleByIndex_v2");
    nvml.memory = (nvml_memory_fn)dlsym(library, "nvmlDeviceGetMemoryInfo");
    nvml.utilization = (nvml_utilization_fn)dlsym(library, "nvmlDeviceGetUtilizationRates");
    nvml.temperature = (nvml_temperature_fn)dlsym(library, "nvmlDeviceGetTemperature");
    nvml.name = (nvml_name_fn)dlsym(library, "nvmlDeviceGetName");
    nvml.error = (nvml_error_fn)dlsym(library, "nvmlErrorString");
    nvml.handle_by_bus = (nvml_handle_by_bus_fn)dlsym(library, "nvmlDeviceGetHandleByPciBusId_v2");
    nvml.processes_v2 = (nvml_processes_fn)dlsym(library, "nvmlDeviceGetComputeRunningProcesses_v2");
    nvml.processes_v1 = (nvml_processes_fn)dlsym(library, "nvmlDeviceGetComputeRunningProcesses");
    nvml.driver_version = (nvml_driver_version_fn)dlsym(library, "nvmlSystemGetDriverVersion");
    nvml.cuda_version = (nvml_cuda_version_fn)dlsym(library, "nvmlSystemGetCudaDriverVersion_v2");
    nvml.persistence_mode = (nvml_mode_fn)dlsym(library, "nvmlDeviceGetPersistenceMode");
    nvml.ecc_mode = (nvml_modes_fn)dlsym(library, "nvmlDeviceGetEccMode");
    nvml.mig_mode = (nvml_modes_fn)dlsym(library, "nvmlDeviceGetMigMode");
    nvml.pcie_generation = (nvml_unsigned_fn)dlsym(library, "nvmlDeviceGetCurrPcieLinkGeneration");
    nvml.pcie_max_generation = (nvml_unsigned_fn)dlsym(library, "nvmlDeviceGetMaxPcieLinkGeneration");
    nvml.pcie_width = (nvml_unsigned_fn)dlsym(library, "nvmlDeviceGetCurrPcieLinkWidth");
    nvml.pcie_max_width = (nvml_unsigned_fn)dlsym(library, "nvmlDeviceGetMaxPcieLinkWidth");
    int result = -1;
    if (!init || !nvml.count || !nvml.handle || !nvml.memory)
        snprintf(nvml.failure, sizeof nvml.failure, "NVML is not usable (libnvidia-ml.so.1 lacks an entry point)");
    else if ((result = init()) != 0)
        snprintf(nvml.failure, sizeof nvml.failure, "NVML did not start: %s",
                 nvml.error ? nvml.error(result) : "error");
    if (nvml.failure[0])
        nvml.count = NULL;
}

gm_status gm_read_gpus(gm_gpu_reading *gpus, size_t capacity, size_t *count_out)
{
    pthread_once(&nvml_once, load_nvml);
    *count_out = 0;
    if (!nvml.count)
        return gm_fail(GM_ERROR_NO_DEVICE, "%s", nvml.failure);
    unsigned int devices = 0;
    int result = nvml.count(&devices);
    if (result != 0)
        return gm_fail(GM_ERROR_NO_DEVICE, "NVML cannot count the GPUs: %s", nvml.error ? nvml.error(result) : "error");
    for (unsigned int index = 0; index < devices && *count_out < capacity; index++) {
        void *device = NULL;
        nvml_memory memory;
        if (nvml.handle(index, &device) != 0 || nvml.memory(device, &memory) != 0)
            continue;
        gm_gpu_reading *gpu = &gpus[(*count_out)++];
        memset(gpu, 0, sizeof *gpu);
        gpu->index = (int)index;
        gpu->total_bytes = memory.total;
        gpu->used_bytes = memory.used;
        nvml_utilization utilization;
        unsigned int temperature = 0;
        gpu->utilization_percent = nvml.utilization && nvml.utilization(device, &utilization) == 0 ? (int)utilization.gpu : -1;
        gpu->temperature_celsius = nvml.temperature && nvml.temperature(device, 0, &temperature) == 0 ? (int)temperature : -1;
        if (!nvml.name || nvml.name(device, gpu->name, sizeof gpu->name) != 0)
            snprintf(gpu->name, sizeof gpu->name, "GPU %u", index);
    }
    return GM_OK;
}

gm_status gm_gpu_driver_versions(char *driver, size_t size, int *cuda_version_out)
{
    pthread_once(&nvml_once, load_nvml);
    if (size)
        snprintf(driver, size, "?");
    *cuda_version_out = 0;
    if (!nvml.count)
        return gm_fail(GM_ERROR_NO_DEVICE, "%s", nvml.failure);
    if (nvml.driver_version && size && nvml.driver_version(driver, (unsigned int)size) != 0)
        snprintf(driver, size, "?");
    if (nvml.cuda_version && nvml.cuda_version(cuda_version_out) != 0)
        *cuda_version_out = 0;
    return GM_OK;
}

#define NVML_PROCESSES_MAX 64

/* NVML's enums (persistence, ECC, MIG modes) are ints: 1 enabled, 0 disabled. */
static int mode_of(nvml_mode_fn read, void *device)
{
    int mode = 0;
    return read && read(device, &mode) == 0 ? mode != 0 : -1;
}

static int current_mode_of(nvml_modes_fn read, void *device)
{
    int current = 0, pending = 0;
    return read && read(device, &current, &pending) == 0 ? current != 0 : -1;
}

static int unsigned_of(nvml_unsigned_fn read, void *device)
{
    unsigned int value = 0;
    return read && read(device, &value) == 0 ? (int)value : -1;
}

static gm_status list_processes(void *device, gm_gpu_process *processes, size_t capacity, size_t *count_out);

gm_status gm_read_gpu_details(int index, gm_gpu_details *details_out)
{
    pthread_once(&nvml_once, load_nvml);
    if (!nvml.count)
        return gm_fail(GM_ERROR_NO_DEVICE, "%s", nvml.failure);
    void *device = NULL;
    if (index < 0 || nvml.handle((unsigned int)index, &device) != 0)
        return gm_fail(GM_ERROR_NO_DEVICE, "NVML does not know GPU %d", index);
    gm_gpu_details details = {
        .persistence_mode = mode_of(nvml.persistence_mode, device),
        .ecc_mode = current_mode_of(nvml.ecc_mode, device),
        .mig_mode = current_mode_of(nvml.mig_mode, device),
        .pcie_generation = unsigned_of(nvml.pcie_generation, device),
        .pcie_max_generation = unsigned_of(nvml.pcie_max_generation, device),
        .pcie_width = unsigned_of(nvml.pcie_width, device),
        .pcie_max_width = unsigned_of(nvml.pcie_max_width, device),
        .processes = -1,
    };
    gm_gpu_process processes[NVML_PROCESSES_MAX];
    size_t count = 0;
    if (list_processes(device, processes, NVML_PROCESSES_MAX, &count) == GM_OK) {
        details.processes = (int)count;
        for (size_t i = 0; i < count; i++)
            details.processes_bytes += processes[i].used_bytes;
    }
    *details_out = details;
    return GM_OK;
}
#define NVML_VALUE_NOT_AVAILABLE (~0ull)

static gm_gpu_process process_of(unsigned int pid, unsigned long long used_memory)
{
    return (gm_gpu_process){.pid = (long)pid, .used_bytes = used_memory == NVML_VALUE_NOT_AVAILABLE ? 0 : used_memory};
}

gm_status gm_gpu_processes(const char *pci_bus_id, gm_gpu_process *processes, size_t capacity, size_t *count_out)
{
    pthread_once(&nvml_once, load_nvml);
    *count_out = 0;
    if (!nvml.count)
        return gm_fail(GM_ERROR_NO_DEVICE, "%s", nvml.failure);
    void *device = NULL;
    if (!pci_bus_id || !*pci_bus_id || !nvml.handle_by_bus || nvml.handle_by_bus(pci_bus_id, &device) != 0)
        return gm_fail(GM_ERROR_NO_DEVICE, "NVML does not know the GPU at PCI bus id '%s'", pci_bus_id ? pci_bus_id : "");
    return list_processes(device, processes, capacity, count_out);
}

static gm_status list_processes(void *device, gm_gpu_process *processes, size_t capacity, size_t *count_out)
{
    *count_out = 0;
    unsigned int found = NVML_PROCESSES_MAX;
    if (nvml.processes_v2) {
        nvml_process_v2 entries[NVML_PROCESSES_MAX];
        if (nvml.processes_v2(device, &found, entries) != 0)
            return gm_fail(GM_ERROR_NO_DEVICE, "NVML cannot list the GPU's processes");
        for (unsigned int i = 0; i < found && *count_out < capacity; i++)
            processes[(*count_out)++] = process_of(entries[i].pid, entries[i].used_memory);
    } else if (nvml.processes_v1) {
        nvml_process_v1 entries[NVML_PROCESSES_MAX];
        if (nvml.processes_v1(device, &found, entries) != 0)
            return gm_fail(GM_ERROR_NO_DEVICE, "NVML cannot list the GPU's processes");
        for (unsigned int i = 0; i < found && *count_out < capacity; i++)
            processes[(*count_out)++] = process_of(entries[i].pid, entries[i].used_memory);
    } else {
        return gm_fail(GM_ERROR_NO_DEVICE, "NVML lacks nvmlDeviceGetComputeRunningProcesses");
    }
    return GM_OK;
}
