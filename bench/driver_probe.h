/*
 * driver_probe.h -- what the CUDA driver probes (vmm_probe.c, vmm_threads.c) share: a check that ends
 * the probe with the failed call's name and error, a microsecond clock, and the device set up for
 * pinned device memory that the probe can read and write.
 */
#ifndef GPUMEM_BENCH_DRIVER_PROBE_H
#define GPUMEM_BENCH_DRIVER_PROBE_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        CUresult result_ = (call);                                                        \
        if (result_ != CUDA_SUCCESS) {                                                    \
            const char *name_ = NULL;                                                     \
            cuGetErrorName(result_, &name_);                                              \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, name_);  \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static inline double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Device 0's primary context made current; *properties and *access describe its device memory. */
static inline CUcontext open_device(CUmemAllocationProp *properties, CUmemAccessDesc *access)
{
    CUdevice device;
    CUcontext context;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    *properties = (CUmemAllocationProp){0};
    properties->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    properties->location.id = device;
    *access = (CUmemAccessDesc){0};
    access->location = properties->location;
    access->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return context;
}

#endif
