/*
 * snapshot.c -- the allocator's state at one moment (gm_snapshot_take) and its recent past (the
 * history ring), for memory_viz-style views, reports and tools that look from outside.
 *
 * A snapshot walks every heap's regions and their blocks under the allocator's lock, twice: once to
 * count (so each array is allocated in one piece) and once to fill. It sees the
 * engines' regions as they are: a device segment, or a reserved virtual range whose unmapped blocks
 * are addresses without memory; a region of a growth lane is marked as such. Memory an engine made
 * ahead of need under an unmapped block (the pages engine's waiting pages) is shown as free blocks
 * where it lies (describe_unmapped), so that the regions' mapped bytes add up to reserved_bytes.
 */
#include "core/allocator.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>
#include <string.h>

static gm_block_kind kind_of(const gm_block *block)
{
    switch (block->state) {
    case GM_BLOCK_ALLOCATED:
        return GM_BLOCK_KIND_ALLOCATED;
    case GM_BLOCK_PENDING:
        return GM_BLOCK_KIND_PENDING;
    case GM_BLOCK_UNMAPPED:
    case GM_BLOCK_HELD: /* its memory is shown where it is reached (stitching.c) */
        return GM_BLOCK_KIND_UNMAPPED;
    default:
        return GM_BLOCK_KIND_FREE;
    }
}

/* The parts of an unmapped block, written from out[0] on unless `out` is NULL: how many. Memory the
 * engine made ahead of need under it is shown as free blocks: mapped memory no allocation holds, which
 * is what it is; shown as unmapped, it would leave the regions' mapped bytes short of reserved_bytes.
 * The rest of the block is unmapped addresses. */
static size_t describe_unmapped(const gm_arena *arena, const gm_block *block, gm_snapshot_block *out)
{
    uintptr_t end = block->address + block->size;
    size_t count = 0;
    for (uintptr_t from = block->address, to; from < end; from = to, count++) {
        bool reserved = false;
        to = arena->engine->unmapped_part_end(arena, block, from, &reserved);
        if (to <= from || to > end) /* an engine's fault: the rest shown as one part, not a loop */
            to = end;
        if (out)
            out[count] = (gm_snapshot_block){from, to - from, 0,
                                             reserved ? GM_BLOCK_KIND_FREE : GM_BLOCK_KIND_UNMAPPED};
    }
    return count;
}

/* The snapshot's blocks for `block`, written from out[0] on unless `out` is NULL (the counting pass):
 * how many. One, but for an unmapped block of an engine that may make memory ahead of need. */
static size_t describe_block(const gm_arena *arena, const gm_block *block, gm_snapshot_block *out)
{
    gm_block_kind kind = kind_of(block);
    if (kind == GM_BLOCK_KIND_UNMAPPED && arena->engine->unmapped_part_end)
        return describe_unmapped(arena, block, out);
    bool live = kind == GM_BLOCK_KIND_ALLOCATED || kind == GM_BLOCK_KIND_PENDING;
    if (out)
        *out = (gm_snapshot_block){block->address, block->size, live ? block->requested : 0, kind};
    return 1;
}

static void count_regions(const gm_arena *arena, size_t *regions_out, size_t *blocks_out)
{
    *regions_out = *blocks_out = 0;
    for (size_t h = 0; h < arena->heap_count; h++)
        for (const gm_region *region = gm_first_region(arena->heaps[h]); region; region = gm_next_region(region)) {
            (*regions_out)++;
            for (const gm_block *block = region->first_block; block; block = block->next)
                *blocks_out += describe_block(arena, block, NULL);
        }
}

static void fill_regions(const gm_arena *arena, gm_snapshot *snapshot)
{
    size_t r = 0, b = 0;
    for (size_t h = 0; h < arena->heap_count; h++) {
        const gm_heap *heap = arena->heaps[h];
        for (const gm_region *region = gm_first_region(heap); region; region = gm_next_region(region), r++) {
            gm_snapshot_region *out = &snapshot->regions[r];
            *out = (gm_snapshot_region){.address = region->base, .size = region->size, .stream = heap->stream,
                                        .pool = region->pool, .growth_lane = heap->engine_private,
                                        .private_pool = gm_heap_pool_id(heap),
                                        .first_block = b};
            for (const gm_block *block = region->first_block; block; block = block->next)
                out->block_count += describe_block(arena, block, &snapshot->blocks[b + out->block_count]);
            for (size_t i = b; i < b + out->block_count; i++) {
                const gm_snapshot_block *shown = &snapshot->blocks[i];
                out->mapped_bytes += shown->kind == GM_BLOCK_KIND_UNMAPPED ? 0 : shown->size;
            }
            b += out->block_count;
        }
    }
}

gm_status gm_snapshot_take(gm_allocator *allocator, gm_snapshot **snapshot_out)
{
    if (!allocator || !snapshot_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_snapshot_take: %s is NULL", allocator ? "snapshot_out" : "allocator");
    gm_snapshot *snapshot = gm_system_calloc(1, sizeof *snapshot);
    if (!snapshot)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a snapshot");
    gm_arena *arena = gm_lock_arena(allocator);
    count_regions(arena, &snapshot->region_count, &snapshot->block_count);
    snapshot->regions = gm_system_calloc(snapshot->region_count ? snapshot->region_count : 1, sizeof *snapshot->regions);
    snapshot->blocks = gm_system_calloc(snapshot->block_count ? snapshot->block_count : 1, sizeof *snapshot->blocks);
    gm_status status = snapshot->regions && snapshot->blocks ? GM_OK
                                                             : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a snapshot");
    if (status == GM_OK) {
        fill_regions(arena, snapshot);
        gm_read_stats_locked(allocator, &snapshot->stats);
        status = gm_read_device_info_locked(allocator, &snapshot->device);
    }
    gm_unlock_arena(allocator);
    if (status != GM_OK) {
        gm_snapshot_free(snapshot);
        return status;
    }
    *snapshot_out = snapshot;
    return GM_OK;
}

void gm_snapshot_free(gm_snapshot *snapshot)
{
    if (!snapshot)
        return;
    free(snapshot->regions);
    free(snapshot->blocks);
    free(snapshot);
}

const char *gm_event_name(gm_event_kind kind)
{
    static const char *const names[GM_EVENT_KIND_COUNT] = {
        [GM_EVENT_ALLOC] = "alloc",           [GM_EVENT_FREE_REQUESTED] = "free_requested",
        [GM_EVENT_FREE_COMPLETED] = "free_completed", [GM_EVENT_SEGMENT_MAP] = "segment_map",
        [GM_EVENT_SEGMENT_UNMAP] = "segment_unmap",   [GM_EVENT_OOM] = "oom",
        [GM_EVENT_PRESSURE_HIGH] = "pressure_high",   [GM_EVENT_PRESSURE_CRITICAL] = "pressure_critical",
        [GM_EVENT_PRESSURE_NORMAL] = "pressure_normal", [GM_EVENT_PRESSURE_RELEASE] = "pressure_release",
        [GM_EVENT_PRESSURE_CALLBACKS] = "pressure_callbacks",
    };
    return (unsigned)kind < GM_EVENT_KIND_COUNT ? names[kind] : "unknown";
}

gm_status gm_history_read(gm_allocator *allocator, gm_event *events, size_t capacity, size_t *count_out,
                          uint64_t *dropped_out)
{
    if (!allocator || !count_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_history_read: %s is NULL", allocator ? "count_out" : "allocator");
    gm_arena *arena = gm_lock_arena(allocator);
    gm_status status = GM_OK;
    uint64_t dropped = 0;
    *count_out = 0;
    if (arena->history && arena->history->capacity)
        gm_history_copy(arena->history, events, capacity, count_out, &dropped);
    else
        status = gm_fail(GM_ERROR_NOT_SUPPORTED, "this allocator keeps no history (GPUMEM_CONF history:N, N > 0)");
    gm_unlock_arena(allocator);
    if (dropped_out)
        *dropped_out = dropped;
    return status;
}

/* A new ring of `capacity` events in place of the arena's history, with its tagger and observer (and,
 * with `keep_events`, its newest events that fit). Made outside the lock; a ring of 0 events stays only
 * for an observer. */
static gm_status set_history(gm_allocator *allocator, size_t capacity, bool keep_events, const char *call)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", call);
    if (capacity > GM_HISTORY_MAX_EVENTS)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: %zu events is more than the %zu a history holds", call,
                       capacity, GM_HISTORY_MAX_EVENTS);
    gm_history *fresh = gm_history_create(capacity);
    if (!fresh)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a history of %zu events", capacity);
    gm_arena *arena = gm_lock_arena(allocator);
    gm_history *old = arena->history, *unused = NULL;
    if (old) {
        if (keep_events)
            gm_history_keep_newest(fresh, old);
        fresh->tagger = old->tagger;
        fresh->tagger_context = old->tagger_context;
        fresh->observer = old->observer;
        fresh->observer_context = old->observer_context;
    }
    if (!fresh->capacity && !fresh->observer) {
        unused = fresh;
        fresh = NULL;
    }
    arena->history = fresh;
    gm_unlock_arena(allocator);
    gm_history_destroy(old);
    gm_history_destroy(unused);
    return GM_OK;
}

gm_status gm_set_history(gm_allocator *allocator, size_t capacity)
{
    return set_history(allocator, capacity, false, "gm_set_history");
}

gm_status gm_resize_history(gm_allocator *allocator, size_t capacity)
{
    return set_history(allocator, capacity, true, "gm_resize_history");
}

gm_status gm_history_capacity(gm_allocator *allocator, size_t *capacity_out)
{
    if (!allocator || !capacity_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_history_capacity: %s is NULL",
                       allocator ? "capacity_out" : "allocator");
    gm_arena *arena = gm_lock_arena(allocator);
    *capacity_out = arena->history ? arena->history->capacity : 0;
    gm_unlock_arena(allocator);
    return GM_OK;
}

gm_status gm_set_event_observer(gm_allocator *allocator, gm_event_observer observer, void *context)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_event_observer: allocator is NULL");
    gm_history *spare = gm_history_create(0); /* made outside the lock, in case there is no history yet */
    if (!spare)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the event observer");
    gm_arena *arena = gm_lock_arena(allocator);
    gm_history *history = arena->history;
    if (!history && observer) {
        history = arena->history = spare;
        spare = NULL;
    }
    if (history) {
        history->observer = observer;
        history->observer_context = context;
    }
    gm_history *gone = NULL;
    if (history && !observer && !history->capacity) {
        arena->history = NULL; /* a history kept only for the observer goes with it */
        gone = history;
    }
    gm_unlock_arena(allocator);
    gm_history_destroy(spare);
    gm_history_destroy(gone);
    return GM_OK;
}

gm_status gm_set_history_tagger(gm_allocator *allocator, uint64_t (*tagger)(void *context), void *context)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_history_tagger: allocator is NULL");
    gm_arena *arena = gm_lock_arena(allocator);
    gm_status status = GM_OK;
    if (arena->history) {
        arena->history->tagger = tagger;
        arena->history->tagger_context = context;
    } else {
        status = gm_fail(GM_ERROR_NOT_SUPPORTED, "this allocator keeps no history (GPUMEM_CONF history:N, N > 0)");
    }
    gm_unlock_arena(allocator);
    return status;
}
