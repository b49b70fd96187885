/*
 * history.h -- the history ring: the allocator's last N events, for memory_viz-style timelines, and
 * the event observer that sees each event as it happens.
 *
 * Off by default (GPUMEM_CONF history:0): the arena then holds no history and every recording site
 * costs one predictable branch on a NULL pointer. With history:N the ring keeps the newest N events
 * (allocations, frees requested and completed, segments or chunks mapped and unmapped, out-of-memory
 * failures), each with a monotonic timestamp, address, size, stream, private pool and the caller's tag
 * (a callback an adapter sets, to attach a stack id). The ring is allocated once, at creation:
 * recording allocates nothing. An observer (gm_set_event_observer: PyTorch's allocator trace trackers,
 * through which NCCL registers memory) is called with every event, with or without a ring; the history
 * then exists with a capacity of 0.
 */
#ifndef GM_HISTORY_H
#define GM_HISTORY_H

/* The largest ring: history:N and gm_set_history take at most this many events. */
#define GM_HISTORY_MAX_EVENTS ((size_t)1 << 20)

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gm_history {
    gm_event *events;
    size_t capacity;
    uint64_t recorded;  /* events ever recorded */
    uint64_t forgotten; /* the first of them, which a resize did not keep; the ring holds the last
                           min(recorded - forgotten, capacity) */
    uint64_t (*tagger)(void *context);
    void *tagger_context;
    gm_event_observer observer;
    void *observer_context;
} gm_history;

/* A ring of `capacity` events (0: no ring, for an observer alone); NULL without host memory. */
gm_history *gm_history_create(size_t capacity);
void gm_history_destroy(gm_history *history);

void gm_history_add(gm_history *history, gm_event_kind kind, uint64_t address, uint64_t size, gm_stream stream,
                    gm_pool_id pool);

/* Record an event when history is on or an observer is set. `pool`: the private pool whose memory it
 * concerns ({0, 0}: none). */
static inline void gm_history_record(gm_history *history, gm_event_kind kind, uint64_t address, uint64_t size,
                                     gm_stream stream, gm_pool_id pool)
{
    if (history)
        gm_history_add(history, kind, address, size, stream, pool);
}

#define GM_NO_POOL ((gm_pool_id){0, 0})

/* Put the newest events of `old` that fit into the empty ring `fresh`, which counts what `old` recorded
 * (so that what it no longer holds is counted as dropped). */
void gm_history_keep_newest(gm_history *fresh, const gm_history *old);

/* Copy the held events (of a ring of at least one event), oldest first, into `events` (at most `capacity`); *count_out: how many were
 * copied (with `events` NULL: how many it holds), *dropped_out: how many older ones the ring no longer
 * holds. */
void gm_history_copy(const gm_history *history, gm_event *events, size_t capacity, size_t *count_out,
                     uint64_t *dropped_out);

#endif
