/*
 * fake_cuda.c -- a stand-in libcuda.so.1, so that the cuda backend (src/backend/cuda.c) runs in CI on a
 * machine without a GPU. cuda.c loads the driver with dlopen and looks its entry points up by name, so a
 * library of those names, found first through LD_LIBRARY_PATH, takes the driver's place.
 *
 * The device is host memory under the driver's virtual-memory rules, kept strictly as its documentation
 * states them:
 *   - an address reservation is an inaccessible anonymous mapping of whole pages (granularity 2 MiB);
 *   - physical memory (cuMemCreate) is a run of whole pages of one sparse memfd (thousands of
 *     allocations, one file descriptor), counted against the capacity (GPUMEM_FAKE_CUDA_CAPACITY bytes,
 *     default 256 MiB) and punched out of the file when freed;
 *   - cuMemMap maps it at offset 0 into a free part of one reservation, without access until
 *     cuMemSetAccess covers whole mappings; cuMemUnmap takes whole mappings only; a reservation is freed
 *     whole and empty; released memory goes once its last mapping does;
 *   - every call needs the primary context current in the calling thread.
 * A call that breaks a rule is refused with CUDA_ERROR_INVALID_VALUE, told on stderr and counted
 * (fakeCudaViolations, for the tests through gm_cuda_driver_symbol). Device work is synchronous: every
 * event and stream is complete at once, and cuMemcpyDtoD is a memcpy between accessible ranges.
 *
 * What the tests set:
 *   - GPUMEM_FAKE_CUDA: unset, one such device; "init_fails" (cuInit answers CUDA_ERROR_NO_DEVICE, as
 *     where the driver cannot use the GPU) or "no_device" (none counted).
 *   - GPUMEM_FAKE_CUDA_EXPORT (any value): POSIX file descriptor handles. Memory asked for with them is a
 *     memfd of its own, which cuMemExportToShareableHandle hands out and cuMemImportFromShareableHandle
 *     maps in another allocator or process. "refused": the attribute says yes, but cuMemCreate refuses
 *     such memory (CUDA_ERROR_INVALID_VALUE), as WSL2's driver does. Unset, it refuses them too.
 *   - fakeCudaSetCapturing marks a stream as captured into a graph: then memory calls must come in the
 *     relaxed capture mode, a device-wide wait is refused and the legacy stream reads as captured.
 *   - GPUMEM_FAKE_CUDA_FAIL_EVERY=N: every Nth call that makes memory (cuMemAddressReserve, cuMemCreate,
 *     cuMemMap, cuMemSetAccess, cuMemAlloc) fails as a driver can (out of memory, or an unknown error).
 *   - GPUMEM_FAKE_CUDA_USED_ELSEWHERE=BYTES: memory that other processes hold, gone from cuMemGetInfo's
 *     free memory and from what cuMemCreate and cuMemAlloc can have.
 * Built with FAKE_CUDA_OLD it has cuInit alone: a driver too old for gpumem.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
    SUCCESS = 0,
    ERROR_INVALID_VALUE = 1,
    ERROR_OUT_OF_MEMORY = 2,
    ERROR_NO_DEVICE = 100,
    ERROR_CAPTURE_UNSUPPORTED = 900,
    ERROR_CAPTURE_IMPLICIT = 906,
    ERROR_UNKNOWN = 999,
};

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

#define GRANULARITY (2ull << 20)
#define MAX_RANGES 65536
#define FILE_PAGES (1ull << 19) /* 1 TiB of sparse file: room for any capacity a test asks, unfragmented */

typedef struct range {
    uintptr_t address;
    size_t size;
    int handle; /* mappings: the index of their memory; segments: -1 */
    int accessible;
} range;

typedef struct memory {
    int live; /* 0: the slot is free */
    int own_file; /* exportable or imported memory: a memfd of its own; else -1 (a run of the shared file) */
    int imported; /* another allocation's memory: not counted again */
    size_t offset, size; /* in its file */
    int mappings;
    int released;
} memory;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static range reservations[MAX_RANGES], mappings[MAX_RANGES], segments[MAX_RANGES];
static size_t reservation_count, mapping_count, segment_count;
static memory memories[MAX_RANGES];
static size_t memory_count;
static int file = -1;
static unsigned char *file_page_used;
static size_t file_next_page;
static size_t used_bytes;
static unsigned long long violations, making_calls;
static int retained;
static char context_token;
static __thread void *current_context;
static __thread int capture_mode; /* 0: global (the default), 1: thread local, 2: relaxed */
#define MOST_CAPTURES 16
static void *captured_streams[MOST_CAPTURES];
static size_t capture_count;

static size_t capacity(void)
{
    const char *value = getenv("GPUMEM_FAKE_CUDA_CAPACITY");
    return value ? (size_t)strtoull(value, NULL, 10) : 256ull << 20;
}

/* Memory that other processes hold (GPUMEM_FAKE_CUDA_USED_ELSEWHERE). */
static size_t used_elsewhere(void)
{
    const char *value = getenv("GPUMEM_FAKE_CUDA_USED_ELSEWHERE");
    return value ? (size_t)strtoull(value, NULL, 10) : 0;
}

/* Whether `size` more bytes fit beside what this process and others use. */
static int fits(size_t size)
{
    size_t elsewhere = used_elsewhere(), total = capacity();
    return elsewhere <= total && used_bytes <= total - elsewhere && size <= total - elsewhere - used_bytes;
}

/* Refuse a call that breaks the driver's rules, and say which. */
static int violation(const char *call, const char *rule)
{
    violations++;
    fprintf(stderr, "fake_cuda: %s refused: %s\n", call, rule);
    return ERROR_INVALID_VALUE;
}

/* Every Nth call that makes memory fails (GPUMEM_FAKE_CUDA_FAIL_EVERY). */
static int injected_failure(void)
{
    const char *value = getenv("GPUMEM_FAKE_CUDA_FAIL_EVERY");
    unsigned long long every = value ? strtoull(value, NULL, 10) : 0;
    return every && ++making_calls % every == 0;
}

unsigned long long fakeCudaViolations(void);
unsigned long long fakeCudaViolations(void) { return violations; }
size_t fakeCudaUsedBytes(void);
size_t fakeCudaUsedBytes(void) { return used_bytes; }

static int add_range(range *ranges, size_t *count, range added)
{
    if (*count == MAX_RANGES)
        return 0;
    ranges[(*count)++] = added;
    return 1;
}

static void remove_range(range *ranges, size_t *count, size_t index)
{
    ranges[index] = ranges[--*count];
}

/* The reservation that holds [address, address + size) whole, or -1. */
static long reservation_holding(uintptr_t address, size_t size)
{
    for (size_t i = 0; i < reservation_count; i++)
        if (address >= reservations[i].address && address + size <= reservations[i].address + reservations[i].size)
            return (long)i;
    return -1;
}

static int overlaps_mapping(uintptr_t address, size_t size)
{
    for (size_t i = 0; i < mapping_count; i++)
        if (address < mappings[i].address + mappings[i].size && mappings[i].address < address + size)
            return 1;
    return 0;
}

/* Whether whole mappings cover [address, address + size) exactly, with no gap and none cut. */
static int whole_mappings_cover(uintptr_t address, size_t size)
{
    size_t covered = 0;
    for (size_t i = 0; i < mapping_count; i++) {
        const range *mapping = &mappings[i];
        if (mapping->address >= address + size || mapping->address + mapping->size <= address)
            continue;
        if (mapping->address < address || mapping->address + mapping->size > address + size)
            return 0;
        covered += mapping->size;
    }
    return covered == size;
}

/* Whether [address, address + size) is readable and writable: accessible mappings or segments. */
static int accessible(uintptr_t address, size_t size)
{
    size_t covered = 0;
    for (size_t i = 0; i < segment_count; i++)
        if (address >= segments[i].address && address + size <= segments[i].address + segments[i].size)
            return 1;
    for (size_t i = 0; i < mapping_count; i++) {
        const range *mapping = &mappings[i];
        uintptr_t start = mapping->address > address ? mapping->address : address;
        uintptr_t end = mapping->address + mapping->size < address + size ? mapping->address + mapping->size
                                                                             : address + size;
        if (start < end) {
            if (!mapping->accessible)
                return 0;
            covered += end - start;
        }
    }
    return covered == size;
}

/* A run of `pages` free pages of the file (made at the first call), marked used; its offset, or -1. */
static long long take_file_pages(size_t pages)
{
    if (file < 0) {
        file = memfd_create("fake_cuda", MFD_CLOEXEC);
        file_page_used = calloc(FILE_PAGES, 1);
        if (file < 0 || !file_page_used || ftruncate(file, (off_t)(FILE_PAGES * GRANULARITY)) != 0)
            return -1;
    }
    for (size_t scanned = 0, run = 0; scanned < FILE_PAGES + pages; scanned++) {
        size_t page = (file_next_page + scanned) % FILE_PAGES;
        run = page == 0 ? 0 : run; /* a run does not wrap around the file's end */
        run = file_page_used[page] ? 0 : run + 1;
        if (run == pages) {
            size_t first = page + 1 - pages;
            memset(file_page_used + first, 1, pages);
            file_next_page = (page + 1) % FILE_PAGES;
            return (long long)(first * GRANULARITY);
        }
    }
    return -1;
}

static void forget_memory_if_unused(int handle)
{
    memory *memory = &memories[handle];
    if (!memory->released || memory->mappings > 0)
        return;
    if (memory->own_file >= 0) {
        close(memory->own_file);
    } else {
        fallocate(file, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)memory->offset, (off_t)memory->size);
        memset(file_page_used + memory->offset / GRANULARITY, 0, memory->size / GRANULARITY);
    }
    memory->live = 0;
    used_bytes -= memory->imported ? 0 : memory->size;
}

/* A memfd of `size` bytes for memory of its own (exportable), or -1. */
static int make_own_file(size_t size)
{
    int descriptor = memfd_create("fake_cuda_exportable", MFD_CLOEXEC);
    if (descriptor >= 0 && ftruncate(descriptor, (off_t)size) != 0) {
        close(descriptor);
        descriptor = -1;
    }
    return descriptor;
}

/* A free slot for a memory record, or MAX_RANGES. */
static size_t free_memory_slot(void)
{
    size_t slot = 0;
    while (slot < memory_count && memories[slot].live)
        slot++;
    return slot;
}

/* ---------------------------------------------------------------- device, context */

int cuDriverGetVersion(int *version)
{
    *version = 13000;
    return SUCCESS;
}

int cuDeviceGetCount(int *count)
{
    *count = strcmp(mode(), "no_device") ? 1 : 0;
    return SUCCESS;
}

int cuDeviceGet(int *device, int ordinal)
{
    if (ordinal != 0)
        return violation("cuDeviceGet", "only device 0 exists");
    *device = 0;
    return SUCCESS;
}

int cuDeviceGetName(char *name, int length, int device)
{
    (void)device;
    snprintf(name, (size_t)length, "Fake GPU (tests/fake_cuda.c)");
    return SUCCESS;
}

int cuDeviceGetAttribute(int *value, int attribute, int device)
{
    (void)device;
    /* Virtual memory management (102): yes; POSIX file descriptor handles (103) with GPUMEM_FAKE_CUDA_EXPORT. */
    *value = attribute == 102 || (attribute == 103 && getenv("GPUMEM_FAKE_CUDA_EXPORT"));
    return SUCCESS;
}

int cuDeviceGetPCIBusId(char *bus_id, int length, int device)
{
    (void)device;
    snprintf(bus_id, (size_t)length, "0000:00:00.0");
    return SUCCESS;
}

int cuDevicePrimaryCtxRetain(void **context, int device)
{
    if (device != 0)
        return violation("cuDevicePrimaryCtxRetain", "only device 0 exists");
    pthread_mutex_lock(&lock);
    retained++;
    pthread_mutex_unlock(&lock);
    *context = &context_token;
    return SUCCESS;
}

int cuDevicePrimaryCtxRelease_v2(int device)
{
    (void)device;
    pthread_mutex_lock(&lock);
    int result = retained > 0 ? (retained--, SUCCESS) : violation("cuDevicePrimaryCtxRelease", "not retained");
    pthread_mutex_unlock(&lock);
    return result;
}

int cuCtxGetCurrent(void **context)
{
    *context = current_context;
    return SUCCESS;
}

int cuCtxSetCurrent(void *context)
{
    current_context = context;
    return SUCCESS;
}

/* A device-wide wait during a capture is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): the caller must
 * not need it then. */
int cuCtxSynchronize(void) { return capture_count ? ERROR_CAPTURE_UNSUPPORTED : SUCCESS; }

int cuThreadExchangeStreamCaptureMode(int *mode_in_out)
{
    int previous = capture_mode;
    capture_mode = *mode_in_out;
    *mode_in_out = previous;
    return SUCCESS;
}

int cuGetErrorString(int result, const char **text)
{
    *text = result == ERROR_NO_DEVICE        ? "no CUDA-capable device is detected"
            : result == ERROR_OUT_OF_MEMORY  ? "out of memory"
            : result == ERROR_INVALID_VALUE  ? "invalid argument"
            : result == ERROR_CAPTURE_UNSUPPORTED ? "operation not permitted when stream is capturing"
            : result == ERROR_CAPTURE_IMPLICIT ? "operation would make the legacy stream depend on a capturing blocking stream"
                                             : "unknown error";
    return SUCCESS;
}

/* Every call below needs the primary context current, as the real driver does. */
#define NEEDS_CONTEXT(call)                                                                                       \
    do {                                                                                                           \
        if (current_context != &context_token)                                                                    \
            return violation(call, "no current context");                                                         \
    } while (0)

/* A call that makes or frees memory needs the context, and during a capture (in any thread) the relaxed
 * capture mode: in the others the driver refuses it and invalidates the capture. */
#define MEMORY_CALL(call)                                                                                         \
    do {                                                                                                           \
        NEEDS_CONTEXT(call);                                                                                       \
        if (capture_count && capture_mode != 2)                                                                   \
            return (violation(call, "during a capture, outside the relaxed capture mode"), ERROR_CAPTURE_UNSUPPORTED); \
    } while (0)

/* ---------------------------------------------------------------- memory */

int cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    NEEDS_CONTEXT("cuMemGetInfo");
    pthread_mutex_lock(&lock);
    *total_bytes = capacity();
    size_t used = used_bytes + used_elsewhere();
    *free_bytes = used < *total_bytes ? *total_bytes - used : 0;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

int cuMemGetAllocationGranularity(size_t *granularity, const void *properties, int option)
{
    (void)properties;
    (void)option;
    *granularity = GRANULARITY;
    return SUCCESS;
}

int cuMemAddressReserve(uintptr_t *address_out, size_t size, size_t alignment, uintptr_t hint, unsigned long long flags)
{
    MEMORY_CALL("cuMemAddressReserve");
    if (size == 0 || size % GRANULARITY || alignment % GRANULARITY || hint || flags)
        return violation("cuMemAddressReserve", "size and alignment are whole pages, no fixed address or flags");
    pthread_mutex_lock(&lock);
    int result = SUCCESS;
    char *base = injected_failure() ? MAP_FAILED
                                    : mmap(NULL, size + GRANULARITY, PROT_NONE,
                                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        result = ERROR_OUT_OF_MEMORY;
    } else {
        uintptr_t start = ((uintptr_t)base + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
        if (start > (uintptr_t)base)
            munmap(base, start - (uintptr_t)base);
        munmap((char *)start + size, (uintptr_t)base + GRANULARITY - start);
        if (add_range(reservations, &reservation_count, (range){start, size, -1, 0}))
            *address_out = start;
        else
            result = (munmap((char *)start, size), ERROR_OUT_OF_MEMORY);
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemAddressFree(uintptr_t address, size_t size)
{
    MEMORY_CALL("cuMemAddressFree");
    pthread_mutex_lock(&lock);
    long index = reservation_holding(address, size);
    int result;
    if (index < 0 || reservations[index].address != address || reservations[index].size != size)
        result = violation("cuMemAddressFree", "not a whole reservation");
    else if (overlaps_mapping(address, size))
        result = violation("cuMemAddressFree", "memory is still mapped in the reservation");
    else
        result = (munmap((void *)address, size), remove_range(reservations, &reservation_count, (size_t)index), SUCCESS);
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemCreate(unsigned long long *handle_out, size_t size, const int *properties, unsigned long long flags)
{
    MEMORY_CALL("cuMemCreate");
    /* properties: type (pinned, 1), handle types (none, or POSIX descriptors: 1), location type (device,
     * 1) and id (0). */
    if (size == 0 || size % GRANULARITY || flags || properties[0] != 1 || properties[2] != 1 || properties[3] != 0 ||
        (properties[1] != 0 && properties[1] != 1))
        return violation("cuMemCreate", "whole pages of pinned memory on device 0, no flags");
    int exportable = properties[1] == 1;
    const char *export = getenv("GPUMEM_FAKE_CUDA_EXPORT");
    if (exportable && (!export || !strcmp(export, "refused")))
        return ERROR_INVALID_VALUE; /* what a driver without them answers: not a broken rule of gpumem's */
    pthread_mutex_lock(&lock);
    int result = SUCCESS;
    size_t slot = free_memory_slot();
    long long offset = -1;
    int own_file = -1;
    if (injected_failure() || !fits(size) || slot == MAX_RANGES ||
        (exportable ? (own_file = make_own_file(size)) < 0 : (offset = take_file_pages(size / GRANULARITY)) < 0)) {
        result = ERROR_OUT_OF_MEMORY;
    } else {
        memories[slot] = (memory){1, own_file, 0, exportable ? 0 : (size_t)offset, size, 0, 0};
        memory_count += slot == memory_count;
        used_bytes += size;
        *handle_out = slot + 1;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

static memory *live_memory(unsigned long long handle)
{
    if (handle == 0 || handle > memory_count || !memories[handle - 1].live || memories[handle - 1].released)
        return NULL;
    return &memories[handle - 1];
}

int cuMemRelease(unsigned long long handle)
{
    pthread_mutex_lock(&lock);
    memory *memory = live_memory(handle);
    int result = memory ? SUCCESS : violation("cuMemRelease", "not a live handle");
    if (memory) {
        memory->released = 1;
        forget_memory_if_unused((int)(handle - 1));
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemMap(uintptr_t address, size_t size, size_t offset, unsigned long long handle, unsigned long long flags)
{
    MEMORY_CALL("cuMemMap");
    pthread_mutex_lock(&lock);
    memory *memory = live_memory(handle);
    int result = SUCCESS;
    if (!memory || offset != 0 || flags || size == 0 || size % GRANULARITY || address % GRANULARITY ||
        size > memory->size)
        result = violation("cuMemMap", "a live handle, offset 0, no flags, whole pages within its size");
    else if (reservation_holding(address, size) < 0)
        result = violation("cuMemMap", "outside one reservation");
    else if (overlaps_mapping(address, size))
        result = violation("cuMemMap", "over memory already mapped");
    else if (injected_failure())
        result = ERROR_UNKNOWN;
    else if (mapping_count == MAX_RANGES || /* room to record it before the reservation is replaced */
             mmap((void *)address, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                  memory->own_file >= 0 ? memory->own_file : file, (off_t)memory->offset) == MAP_FAILED)
        result = ERROR_OUT_OF_MEMORY;
    else
        memory->mappings += add_range(mappings, &mapping_count, (range){address, size, (int)(handle - 1), 0});
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemSetAccess(uintptr_t address, size_t size, const int *descriptors, size_t count)
{
    MEMORY_CALL("cuMemSetAccess");
    /* descriptors: location type (device, 1), location id, flags (read and write, 3). */
    for (size_t i = 0; i < count; i++)
        if (descriptors[3 * i] != 1 || descriptors[3 * i + 1] != 0 || descriptors[3 * i + 2] != 3)
            return violation("cuMemSetAccess", "read and write access for device 0");
    pthread_mutex_lock(&lock);
    int result = SUCCESS;
    if (count == 0 || !whole_mappings_cover(address, size))
        result = violation("cuMemSetAccess", "the range must be whole mappings, with no gap");
    else if (injected_failure())
        result = ERROR_UNKNOWN;
    else if (mprotect((void *)address, size, PROT_READ | PROT_WRITE) != 0)
        result = ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; result == SUCCESS && i < mapping_count; i++)
        if (mappings[i].address >= address && mappings[i].address < address + size)
            mappings[i].accessible = 1;
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemUnmap(uintptr_t address, size_t size)
{
    MEMORY_CALL("cuMemUnmap");
    pthread_mutex_lock(&lock);
    int result = SUCCESS;
    if (!whole_mappings_cover(address, size)) {
        result = violation("cuMemUnmap", "the range must be whole mappings, with no gap");
    } else {
        mmap((void *)address, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        for (size_t i = 0; i < mapping_count;) {
            if (mappings[i].address >= address && mappings[i].address < address + size) {
                int handle = mappings[i].handle;
                memories[handle].mappings--;
                remove_range(mappings, &mapping_count, i);
                forget_memory_if_unused(handle);
            } else {
                i++;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

/* Export (POSIX file descriptor handles, 1): a descriptor of the memory's own memfd. */
int cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type, unsigned long long flags)
{
    NEEDS_CONTEXT("cuMemExportToShareableHandle");
    pthread_mutex_lock(&lock);
    memory *memory = live_memory(handle);
    int result = SUCCESS;
    if (!memory || type != 1 || flags || memory->own_file < 0)
        result = violation("cuMemExportToShareableHandle", "a live handle made with POSIX descriptor handles");
    else if ((*(int *)shareable = fcntl(memory->own_file, F_DUPFD_CLOEXEC, 0)) < 0)
        result = ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&lock);
    return result;
}

/* Import: memory of its own over the descriptor's memfd. A descriptor that holds no whole pages is refused
 * (as the driver refuses one it did not export): bad input, not a broken rule. */
int cuMemImportFromShareableHandle(unsigned long long *handle_out, void *os_handle, int type)
{
    NEEDS_CONTEXT("cuMemImportFromShareableHandle");
    int descriptor = (int)(intptr_t)os_handle;
    off_t size = descriptor >= 0 ? lseek(descriptor, 0, SEEK_END) : -1;
    if (type != 1)
        return violation("cuMemImportFromShareableHandle", "POSIX descriptor handles");
    if (size <= 0 || (size_t)size % GRANULARITY)
        return ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t slot = free_memory_slot();
    int own_file = slot < MAX_RANGES ? fcntl(descriptor, F_DUPFD_CLOEXEC, 0) : -1;
    int result = own_file >= 0 ? SUCCESS : ERROR_OUT_OF_MEMORY;
    if (result == SUCCESS) {
        memories[slot] = (memory){1, own_file, 1, 0, (size_t)size, 0, 0};
        memory_count += slot == memory_count;
        *handle_out = slot + 1;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemcpyDtoD_v2(uintptr_t destination, uintptr_t source, size_t size)
{
    NEEDS_CONTEXT("cuMemcpyDtoD");
    if (capture_count) /* compaction's copy: never while a stream is captured (its wait would fail first) */
        return violation("cuMemcpyDtoD", "a copy during a capture");
    pthread_mutex_lock(&lock);
    int result = accessible(destination, size) && accessible(source, size)
                     ? (memmove((void *)destination, (const void *)source, size), SUCCESS)
                     : violation("cuMemcpyDtoD", "both ranges must be accessible device memory");
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemAlloc_v2(uintptr_t *address_out, size_t size)
{
    MEMORY_CALL("cuMemAlloc");
    if (size == 0)
        return violation("cuMemAlloc", "size 0");
    size_t rounded = (size + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
    pthread_mutex_lock(&lock);
    int result = SUCCESS;
    void *address = MAP_FAILED;
    if (injected_failure() || !fits(rounded) ||
        (address = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)) ==
            MAP_FAILED ||
        !add_range(segments, &segment_count, (range){(uintptr_t)address, rounded, -1, 1})) {
        if (address != MAP_FAILED)
            munmap(address, rounded);
        result = ERROR_OUT_OF_MEMORY;
    } else {
        used_bytes += rounded;
        *address_out = (uintptr_t)address;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemFree_v2(uintptr_t address)
{
    MEMORY_CALL("cuMemFree");
    pthread_mutex_lock(&lock);
    size_t index = 0;
    while (index < segment_count && segments[index].address != address)
        index++;
    int result = index == segment_count ? violation("cuMemFree", "not the start of a cuMemAlloc allocation") : SUCCESS;
    if (result == SUCCESS) {
        munmap((void *)address, segments[index].size);
        used_bytes -= segments[index].size;
        remove_range(segments, &segment_count, index);
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int cuMemHostAlloc(void **pointer, size_t size, unsigned int flags)
{
    (void)flags;
    NEEDS_CONTEXT("cuMemHostAlloc");
    return posix_memalign(pointer, 4096, size ? size : 1) == 0 ? SUCCESS : ERROR_OUT_OF_MEMORY;
}

int cuMemFreeHost(void *pointer)
{
    NEEDS_CONTEXT("cuMemFreeHost");
    free(pointer);
    return SUCCESS;
}

/* ---------------------------------------------------------------- events and streams: always complete */

static int make_token(void **token_out)
{
    *token_out = malloc(1);
    return *token_out ? SUCCESS : ERROR_OUT_OF_MEMORY;
}

int cuEventCreate(void **event, unsigned int flags)
{
    (void)flags;
    NEEDS_CONTEXT("cuEventCreate");
    return make_token(event);
}

int cuEventDestroy_v2(void *event)
{
    NEEDS_CONTEXT("cuEventDestroy");
    free(event);
    return SUCCESS;
}

int cuEventRecord(void *event, void *stream)
{
    (void)stream;
    NEEDS_CONTEXT("cuEventRecord");
    return event ? SUCCESS : violation("cuEventRecord", "no event");
}

int cuEventQuery(void *event)
{
    NEEDS_CONTEXT("cuEventQuery");
    return event ? SUCCESS : violation("cuEventQuery", "no event");
}

int cuEventSynchronize(void *event)
{
    NEEDS_CONTEXT("cuEventSynchronize");
    return event ? SUCCESS : violation("cuEventSynchronize", "no event");
}

int cuStreamCreate(void **stream, unsigned int flags)
{
    (void)flags;
    NEEDS_CONTEXT("cuStreamCreate");
    return make_token(stream);
}

int cuStreamDestroy_v2(void *stream)
{
    NEEDS_CONTEXT("cuStreamDestroy");
    free(stream);
    return SUCCESS;
}

int cuStreamQuery(void *stream)
{
    (void)stream;
    NEEDS_CONTEXT("cuStreamQuery");
    return SUCCESS;
}

/* Active (1) for a stream marked by fakeCudaSetCapturing; the legacy stream (NULL or CU_STREAM_LEGACY)
 * during any capture: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, as while a blocking stream is captured. */
int cuStreamIsCapturing(void *stream, int *status)
{
    NEEDS_CONTEXT("cuStreamIsCapturing");
    pthread_mutex_lock(&lock);
    int result = SUCCESS;
    *status = 0;
    for (size_t i = 0; i < capture_count; i++)
        *status |= captured_streams[i] == stream;
    if (capture_count && (stream == NULL || stream == (void *)1))
        result = ERROR_CAPTURE_IMPLICIT;
    pthread_mutex_unlock(&lock);
    return result;
}

/* For the tests: start (on) or end a capture of `stream`. */
void fakeCudaSetCapturing(void *stream, int on);
void fakeCudaSetCapturing(void *stream, int on)
{
    pthread_mutex_lock(&lock);
    size_t kept = 0;
    for (size_t i = 0; i < capture_count; i++)
        if (captured_streams[i] != stream)
            captured_streams[kept++] = captured_streams[i];
    capture_count = kept;
    if (on && capture_count < MOST_CAPTURES)
        captured_streams[capture_count++] = stream;
    pthread_mutex_unlock(&lock);
}

#endif
