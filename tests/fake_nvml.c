/*
 * fake_nvml.c -- a stand-in libnvidia-ml.so.1 for test_doctor.sh and test_cuda_fake: one GPU ("Fake H200",
 * 140 GiB, 1 GiB used, persistence and ECC on, MIG off, PCIe gen5 x8 of x16, one process, PID 4321, holding
 * 1 GiB, at PCI bus id 0000:00:00.0 as tests/fake_cuda.c's device) and driver 550.54.15 / CUDA 12.4, so that
 * the GPU findings of gpumem doctor and the out-of-memory report's list of processes are checked without a
 * GPU. Loaded through LD_LIBRARY_PATH by nvml.c's dlopen; only the entry points nvml.c looks up.
 */
#include <stdio.h>
#include <string.h>

#define GIB (1024ull * 1024ull * 1024ull)

typedef struct fake_memory {
    unsigned long long total, free, used;
} fake_memory;

typedef struct fake_process {
    unsigned int pid;
    unsigned long long used_memory;
    unsigned int gpu_instance, compute_instance;
} fake_process;

static int device_token;

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device)
{
    if (index != 0)
        return 2;
    *device = &device_token;
    return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, void **device)
{
    if (strcmp(bus_id, "0000:00:00.0") != 0)
        return 6; /* NVML_ERROR_NOT_FOUND */
    *device = &device_token;
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *device, fake_memory *memory)
{
    (void)device;
    memory->total = 140 * GIB;
    memory->used = GIB;
    memory->free = memory->total - memory->used;
    return 0;
}
int nvmlDeviceGetName(void *device, char *name, unsigned int size)
{
    (void)device;
    snprintf(name, size, "Fake H200");
    return 0;
}
const char *nvmlErrorString(int result) { return result ? "fake error" : "success"; }
int nvmlSystemGetDriverVersion(char *version, unsigned int size)
{
    snprintf(version, size, "550.54.15");
    return 0;
}
int nvmlSystemGetCudaDriverVersion_v2(int *version) { *version = 12040; return 0; }
int nvmlDeviceGetPersistenceMode(void *device, int *mode) { (void)device; *mode = 1; return 0; }
int nvmlDeviceGetEccMode(void *device, int *current, int *pending) { (void)device; *current = *pending = 1; return 0; }
int nvmlDeviceGetMigMode(void *device, int *current, int *pending) { (void)device; *current = *pending = 0; return 0; }
int nvmlDeviceGetCurrPcieLinkGeneration(void *device, unsigned int *value) { (void)device; *value = 5; return 0; }
int nvmlDeviceGetMaxPcieLinkGeneration(void *device, unsigned int *value) { (void)device; *value = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(void *device, unsigned int *value) { (void)device; *value = 8; return 0; }
int nvmlDeviceGetMaxPcieLinkWidth(void *device, unsigned int *value) { (void)device; *value = 16; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v2(void *device, unsigned int *count, fake_process *processes)
{
    (void)device;
    if (*count < 1) {
        *count = 1;
        return 7;
    }
    *count = 1;
    memset(processes, 0, sizeof *processes);
    processes[0].pid = 4321;
    processes[0].used_memory = GIB;
    return 0;
}
