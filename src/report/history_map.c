/*
 * history_map.c -- rebuilding the memory map at one moment from a history (history_map.h).
 *
 * No lookup tables: the mapping events up to the moment are sorted by (address, order), and the last
 * event of each address says whether it is mapped then; the same for the block events and whether a
 * block is allocated, pending or gone. The mappings, in address order, are joined into regions; the
 * live blocks, in address order, are laid into them, with free blocks for the gaps. A block that
 * overlaps the one before it or runs past its region (possible only in an inconsistent history) is cut
 * to fit, so that the blocks always tile their region.
 */
#include "report/history_map.h"

#include "base/array.h"
#include "base/error.h"
#include "base/system_memory.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The front end rounds every request up to a multiple of 512 bytes (docs/design.md). */
enum { ROUNDING = 512 };

typedef struct located_event {
    uint64_t address;
    size_t order; /* index in the history */
    uint64_t size;
    gm_stream stream;
    gm_event_kind kind;
} located_event;

static int by_address_then_order(const void *left, const void *right)
{
    const located_event *a = left, *b = right;
    if (a->address != b->address)
        return a->address < b->address ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

/* The events up to `last` of the given kinds, sorted; then only the last of each address, and only if
 * it is of a kind in `holding`. Returns how many remain in *out (malloc'd). */
static size_t live_at(const gm_event *events, size_t last, const gm_event_kind *kinds, size_t kind_count,
                      const gm_event_kind *holding, size_t holding_count, located_event **out)
{
    size_t count = 0;
    for (size_t i = 0; i <= last; i++)
        for (size_t k = 0; k < kind_count; k++)
            count += events[i].kind == kinds[k];
    located_event *located = gm_system_malloc((count ? count : 1) * sizeof *located);
    *out = located;
    if (!located)
        return 0;
    count = 0;
    for (size_t i = 0; i <= last; i++)
        for (size_t k = 0; k < kind_count; k++)
            if (events[i].kind == kinds[k])
                located[count++] = (located_event){events[i].address, i, events[i].size, events[i].stream,
                                                   events[i].kind};
    qsort(located, count, sizeof *located, by_address_then_order);
    size_t kept = 0;
    for (size_t i = 0; i < count; i++) {
        if (i + 1 < count && located[i + 1].address == located[i].address)
            continue; /* a later event of this address decides */
        for (size_t h = 0; h < holding_count; h++)
            if (located[i].kind == holding[h] && located[i].size > 0)
                located[kept++] = located[i];
    }
    return kept;
}

typedef struct map_builder {
    gm_snapshot *map;
    size_t block_capacity;
    bool failed;
} map_builder;

static void add_block(map_builder *builder, gm_snapshot_region *region, uint64_t address, uint64_t size,
                      uint64_t requested, gm_block_kind kind)
{
    gm_snapshot *map = builder->map;
    if (builder->failed || size == 0)
        return;
    gm_snapshot_block *grown = gm_array_room_for_one(map->blocks, map->block_count, &builder->block_capacity,
                                                     sizeof *grown, 256);
    if (!grown) {
        builder->failed = true;
        return;
    }
    map->blocks = grown;
    map->blocks[map->block_count++] = (gm_snapshot_block){address, size, requested, kind};
    region->block_count++;
}

/* Lay the live blocks (sorted) into the region, from *next_block on; gaps become free blocks. */
static void fill_region(map_builder *builder, gm_snapshot_region *region, const located_event *blocks,
                        size_t block_count, size_t *next_block)
{
    uint64_t end = region->address + region->size, cursor = region->address;
    region->first_block = builder->map->block_count;
    size_t i = *next_block;
    while (i < block_count && blocks[i].address < region->address)
        i++; /* blocks outside every mapping: the history is not whole */
    for (; i < block_count && blocks[i].address < end; i++) {
        const located_event *block = &blocks[i];
        uint64_t size = block->size + (ROUNDING - block->size % ROUNDING) % ROUNDING;
        if (size < block->size)
            size = block->size;
        uint64_t start = block->address > cursor ? block->address : cursor;
        uint64_t stop = size > end - block->address ? end : block->address + size;
        if (stop <= start)
            continue;
        add_block(builder, region, cursor, start - cursor, 0, GM_BLOCK_KIND_FREE);
        gm_block_kind kind = block->kind == GM_EVENT_ALLOC ? GM_BLOCK_KIND_ALLOCATED : GM_BLOCK_KIND_PENDING;
        add_block(builder, region, start, stop - start, block->size, kind);
        cursor = stop;
    }
    add_block(builder, region, cursor, end - cursor, 0, GM_BLOCK_KIND_FREE);
    *next_block = i;
}

size_t gm_history_operation_end(const gm_event *events, size_t count, size_t index)
{
    if (index + 1 < count && events[index].kind == GM_EVENT_SEGMENT_MAP && events[index + 1].kind == GM_EVENT_ALLOC)
        return index + 1;
    return index;
}

gm_status gm_history_map(const gm_event *events, size_t count, size_t last, gm_snapshot **map_out)
{
    *map_out = NULL;
    if (!events || last >= count)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_history_map: no event %zu in a history of %zu", last, count);
    static const gm_event_kind mapping_kinds[] = {GM_EVENT_SEGMENT_MAP, GM_EVENT_SEGMENT_UNMAP};
    static const gm_event_kind block_kinds[] = {GM_EVENT_ALLOC, GM_EVENT_FREE_REQUESTED, GM_EVENT_FREE_COMPLETED};
    static const gm_event_kind live_block_kinds[] = {GM_EVENT_ALLOC, GM_EVENT_FREE_REQUESTED};
    located_event *mappings = NULL, *blocks = NULL;
    size_t mapping_count = live_at(events, last, mapping_kinds, 2, mapping_kinds, 1, &mappings);
    size_t block_count = live_at(events, last, block_kinds, 3, live_block_kinds, 2, &blocks);
    map_builder builder = {.map = gm_system_calloc(1, sizeof(gm_snapshot))};
    gm_snapshot *map = builder.map;
    if (map)
        map->regions = gm_system_calloc(mapping_count ? mapping_count : 1, sizeof *map->regions);
    builder.failed = !mappings || !blocks || !map || !map->regions;
    size_t next_block = 0;
    uint64_t previous_end = 0;
    for (size_t m = 0; m < mapping_count && !builder.failed;) {
        if (map->region_count && mappings[m].address < previous_end) {
            m++; /* overlaps the previous region (an inconsistent history): left out */
            continue;
        }
        /* One region: this mapping and the following ones that continue it on the same stream. */
        uint64_t start = mappings[m].address, end = start;
        gm_stream stream = mappings[m].stream;
        for (; m < mapping_count && mappings[m].address == end && mappings[m].stream == stream &&
               mappings[m].size <= UINT64_MAX - end;
             m++)
            end += mappings[m].size;
        if (end == start) { /* runs past the largest address (an inconsistent history): left out */
            m++;
            continue;
        }
        previous_end = end;
        gm_snapshot_region *region = &map->regions[map->region_count++];
        *region = (gm_snapshot_region){.address = start, .size = end - start, .mapped_bytes = end - start,
                                       .stream = stream, .pool = GM_POOL_ALL};
        fill_region(&builder, region, blocks, block_count, &next_block);
    }
    free(mappings);
    free(blocks);
    if (builder.failed) {
        gm_history_map_free(map);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the memory map");
    }
    *map_out = map;
    return GM_OK;
}

void gm_history_map_free(gm_snapshot *map)
{
    if (!map)
        return;
    free(map->regions);
    free(map->blocks);
    free(map);
}

gm_status gm_history_peak_build(const gm_event *events, size_t count, bool whole, size_t max_buckets,
                                gm_history_peak *out)
{
    *out = (gm_history_peak){0};
    gm_status status = gm_memory_curve_from_events(&out->curve, max_buckets, events, count, &out->allocated_baseline,
                                                   &out->reserved_baseline);
    if (status != GM_OK)
        return status;
    if (count == 0)
        return GM_OK;
    out->moment = gm_history_operation_end(events, count, (size_t)out->curve.peak_reserved_x);
    if (whole)
        status = gm_history_map(events, count, out->moment, &out->map);
    if (status != GM_OK)
        gm_history_peak_free(out);
    return status;
}

void gm_history_peak_free(gm_history_peak *peak)
{
    gm_history_map_free(peak->map);
    gm_memory_curve_free(&peak->curve);
    *peak = (gm_history_peak){0};
}
