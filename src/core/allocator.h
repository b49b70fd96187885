/*
 * allocator.h -- the front end's state, for the front end's files alone (allocator.c, validate.c,
 * device.c, pressure.c, host_cache.c, private_pool.c), and what it lends the rest of core: its lock around the arena, and the
 * readings that need it held. The engines never include this header: they see the arena.
 */
#ifndef GM_ALLOCATOR_H
#define GM_ALLOCATOR_H

#include "core/arena.h"

#include "base/hash_map.h"
#include "base/lock.h"
#include "core/host_cache.h"
#include "core/pressure.h"
#include "monitor/publish.h"

/* A freed block waiting for one stream's event (one node per recorded stream). */
typedef struct gm_pending_free {
    gm_block *block;
    uint64_t event;
    gm_stream stream; /* where the event was recorded */
    struct gm_pending_free *next;
} gm_pending_free;

/* The pending frees of one stream, in the order their events were recorded (the stream's order). */
typedef struct gm_pending_queue {
    gm_stream stream;
    gm_pending_free *head; /* oldest first */
    gm_pending_free *tail;
    struct gm_pending_queue *next;
} gm_pending_queue;

/* A private pool being allocated to (gm_begin_allocate_to_pool), with its stream filter. */
typedef struct gm_pool_route {
    gm_private_pool *pool;
    gm_stream_filter filter;
    void *context;
} gm_pool_route;

/* The front end's state: the arena the engine works on, and what only the front end knows. */
struct gm_allocator {
    /* What every call reads comes first, a cache line each: these fields, the arena's first ones, the
     * options' first ones and the pressure watch. In an interpreter's loop the processor's caches keep
     * little of gpumem between two calls, and each line read costs a trip to a slower cache. */
    gm_lock lock;
    uint32_t unlocked_allocations; /* allocations waiting for pressure callbacks, lock released */
    bool pools_to_forget;          /* a gone pool waits for those to finish */
    size_t pool_route_count;       /* the pools being allocated to (pool_routes) */
    gm_pending_queue *pending_queues; /* the streams with freed blocks waiting for their events */
    gm_seqlock_writer *published;  /* the statistics region's seqlock (publish:true), or NULL */
    gm_hash_map live_blocks;       /* address -> allocated block */
    _Alignas(64) gm_arena arena;
    _Alignas(64) gm_options options;
    _Alignas(64) gm_pressure pressure; /* the pressure policy, level and callbacks (pressure.c) */

    bool exclusive_device;  /* sim/host: nobody else uses the device, so its used bytes are ours */
    gm_pending_queue *spare_queues; /* recycled queues */
    gm_hash_map queue_of_stream;    /* stream + 1 -> its queue in pending_queues (a stream of UINTPTR_MAX: none) */
    gm_pending_free *spare_pending; /* recycled list nodes */
    uint64_t *spare_events;         /* pooled backend events */
    size_t spare_event_count;
    size_t spare_event_capacity;
    gm_stats own_stats;            /* the statistics (the five hot ones: arena.hot_stats), unless they are kept in
                                      the published region */
    gm_publisher *publisher;       /* publish:true and its region was made; else NULL */
    gm_status publish_status;      /* why there is no publisher */
    char publish_error[512];
    uint32_t publish_countdown;    /* calls until the device-call counts are published again */
    int64_t published_memory_calls; /* the backend's memory_calls when they were published last */
    gm_host_cache host_cache;      /* the pinned host memory cache (host_cache.c), under `lock` */
    gm_private_pool *private_pools; /* every private pool that exists (private_pool.c) */
    gm_pool_route *pool_routes;     /* the pools being allocated to, in the order begun */
    size_t pool_route_capacity;
    bool destroying;               /* gm_destroy: no pool is forgotten one by one */
    struct gm_opened_share *opened_shares; /* memory of other processes mapped here (sharing.c) */
    size_t opened_share_count;
    size_t opened_share_capacity;
    struct gm_named_stream_entry *named_streams; /* gm_named_stream's streams (device.c) */
    size_t named_stream_count;
    gm_pending_free *held_for_capture; /* frees with recorded streams made while a pool was allocated to:
                                          their events wait for the end of the capture (event 0) */
};


/* Lock the allocator and give its arena; gm_unlock_arena ends it. */
gm_arena *gm_lock_arena(gm_allocator *allocator);
void gm_unlock_arena(gm_allocator *allocator);
/* Lock the allocator and open its statistics for change (the published region's seqlock bracket), and
 * the reverse: for changes made outside allocator.c (pressure.c). */
void gm_lock_for_change(gm_allocator *allocator);
void gm_unlock_after_change(gm_allocator *allocator);
/* Freeing (pending_frees.c), lock held. A block neither allocated nor awaited any more goes back to
 * the engine (retire). A free used on other streams waits for an event recorded on each (defer);
 * pending frees whose events are done are completed (process; with `wait`, after waiting for all).
 * During a capture the events wait too (hold), until the last pool stops being allocated to (release). */
void gm_retire_block_locked(gm_allocator *allocator, gm_block *block);
gm_status gm_defer_free_locked(gm_allocator *allocator, gm_block *block, gm_stream stream);
/* A freed block whose streams were recorded: a pending free on each of them, the block reused once all
 * have passed the free; with none, retired at once. When no event can be had, every pending free is
 * waited for instead. */
void gm_free_after_recorded_streams_locked(gm_allocator *allocator, gm_block *block);
void gm_process_pending_frees_locked(gm_allocator *allocator, bool wait);
/* A backend event from the allocator's pool (made if the pool is empty), and its return (lock held). */
gm_status gm_take_event_locked(gm_allocator *allocator, uint64_t *event_out);
void gm_return_event_locked(gm_allocator *allocator, uint64_t event);
gm_status gm_hold_free_for_capture_locked(gm_allocator *allocator, gm_block *block);
void gm_release_frees_held_for_capture_locked(gm_allocator *allocator);
/* At gm_destroy: complete the pending frees whose events could not be waited for (a stream still
 * capturing, a device that fails), so that nothing is left behind (drop); then free the recycled nodes
 * and queues and the map from streams to queues (free_spare). */
void gm_drop_pending_frees_locked(gm_allocator *allocator);
void gm_free_spare_pending_locked(gm_allocator *allocator);
/* Wait for the streams of every pending cross-stream free, so that their blocks become free memory
 * (lock held; counted in num_sync_all_streams). */
void gm_wait_for_pending_frees_locked(gm_allocator *allocator);
/* The heap a request on `stream` is served from: a private pool's when one being allocated to
 * accepts the stream, else the stream's own; NULL without host memory (private_pool.c). */
gm_heap *gm_heap_for_request_locked(gm_allocator *allocator, gm_stream stream);
/* A block of `pool` went back to the engine; the pool may be gone now. */
void gm_pool_block_retired_locked(gm_allocator *allocator, gm_private_pool *pool);
/* Let the pools marked use_on_oom lend their free memory to every heap (`lend`), or stop; whether any
 * pool is marked so (private_pool.c). */
bool gm_lend_pools_locked(gm_allocator *allocator, bool lend);
/* Drop the pools that are gone but had to wait (pools_to_forget). */
void gm_forget_gone_pools_locked(gm_allocator *allocator);
/* Free the pool structs and routes (gm_destroy, after the engine gave everything back). */
void gm_free_private_pools(gm_allocator *allocator);
/* Destroy the streams gm_named_stream made (gm_destroy, before the backend closes). */
void gm_destroy_named_streams(gm_allocator *allocator);
/* Unmap whatever gm_open_shared mapped and was not closed (gm_destroy). */
void gm_close_all_shared(gm_allocator *allocator);
/* The books of a block the engine just allocated in `heap` for `requested` bytes on `stream`: statistics,
 * history, the heap's and its pool's live counts (lock held, statistics open for change). */
void gm_count_new_allocation_locked(gm_allocator *allocator, gm_heap *heap, gm_block *block, size_t requested,
                                    gm_stream stream);
/* gm_cache_info with the lock held (cache_info.c). */
void gm_cache_info_locked(gm_allocator *allocator, uint64_t *free_bytes_out, uint64_t *largest_block_out);
/* gm_get_stats and gm_get_device_info with the lock held. */
void gm_read_stats_locked(gm_allocator *allocator, gm_stats *stats_out);
gm_status gm_read_device_info_locked(gm_allocator *allocator, gm_device_info *info_out);

#endif
