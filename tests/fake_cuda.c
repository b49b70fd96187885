/*
 * fake_cuda.c -- a stand-in libcuda.so.1 for test_cli.sh: the cuda backend's refusals, checked without a
 * GPU. cuda.c loads the driver with dlopen and looks its entry points up by name, so a library of those
 * names, found first through LD_LIBRARY_PATH, takes the driver's place.
 *
 * Built twice. Plain, it has every entry point cuda.c needs and none of the optional ones, and its
 * cuInit and cuDeviceGetCount act as GPUMEM_FAKE_CUDA says: "init_fails" (cuInit answers
 * CUDA_ERROR_NO_DEVICE, as on a machine whose GPU the driver cannot use), "no_device" (cuInit succeeds,
 * no device is counted), or "one_device" (one device, so any other ordinal does not exist). With
 * FAKE_CUDA_OLD it has cuInit alone: a driver older than what gpumem needs.
 *
 * Only those paths are reached: every other entry point answers CUDA_ERROR_NOT_SUPPORTED and is never
 * called by them (each is declared without its parameters, which no caller here passes).
 */
#include <stdlib.h>
#include <string.h>

enum { SUCCESS = 0, ERROR_NO_DEVICE = 100, ERROR_NOT_SUPPORTED = 801 };

static const char *mode(void)
{
    const char *value = getenv("GPUMEM_FAKE_CUDA");
    return value ? value : "";
}

int cuInit(unsigned int flags)
{
    (void)flags;
    return strcmp(mode(), "init_fails") ? SUCCESS : ERROR_NO_DEVICE;
}

#ifndef FAKE_CUDA_OLD
int cuDeviceGetCount(int *count)
{
    *count = strcmp(mode(), "one_device") ? 0 : 1;
    return SUCCESS;
}

int cuGetErrorString(int result, const char **text)
{
    *text = result == ERROR_NO_DEVICE ? "no CUDA-capable device is detected" : "operation not supported";
    return SUCCESS;
}

#define UNSUPPORTED(name)                                                                                         \
    int name(void);                                                                                                \
    int name(void) { return ERROR_NOT_SUPPORTED; }
UNSUPPORTED(cuDriverGetVersion)
UNSUPPORTED(cuDeviceGet)
UNSUPPORTED(cuDeviceGetName)
UNSUPPORTED(cuDeviceGetAttribute)
UNSUPPORTED(cuDeviceGetPCIBusId)
UNSUPPORTED(cuDevicePrimaryCtxRetain)
UNSUPPORTED(cuDevicePrimaryCtxRelease_v2)
UNSUPPORTED(cuCtxGetCurrent)
UNSUPPORTED(cuCtxSetCurrent)
UNSUPPORTED(cuMemGetInfo_v2)
UNSUPPORTED(cuMemAlloc_v2)
UNSUPPORTED(cuMemFree_v2)
UNSUPPORTED(cuMemHostAlloc)
UNSUPPORTED(cuMemFreeHost)
UNSUPPORTED(cuMemAddressReserve)
UNSUPPORTED(cuMemAddressFree)
UNSUPPORTED(cuMemCreate)
UNSUPPORTED(cuMemRelease)
UNSUPPORTED(cuMemMap)
UNSUPPORTED(cuMemSetAccess)
UNSUPPORTED(cuMemUnmap)
UNSUPPORTED(cuCtxSynchronize)
UNSUPPORTED(cuMemcpyDtoD_v2)
UNSUPPORTED(cuMemGetAllocationGranularity)
UNSUPPORTED(cuEventCreate)
UNSUPPORTED(cuEventDestroy_v2)
UNSUPPORTED(cuEventRecord)
UNSUPPORTED(cuEventQuery)
UNSUPPORTED(cuEventSynchronize)
#endif
