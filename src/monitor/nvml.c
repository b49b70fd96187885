/*
 * nvml.c -- NVML through dlopen: libnvidia-ml.so.1 is looked up when a reading is asked for, so that
 * gpumem builds and runs where there is no driver, and says why its GPU rows are empty. Only plain
 * types cross the boundary (NVML's structs are two or three integers, declared here as NVML
 * documents them), and every entry point is checked before use.
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

static struct {
    nvml_count_fn count;
    nvml_handle_fn handle;
    nvml_memory_fn memory;
    nvml_utilization_fn utilization;
    nvml_temperature_fn temperature;
    nvml_name_fn name;
    nvml_error_fn error;
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
