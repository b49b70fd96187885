/*
 * cuda.c -- the CUDA backend, on the driver API, loaded at run time from libcuda.so.1.
 *
 * Nothing here needs CUDA at build time: the few driver types and entry points used are declared
 * below (layouts as in cuda.h of CUDA 12/13) and resolved with dlsym. So the library builds and its
 * CPU tests run where there is no driver, and it never links against, or fights with, the
 * application's CUDA runtime. Without a driver or a device, opening fails with GM_ERROR_NO_DEVICE
 * and a message that says which.
 *
 * Context: like PyTorch, the backend works in the device's primary context (retained at open);
 * each call makes it current only if it is not already, and restores the caller's context after.
 * Memory: plain segments (cuMemAlloc/cuMemFree) and the virtual-memory path (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease) with the device's minimum
 * granularity as page size; for compaction, a copy into new memory after a device-wide wait
 * (cuCtxSynchronize, cuMemcpyDtoD). Events are created without timing, and pooled by the front end.
 * CUDA graphs: every call runs in the relaxed stream-capture mode (cuThreadExchangeStreamCaptureMode),
 * as PyTorch's allocator does around cudaMalloc: a capture under way in this or another thread must
 * not make memory calls fail (a graph's private pool grows during its capture). Whether a stream is
 * being captured is asked with cuStreamIsCapturing, so that nothing waits for work that only a graph
 * holds. Drivers without these two entry points (older than CUDA 10.1) run without them.
 */
#include "backend/backend.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- driver declarations */

typedef int cu_result;
typedef int cu_device;
typedef struct cu_context_opaque *cu_context;
typedef struct cu_stream_opaque *cu_stream;
typedef struct cu_event_opaque *cu_event;
typedef unsigned long long cu_device_pointer;
typedef unsigned long long cu_allocation_handle;

typedef struct cu_location {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int id;
} cu_location;

typedef struct cu_allocation_properties {
    int type;                  /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requested_handle_types; /* CU_MEM_HANDLE_TYPE_NONE = 0 */
    cu_location location;
    void *win32_metadata;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } flags;
} cu_allocation_properties;

typedef struct cu_access_descriptor {
    cu_location location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} cu_access_descriptor;

enum {
    CU_SUCCESS = 0,
    CU_ERROR_OUT_OF_MEMORY = 2,
    CU_ERROR_NOT_READY = 600,
    CU_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CU_LOCATION_DEVICE = 1,
    CU_ALLOCATION_PINNED = 1,
    CU_ACCESS_READ_WRITE = 3,
    CU_GRANULARITY_MINIMUM = 0,
    CU_ATTRIBUTE_VIRTUAL_MEMORY_SUPPORTED = 102,
    CU_ATTRIBUTE_POSIX_DESCRIPTOR_SUPPORTED = 103,
    CU_HANDLE_POSIX_DESCRIPTOR = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};

/* The driver entry points, resolved once per process. */
typedef struct cuda_driver {
    cu_result (*init)(unsigned int);
    cu_result (*driver_get_version)(int *);
    cu_result (*device_get_count)(int *);
    cu_result (*device_get)(cu_device *, int);
    cu_result (*device_get_name)(char *, int, cu_device);
    cu_result (*device_get_attribute)(int *, int, cu_device);
    cu_result (*device_get_pci_bus_id)(char *, int, cu_device);
    cu_result (*primary_context_retain)(cu_context *, cu_device);
    cu_result (*primary_context_release)(cu_device);
    cu_result (*context_get_current)(cu_context *);
    cu_result (*context_set_current)(cu_context);
    cu_result (*memory_get_info)(size_t *, size_t *);
    cu_result (*memory_allocate)(cu_device_pointer *, size_t);
    cu_result (*memory_free)(cu_device_pointer);
    cu_result (*host_allocate)(void **, size_t, unsigned int);
    cu_result (*host_free)(void *);
    cu_result (*address_reserve)(cu_device_pointer *, size_t, size_t, cu_device_pointer, unsigned long long);
    cu_result (*address_free)(cu_device_pointer, size_t);
    cu_result (*create)(cu_allocation_handle *, size_t, const cu_allocation_properties *, unsigned long long);
    cu_result (*release)(cu_allocation_handle);
    cu_result (*map)(cu_device_pointer, size_t, size_t, cu_allocation_handle, unsigned long long);
    cu_result (*set_access)(cu_device_pointer, size_t, const cu_access_descriptor *, size_t);
    cu_result (*unmap)(cu_device_pointer, size_t);
    cu_result (*context_synchronize)(void);
    cu_result (*copy)(cu_device_pointer, cu_device_pointer, size_t);
    cu_result (*granularity)(size_t *, const cu_allocation_properties *, int);
    cu_result (*event_create)(cu_event *, unsigned int);
    cu_result (*event_destroy)(cu_event);
    cu_result (*event_record)(cu_event, cu_stream);
    cu_result (*event_query)(cu_event);
    cu_result (*event_synchronize)(cu_event);
    cu_result (*get_error_string)(cu_result, const char **);
    cu_result (*exchange_capture_mode)(int *); /* optional: cuThreadExchangeStreamCaptureMode */
    cu_result (*stream_is_capturing)(cu_stream, int *); /* optional: cuStreamIsCapturing */
    cu_result (*stream_query)(cu_stream);               /* optional: cuStreamQuery */
    cu_result (*stream_create)(cu_stream *, unsigned int); /* optional: cuStreamCreate */
    cu_result (*stream_destroy)(cu_stream);                /* optional: cuStreamDestroy_v2 */
    cu_result (*export_handle)(void *, cu_allocation_handle, int, unsigned long long); /* optional */
    cu_result (*import_handle)(cu_allocation_handle *, void *, int);                   /* optional */
} cuda_driver;

static cuda_driver driver;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static char driver_failure[512];
static void *driver_library;

static void load_driver(void)
{
    void *library = driver_library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(driver_failure, sizeof driver_failure,
                 "cuda backend: cannot load libcuda.so.1, so there is no NVIDIA driver on this machine (%s)", dlerror());
        return;
    }
    static const struct {
        const char *symbol;
        size_t offset;
        bool optional; /* newer than what gpumem needs: a NULL pointer when the driver lacks it */
    } entries[] = {
        {"cuInit", offsetof(cuda_driver, init), false},
        {"cuDriverGetVersion", offsetof(cuda_driver, driver_get_version), false},
        {"cuDeviceGetCount", offsetof(cuda_driver, device_get_count), false},
        {"cuDeviceGet", offsetof(cuda_driver, device_get), false},
        {"cuDeviceGetName", offsetof(cuda_driver, device_get_name), false},
        {"cuDeviceGetAttribute", offsetof(cuda_driver, device_get_attribute), false},
        {"cuDeviceGetPCIBusId", offsetof(cuda_driver, device_get_pci_bus_id), false},
        {"cuDevicePrimaryCtxRetain", offsetof(cuda_driver, primary_context_retain), false},
        {"cuDevicePrimaryCtxRelease_v2", offsetof(cuda_driver, primary_context_release), false},
        {"cuCtxGetCurrent", offsetof(cuda_driver, context_get_current), false},
        {"cuCtxSetCurrent", offsetof(cuda_driver, context_set_current), false},
        {"cuMemGetInfo_v2", offsetof(cuda_driver, memory_get_info), false},
        {"cuMemAlloc_v2", offsetof(cuda_driver, memory_allocate), false},
        {"cuMemFree_v2", offsetof(cuda_driver, memory_free), false},
        {"cuMemHostAlloc", offsetof(cuda_driver, host_allocate), false},
        {"cuMemFreeHost", offsetof(cuda_driver, host_free), false},
        {"cuMemAddressReserve", offsetof(cuda_driver, address_reserve), false},
        {"cuMemAddressFree", offsetof(cuda_driver, address_free), false},
        {"cuMemCreate", offsetof(cuda_driver, create), false},
        {"cuMemRelease", offsetof(cuda_driver, release), false},
        {"cuMemMap", offsetof(cuda_driver, map), false},
        {"cuMemSetAccess", offsetof(cuda_driver, set_access), false},
        {"cuMemUnmap", offsetof(cuda_driver, unmap), false},
        {"cuCtxSynchronize", offsetof(cuda_driver, context_synchronize), false},
        {"cuMemcpyDtoD_v2", offsetof(cuda_driver, copy), false},
        {"cuMemGetAllocationGranularity", offsetof(cuda_driver, granularity), false},
        {"cuEventCreate", offsetof(cuda_driver, event_create), false},
        {"cuEventDestroy_v2", offsetof(cuda_driver, event_destroy), false},
        {"cuEventRecord", offsetof(cuda_driver, event_record), false},
        {"cuEventQuery", offsetof(cuda_driver, event_query), false},
        {"cuEventSynchronize", offsetof(cuda_driver, event_synchronize), false},
        {"cuGetErrorString", offsetof(cuda_driver, get_error_string), false},
        {"cuThreadExchangeStreamCaptureMode", offsetof(cuda_driver, exchange_capture_mode), true},
        {"cuStreamIsCapturing", offsetof(cuda_driver, stream_is_capturing), true},
        {"cuStreamQuery", offsetof(cuda_driver, stream_query), true},
        {"cuStreamCreate", offsetof(cuda_driver, stream_create), true},
        {"cuStreamDestroy_v2", offsetof(cuda_driver, stream_destroy), true},
        {"cuMemExportToShareableHandle", offsetof(cuda_driver, export_handle), true},
        {"cuMemImportFromShareableHandle", offsetof(cuda_driver, import_handle), true},
    };
    cuda_driver loaded;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *address = dlsym(library, entries[i].symbol);
        if (!address && !entries[i].optional) {
            snprintf(driver_failure, sizeof driver_failure,
                     "cuda backend: libcuda.so.1 lacks %s; the NVIDIA driver is too old", entries[i].symbol);
            return;
        }
        memcpy((char *)&loaded + entries[i].offset, &address, sizeof address);
    }
    cu_result result = loaded.init(0);
    if (result != CU_SUCCESS) {
        const char *text = "unknown error";
        loaded.get_error_string(result, &text);
        snprintf(driver_failure, sizeof driver_failure, "cuda backend: cuInit failed (%d: %s): no usable GPU",
                 result, text ? text : "unknown error");
        return;
    }
    driver = loaded;
}

void *gm_cuda_driver_symbol(const char *name)
{
    pthread_once(&driver_once, load_driver);
    return driver.init ? dlsym(driver_library, name) : NULL;
}

/* ---------------------------------------------------------------- state and errors */

typedef struct cuda_state {
    cu_device device;
    int ordinal;
    cu_context context;
    bool exportable; /* its memory is made with POSIX file descriptor handles, for gm_share */
} cuda_state;

static cuda_state *state_of(gm_backend *backend)
{
    return (cuda_state *)backend->state;
}

static gm_status driver_error(cu_result result, const char *call)
{
    const char *text = NULL;
    if (driver.get_error_string)
        driver.get_error_string(result, &text);
    return gm_fail(result == CU_ERROR_OUT_OF_MEMORY ? GM_ERROR_OUT_OF_MEMORY : GM_ERROR_DEVICE,
                   "cuda backend: %s failed (%d: %s)", call, result, text ? text : "unknown error");
}

#define CHECK(call, name)                                                                                          \
    do {                                                                                                           \
        cu_result result_ = (call);                                                                                \
        if (result_ != CU_SUCCESS)                                                                                 \
            return driver_error(result_, name);                                                                    \
    } while (0)

/* Make the primary context current for the duration of a call; returns the context to restore. */
static cu_context enter(cuda_state *state)
{
    cu_context current = NULL;
    driver.context_get_current(&current);
    if (current != state->context)
        driver.context_set_current(state->context);
    return current;
}

static void leave(cuda_state *state, cu_context previous)
{
    if (previous != state->context)
        driver.context_set_current(previous);
}

/* Switch this thread to the relaxed stream-capture mode; returns the mode to restore (-1: none). */
static int relax_capture(void)
{
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!driver.exchange_capture_mode || driver.exchange_capture_mode(&mode) != CU_SUCCESS)
        return -1;
    return mode;
}

static void restore_capture(int mode)
{
    if (mode >= 0)
        driver.exchange_capture_mode(&mode);
}

/* Run `body` (which sets `status`) inside the primary context, in the relaxed capture mode. */
#define IN_CONTEXT(backend, body)                                                                                  \
    do {                                                                                                           \
        cuda_state *state_ = state_of(backend);                                                                    \
        cu_context previous_ = enter(state_);                                                                      \
        int capture_mode_ = relax_capture();                                                                       \
        body;                                                                                                      \
        restore_capture(capture_mode_);                                                                            \
        leave(state_, previous_);                                                                                  \
    } while (0)

static cu_allocation_properties device_properties(const cuda_state *state)
{
    cu_allocation_properties properties;
    memset(&properties, 0, sizeof properties);
    properties.type = CU_ALLOCATION_PINNED;
    properties.location.type = CU_LOCATION_DEVICE;
    properties.location.id = state->ordinal;
    if (state->exportable) /* as PyTorch's expandable segments: other processes can map it (gm_share) */
        properties.requested_handle_types = CU_HANDLE_POSIX_DESCRIPTOR;
    return properties;
}

/* ---------------------------------------------------------------- open / close / info */

static gm_status open_device(gm_backend *backend, cuda_state *state, int ordinal)
{
    int count = 0;
    CHECK(driver.device_get_count(&count), "cuDeviceGetCount");
    if (count == 0)
        return gm_fail(GM_ERROR_NO_DEVICE, "cuda backend: the driver sees no CUDA device");
    if (ordinal >= count)
        return gm_fail(GM_ERROR_NO_DEVICE, "cuda backend: device %d does not exist (%d device%s)", ordinal, count,
                       count == 1 ? "" : "s");
    state->ordinal = ordinal;
    CHECK(driver.device_get(&state->device, ordinal), "cuDeviceGet");
    if (driver.device_get_pci_bus_id(backend->pci_bus_id, (int)sizeof backend->pci_bus_id, state->device) != CU_SUCCESS)
        backend->pci_bus_id[0] = '\0'; /* only the out-of-memory report's list of processes needs it */
    CHECK(driver.primary_context_retain(&state->context, state->device), "cuDevicePrimaryCtxRetain");
    int virtual_memory = 0;
    driver.device_get_attribute(&virtual_memory, CU_ATTRIBUTE_VIRTUAL_MEMORY_SUPPORTED, state->device);
    backend->supports_virtual_memory = virtual_memory != 0;
    int exportable = 0;
    if (virtual_memory && driver.export_handle && driver.import_handle)
        driver.device_get_attribute(&exportable, CU_ATTRIBUTE_POSIX_DESCRIPTOR_SUPPORTED, state->device);
    state->exportable = exportable != 0; /* before the granularity: asked for the properties chunks will have */
    size_t granularity = 2u << 20;
    if (virtual_memory) {
        cu_allocation_properties properties = device_properties(state);
        if (driver.granularity(&granularity, &properties, CU_GRANULARITY_MINIMUM) != CU_SUCCESS)
            granularity = 2u << 20;
    }
    backend->page_size = granularity;
    size_t free_bytes = 0, total_bytes = 0;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.memory_get_info(&free_bytes, &total_bytes);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemGetInfo");
    });
    backend->total_bytes = total_bytes;
    return status;
}

static gm_status cuda_open(gm_backend *backend, const gm_backend_config *config)
{
    pthread_once(&driver_once, load_driver);
    if (!driver.init)
        return gm_fail(GM_ERROR_NO_DEVICE, "%s", driver_failure);
    cuda_state *state = gm_system_calloc(1, sizeof *state);
    if (!state)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the cuda backend");
    backend->state = state;
    backend->charges_cost = false;
    gm_status status = open_device(backend, state, config->device);
    if (status != GM_OK) {
        if (state->context)
            driver.primary_context_release(state->device);
        free(state);
        backend->state = NULL;
    }
    return status;
}

static void cuda_close(gm_backend *backend)
{
    cuda_state *state = state_of(backend);
    if (!state)
        return;
    driver.primary_context_release(state->device);
    free(state);
}

static gm_status cuda_memory_info(gm_backend *backend, uint64_t *free_out, uint64_t *total_out)
{
    size_t free_bytes = 0, total_bytes = 0;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.memory_get_info(&free_bytes, &total_bytes);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemGetInfo");
    });
    *free_out = free_bytes;
    *total_out = total_bytes;
    return status;
}

static void cuda_describe(gm_backend *backend, gm_device_info *info)
{
    cuda_state *state = state_of(backend);
    driver.device_get_name(info->name, (int)sizeof info->name, state->device);
    driver.device_get_count(&info->device_count);
    driver.driver_get_version(&info->driver_version);
}

/* ---------------------------------------------------------------- memory */

/* Each operation: run one driver call in the primary context, turning its result into a status. */
#define DRIVER_CALL(backend, name, call)                                                                           \
    do {                                                                                                           \
        gm_status status_ = GM_OK;                                                                                 \
        IN_CONTEXT(backend, {                                                                                      \
            cu_result result_ = (call);                                                                            \
            if (result_ != CU_SUCCESS)                                                                             \
                status_ = driver_error(result_, name);                                                             \
        });                                                                                                        \
        return status_;                                                                                            \
    } while (0)

static gm_status cuda_segment_allocate(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    cu_device_pointer address = 0;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.memory_allocate(&address, size);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemAlloc");
    });
    *address_out = (uintptr_t)address;
    return status;
}

static gm_status cuda_segment_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    (void)size;
    DRIVER_CALL(backend, "cuMemFree", driver.memory_free((cu_device_pointer)address));
}

/* Page-locked host memory for the pinned host cache, portable to every context (CU_MEMHOSTALLOC_PORTABLE). */
static gm_status cuda_host_allocate(gm_backend *backend, uint64_t size, void **pointer_out)
{
    void *pointer = NULL;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.host_allocate(&pointer, size, 0x01);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemHostAlloc");
    });
    *pointer_out = pointer;
    return status;
}

static gm_status cuda_host_free(gm_backend *backend, void *pointer, uint64_t size)
{
    (void)size;
    DRIVER_CALL(backend, "cuMemFreeHost", driver.host_free(pointer));
}

static gm_status cuda_address_reserve(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    cu_device_pointer address = 0;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.address_reserve(&address, size, backend->page_size, 0, 0);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemAddressReserve");
    });
    *address_out = (uintptr_t)address;
    return status;
}

static gm_status cuda_address_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    DRIVER_CALL(backend, "cuMemAddressFree", driver.address_free((cu_device_pointer)address, size));
}

/* Chunks are made exportable (POSIX descriptors) where the device says it can; a driver that then
 * refuses such chunks for any reason but memory (WSL2 does, its attribute notwithstanding) gets plain
 * ones from then on, and gm_share says it cannot share, as PyTorch's expandable segments fall back. */
static gm_status cuda_physical_create(gm_backend *backend, uint64_t size, uint64_t *handle_out)
{
    cuda_state *state = state_of(backend);
    cu_allocation_handle handle = 0;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_allocation_properties properties = device_properties(state);
        cu_result result = driver.create(&handle, size, &properties, 0);
        if (result != CU_SUCCESS && result != CU_ERROR_OUT_OF_MEMORY && state->exportable) {
            state->exportable = false;
            properties = device_properties(state);
            result = driver.create(&handle, size, &properties, 0);
        }
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemCreate");
    });
    *handle_out = (uint64_t)handle;
    return status;
}

static gm_status cuda_physical_release(gm_backend *backend, uint64_t handle)
{
    DRIVER_CALL(backend, "cuMemRelease", driver.release((cu_allocation_handle)handle));
}

static gm_status cuda_map(gm_backend *backend, uintptr_t address, uint64_t size, uint64_t handle)
{
    DRIVER_CALL(backend, "cuMemMap", driver.map((cu_device_pointer)address, size, 0, (cu_allocation_handle)handle, 0));
}

/* One call for the device and its peers: the driver charges per mapping, not per device. */
static gm_status cuda_set_access(gm_backend *backend, uintptr_t address, uint64_t size)
{
    cu_access_descriptor access[1 + GM_BACKEND_MAX_PEERS];
    access[0] = (cu_access_descriptor){{CU_LOCATION_DEVICE, state_of(backend)->ordinal}, CU_ACCESS_READ_WRITE};
    for (int i = 0; i < backend->peer_count; i++)
        access[1 + i] = (cu_access_descriptor){{CU_LOCATION_DEVICE, backend->peers[i]}, CU_ACCESS_READ_WRITE};
    DRIVER_CALL(backend, "cuMemSetAccess",
                driver.set_access((cu_device_pointer)address, size, access, 1 + (size_t)backend->peer_count));
}

static gm_status cuda_grant_access(gm_backend *backend, uintptr_t address, uint64_t size, int device)
{
    cu_access_descriptor access = {{CU_LOCATION_DEVICE, device}, CU_ACCESS_READ_WRITE};
    DRIVER_CALL(backend, "cuMemSetAccess", driver.set_access((cu_device_pointer)address, size, &access, 1));
}

static gm_status cuda_unmap(gm_backend *backend, uintptr_t address, uint64_t size)
{
    DRIVER_CALL(backend, "cuMemUnmap", driver.unmap((cu_device_pointer)address, size));
}

/* The new memory at a second, temporary address; a wait for every stream of the context (the copy
 * must see each write queued before it); the copy; a wait for the copy, so that the caller may unmap
 * the source. */
static gm_status copy_through_second_mapping(const cuda_state *state, uint64_t handle, uint64_t size,
                                             uintptr_t source, uint64_t page_size)
{
    cu_device_pointer second = 0;
    cu_result result = driver.address_reserve(&second, size, page_size, 0, 0);
    if (result != CU_SUCCESS)
        return driver_error(result, "cuMemAddressReserve");
    const char *failed = NULL;
    cu_access_descriptor access = {{CU_LOCATION_DEVICE, state->ordinal}, CU_ACCESS_READ_WRITE};
    if ((result = driver.map(second, size, 0, (cu_allocation_handle)handle, 0)) != CU_SUCCESS) {
        failed = "cuMemMap";
    } else {
        if ((result = driver.set_access(second, size, &access, 1)) != CU_SUCCESS)
            failed = "cuMemSetAccess";
        else if ((result = driver.context_synchronize()) != CU_SUCCESS)
            failed = "cuCtxSynchronize";
        else if ((result = driver.copy(second, (cu_device_pointer)source, size)) != CU_SUCCESS)
            failed = "cuMemcpyDtoD";
        else if ((result = driver.context_synchronize()) != CU_SUCCESS)
            failed = "cuCtxSynchronize";
        driver.unmap(second, size);
    }
    driver.address_free(second, size);
    return failed ? driver_error(result, failed) : GM_OK;
}

/* In the thread's own capture mode, not the relaxed one: where a capture forbids a device-wide wait,
 * the driver refuses it (the caller undoes the compaction) instead of being told to let it through. */
static gm_status cuda_copy_into(gm_backend *backend, uint64_t handle, uint64_t size, uintptr_t source)
{
    cuda_state *state = state_of(backend);
    cu_context previous = enter(state);
    gm_status status = copy_through_second_mapping(state, handle, size, source, backend->page_size);
    leave(state, previous);
    return status;
}

/* Also in the thread's own capture mode, for the same reason. */
static gm_status cuda_synchronize(gm_backend *backend)
{
    cuda_state *state = state_of(backend);
    cu_context previous = enter(state);
    cu_result result = driver.context_synchronize();
    leave(state, previous);
    return result == CU_SUCCESS ? GM_OK : driver_error(result, "cuCtxSynchronize");
}

/* ---------------------------------------------------------------- memory shared between processes */

static gm_status cuda_export_handle(gm_backend *backend, uint64_t handle, int *descriptor_out)
{
    if (!state_of(backend)->exportable)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "cuda backend: device %d cannot export memory to other processes "
                       "(no POSIX file descriptor handles)", state_of(backend)->ordinal);
    int descriptor = -1;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.export_handle(&descriptor, (cu_allocation_handle)handle, CU_HANDLE_POSIX_DESCRIPTOR, 0);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemExportToShareableHandle");
    });
    *descriptor_out = descriptor;
    return status;
}

static void cuda_close_export(gm_backend *backend, int descriptor)
{
    (void)backend;
    close(descriptor);
}

/* Physical memory of another process, from its descriptor, mapped at `address` with access set; the
 * mapping alone keeps it (the handle is released at once). */
static gm_status map_shared_piece(gm_backend *backend, int process, const gm_shared_piece *piece, uintptr_t address)
{
    int mine = -1;
    gm_status status = gm_take_descriptor(process, piece->descriptor, &mine);
    if (status != GM_OK)
        return status;
    cu_allocation_handle handle = 0;
    IN_CONTEXT(backend, {
        cu_result result = driver.import_handle(&handle, (void *)(uintptr_t)mine, CU_HANDLE_POSIX_DESCRIPTOR);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuMemImportFromShareableHandle");
    });
    close(mine);
    if (status != GM_OK)
        return status;
    status = cuda_map(backend, address, piece->size, handle);
    IN_CONTEXT(backend, { driver.release(handle); }); /* the mapping keeps the memory; unmapped, it goes */
    if (status == GM_OK && (status = cuda_set_access(backend, address, piece->size)) != GM_OK)
        cuda_unmap(backend, address, piece->size);
    return status;
}

static gm_status cuda_open_shared(gm_backend *backend, int process, const gm_shared_piece *pieces, size_t count,
                                  uint64_t size, uintptr_t *address_out)
{
    if (!driver.import_handle)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "cuda backend: the driver cannot import memory of other processes");
    uintptr_t base = 0;
    gm_status status = cuda_address_reserve(backend, size, &base);
    size_t mapped = 0;
    while (status == GM_OK && mapped < count) {
        status = map_shared_piece(backend, process, &pieces[mapped], base + pieces[mapped].offset);
        mapped += status == GM_OK;
    }
    if (status != GM_OK) {
        if (mapped)
            cuda_unmap(backend, base, pieces[mapped - 1].offset + pieces[mapped - 1].size);
        if (base)
            cuda_address_free(backend, base, size);
        return status;
    }
    *address_out = base;
    return GM_OK;
}

/* One unmap for every piece: the range covers whole mappings. cuMemUnmap does not wait for work still
 * reading the memory, and this process's work on another's memory is on streams gpumem never saw: the
 * device is waited for first, as PyTorch does before unmapping an imported expandable segment. */
static void cuda_close_shared(gm_backend *backend, uintptr_t address, uint64_t size)
{
    cuda_synchronize(backend); /* if even that fails, the unmap is what it was without it */
    cuda_unmap(backend, address, size);
    cuda_address_free(backend, address, size);
}

/* ---------------------------------------------------------------- events */

static gm_status cuda_event_create(gm_backend *backend, uint64_t *event_out)
{
    cu_event event = NULL;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.event_create(&event, CU_EVENT_DISABLE_TIMING);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuEventCreate");
    });
    *event_out = (uint64_t)(uintptr_t)event;
    return status;
}

static gm_status cuda_event_destroy(gm_backend *backend, uint64_t event)
{
    DRIVER_CALL(backend, "cuEventDestroy", driver.event_destroy((cu_event)(uintptr_t)event));
}

static gm_status cuda_event_record(gm_backend *backend, uint64_t event, gm_stream stream)
{
    DRIVER_CALL(backend, "cuEventRecord", driver.event_record((cu_event)(uintptr_t)event, (cu_stream)stream));
}

static gm_status cuda_event_query(gm_backend *backend, uint64_t event, bool *done_out)
{
    cu_result result = CU_SUCCESS;
    IN_CONTEXT(backend, { result = driver.event_query((cu_event)(uintptr_t)event); });
    *done_out = result == CU_SUCCESS;
    return result == CU_SUCCESS || result == CU_ERROR_NOT_READY ? GM_OK : driver_error(result, "cuEventQuery");
}

static gm_status cuda_event_synchronize(gm_backend *backend, uint64_t event)
{
    DRIVER_CALL(backend, "cuEventSynchronize", driver.event_synchronize((cu_event)(uintptr_t)event));
}

/* Whether work on the stream would be captured, or would break a capture: the stream itself is being
 * captured, or it is the legacy default stream while a blocking stream is being captured (the driver
 * answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream is unusable until that capture ends,
 * and querying it or waiting for it would invalidate the capture). */
static bool cuda_stream_is_capturing(gm_backend *backend, gm_stream stream)
{
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    bool implicit = false;
    if (!driver.stream_is_capturing)
        return false;
    IN_CONTEXT(backend, {
        cu_result result = driver.stream_is_capturing((cu_stream)stream, &status);
        implicit = result == CU_ERROR_STREAM_CAPTURE_IMPLICIT;
        if (result != CU_SUCCESS)
            status = CU_STREAM_CAPTURE_STATUS_NONE;
    });
    return implicit || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* cuStreamQuery: CUDA_SUCCESS when all work queued on the stream is done, CUDA_ERROR_NOT_READY while
 * some runs. Anything else (a stream being captured, an error) reads as busy: nothing is moved from it. */
static bool cuda_stream_is_busy(gm_backend *backend, gm_stream stream)
{
    cu_result result = CU_SUCCESS;
    if (!driver.stream_query)
        return true;
    IN_CONTEXT(backend, { result = driver.stream_query((cu_stream)stream); });
    return result != CU_SUCCESS;
}

static gm_status cuda_stream_create(gm_backend *backend, gm_stream *stream_out)
{
    if (!driver.stream_create || !driver.stream_destroy)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "cuda backend: the driver lacks cuStreamCreate");
    cu_stream stream = NULL;
    gm_status status = GM_OK;
    IN_CONTEXT(backend, {
        cu_result result = driver.stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */);
        if (result != CU_SUCCESS)
            status = driver_error(result, "cuStreamCreate");
    });
    *stream_out = (gm_stream)stream;
    return status;
}

static gm_status cuda_stream_destroy(gm_backend *backend, gm_stream stream)
{
    DRIVER_CALL(backend, "cuStreamDestroy", driver.stream_destroy((cu_stream)stream));
}

const gm_backend_operations gm_cuda_backend_operations = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .memory_info = cuda_memory_info,
    .segment_allocate = cuda_segment_allocate,
    .segment_free = cuda_segment_free,
    .address_reserve = cuda_address_reserve,
    .address_free = cuda_address_free,
    .physical_create = cuda_physical_create,
    .physical_release = cuda_physical_release,
    .map = cuda_map,
    .set_access = cuda_set_access,
    .grant_access = cuda_grant_access,
    .export_handle = cuda_export_handle,
    .close_export = cuda_close_export,
    .open_shared = cuda_open_shared,
    .close_shared = cuda_close_shared,
    .unmap = cuda_unmap,
    .copy_into = cuda_copy_into,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .synchronize = cuda_synchronize,
    .stream_is_capturing = cuda_stream_is_capturing,
    .stream_is_busy = cuda_stream_is_busy,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .describe = cuda_describe,
    .stream_enqueue = NULL,
    .stream_complete = NULL,
    .host_allocate = cuda_host_allocate,
    .host_free = cuda_host_free,
};
