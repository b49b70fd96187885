/*
 * backend.c -- opening a backend by name, and the counted wrappers around its operations.
 *
 * Each wrapper forwards to the backend and adds one to the call's counter. The cost of a call is
 * either what the backend charges (the sim's H200 cost model) or, on real backends, the measured
 * wall time of the call. Device calls are never on the allocator's fast path, so timing them with
 * clock_gettime costs nothing that matters.
 */
#include "backend/backend.h"
#include "backend/descriptor_broker.h"

#include "base/blocking.h"
#include "base/error.h"
#include "base/options.h"
#include "base/system_memory.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

const char *gm_device_call_name(gm_device_call call)
{
#define NAME(suffix, name, cuda) #name,
    static const char *const names[GM_CALL_KIND_COUNT] = {GM_DEVICE_CALLS(NAME)};
#undef NAME
    return (unsigned)call < GM_CALL_KIND_COUNT ? names[call] : "unknown";
}

size_t gm_device_call_count(void)
{
    return GM_CALL_KIND_COUNT;
}

gm_backend_config gm_backend_config_of(const gm_options *options)
{
    return (gm_backend_config){.name = options->backend, .device = options->device, .capacity = options->capacity,
                               .page_size = options->page_size, .cost_model = options->cost_model,
                               .fault_rate = options->fault_rate, .fault_seed = (uint64_t)options->fault_seed};
}

gm_status gm_backend_open(const gm_backend_config *config, gm_backend **backend_out)
{
    static const gm_backend_operations *const known[] = {&gm_sim_backend_operations,
                                                         &gm_host_backend_operations,
                                                         &gm_cuda_backend_operations};
    const gm_backend_operations *operations = NULL;
    for (size_t i = 0; config->name && i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(known[i]->name, config->name))
            operations = known[i];
    if (!operations)
        return gm_fail(GM_ERROR_BAD_CONFIG, "unknown backend '%s' (expected sim, host or cuda)",
                       config->name ? config->name : "(none)");
    gm_backend *backend = gm_system_calloc(1, sizeof *backend);
    if (!backend)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the backend");
    backend->operations = operations;
    if (config->fault_rate > 0) {
        backend->faults_armed = true;
        backend->fault_threshold = config->fault_rate >= 1 ? UINT64_MAX : (uint64_t)(config->fault_rate * 18446744073709551616.0);
        backend->fault_state = config->fault_seed * 0x9e3779b97f4a7c15ull + 1;
    }
    gm_status status = operations->open(backend, config);
    if (status != GM_OK) {
        free(backend);
        return status;
    }
    *backend_out = backend;
    return GM_OK;
}

void gm_backend_close(gm_backend *backend)
{
    if (!backend)
        return;
    backend->operations->close(backend);
    free(backend);
}

/* ---------------------------------------------------------------- cost model */

/* Median microseconds measured on an H200 with CUDA 13.0 at 2 MiB, 20 MiB, 256 MiB and 1 GiB. */
static const double measured_sizes_mib[4] = {2, 20, 256, 1024};
static const double measured_microseconds[GM_CALL_KIND_COUNT][4] = {
    [GM_CALL_SEGMENT_ALLOCATE] = {45, 46, 80, 171},
    [GM_CALL_SEGMENT_FREE] = {38, 52, 167, 533},
    [GM_CALL_PHYSICAL_CREATE] = {12, 12, 17, 98},
    [GM_CALL_MAP] = {1.1, 1.0, 1.2, 1.8},
    [GM_CALL_SET_ACCESS] = {27, 27, 58, 98},
    [GM_CALL_UNMAP] = {18, 18, 27, 38},
    [GM_CALL_PHYSICAL_RELEASE] = {13, 28, 133, 508},
    [GM_CALL_COPY] = {47, 94, 232, 684}, /* on an idle device: the waits, the second mapping, the copy */
};

int64_t gm_device_call_cost_ns(gm_device_call kind, uint64_t size)
{
    const double *cost = measured_microseconds[kind];
    if (cost[0] == 0)
        return 0; /* not measured: reserve/free of address ranges, events */
    double mib = (double)size / (1024.0 * 1024.0);
    if (mib <= measured_sizes_mib[0])
        return (int64_t)(cost[0] * 1000.0);
    size_t segment = 0;
    while (segment < 2 && mib > measured_sizes_mib[segment + 1])
        segment++;
    double left = measured_sizes_mib[segment], right = measured_sizes_mib[segment + 1];
    double microseconds = cost[segment] + (cost[segment + 1] - cost[segment]) * (mib - left) / (right - left);
    return microseconds > 0 ? (int64_t)(microseconds * 1000.0) : 0;
}

/* ---------------------------------------------------------------- counted calls */

/* Run `call` on `size` bytes, count it as `kind`, add its modelled cost and its cost: the modelled
 * one on a backend that charges the model (sim), the measured wall time elsewhere. */
/* Whether this call of `kind` is one to fail: by gm_inject_device_failures, or drawn at fault_rate. */
static bool injected_failure(gm_backend *backend, gm_device_call kind)
{
    if (backend->fault_threshold) {
        uint64_t x = backend->fault_state; /* xorshift64* */
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        backend->fault_state = x;
        if (x * 2685821657736338717ull < backend->fault_threshold) {
            backend->faults_injected++;
            return true;
        }
    }
    if (!backend->failures_to_inject[kind])
        return false;
    if (backend->succeed_before_failing[kind]) {
        backend->succeed_before_failing[kind]--;
        return false;
    }
    backend->failures_to_inject[kind]--;
    backend->faults_injected++;
    return true;
}

#define COUNTED_CALL(backend, kind, size, call)                                                            \
    do {                                                                                                   \
        gm_before_blocking();                                                                              \
        if ((backend)->faults_armed && injected_failure(backend, kind))                                    \
            return gm_fail(GM_ERROR_DEVICE, "%s failed (injected: fault_rate or gm_inject_device_failures)",\
                           gm_device_call_name(kind));                                                     \
        int64_t started = (backend)->charges_cost ? 0 : monotonic_ns();                                   \
        gm_status status_ = (call);                                                                        \
        int64_t modelled_ = gm_device_call_cost_ns(kind, size);                                           \
        int64_t cost_ = (backend)->charges_cost ? modelled_ : monotonic_ns() - started;                   \
        (backend)->calls[kind]++;                                                                          \
        (backend)->memory_calls += (kind) < GM_CALL_EVENT_RECORD;                                          \
        (backend)->modelled_ns += modelled_;                                                               \
        (backend)->call_ns += cost_;                                                                       \
        (backend)->call_ns_by_kind[kind] += cost_;                                                         \
        return status_;                                                                                    \
    } while (0)

/* A segment from the allocator's source (gm_create_with_source) when it has one. */
static gm_status source_allocate(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    void *address = NULL;
    gm_status status = backend->source.allocate(backend->source.context, size, &address);
    if (status == GM_OK && !address)
        status = GM_ERROR_OUT_OF_MEMORY;
    if (status != GM_OK)
        return gm_fail(status == GM_ERROR_OUT_OF_MEMORY ? status : GM_ERROR_DEVICE,
                       "the memory source could not give %" PRIu64 " bytes", size);
    *address_out = (uintptr_t)address;
    return GM_OK;
}

static gm_status source_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    backend->source.free(backend->source.context, (void *)address, size);
    return GM_OK;
}

gm_status gm_backend_segment_allocate(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    if (backend->source.allocate)
        COUNTED_CALL(backend, GM_CALL_SEGMENT_ALLOCATE, size, source_allocate(backend, size, address_out));
    COUNTED_CALL(backend, GM_CALL_SEGMENT_ALLOCATE, size, backend->operations->segment_allocate(backend, size, address_out));
}

gm_status gm_backend_segment_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    if (backend->source.free)
        COUNTED_CALL(backend, GM_CALL_SEGMENT_FREE, size, source_free(backend, address, size));
    COUNTED_CALL(backend, GM_CALL_SEGMENT_FREE, size, backend->operations->segment_free(backend, address, size));
}

static gm_status counted_address_reserve(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    COUNTED_CALL(backend, GM_CALL_ADDRESS_RESERVE, size, backend->operations->address_reserve(backend, size, address_out));
}

gm_status gm_backend_address_reserve(gm_backend *backend, uint64_t size, uintptr_t *address_out)
{
    gm_status status = counted_address_reserve(backend, size, address_out);
    if (status == GM_ERROR_OUT_OF_MEMORY)
        backend->address_space_failed = true;
    return status;
}

gm_status gm_backend_address_free(gm_backend *backend, uintptr_t address, uint64_t size)
{
    COUNTED_CALL(backend, GM_CALL_ADDRESS_FREE, size, backend->operations->address_free(backend, address, size));
}

gm_status gm_backend_physical_create(gm_backend *backend, uint64_t size, uint64_t *handle_out)
{
    COUNTED_CALL(backend, GM_CALL_PHYSICAL_CREATE, size, backend->operations->physical_create(backend, size, handle_out));
}

gm_status gm_backend_physical_release(gm_backend *backend, uint64_t handle, uint64_t size)
{
    COUNTED_CALL(backend, GM_CALL_PHYSICAL_RELEASE, size, backend->operations->physical_release(backend, handle));
}

gm_status gm_backend_map(gm_backend *backend, uintptr_t address, uint64_t size, uint64_t handle)
{
    COUNTED_CALL(backend, GM_CALL_MAP, size, backend->operations->map(backend, address, size, handle));
}

gm_status gm_backend_set_access(gm_backend *backend, uintptr_t address, uint64_t size)
{
    COUNTED_CALL(backend, GM_CALL_SET_ACCESS, size, backend->operations->set_access(backend, address, size));
}

/* Counted as a set-access call: it is one, for one device. */
gm_status gm_backend_grant_access(gm_backend *backend, uintptr_t address, uint64_t size, int device)
{
    COUNTED_CALL(backend, GM_CALL_SET_ACCESS, size, backend->operations->grant_access(backend, address, size, device));
}

gm_status gm_backend_unmap(gm_backend *backend, uintptr_t address, uint64_t size)
{
    COUNTED_CALL(backend, GM_CALL_UNMAP, size, backend->operations->unmap(backend, address, size));
}

gm_status gm_backend_copy_into(gm_backend *backend, uint64_t handle, uint64_t size, uintptr_t source)
{
    if (!backend->operations->copy_into)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend cannot copy device memory", backend->operations->name);
    COUNTED_CALL(backend, GM_CALL_COPY, size, backend->operations->copy_into(backend, handle, size, source));
}

gm_status gm_backend_event_create(gm_backend *backend, uint64_t *event_out)
{
    gm_before_blocking();
    return backend->operations->event_create(backend, event_out);
}

gm_status gm_backend_event_destroy(gm_backend *backend, uint64_t event)
{
    gm_before_blocking();
    return backend->operations->event_destroy(backend, event);
}

gm_status gm_backend_event_record(gm_backend *backend, uint64_t event, gm_stream stream)
{
    COUNTED_CALL(backend, GM_CALL_EVENT_RECORD, 0, backend->operations->event_record(backend, event, stream));
}

gm_status gm_backend_event_query(gm_backend *backend, uint64_t event, bool *done_out)
{
    COUNTED_CALL(backend, GM_CALL_EVENT_QUERY, 0, backend->operations->event_query(backend, event, done_out));
}

gm_status gm_backend_event_synchronize(gm_backend *backend, uint64_t event)
{
    COUNTED_CALL(backend, GM_CALL_EVENT_SYNCHRONIZE, 0, backend->operations->event_synchronize(backend, event));
}

gm_status gm_backend_synchronize(gm_backend *backend)
{
    COUNTED_CALL(backend, GM_CALL_EVENT_SYNCHRONIZE, 0, backend->operations->synchronize(backend));
}

gm_status gm_backend_memory_info(gm_backend *backend, uint64_t *free_out, uint64_t *total_out)
{
    gm_before_blocking();
    return backend->operations->memory_info(backend, free_out, total_out);
}

/* ---------------------------------------------------------------- host memory */

gm_status gm_backend_host_allocate(gm_backend *backend, uint64_t size, void **pointer_out)
{
    if (!backend->operations->host_allocate)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend has no page-locked host memory",
                       backend->operations->name);
    gm_before_blocking();
    return backend->operations->host_allocate(backend, size, pointer_out);
}

gm_status gm_backend_host_free(gm_backend *backend, void *pointer, uint64_t size)
{
    if (!backend->operations->host_free)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend has no page-locked host memory",
                       backend->operations->name);
    gm_before_blocking();
    return backend->operations->host_free(backend, pointer, size);
}

gm_status gm_plain_host_allocate(gm_backend *backend, uint64_t size, void **pointer_out)
{
    (void)backend;
    /* aligned_alloc wants a multiple of the alignment; the cache's sizes are powers of two >= 512 */
    uint64_t rounded = (size + 63) & ~(uint64_t)63;
    void *pointer = aligned_alloc(64, (size_t)rounded);
    if (!pointer)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for %llu bytes of pinned host memory",
                       (unsigned long long)size);
    *pointer_out = pointer;
    return GM_OK;
}

gm_status gm_plain_host_free(gm_backend *backend, void *pointer, uint64_t size)
{
    (void)backend;
    (void)size;
    free(pointer);
    return GM_OK;
}

/* ---------------------------------------------------------------- memory shared between processes */

gm_status gm_backend_export(gm_backend *backend, uint64_t handle, int *descriptor_out)
{
    if (!backend->operations->export_handle)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend cannot share memory with other processes (the "
                       "host and cuda backends can)", backend->operations->name);
    gm_before_blocking();
    gm_status status = backend->operations->export_handle(backend, handle, descriptor_out);
    if (status == GM_OK)
        gm_broker_offer(*descriptor_out);
    return status;
}

void gm_backend_offer_export(int descriptor)
{
    gm_broker_offer(descriptor);
}

void gm_backend_close_export(gm_backend *backend, int descriptor)
{
    gm_broker_withdraw(descriptor);
    backend->operations->close_export(backend, descriptor);
}

/* pidfd_getfd was refused (no right to trace `process`, or a kernel without it): the descriptor from
 * the process's own broker instead, or an error that gives both reasons. */
static gm_status take_from_broker(int process, int descriptor, const char *refusal, int *mine_out)
{
    if (gm_broker_request(process, descriptor, mine_out) == GM_OK)
        return GM_OK;
    char asked[512];
    snprintf(asked, sizeof asked, "%s", gm_last_error());
    return gm_fail(GM_ERROR_IO, "cannot take descriptor %d of process %d: %s; nor did that process give it: %s",
                   descriptor, process, refusal, asked);
}

gm_status gm_take_descriptor(int process, int descriptor, int *mine_out)
{
    long process_descriptor = syscall(SYS_pidfd_open, process, 0);
    if (process_descriptor < 0) {
        int error = errno;
        if (error == ENOSYS)
            return take_from_broker(process, descriptor, "this kernel has no pidfd_open", mine_out);
        return gm_fail(error == ESRCH ? GM_ERROR_INVALID_ARGUMENT : GM_ERROR_IO,
                       "cannot reach process %d to take the memory it shared (pidfd_open: %s)", process, strerror(error));
    }
    long mine = syscall(SYS_pidfd_getfd, (int)process_descriptor, descriptor, 0);
    int error = errno;
    close((int)process_descriptor);
    if (mine < 0 && (error == EPERM || error == ENOSYS))
        return take_from_broker(process, descriptor,
                                error == EPERM ? "pidfd_getfd needs the right to trace it (the same user, and "
                                                 "/proc/sys/kernel/yama/ptrace_scope 0 or it a descendant of this one)"
                                               : "this kernel has no pidfd_getfd", mine_out);
    if (mine < 0)
        return gm_fail(error == EBADF ? GM_ERROR_INVALID_ARGUMENT : GM_ERROR_IO,
                       "cannot take descriptor %d of process %d (pidfd_getfd: %s)", descriptor, process, strerror(error));
    *mine_out = (int)mine;
    return GM_OK;
}
