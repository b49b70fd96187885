/*
 * device.c -- the device behind an allocator: gm_get_device_info; the streams it holds (gm_holds_stream);
 * the other devices that may reach its memory (gm_enable_peer_access);
 * named streams (a recorded program's stream ids turned into the device's streams, for replays); and
 * what the sim and host backends let tests drive: the simulated streams, and memory used by "other
 * processes" (the device model counts it as used: the driver's free memory drops, allocations find
 * less room, gm_validate leaves it out).
 */
#include "core/allocator.h"
#include "base/blocking.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

gm_status gm_read_device_info_locked(gm_allocator *allocator, gm_device_info *info_out)
{
    memset(info_out, 0, sizeof *info_out);
    gm_backend *backend = allocator->arena.backend;
    snprintf(info_out->backend, sizeof info_out->backend, "%s", backend->operations->name);
    snprintf(info_out->name, sizeof info_out->name, "%s device", backend->operations->name);
    snprintf(info_out->engine, sizeof info_out->engine, "%s", allocator->arena.engine->name);
    info_out->device = allocator->options.device;
    info_out->device_count = 1;
    info_out->virtual_memory = backend->supports_virtual_memory;
    info_out->granularity = backend->page_size;
    if (backend->operations->describe)
        backend->operations->describe(backend, info_out);
    return gm_backend_memory_info(backend, &info_out->free_bytes, &info_out->total_bytes);
}

gm_status gm_get_device_info(gm_allocator *allocator, gm_device_info *info_out)
{
    if (!allocator || !info_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_device_info: %s is NULL", allocator ? "info_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    gm_status status = gm_read_device_info_locked(allocator, info_out);
    gm_lock_release(&allocator->lock);
    return status;
}

/* ---------------------------------------------------------------- simulated streams */

gm_status gm_sim_stream_enqueue(gm_allocator *allocator, gm_stream stream, uint64_t units)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_sim_stream_enqueue: allocator is NULL");
    if (!allocator->arena.backend->operations->stream_enqueue)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend has real streams", allocator->arena.backend->operations->name);
    gm_lock_acquire(&allocator->lock);
    gm_status status = allocator->arena.backend->operations->stream_enqueue(allocator->arena.backend, stream, units);
    gm_lock_release(&allocator->lock);
    return status;
}

/* Finish the oldest work queued on `stream` until `units_left` units remain; `caller` names the public
 * function in the error message. */
static gm_status finish_stream_work(gm_allocator *allocator, gm_stream stream, uint64_t units_left, const char *caller)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", caller);
    if (!allocator->arena.backend->operations->stream_complete)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend has real streams", allocator->arena.backend->operations->name);
    gm_lock_acquire(&allocator->lock);
    gm_status status = allocator->arena.backend->operations->stream_complete(allocator->arena.backend, stream,
                                                                            units_left);
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_sim_stream_complete(gm_allocator *allocator, gm_stream stream)
{
    return finish_stream_work(allocator, stream, 0, "gm_sim_stream_complete");
}

gm_status gm_sim_stream_finish_until(gm_allocator *allocator, gm_stream stream, uint64_t units_left)
{
    return finish_stream_work(allocator, stream, units_left, "gm_sim_stream_finish_until");
}

gm_status gm_sim_work_waited_for(gm_allocator *allocator, uint64_t *units_out)
{
    if (!allocator || !units_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_sim_work_waited_for: %s is NULL", allocator ? "units_out" : "allocator");
    if (!allocator->arena.backend->operations->stream_enqueue)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend has real streams", allocator->arena.backend->operations->name);
    gm_lock_acquire(&allocator->lock);
    *units_out = allocator->arena.backend->work_waited_for;
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_status gm_sim_stream_set_capturing(gm_allocator *allocator, gm_stream stream, int capturing)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_sim_stream_set_capturing: allocator is NULL");
    if (!allocator->arena.backend->operations->stream_set_capturing)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend has real streams", allocator->arena.backend->operations->name);
    gm_lock_acquire(&allocator->lock);
    gm_status status = allocator->arena.backend->operations->stream_set_capturing(allocator->arena.backend, stream,
                                                                                 capturing != 0);
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_sim_set_used_elsewhere(gm_allocator *allocator, uint64_t bytes)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_sim_set_used_elsewhere: allocator is NULL");
    gm_backend *backend = allocator->arena.backend;
    if (!backend->operations->stream_enqueue)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "the %s backend's device has real other users", backend->operations->name);
    gm_lock_acquire(&allocator->lock);
    uint64_t free_bytes = 0, total_bytes = 0;
    gm_status status = gm_backend_memory_info(backend, &free_bytes, &total_bytes);
    if (status == GM_OK && bytes > free_bytes + backend->used_elsewhere)
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "gm_sim_set_used_elsewhere: %" PRIu64 " bytes do not fit beside the "
                         "allocator's; %" PRIu64 " could be used elsewhere", bytes, free_bytes + backend->used_elsewhere);
    if (status == GM_OK)
        backend->used_elsewhere = bytes;
    gm_lock_release(&allocator->lock);
    return status;
}

/* ---------------------------------------------------------------- injected failures */

gm_status gm_inject_device_failures(gm_allocator *allocator, gm_device_call call, uint64_t after_calls,
                                    uint64_t failures)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_inject_device_failures: allocator is NULL");
    if ((unsigned)call >= GM_CALL_KIND_COUNT)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_inject_device_failures: no device call of kind %d", (int)call);
    gm_lock_acquire(&allocator->lock);
    allocator->arena.backend->succeed_before_failing[call] = after_calls;
    allocator->arena.backend->failures_to_inject[call] = failures;
    allocator->arena.backend->faults_armed = true;
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

/* ---------------------------------------------------------------- named streams */

struct gm_named_stream_entry {
    uint64_t name;
    gm_stream stream;
};

gm_status gm_named_stream(gm_allocator *allocator, uint64_t name, gm_stream *stream_out)
{
    if (!allocator || !stream_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_named_stream: %s is NULL", allocator ? "stream_out" : "allocator");
    gm_backend *backend = allocator->arena.backend;
    if (!backend->operations->stream_create || name == 0) {
        *stream_out = (gm_stream)name;
        return GM_OK;
    }
    gm_status status = GM_OK;
    gm_lock_acquire(&allocator->lock);
    size_t i = 0;
    while (i < allocator->named_stream_count && allocator->named_streams[i].name != name)
        i++;
    if (i == allocator->named_stream_count) {
        struct gm_named_stream_entry *grown =
            gm_system_realloc(allocator->named_streams, (allocator->named_stream_count + 1) * sizeof *grown);
        gm_stream stream = 0;
        if (!grown)
            status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a named stream");
        else if ((allocator->named_streams = grown, status = backend->operations->stream_create(backend, &stream)) == GM_OK)
            grown[allocator->named_stream_count++] = (struct gm_named_stream_entry){name, stream};
    }
    if (status == GM_OK)
        *stream_out = allocator->named_streams[i].stream;
    gm_lock_release(&allocator->lock);
    return status;
}

void gm_destroy_named_streams(gm_allocator *allocator)
{
    gm_backend *backend = allocator->arena.backend;
    for (size_t i = 0; i < allocator->named_stream_count; i++)
        backend->operations->stream_destroy(backend, allocator->named_streams[i].stream);
    free(allocator->named_streams);
    allocator->named_streams = NULL;
    allocator->named_stream_count = 0;
}

gm_status gm_holds_stream(gm_allocator *allocator, gm_stream stream, int *held_out)
{
    if (!allocator || !held_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_holds_stream: %s is NULL", allocator ? "held_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    int held = 0;
    for (size_t h = 0; h < allocator->arena.heap_count && !held; h++) /* lanes and pool heaps too */
        held = allocator->arena.heaps[h]->stream == stream;
    gm_lock_release(&allocator->lock);
    *held_out = held;
    return GM_OK;
}

/* Whether `peer` is the allocator's own device or already one of its backend's peers. */
static bool reaches_already(const gm_allocator *allocator, int peer)
{
    const gm_backend *backend = allocator->arena.backend;
    bool found = peer == allocator->options.device;
    for (int i = 0; i < backend->peer_count && !found; i++)
        found = backend->peers[i] == peer;
    return found;
}

gm_status gm_enable_peer_access(gm_allocator *allocator, int peer)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_enable_peer_access: allocator is NULL");
    if (peer < 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_enable_peer_access: device %d does not exist", peer);
    gm_lock_for_change(allocator);
    gm_backend *backend = allocator->arena.backend;
    gm_status status = GM_OK;
    if (reaches_already(allocator, peer)) {
        /* nothing to do */
    } else if (backend->peer_count == GM_BACKEND_MAX_PEERS) {
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_enable_peer_access: device %d would be peer number %d; "
                         "at most %d devices can reach one device's memory", peer, GM_BACKEND_MAX_PEERS + 1,
                         GM_BACKEND_MAX_PEERS);
    } else {
        /* Mappings made from now on include the peer; those made before are granted it one by one. A
         * refusal leaves the peer out, so later mappings do not ask the driver for what it refused. */
        backend->peers[backend->peer_count++] = peer;
        if (allocator->arena.engine->grant_peer_access)
            status = allocator->arena.engine->grant_peer_access(&allocator->arena, peer);
        if (status != GM_OK)
            backend->peer_count--;
    }
    gm_unlock_after_change(allocator);
    return status;
}
