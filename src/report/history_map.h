/*
 * history_map.h -- the memory map at one moment of a history, rebuilt from its events alone: what a
 * snapshot taken then would have shown, as far as the events tell it.
 *
 * The regions are the mappings held after events[0 .. last] (each `segment_map` not yet undone by a
 * `segment_unmap` of the same address), neighbouring mappings of one stream joined into one region. In
 * each region the blocks are those then allocated (an `alloc` not yet followed by `free_requested`) or
 * pending (freed, awaiting `free_completed`); the rest of the region is free. The events give the
 * bytes requested, not the block's size: a block is sized as requested rounded up to 512 bytes, as the
 * front end rounds, so a block the engine made larger (a remainder too small to split off) shows
 * its excess as free. Regions carry no pool (GM_POOL_ALL). Only a whole history (nothing dropped)
 * gives every mapping and block.
 */
#ifndef GM_HISTORY_MAP_H
#define GM_HISTORY_MAP_H

#include "gpumem.h"
#include "report/memory_curve.h"

#include <stdbool.h>
#include <stddef.h>

/* The last event of the operation that events[index] belongs to: an allocation's mapping events come
 * before its `alloc` event, so for a `segment_map` followed by an `alloc`, that alloc; else `index`.
 * The map after it shows the allocation that made the mapping. */
size_t gm_history_operation_end(const gm_event *events, size_t count, size_t index);

/* The map after events[0 .. last]; free it with gm_history_map_free. */
gm_status gm_history_map(const gm_event *events, size_t count, size_t last, gm_snapshot **map_out);
void gm_history_map_free(gm_snapshot *map);

/* What `gpumem report` draws of a history: its curve (gm_memory_curve_from_events, with its baselines)
 * and, when the history has events and is whole (its ring dropped none), the map after the operation
 * that first took reserved memory to its peak; `moment` is that operation's last event (0 for an empty
 * history). On a failure nothing is left to free. */
typedef struct gm_history_peak {
    gm_memory_curve curve;
    uint64_t allocated_baseline, reserved_baseline;
    size_t moment;
    gm_snapshot *map; /* NULL when there is no map to rebuild */
} gm_history_peak;

gm_status gm_history_peak_build(const gm_event *events, size_t count, bool whole, size_t max_buckets,
                                gm_history_peak *out);
void gm_history_peak_free(gm_history_peak *peak);

#endif
