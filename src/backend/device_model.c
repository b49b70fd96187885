/*
 * device_model.c -- see device_model.h.
 *
 * Books: segments and mappings by start address (hash maps), physical handles by id, reserved
 * ranges in a short array, each with a bitmap of its mapped pages (to refuse overlapping maps).
 * Events live in a small growable array; an event handle is its index + 1.
 *
 * Streams are records in a hash map, made on first use. Nothing says when a stream is gone, and a
 * program may use a new stream per request, so a record is dropped as soon as it is indistinguishable
 * from a stream never seen: all its work completed, not being captured, and no event waiting on it (an
 * event lets go of its stream once it is found done, since a done event stays done).
 */
#include "backend/device_model.h"

#include "base/error.h"
#include "base/format.h"
#include "base/hash_map.h"
#include "base/options.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct reservation {
    uintptr_t base;
    uint64_t size;
    uint64_t *mapped_pages; /* one bit per page */
} reservation;

typedef struct physical_memory {
    uint64_t size;
    uint32_t mappings;
    bool released;
} physical_memory;

typedef struct simulated_stream {
    gm_stream stream;
    uint64_t enqueued;
    uint64_t completed;
    uint64_t waiting_events; /* events recorded on it and not yet found done */
    bool capturing;
} simulated_stream;

/* Destroyed streams a model remembers, for tests that check that none is named again. */
#define MAX_DESTROYED_STREAMS 16

typedef struct simulated_event {
    simulated_stream *stream; /* while recorded and not yet found done */
    uint64_t target;
    bool in_use;
    bool captured; /* recorded while its stream was being captured: never completes */
} simulated_event;

struct gm_device_model {
    gm_backend *backend;
    uint64_t capacity;
    uint64_t page_size;
    uint64_t used;
    gm_hash_map segments;        /* address -> size */
    gm_hash_map mapping_sizes;   /* address -> size */
    gm_hash_map mapping_handles; /* address -> handle */
    gm_hash_map physical;        /* handle -> physical_memory* */
    reservation *reservations;
    size_t reservation_count;
    gm_hash_map streams;                /* stream + 1 -> simulated_stream* */
    simulated_stream *last_named_stream; /* the stream UINTPTR_MAX, whose key would be 0 */
    simulated_event *events;
    size_t event_count;
    gm_stream destroyed[MAX_DESTROYED_STREAMS]; /* streams destroyed by a test (gm_model_stream_destroy) */
    size_t destroyed_count;
    uint64_t calls_on_destroyed_streams;
};

/* ---------------------------------------------------------------- life */

gm_status gm_device_model_create(gm_backend *backend, uint64_t capacity, uint64_t page_size,
                                 gm_device_model **model_out)
{
    gm_device_model *model = gm_system_calloc(1, sizeof *model);
    if (!model)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    model->backend = backend;
    model->capacity = capacity;
    model->page_size = page_size;
    if (!gm_hash_map_init(&model->segments, 64) || !gm_hash_map_init(&model->mapping_sizes, 64) ||
        !gm_hash_map_init(&model->mapping_handles, 64) || !gm_hash_map_init(&model->physical, 64) ||
        !gm_hash_map_init(&model->streams, 16)) {
        gm_device_model_destroy(model);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    }
    *model_out = model;
    return GM_OK;
}

/* Free the records a map's values point at (the map itself stays). */
static void free_values(gm_hash_map *map)
{
    for (size_t i = 0; map->entries && i < map->capacity; i++)
        if (map->entries[i].key)
            free((void *)(uintptr_t)map->entries[i].value);
}

void gm_device_model_give_back_leftovers(const gm_device_model *model, const gm_model_leftovers *leftovers)
{
    const gm_hash_map *physical = &model->physical;
    for (size_t i = 0; physical->entries && i < physical->capacity; i++) {
        const physical_memory *memory = (const physical_memory *)(uintptr_t)physical->entries[i].value;
        if (physical->entries[i].key && !memory->released)
            leftovers->physical(physical->entries[i].key);
    }
    for (size_t i = 0; i < model->reservation_count; i++)
        leftovers->range(model->reservations[i].base, model->reservations[i].size);
    const gm_hash_map *segments = &model->segments;
    for (size_t i = 0; segments->entries && i < segments->capacity; i++)
        if (segments->entries[i].key)
            leftovers->range((uintptr_t)segments->entries[i].key, segments->entries[i].value);
}

void gm_device_model_destroy(gm_device_model *model)
{
    if (!model)
        return;
    free_values(&model->physical);
    for (size_t i = 0; i < model->reservation_count; i++)
        free(model->reservations[i].mapped_pages);
    free(model->reservations);
    free_values(&model->streams);
    free(model->last_named_stream);
    free(model->events);
    gm_hash_map_free(&model->segments);
    gm_hash_map_free(&model->mapping_sizes);
    gm_hash_map_free(&model->mapping_handles);
    gm_hash_map_free(&model->physical);
    gm_hash_map_free(&model->streams);
    free(model);
}

uint64_t gm_device_model_used_bytes(const gm_device_model *model)
{
    return model->used;
}

gm_status gm_device_model_check_room(gm_device_model *model, uint64_t size)
{
    uint64_t free_bytes = model->capacity - model->used - model->backend->used_elsewhere;
    if (size > free_bytes)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "device out of memory: %" PRIu64 " bytes requested, %" PRIu64
                       " of %" PRIu64 " bytes free", size, free_bytes, model->capacity);
    return GM_OK;
}

/* ---------------------------------------------------------------- segments */

gm_status gm_device_model_segment_allocate(gm_device_model *model, uintptr_t address, uint64_t size)
{
    gm_status status = gm_device_model_check_room(model, size);
    if (status != GM_OK)
        return status;
    if (!gm_hash_map_put(&model->segments, address, size))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    model->used += size;
    return GM_OK;
}

gm_status gm_device_model_segment_free(gm_device_model *model, uintptr_t address, uint64_t size)
{
    uint64_t recorded = 0;
    if (!gm_hash_map_get(&model->segments, address, &recorded))
        return gm_fail(GM_ERROR_DEVICE, "segment free of 0x%" PRIxPTR ", which is not a segment", address);
    if (recorded != size)
        return gm_fail(GM_ERROR_DEVICE, "segment free of 0x%" PRIxPTR " with size %" PRIu64 ", allocated with %" PRIu64,
                       address, size, recorded);
    gm_hash_map_remove(&model->segments, address, NULL);
    model->used -= size;
    return GM_OK;
}

/* ---------------------------------------------------------------- virtual memory */

static reservation *find_reservation(gm_device_model *model, uintptr_t address, uint64_t size)
{
    for (size_t i = 0; i < model->reservation_count; i++) {
        reservation *range = &model->reservations[i];
        if (address >= range->base && address - range->base <= range->size && size <= range->size - (address - range->base))
            return range;
    }
    return NULL;
}

gm_status gm_device_model_address_reserve(gm_device_model *model, uintptr_t address, uint64_t size)
{
    if (size == 0 || size % model->page_size || address % model->page_size)
        return gm_fail(GM_ERROR_DEVICE, "address reservation of %" PRIu64 " bytes is not page-aligned", size);
    reservation *grown = gm_system_realloc(model->reservations, (model->reservation_count + 1) * sizeof *grown);
    if (!grown)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    model->reservations = grown;
    uint64_t pages = size / model->page_size;
    uint64_t *bits = gm_system_calloc((pages + 63) / 64, sizeof *bits);
    if (!bits)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    grown[model->reservation_count++] = (reservation){address, size, bits};
    return GM_OK;
}

static bool any_page_mapped(const reservation *range, uint64_t first, uint64_t count)
{
    for (uint64_t page = first; page < first + count; page++)
        if (range->mapped_pages[page / 64] & (1ull << (page % 64)))
            return true;
    return false;
}

static bool all_pages_mapped(const reservation *range, uint64_t first, uint64_t count)
{
    for (uint64_t page = first; page < first + count; page++)
        if (!(range->mapped_pages[page / 64] & (1ull << (page % 64))))
            return false;
    return true;
}

static void set_pages(reservation *range, uint64_t first, uint64_t count, bool mapped)
{
    for (uint64_t page = first; page < first + count; page++) {
        if (mapped)
            range->mapped_pages[page / 64] |= 1ull << (page % 64);
        else
            range->mapped_pages[page / 64] &= ~(1ull << (page % 64));
    }
}

gm_status gm_device_model_address_free(gm_device_model *model, uintptr_t address, uint64_t size)
{
    for (size_t i = 0; i < model->reservation_count; i++) {
        reservation *range = &model->reservations[i];
        if (range->base != address)
            continue;
        if (range->size != size)
            return gm_fail(GM_ERROR_DEVICE, "address free with size %" PRIu64 ", reserved with %" PRIu64, size, range->size);
        if (any_page_mapped(range, 0, size / model->page_size))
            return gm_fail(GM_ERROR_DEVICE, "address free of 0x%" PRIxPTR " while pages are still mapped", address);
        free(range->mapped_pages);
        *range = model->reservations[--model->reservation_count];
        return GM_OK;
    }
    return gm_fail(GM_ERROR_DEVICE, "address free of 0x%" PRIxPTR ", which is not a reserved range", address);
}

static physical_memory *find_physical(gm_device_model *model, uint64_t handle)
{
    uint64_t value = 0;
    return gm_hash_map_get(&model->physical, handle, &value) ? (physical_memory *)(uintptr_t)value : NULL;
}

gm_status gm_device_model_physical_create(gm_device_model *model, uint64_t handle, uint64_t size)
{
    if (size == 0 || size % model->page_size)
        return gm_fail(GM_ERROR_DEVICE, "physical allocation of %" PRIu64 " bytes is not a multiple of the page size", size);
    gm_status status = gm_device_model_check_room(model, size);
    if (status != GM_OK)
        return status;
    physical_memory *memory = gm_system_calloc(1, sizeof *memory);
    if (!memory || !gm_hash_map_put(&model->physical, handle, (uint64_t)(uintptr_t)memory)) {
        free(memory);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    }
    memory->size = size;
    model->used += size;
    return GM_OK;
}

static void forget_physical(gm_device_model *model, uint64_t handle, physical_memory *memory)
{
    model->used -= memory->size;
    gm_hash_map_remove(&model->physical, handle, NULL);
    free(memory);
}

gm_status gm_device_model_physical_release(gm_device_model *model, uint64_t handle)
{
    physical_memory *memory = find_physical(model, handle);
    if (!memory || memory->released)
        return gm_fail(GM_ERROR_DEVICE, "release of physical handle %" PRIu64 ", which is not live", handle);
    memory->released = true;
    if (memory->mappings == 0)
        forget_physical(model, handle, memory);
    return GM_OK;
}

gm_status gm_device_model_map(gm_device_model *model, uintptr_t address, uint64_t size, uint64_t handle)
{
    physical_memory *memory = find_physical(model, handle);
    if (!memory || memory->released)
        return gm_fail(GM_ERROR_DEVICE, "map of physical handle %" PRIu64 ", which is not live", handle);
    if (size != memory->size)
        return gm_fail(GM_ERROR_DEVICE, "map of %" PRIu64 " bytes of a %" PRIu64 "-byte physical allocation "
                       "(a handle is mapped whole)", size, memory->size);
    reservation *range = find_reservation(model, address, size);
    if (!range || address % model->page_size)
        return gm_fail(GM_ERROR_DEVICE, "map at 0x%" PRIxPTR " outside any reserved range or unaligned", address);
    uint64_t first = (address - range->base) / model->page_size, count = size / model->page_size;
    if (any_page_mapped(range, first, count))
        return gm_fail(GM_ERROR_DEVICE, "map at 0x%" PRIxPTR " overlaps an existing mapping", address);
    if (!gm_hash_map_put(&model->mapping_sizes, address, size) || !gm_hash_map_put(&model->mapping_handles, address, handle))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the device model");
    set_pages(range, first, count, true);
    memory->mappings++;
    return GM_OK;
}

gm_status gm_device_model_set_access(gm_device_model *model, uintptr_t address, uint64_t size)
{
    reservation *range = find_reservation(model, address, size);
    if (!range || address % model->page_size || size % model->page_size ||
        !all_pages_mapped(range, (address - range->base) / model->page_size, size / model->page_size))
        return gm_fail(GM_ERROR_DEVICE, "set access on 0x%" PRIxPTR "+%" PRIu64 ", which is not entirely mapped",
                       address, size);
    return GM_OK;
}

gm_status gm_device_model_unmap(gm_device_model *model, uintptr_t address, uint64_t size)
{
    uint64_t mapped_size = 0, handle = 0;
    if (!gm_hash_map_get(&model->mapping_sizes, address, &mapped_size) || mapped_size != size)
        return gm_fail(GM_ERROR_DEVICE, "unmap of 0x%" PRIxPTR "+%" PRIu64 ", which is not one mapping", address, size);
    gm_hash_map_remove(&model->mapping_sizes, address, NULL);
    gm_hash_map_remove(&model->mapping_handles, address, &handle);
    reservation *range = find_reservation(model, address, size);
    set_pages(range, (address - range->base) / model->page_size, size / model->page_size, false);
    physical_memory *memory = find_physical(model, handle);
    if (memory && --memory->mappings == 0 && memory->released)
        forget_physical(model, handle, memory);
    return GM_OK;
}

static void forget_stream_if_idle(gm_device_model *model, simulated_stream *queue);

/* `event` no longer waits on its stream (whose record the caller may then forget). */
static void detach_from_stream(simulated_event *event)
{
    event->stream->waiting_events--;
    event->stream = NULL;
}

/* After a device-wide wait every stream has run all its work: each event recorded outside a capture is
 * done and lets go of its stream, and the streams left with nothing to keep are forgotten. Their names
 * are gathered first (removing entries would disturb the walk); without host memory for the list they
 * stay remembered, which changes no answer the model gives. */
static void settle_every_stream(gm_device_model *model)
{
    for (size_t i = 0; i < model->event_count; i++) {
        simulated_event *event = &model->events[i];
        if (event->in_use && event->stream && !event->captured)
            detach_from_stream(event);
    }
    size_t count = 0;
    simulated_stream **idle = gm_system_calloc(model->streams.count + 1, sizeof *idle);
    if (!idle)
        return;
    for (size_t i = 0; i < model->streams.capacity; i++)
        if (model->streams.entries[i].key)
            idle[count++] = (simulated_stream *)(uintptr_t)model->streams.entries[i].value;
    if (model->last_named_stream)
        idle[count++] = model->last_named_stream;
    for (size_t i = 0; i < count; i++)
        forget_stream_if_idle(model, idle[i]);
    free(idle);
}

/* Every stream's queued work completes; *finished_out (if given) counts the units it finished early. */
static gm_status wait_for_every_stream(gm_device_model *model, uint64_t *finished_out)
{
    simulated_stream *last = model->last_named_stream;
    for (size_t i = 0; i < model->streams.capacity; i++) {
        simulated_stream *queue = (simulated_stream *)(uintptr_t)model->streams.entries[i].value;
        if (model->streams.entries[i].key && queue->capturing)
            return gm_fail(GM_ERROR_DEVICE, "a device-wide wait while stream %" PRIuPTR " is being captured "
                           "(it would invalidate the capture)", queue->stream);
    }
    if (last && last->capturing)
        return gm_fail(GM_ERROR_DEVICE, "a device-wide wait while a stream is being captured");
    uint64_t finished = 0;
    for (size_t i = 0; i < model->streams.capacity; i++) {
        simulated_stream *queue = (simulated_stream *)(uintptr_t)model->streams.entries[i].value;
        if (model->streams.entries[i].key) {
            finished += queue->enqueued - queue->completed;
            queue->completed = queue->enqueued;
        }
    }
    if (last) {
        finished += last->enqueued - last->completed;
        last->completed = last->enqueued;
    }
    settle_every_stream(model);
    if (finished_out)
        *finished_out = finished;
    return GM_OK;
}

gm_status gm_device_model_copy_into(gm_device_model *model, uint64_t handle, uint64_t size, uintptr_t source)
{
    physical_memory *memory = find_physical(model, handle);
    if (!memory || memory->released || memory->mappings || memory->size != size)
        return gm_fail(GM_ERROR_DEVICE, "copy of %" PRIu64 " bytes into physical handle %" PRIu64 ", which is not a "
                       "live, unmapped allocation of that size", size, handle);
    reservation *range = find_reservation(model, source, size);
    if (!range || source % model->page_size ||
        !all_pages_mapped(range, (source - range->base) / model->page_size, size / model->page_size))
        return gm_fail(GM_ERROR_DEVICE, "copy from 0x%" PRIxPTR "+%" PRIu64 ", which is not entirely mapped",
                       source, size);
    return wait_for_every_stream(model, NULL);
}

/* ---------------------------------------------------------------- streams and events */

static simulated_stream *find_stream(gm_device_model *model, gm_stream stream)
{
    if (stream == UINTPTR_MAX)
        return model->last_named_stream;
    uint64_t value = 0;
    return gm_hash_map_get(&model->streams, (uint64_t)stream + 1, &value) ? (simulated_stream *)(uintptr_t)value : NULL;
}

/* Whether `stream` was destroyed (gm_model_stream_destroy); each such call is counted. */
static bool named_destroyed(gm_device_model *model, gm_stream stream)
{
    for (size_t i = 0; i < model->destroyed_count; i++)
        if (model->destroyed[i] == stream) {
            model->calls_on_destroyed_streams++;
            return true;
        }
    return false;
}

/* The record of `stream`, made if new; NULL without host memory. */
static simulated_stream *stream_record(gm_device_model *model, gm_stream stream)
{
    simulated_stream *queue = find_stream(model, stream);
    if (queue)
        return queue;
    queue = gm_system_calloc(1, sizeof *queue);
    if (!queue)
        return NULL;
    queue->stream = stream;
    if (stream == UINTPTR_MAX) {
        model->last_named_stream = queue;
    } else if (!gm_hash_map_put(&model->streams, (uint64_t)stream + 1, (uint64_t)(uintptr_t)queue)) {
        free(queue);
        return NULL;
    }
    return queue;
}

/* Drop the record of a stream that is as good as never seen: nothing pending, captured or waited on. */
static void forget_stream_if_idle(gm_device_model *model, simulated_stream *queue)
{
    if (queue->waiting_events || queue->capturing || queue->completed != queue->enqueued)
        return;
    if (queue->stream == UINTPTR_MAX)
        model->last_named_stream = NULL;
    else
        gm_hash_map_remove(&model->streams, (uint64_t)queue->stream + 1, NULL);
    free(queue);
}

/* An event no longer waits on its stream: destroyed, recorded elsewhere, or found done. */
static void let_go_of_stream(gm_device_model *model, simulated_event *event)
{
    simulated_stream *queue = event->stream;
    if (!queue)
        return;
    detach_from_stream(event);
    forget_stream_if_idle(model, queue);
}

/* Once a stream has run all its work, every event recorded on it is done, whether or not anyone asked:
 * they let go of it, so that its record goes (the driver keeps nothing for a stream with nothing left to
 * run). An allocator need not ask about each event: one that knows a later event of the stream is done
 * knows the earlier ones are. */
static void settle_stream(gm_device_model *model, simulated_stream *queue)
{
    for (size_t i = 0; i < model->event_count && queue->waiting_events && queue->completed == queue->enqueued; i++) {
        simulated_event *event = &model->events[i];
        if (event->in_use && event->stream == queue && !event->captured)
            detach_from_stream(event);
    }
    forget_stream_if_idle(model, queue);
}

static gm_device_model *model_of(gm_backend *backend)
{
    return *(gm_device_model **)backend->state;
}

static simulated_event *find_event(gm_device_model *model, uint64_t event)
{
    if (event == 0 || event > model->event_count || !model->events[event - 1].in_use)
        return NULL;
    return &model->events[event - 1];
}

gm_status gm_model_event_create(gm_backend *backend, uint64_t *event_out)
{
    gm_device_model *model = model_of(backend);
    for (size_t i = 0; i < model->event_count; i++) {
        if (!model->events[i].in_use) {
            model->events[i] = (simulated_event){.in_use = true};
            *event_out = i + 1;
            return GM_OK;
        }
    }
    simulated_event *grown = gm_system_realloc(model->events, (model->event_count + 1) * sizeof *grown);
    if (!grown)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for an event");
    model->events = grown;
    grown[model->event_count++] = (simulated_event){.in_use = true};
    *event_out = model->event_count;
    return GM_OK;
}

gm_status gm_model_event_destroy(gm_backend *backend, uint64_t event)
{
    gm_device_model *model = model_of(backend);
    simulated_event *found = find_event(model, event);
    if (!found)
        return gm_fail(GM_ERROR_DEVICE, "destroy of event %" PRIu64 ", which does not exist", event);
    let_go_of_stream(model, found);
    found->in_use = false;
    return GM_OK;
}

gm_status gm_model_event_record(gm_backend *backend, uint64_t event, gm_stream stream)
{
    gm_device_model *model = model_of(backend);
    simulated_event *found = find_event(model, event);
    if (!found)
        return gm_fail(GM_ERROR_DEVICE, "record of event %" PRIu64 ", which does not exist", event);
    if (named_destroyed(model, stream))
        return gm_fail(GM_ERROR_DEVICE, "record of an event on stream %" PRIuPTR ", which was destroyed", stream);
    simulated_stream *queue = stream_record(model, stream);
    if (!queue)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a stream");
    queue->waiting_events++; /* before letting go of the previous stream, which may be this one */
    let_go_of_stream(model, found);
    found->stream = queue;
    found->target = queue->enqueued;
    found->captured = queue->capturing;
    if (!found->captured && queue->completed == queue->enqueued)
        let_go_of_stream(model, found); /* recorded on a stream with nothing left to run: done already */
    return GM_OK;
}

gm_status gm_model_event_query(gm_backend *backend, uint64_t event, bool *done_out)
{
    gm_device_model *model = model_of(backend);
    simulated_event *found = find_event(model, event);
    if (!found)
        return gm_fail(GM_ERROR_DEVICE, "query of event %" PRIu64 ", which does not exist", event);
    if (found->captured)
        return gm_fail(GM_ERROR_DEVICE, "query of event %" PRIu64 ", recorded while its stream was being captured "
                       "(the capture is invalid now)", event);
    *done_out = !found->stream || found->stream->completed >= found->target;
    if (*done_out)
        let_go_of_stream(model, found);
    return GM_OK;
}

gm_status gm_model_event_synchronize(gm_backend *backend, uint64_t event)
{
    gm_device_model *model = model_of(backend);
    simulated_event *found = find_event(model, event);
    if (!found)
        return gm_fail(GM_ERROR_DEVICE, "synchronize on event %" PRIu64 ", which does not exist", event);
    if (found->captured)
        return gm_fail(GM_ERROR_DEVICE, "synchronize on event %" PRIu64 ", recorded while its stream was being "
                       "captured (the capture is invalid now)", event);
    simulated_stream *queue = found->stream;
    if (queue && queue->completed < found->target) { /* waiting lets the queued work finish */
        model->backend->work_waited_for += found->target - queue->completed;
        queue->completed = found->target;
    }
    if (queue && queue->completed == queue->enqueued)
        settle_stream(model, queue); /* the wait ran all its work: the stream's other events are done too */
    else
        let_go_of_stream(model, found);
    return GM_OK;
}

gm_status gm_model_stream_enqueue(gm_backend *backend, gm_stream stream, uint64_t units)
{
    gm_device_model *model = model_of(backend);
    if (named_destroyed(model, stream))
        return gm_fail(GM_ERROR_DEVICE, "work queued on stream %" PRIuPTR ", which was destroyed", stream);
    simulated_stream *queue = stream_record(model, stream);
    if (!queue)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a stream");
    queue->enqueued += units;
    forget_stream_if_idle(model, queue); /* no units: nothing to remember */
    return GM_OK;
}

gm_status gm_model_stream_complete(gm_backend *backend, gm_stream stream, uint64_t units_left)
{
    gm_device_model *model = model_of(backend);
    simulated_stream *queue = find_stream(model, stream);
    if (!queue)
        return GM_OK; /* never seen, or forgotten: nothing queued */
    if (queue->enqueued - queue->completed > units_left)
        queue->completed = queue->enqueued - units_left;
    settle_stream(model, queue);
    return GM_OK;
}

gm_status gm_model_stream_set_capturing(gm_backend *backend, gm_stream stream, bool capturing)
{
    gm_device_model *model = model_of(backend);
    simulated_stream *queue = stream_record(model, stream);
    if (!queue)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a stream");
    queue->capturing = capturing;
    forget_stream_if_idle(model, queue);
    return GM_OK;
}

bool gm_model_stream_is_capturing(gm_backend *backend, gm_stream stream)
{
    if (named_destroyed(model_of(backend), stream))
        return false;
    const simulated_stream *queue = find_stream(model_of(backend), stream);
    return queue && queue->capturing;
}

bool gm_model_stream_is_busy(gm_backend *backend, gm_stream stream)
{
    if (named_destroyed(model_of(backend), stream))
        return true; /* as an error reads */
    const simulated_stream *queue = find_stream(model_of(backend), stream);
    return queue && queue->completed != queue->enqueued;
}

gm_status gm_model_synchronize(gm_backend *backend)
{
    uint64_t finished = 0;
    gm_status status = wait_for_every_stream(model_of(backend), &finished);
    if (status == GM_OK)
        backend->work_waited_for += finished;
    return status;
}

gm_status gm_model_stream_destroy(gm_backend *backend, gm_stream stream)
{
    gm_device_model *model = model_of(backend);
    if (model->destroyed_count == MAX_DESTROYED_STREAMS)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "the model remembers at most %d destroyed streams",
                       MAX_DESTROYED_STREAMS);
    simulated_stream *queue = find_stream(model, stream);
    if (queue) { /* as on a GPU, the work queued on it still runs to its end */
        queue->completed = queue->enqueued;
        settle_stream(model, queue);
    }
    model->destroyed[model->destroyed_count++] = stream;
    return GM_OK;
}

gm_model_footprint gm_model_footprint_of(gm_backend *backend)
{
    gm_device_model *model = model_of(backend);
    gm_model_footprint footprint = {.streams = model->streams.count + (model->last_named_stream != NULL),
                                    .reservations = model->reservation_count,
                                    .returned_ranges = gm_sim_returned_range_count(backend),
                                    .calls_on_destroyed_streams = model->calls_on_destroyed_streams};
    for (size_t i = 0; i < model->event_count; i++)
        footprint.events += model->events[i].in_use;
    return footprint;
}

/* ---------------------------------------------------------------- model-only backend operations */

/* What a simulated device cannot be; GM_OK if it can be. */
static gm_status check_device(const gm_backend *backend, const gm_backend_config *config, uint64_t capacity)
{
    const char *name = backend->operations->name;
    if (config->device != 0)
        return gm_fail(GM_ERROR_NO_DEVICE, "%s backend: device %d does not exist (the %s backend has one device, 0)",
                       name, config->device, name);
    if (config->page_size == 0)
        return gm_fail(GM_ERROR_BAD_CONFIG, "%s backend: a page size of 0 bytes", name);
    char capacity_text[32], page_text[32];
    gm_format_bytes(capacity_text, sizeof capacity_text, capacity);
    gm_format_bytes(page_text, sizeof page_text, config->page_size);
    if (config->page_size > capacity)
        return gm_fail(GM_ERROR_BAD_CONFIG, "%s backend: page_size (%s) is larger than the capacity (%s): no page "
                       "could be made", name, page_text, capacity_text);
    /* The pages engine keeps an entry for every page of each address range it reserves (twice the
     * device): the bound keeps those tables small enough to allocate at once. */
    uint64_t pages = capacity / config->page_size;
    if (pages > GM_MAX_DEVICE_PAGES)
        return gm_fail(GM_ERROR_BAD_CONFIG, "%s backend: a capacity of %s in pages of %s is %" PRIu64 " pages, more "
                       "than the %llu supported: raise page_size or lower capacity", name, capacity_text, page_text,
                       pages, GM_MAX_DEVICE_PAGES);
    return GM_OK;
}

gm_status gm_model_backend_open(gm_backend *backend, void *state, const gm_backend_config *config,
                                uint64_t default_capacity, bool charges_cost)
{
    uint64_t capacity = config->capacity ? config->capacity : default_capacity;
    uint64_t page_size = config->page_size;
    gm_status status = check_device(backend, config, capacity);
    if (status != GM_OK) {
        free(state);
        return status;
    }
    backend->state = state;
    backend->total_bytes = capacity;
    backend->page_size = page_size;
    backend->supports_virtual_memory = true;
    backend->charges_cost = charges_cost;
    status = gm_device_model_create(backend, capacity, page_size, (gm_device_model **)state);
    if (status != GM_OK) {
        free(state);
        backend->state = NULL;
    }
    return status;
}

void gm_model_close(gm_backend *backend)
{
    if (!backend->state)
        return;
    gm_device_model_destroy(model_of(backend));
    free(backend->state);
    backend->state = NULL;
}

gm_status gm_model_memory_info(gm_backend *backend, uint64_t *free_out, uint64_t *total_out)
{
    *total_out = backend->total_bytes;
    *free_out = backend->total_bytes - gm_device_model_used_bytes(model_of(backend)) - backend->used_elsewhere;
    return GM_OK;
}
