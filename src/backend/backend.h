/*
 * backend.h -- the small interface between the allocator and a device.
 *
 * A backend offers two ways to get device memory, as CUDA does:
 *   plain segments   segment_allocate / segment_free               (cudaMalloc / cudaFree)
 *   virtual memory   address_reserve / address_free                (cuMemAddressReserve / Free)
 *                    physical_create / physical_release            (cuMemCreate / cuMemRelease)
 *                    map / set_access / unmap                      (cuMemMap / SetAccess / Unmap)
 *                    copy_into                                     (a device-wide wait, then a copy)
 * and events for cross-stream reuse: event_create / record / query / synchronize / destroy.
 *
 * The allocator never calls the operations table directly: the gm_backend_* wrappers below count
 * every call by kind and add its cost to the backend's totals: the cost the H200 model gives it
 * (measured on an H200 with CUDA 13.0, linear in size) always, and as `call_ns` the measured time on
 * real backends or the modelled cost on "sim" (which sets `charges_cost`).
 * Physical handles and events are opaque 64-bit values chosen by the backend.
 */
#ifndef GM_BACKEND_H
#define GM_BACKEND_H

#include "base/blocking.h"
#include "gpumem.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct gm_backend gm_backend;

/* The most peer devices one device's memory is made accessible to (gm_enable_peer_access). */
#define GM_BACKEND_MAX_PEERS 16

/* What a backend is opened with: the part of the configuration that concerns the device. */
typedef struct gm_backend_config {
    const char *name;   /* "sim", "host" or "cuda" */
    int device;         /* device index */
    uint64_t capacity;  /* sim/host: device memory in bytes (0: the backend's default) */
    uint64_t page_size; /* sim/host: mapping granularity */
    bool cost_model;    /* sim: charge each call its modelled H200 cost */
    double fault_rate;  /* the share of calls made to fail (fault_rate in GPUMEM_CONF) */
    uint64_t fault_seed;
} gm_backend_config;

typedef struct gm_backend_operations {
    const char *name;
    gm_status (*open)(gm_backend *backend, const gm_backend_config *config);
    void (*close)(gm_backend *backend);
    gm_status (*memory_info)(gm_backend *backend, uint64_t *free_out, uint64_t *total_out);

    gm_status (*segment_allocate)(gm_backend *backend, uint64_t size, uintptr_t *address_out);
    gm_status (*segment_free)(gm_backend *backend, uintptr_t address, uint64_t size);

    gm_status (*address_reserve)(gm_backend *backend, uint64_t size, uintptr_t *address_out);
    gm_status (*address_free)(gm_backend *backend, uintptr_t address, uint64_t size);
    gm_status (*physical_create)(gm_backend *backend, uint64_t size, uint64_t *handle_out);
    gm_status (*physical_release)(gm_backend *backend, uint64_t handle);
    gm_status (*map)(gm_backend *backend, uintptr_t address, uint64_t size, uint64_t handle);
    /* Let the device, and each of backend->peers, read and write a new mapping. */
    gm_status (*set_access)(gm_backend *backend, uintptr_t address, uint64_t size);
    /* Let `device` (a peer) read and write an existing mapping too (cuda: cuMemSetAccess for it alone;
     * sim and host: the mapping is checked). */
    gm_status (*grant_access)(gm_backend *backend, uintptr_t address, uint64_t size, int device);
    gm_status (*unmap)(gm_backend *backend, uintptr_t address, uint64_t size);
    /* Fill physical memory `handle` (`size` bytes, not mapped) with the `size` bytes mapped at `source`,
     * once all work queued on the device has finished (a device-wide wait: the copy must see every
     * write), and return after the copy is done. Refused while a stream is being captured (the wait
     * would break the capture). For compaction (core/pages/compaction.c). */
    gm_status (*copy_into)(gm_backend *backend, uint64_t handle, uint64_t size, uintptr_t source);

    /* Memory shared between processes (gm_share, gm_open_shared); NULL where there is none (sim).
     * export_handle: a new file descriptor of this process for physical memory `handle`, which another
     * process takes with pidfd_getfd (close_export closes it). open_shared: reserve `size` bytes of
     * addresses and map there, at their offsets, the pieces process `process` exported, readable and
     * writable by the device and its peers; close_shared undoes it. */
    gm_status (*export_handle)(gm_backend *backend, uint64_t handle, int *descriptor_out);
    void (*close_export)(gm_backend *backend, int descriptor);
    gm_status (*open_shared)(gm_backend *backend, int process, const gm_shared_piece *pieces, size_t count,
                             uint64_t size, uintptr_t *address_out);
    void (*close_shared)(gm_backend *backend, uintptr_t address, uint64_t size);

    gm_status (*event_create)(gm_backend *backend, uint64_t *event_out);
    gm_status (*event_destroy)(gm_backend *backend, uint64_t event);
    gm_status (*event_record)(gm_backend *backend, uint64_t event, gm_stream stream);
    gm_status (*event_query)(gm_backend *backend, uint64_t event, bool *done_out);
    gm_status (*event_synchronize)(gm_backend *backend, uint64_t event);
    /* Wait for all work queued on the device, on every stream (those the allocator never saw too);
     * refused while a stream is being captured (the wait would break the capture). For memory last used
     * on a stream the allocator may not name (gm_malloc_on_borrowed_stream). */
    gm_status (*synchronize)(gm_backend *backend);

    /* Page-locked host memory for the pinned host cache (cuda: cuMemHostAlloc / cuMemFreeHost; sim and
     * host: ordinary memory, gm_plain_host_allocate / gm_plain_host_free). */
    gm_status (*host_allocate)(gm_backend *backend, uint64_t size, void **pointer_out);
    gm_status (*host_free)(gm_backend *backend, void *pointer, uint64_t size);

    /* Fill name, device_count and driver_version (NULL: a generic description). */
    void (*describe)(gm_backend *backend, gm_device_info *info);

    /* Whether `stream` is being captured into a CUDA graph: work queued on it then does not run, so an
     * event recorded on it cannot be waited for (NULL: never). */
    bool (*stream_is_capturing)(gm_backend *backend, gm_stream stream);
    /* Whether work queued on `stream` has not finished yet, asked without waiting (NULL: never busy). */
    bool (*stream_is_busy)(gm_backend *backend, gm_stream stream);
    /* A new stream of the device, and its end (cuda); NULL where any number names a stream (sim, host). */
    gm_status (*stream_create)(gm_backend *backend, gm_stream *stream_out);
    gm_status (*stream_destroy)(gm_backend *backend, gm_stream stream);

    /* Simulated streams (sim, host); NULL elsewhere. */
    gm_status (*stream_enqueue)(gm_backend *backend, gm_stream stream, uint64_t units);
    /* Finish the oldest work queued on `stream` until at most `units_left` units remain queued. */
    gm_status (*stream_complete)(gm_backend *backend, gm_stream stream, uint64_t units_left);
    gm_status (*stream_set_capturing)(gm_backend *backend, gm_stream stream, bool capturing);
} gm_backend_operations;

struct gm_backend {
    const gm_backend_operations *operations;
    void *state;                /* the backend's own */
    uint64_t total_bytes;       /* device memory */
    uint64_t page_size;         /* mapping granularity */
    bool supports_virtual_memory;
    bool charges_cost;          /* calls cost what the H200 model says (sim), not their wall time */
    int64_t calls[GM_CALL_KIND_COUNT];
    int64_t call_ns;            /* total cost of all calls: modelled if charges_cost, else measured */
    int64_t call_ns_by_kind[GM_CALL_KIND_COUNT];
    int64_t memory_calls;       /* calls that reserve, make, map or free memory: all but the events' */
    int64_t modelled_ns;        /* total cost of all calls by the H200 model, on every backend */
    int64_t stream_queries;     /* stream_is_busy asked (gm_backend_stream_is_busy): not a device call kind,
                                   counted for tests of how often the callers ask; under the allocator's lock */
    uint64_t work_waited_for;   /* sim/host: units of simulated stream work that waits for events finished
                                   early (the time a GPU's host would stall in them) */
    uint64_t used_elsewhere;    /* sim/host: device memory taken by "other processes" (gm_sim_set_used_elsewhere),
                                   which the device model counts as used */
    bool host_memory_failed;    /* a host allocation failed for lack of memory (the host backend's mmap):
                                   the out-of-memory report names the host; it clears the flag */
    bool address_space_failed;  /* a reservation of virtual addresses ran out: the out-of-memory report names
                                   the address space; the allocator clears it before its retries */
    int peers[GM_BACKEND_MAX_PEERS]; /* other devices that may reach this device's mappings: set_access
                                        grants them access with the device's own (gm_enable_peer_access) */
    int peer_count;
    char pci_bus_id[32];        /* cuda: the device's PCI bus id, to find it in NVML; else empty */
    uint64_t succeed_before_failing[GM_CALL_KIND_COUNT]; /* gm_inject_device_failures: calls left to pass */
    uint64_t failures_to_inject[GM_CALL_KIND_COUNT];     /* then this many fail */
    bool faults_armed;          /* any of the above, or fault_rate: calls look at injected_failure */
    uint64_t fault_threshold;   /* a draw below it fails: fault_rate of 2^64 */
    uint64_t fault_state;       /* the draws' generator */
    int64_t faults_injected;    /* calls failed by the above (for the soak benchmark's report) */
    gm_segment_source source;   /* segments come from here when source.allocate is set (gm_create_with_source) */
};

/* The backend part of an allocator's options. */
struct gm_options;
gm_backend_config gm_backend_config_of(const struct gm_options *options);
/* Open the backend named by config->name. On failure *backend_out is untouched and
 * gm_last_error() says why (GM_ERROR_NO_DEVICE when there is no such device). */
gm_status gm_backend_open(const gm_backend_config *config, gm_backend **backend_out);
void gm_backend_close(gm_backend *backend);

/* export_handle and close_export; GM_ERROR_NOT_SUPPORTED where the backend has none. */
gm_status gm_backend_export(gm_backend *backend, uint64_t handle, int *descriptor_out);
void gm_backend_close_export(gm_backend *backend, int descriptor);
/* A descriptor exported before, shared again: offered to other processes anew (a child made by fork
 * keeps the parent's chunks and descriptors but not its offers). */
void gm_backend_offer_export(int descriptor);

/* Older C libraries lack the names of these system calls (Linux 5.3 and 5.6), not the kernel. */
#include <sys/syscall.h>
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

/* Descriptor `descriptor` of process `process`, duplicated into this one (pidfd_open, pidfd_getfd; where
 * that is refused, from that process's descriptor broker: descriptor_broker.h) into *mine_out: for
 * open_shared. */
gm_status gm_take_descriptor(int process, int descriptor, int *mine_out);

/* An entry point of the CUDA driver (loaded and initialized once), or NULL where there is none.
 * For the GPU tests, which drive the device beside the allocator. */
void *gm_cuda_driver_symbol(const char *name);

extern const gm_backend_operations gm_sim_backend_operations;
extern const gm_backend_operations gm_host_backend_operations;
extern const gm_backend_operations gm_cuda_backend_operations;

/* The modelled cost of one call of `kind` on `size` bytes, in nanoseconds (H200, CUDA 13.0). */
int64_t gm_device_call_cost_ns(gm_device_call kind, uint64_t size);

/* Counted wrappers. */
gm_status gm_backend_segment_allocate(gm_backend *backend, uint64_t size, uintptr_t *address_out);
gm_status gm_backend_segment_free(gm_backend *backend, uintptr_t address, uint64_t size);
gm_status gm_backend_address_reserve(gm_backend *backend, uint64_t size, uintptr_t *address_out);
gm_status gm_backend_address_free(gm_backend *backend, uintptr_t address, uint64_t size);
gm_status gm_backend_physical_create(gm_backend *backend, uint64_t size, uint64_t *handle_out);
gm_status gm_backend_physical_release(gm_backend *backend, uint64_t handle, uint64_t size);
gm_status gm_backend_map(gm_backend *backend, uintptr_t address, uint64_t size, uint64_t handle);
gm_status gm_backend_set_access(gm_backend *backend, uintptr_t address, uint64_t size);
gm_status gm_backend_grant_access(gm_backend *backend, uintptr_t address, uint64_t size, int device);
gm_status gm_backend_unmap(gm_backend *backend, uintptr_t address, uint64_t size);
gm_status gm_backend_copy_into(gm_backend *backend, uint64_t handle, uint64_t size, uintptr_t source);
gm_status gm_backend_event_create(gm_backend *backend, uint64_t *event_out);
gm_status gm_backend_event_destroy(gm_backend *backend, uint64_t event);
gm_status gm_backend_event_record(gm_backend *backend, uint64_t event, gm_stream stream);
gm_status gm_backend_event_query(gm_backend *backend, uint64_t event, bool *done_out);
gm_status gm_backend_event_synchronize(gm_backend *backend, uint64_t event);
/* A device-wide wait, counted as an event synchronization. */
gm_status gm_backend_synchronize(gm_backend *backend);
/* Whether `stream` is being captured (a query, not a counted device call). */
static inline bool gm_backend_stream_is_capturing(gm_backend *backend, gm_stream stream)
{
    if (!backend->operations->stream_is_capturing)
        return false;
    gm_before_blocking();
    return backend->operations->stream_is_capturing(backend, stream);
}
/* Whether `stream` still runs work queued on it (a query, not a counted device call; an error reads as busy). */
static inline bool gm_backend_stream_is_busy(gm_backend *backend, gm_stream stream)
{
    if (!backend->operations->stream_is_busy)
        return false;
    gm_before_blocking();
    backend->stream_queries++;
    return backend->operations->stream_is_busy(backend, stream);
}
/* Host memory (not counted in GM_DEVICE_CALLS: the pinned host cache counts them in gm_host_stats). */
gm_status gm_backend_host_allocate(gm_backend *backend, uint64_t size, void **pointer_out);
gm_status gm_backend_host_free(gm_backend *backend, void *pointer, uint64_t size);
/* The sim and host backends' host memory: aligned ordinary memory. */
gm_status gm_plain_host_allocate(gm_backend *backend, uint64_t size, void **pointer_out);
gm_status gm_plain_host_free(gm_backend *backend, void *pointer, uint64_t size);
gm_status gm_backend_memory_info(gm_backend *backend, uint64_t *free_out, uint64_t *total_out);

#endif
