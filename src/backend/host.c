/*
 * host.c -- real host memory behind the device interface, for data-integrity tests.
 *
 * Segments are anonymous mappings. The virtual-memory path is real too: an address reservation is
 * an inaccessible (PROT_NONE) mapping; a physical allocation is a memfd of that size; mapping
 * places the memfd at a fixed address inside the reservation and set_access makes it readable and
 * writable; unmapping puts the inaccessible reservation back. So data really lives in physical
 * handles and moves with them when the engine remaps pages, and any use of unmapped memory
 * faults. The device model (device_model.c) enforces the capacity and the mapping rules before
 * anything is touched, and simulates streams and events. Default capacity: 1 GiB.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend/backend.h"
#include "backend/device_model.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_DEFAULT_CAPACITY (1ull << 30)

typedef struct host_state {
    gm_device_model *model;
    uint64_t page_size;
} host_state;

static host_state *state_of(gm_backend *backend)
{
    return (host_state *)backend->state;
}

static gm_status system_failure(const char *what)
{
    return gm_fail(GM_ERROR_DEVICE, "host backend: %s failed: %s", what, strerror(errno));
}

/* The host refused memory (mmap failed): out of memory, and the report is to name the host. */
static gm_status host_memory_failure(gm_backend *backend, const char *what, uint64_t size)
{
    int error = errno;
    if (error == ENOMEM)
        backend->host_memory_failed = true;
    return gm_fail(GM_ERROR_OUT_OF_MEMORY, "host backend: %s of %" PRIu64 " bytes failed: %s", what, size,
                   strerror(error));
}

static void raise_file_limit(void)
{
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
    }
}

static gm_status host_open(gm_backend *backend, const gm_backend_config *config)
{
    host_state *state = gm_system_calloc(1, sizeof *state);
    if (!state)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the host backend");
    state->page_size = config->page_size;
    raise_file_limit(); /* each physical allocation holds a file descriptor */
    return gm_model_backend_open(backend, state, config, HOST_DEFAULT_CAPACITY, false);
}

static gm_status host_segment_allocate(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    host_state *state = state_of(backend);
    gm_status status = gm_device_model_check_room(state->model, size);
    if (status != GM_OK)
        return status;
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED)
        return host_memory_failure(backend, "mmap", size);
    status = gm_device_model_segment_allocate(state->model, (uintptr_t)memory, size);
    if (status != GM_OK) {
        munmap(memory, size);
        return status;
    }
    *address_out = (uintptr_t)memory;
    return GM_OK;
}

static gm_status host_segment_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_segment_free(state_of(backend)->model, address, size);
    if (status == GM_OK && munmap((void *)address, size) != 0)
        return system_failure("munmap");
    return status;
}

static gm_status host_address_reserve(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    host_state *state = state_of(backend);
    uint64_t alignment = state->page_size;
    if (size == 0 || size % alignment)
        return gm_fail(GM_ERROR_DEVICE, "host backend: reservation of %" PRIu64 " bytes is not page-aligned", size);
    char *memory = mmap(NULL, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED)
        return host_memory_failure(backend, "reserving addresses", size);
    uintptr_t aligned = ((uintptr_t)memory + alignment - 1) / alignment * alignment;
    size_t head = aligned - (uintptr_t)memory, tail = alignment - head;
    if (head)
        munmap(memory, head);
    if (tail)
        munmap((char *)aligned + size, tail);
    gm_status status = gm_device_model_address_reserve(state->model, aligned, size);
    if (status != GM_OK) {
        munmap((void *)aligned, size);
        return status;
    }
    *address_out = aligned;
    return GM_OK;
}

static gm_status host_address_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_address_free(state_of(backend)->model, address, size);
    if (status == GM_OK && munmap((void *)address, size) != 0)
        return system_failure("munmap");
    return status;
}

static gm_status host_physical_create(gm_backend *backend, uint64_t size, uint64_t *handle_out)
{
    host_state *state = state_of(backend);
    gm_status status = gm_device_model_check_room(state->model, size);
    if (status != GM_OK)
        return status;
    int descriptor = memfd_create("gpumem-physical", MFD_CLOEXEC);
    if (descriptor < 0)
        return system_failure("memfd_create");
    if (ftruncate(descriptor, (off_t)size) != 0) {
        close(descriptor);
        return system_failure("ftruncate");
    }
    uint64_t handle = (uint64_t)descriptor + 1;
    status = gm_device_model_physical_create(state->model, handle, size);
    if (status != GM_OK) {
        close(descriptor);
        return status;
    }
    *handle_out = handle;
    return GM_OK;
}

static gm_status host_physical_release(gm_backend *backend, uint64_t handle)
{
    gm_status status = gm_device_model_physical_release(state_of(backend)->model, handle);
    if (status == GM_OK)
        close((int)(handle - 1)); /* a mapping keeps the memory alive until it is unmapped */
    return status;
}

static gm_status host_map(gm_backend *backend, uintptr_t address, uint64_t size, uint64_t handle)
{
    gm_status status = gm_device_model_map(state_of(backend)->model, address, size, handle);
    if (status != GM_OK)
        return status;
    void *placed = mmap((void *)address, size, PROT_NONE, MAP_SHARED | MAP_FIXED, (int)(handle - 1), 0);
    if (placed == MAP_FAILED) {
        gm_status failure = system_failure("mmap of a physical allocation");
        gm_device_model_unmap(state_of(backend)->model, address, size);
        return failure;
    }
    return GM_OK;
}

static gm_status host_set_access(gm_backend *backend, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_set_access(state_of(backend)->model, address, size);
    if (status == GM_OK && mprotect((void *)address, size, PROT_READ | PROT_WRITE) != 0)
        return system_failure("mprotect");
    return status;
}

/* The physical allocation is a file: written from the mapped bytes, in pieces if the kernel says so. */
static gm_status host_copy_into(gm_backend *backend, uint64_t handle, uint64_t size, uintptr_t source)
{
    gm_status status = gm_device_model_copy_into(state_of(backend)->model, handle, size, source);
    for (uint64_t done = 0; status == GM_OK && done < size;) {
        ssize_t written = pwrite((int)(handle - 1), (const char *)source + done, size - done, (off_t)done);
        if (written <= 0)
            return system_failure("pwrite into a physical allocation");
        done += (uint64_t)written;
    }
    return status;
}

/* Host memory has no device to grant it to: the mapping is only checked. */
static gm_status host_grant_access(gm_backend *backend, uintptr_t address, uint64_t size, int device)
{
    (void)device;
    return gm_device_model_set_access(state_of(backend)->model, address, size);
}

/* ---------------------------------------------------------------- memory shared between processes */

/* A physical allocation is a memfd: another process maps the same file. */
static gm_status host_export_handle(gm_backend *backend, uint64_t handle, int *descriptor_out)
{
    (void)backend;
    int descriptor = fcntl((int)(handle - 1), F_DUPFD_CLOEXEC, 0);
    if (descriptor < 0)
        return system_failure("fcntl(F_DUPFD_CLOEXEC) of a physical allocation");
    *descriptor_out = descriptor;
    return GM_OK;
}

static void host_close_export(gm_backend *backend, int descriptor)
{
    (void)backend;
    close(descriptor);
}

/* Map a piece another process shared at `address`; a file shorter than the piece would fault on use. */
static gm_status map_shared_piece(int process, const gm_shared_piece *piece, void *address)
{
    int mine = -1;
    gm_status status = gm_take_descriptor(process, piece->descriptor, &mine);
    if (status != GM_OK)
        return status;
    struct stat file;
    if (fstat(mine, &file) != 0 || (uint64_t)file.st_size < piece->size)
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "descriptor %d of process %d holds no %" PRIu64 "-byte allocation",
                         piece->descriptor, process, piece->size);
    else if (mmap(address, piece->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mine, 0) == MAP_FAILED)
        status = system_failure("mmap of shared memory");
    close(mine);
    return status;
}

/* Outside the device model: the memory is the other process's. */
static gm_status host_open_shared(gm_backend *backend, int process, const gm_shared_piece *pieces, size_t count,
                                  uint64_t size, uintptr_t *address_out)
{
    (void)backend;
    char *range = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED)
        return system_failure("mmap of a range for shared memory");
    for (size_t i = 0; i < count; i++) {
        gm_status status = map_shared_piece(process, &pieces[i], range + pieces[i].offset);
        if (status != GM_OK) {
            munmap(range, size);
            return status;
        }
    }
    *address_out = (uintptr_t)range;
    return GM_OK;
}

static void host_close_shared(gm_backend *backend, uintptr_t address, uint64_t size)
{
    (void)backend;
    munmap((void *)address, size);
}

static gm_status host_unmap(gm_backend *backend, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_unmap(state_of(backend)->model, address, size);
    if (status != GM_OK)
        return status;
    void *placed = mmap((void *)address, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return placed == MAP_FAILED ? system_failure("mmap restoring a reservation") : GM_OK;
}

static void close_physical(uint64_t handle)
{
    close((int)(handle - 1));
}

static void unmap_range(uintptr_t address, uint64_t size)
{
    munmap((void *)address, size);
}

/* The backend goes: what the model still holds -- a release or free that failed, or that an injected
 * failure kept from reaching the host -- is given back here, descriptors and mappings both, so that a
 * process creating and destroying allocators does not run out of either. */
static void host_close(gm_backend *backend)
{
    static const gm_model_leftovers leftovers = {close_physical, unmap_range};
    if (backend->state)
        gm_device_model_give_back_leftovers(state_of(backend)->model, &leftovers);
    gm_model_close(backend);
}

const gm_backend_operations gm_host_backend_operations = {
    .name = "host",
    .open = host_open,
    .close = host_close,
    .memory_info = gm_model_memory_info,
    .segment_allocate = host_segment_allocate,
    .segment_free = host_segment_free,
    .address_reserve = host_address_reserve,
    .address_free = host_address_free,
    .physical_create = host_physical_create,
    .physical_release = host_physical_release,
    .map = host_map,
    .copy_into = host_copy_into,
    .set_access = host_set_access,
    .grant_access = host_grant_access,
    .export_handle = host_export_handle,
    .close_export = host_close_export,
    .open_shared = host_open_shared,
    .close_shared = host_close_shared,
    .unmap = host_unmap,
    GM_MODEL_OPERATIONS,
};
