/*
 * device_model.h -- the rules of a device, shared by the "sim" and "host" backends.
 *
 * The model keeps the books a driver keeps and refuses what a driver refuses: physical memory is
 * limited to a capacity; a segment is freed once, at its own address and size; a mapping must lie
 * in a reserved range, be page-aligned, not overlap another mapping, and be unmapped as it was
 * mapped; physical memory released while still mapped lives until its last mapping goes, as with
 * cuMemRelease. Each refusal is GM_ERROR_DEVICE with a message, so engine bugs surface in tests.
 *
 * It also simulates streams: each stream counts units of work queued and completed; an event
 * recorded on a stream is done once the work queued before it has completed.
 */
#ifndef GM_DEVICE_MODEL_H
#define GM_DEVICE_MODEL_H

#include "backend/backend.h"

typedef struct gm_device_model gm_device_model;

gm_status gm_device_model_create(gm_backend *backend, uint64_t capacity, uint64_t page_size,
                                 gm_device_model **model_out);
void gm_device_model_destroy(gm_device_model *model);

uint64_t gm_device_model_used_bytes(const gm_device_model *model);

gm_status gm_device_model_segment_allocate(gm_device_model *model, uintptr_t address, uint64_t size);
gm_status gm_device_model_segment_free(gm_device_model *model, uintptr_t address, uint64_t size);
/* Whether `size` more bytes of physical memory would fit. */
gm_status gm_device_model_check_room(gm_device_model *model, uint64_t size);
gm_status gm_device_model_address_reserve(gm_device_model *model, uintptr_t address, uint64_t size);
gm_status gm_device_model_address_free(gm_device_model *model, uintptr_t address, uint64_t size);
gm_status gm_device_model_physical_create(gm_device_model *model, uint64_t handle, uint64_t size);
gm_status gm_device_model_physical_release(gm_device_model *model, uint64_t handle);
gm_status gm_device_model_map(gm_device_model *model, uintptr_t address, uint64_t size, uint64_t handle);
gm_status gm_device_model_set_access(gm_device_model *model, uintptr_t address, uint64_t size);
gm_status gm_device_model_unmap(gm_device_model *model, uintptr_t address, uint64_t size);
/* What a copy into physical memory needs (backend copy_into): `handle` live, not mapped and of `size`
 * bytes, [source, source + size) mapped with access set, and no stream being captured (a device-wide
 * wait would break the capture). Then the wait itself: every stream's queued work completes. */
gm_status gm_device_model_copy_into(gm_device_model *model, uint64_t handle, uint64_t size, uintptr_t source);
/* What the model still holds, for a backend whose close gives back its real resources: each physical
 * allocation not released (`physical`), each address reservation and each segment (`range`). A release
 * or free that failed (or that an injected failure kept from the backend) leaves them here. */
typedef struct gm_model_leftovers {
    void (*physical)(uint64_t handle);
    void (*range)(uintptr_t address, uint64_t size);
} gm_model_leftovers;
void gm_device_model_give_back_leftovers(const gm_device_model *model, const gm_model_leftovers *leftovers);


/* Backend operations that only consult the model, for any backend whose state begins with a
 * gm_device_model pointer (sim and host share them). */
/* Make `state` (allocated by the caller, first member a gm_device_model pointer) the backend's state
 * and give it a model of config's capacity (default_capacity when it is 0) and page size; on failure
 * `state` is freed. Refused, with the reason: a device other than 0 (such a backend has one), a page
 * larger than the device, more than GM_MAX_DEVICE_PAGES pages. */
gm_status gm_model_backend_open(gm_backend *backend, void *state, const gm_backend_config *config,
                                uint64_t default_capacity, bool charges_cost);
void gm_model_close(gm_backend *backend);
gm_status gm_model_memory_info(gm_backend *backend, uint64_t *free_out, uint64_t *total_out);
gm_status gm_model_event_create(gm_backend *backend, uint64_t *event_out);
gm_status gm_model_event_destroy(gm_backend *backend, uint64_t event);
gm_status gm_model_event_record(gm_backend *backend, uint64_t event, gm_stream stream);
gm_status gm_model_event_query(gm_backend *backend, uint64_t event, bool *done_out);
gm_status gm_model_event_synchronize(gm_backend *backend, uint64_t event);
gm_status gm_model_stream_enqueue(gm_backend *backend, gm_stream stream, uint64_t units);
gm_status gm_model_stream_complete(gm_backend *backend, gm_stream stream, uint64_t units_left);
/* A stream being captured (gm_sim_stream_set_capturing): an event recorded on it meanwhile fails to be
 * queried or waited for, as CUDA's does (the work it marks is in a graph, not running). */
gm_status gm_model_stream_set_capturing(gm_backend *backend, gm_stream stream, bool capturing);
bool gm_model_stream_is_capturing(gm_backend *backend, gm_stream stream);
/* Whether work enqueued on `stream` (gm_model_stream_enqueue) has not completed. */
bool gm_model_stream_is_busy(gm_backend *backend, gm_stream stream);
/* The backend's device-wide wait: every stream's work completes (counted in work_waited_for); refused
 * while a stream is being captured. */
gm_status gm_model_synchronize(gm_backend *backend);
/* For tests: `stream` is destroyed by its owner (its queued work still completes). Any later call that
 * names it fails (or reads as busy, never captured) and is counted in calls_on_destroyed_streams. */
gm_status gm_model_stream_destroy(gm_backend *backend, gm_stream stream);

/* The operations a model backend takes from the model as they are (events, streams, the device-wide
 * wait) and its host memory, ordinary memory: in a gm_backend_operations initializer. */
#define GM_MODEL_OPERATIONS                                                                               \
    .event_create = gm_model_event_create, .event_destroy = gm_model_event_destroy,                      \
    .event_record = gm_model_event_record, .event_query = gm_model_event_query,                          \
    .event_synchronize = gm_model_event_synchronize, .synchronize = gm_model_synchronize,                \
    .stream_enqueue = gm_model_stream_enqueue, .stream_complete = gm_model_stream_complete,              \
    .stream_is_capturing = gm_model_stream_is_capturing, .stream_is_busy = gm_model_stream_is_busy,      \
    .stream_set_capturing = gm_model_stream_set_capturing, .host_allocate = gm_plain_host_allocate,      \
    .host_free = gm_plain_host_free

/* What a sim or host backend holds now (only those: their state is a model), for tests and the soak
 * benchmark, which check that it stays bounded. */
typedef struct gm_model_footprint {
    size_t streams;         /* simulated streams the model keeps a record of */
    size_t events;          /* events created and not destroyed */
    size_t reservations;    /* reserved address ranges */
    size_t returned_ranges; /* sim: address ranges given back and kept for reuse */
    uint64_t calls_on_destroyed_streams; /* calls naming a stream after gm_model_stream_destroy */
} gm_model_footprint;
gm_model_footprint gm_model_footprint_of(gm_backend *backend);
/* sim.c: the address ranges it keeps for reuse (0 on another backend). */
size_t gm_sim_returned_range_count(gm_backend *backend);

#endif
