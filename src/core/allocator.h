/*
 * allocator.h -- the front end's state, for the front end's files alone (allocator.c, validate.c,
 * device.c, pressure.c, host_cache.c), and what it lends the rest of core: its lock around the arena, and the
 * readings that need it held. The engines never include this header: they see the arena.
 */
#ifndef GM_ALLOCATOR_H
#define GM_ALLOCATOR_H

#include "core/arena.h"

#include "base/hash_map.h"
#include "core/host_cache.h"
#include "core/pressure.h"
#include "monitor/publish.h"

#include <pthread.h>

/* A freed block waiting for one stream's event (one node per recorded stream). */
typedef struct gm_pending_free {
    gm_block *block;
    uint64_t event;
    struct gm_pending_free *next;
} gm_pending_free;

/* The front end's state: the arena the engine works on, and what only the front end knows. */
struct gm_allocator {
    pthread_mutex_t lock;
    gm_options options;
    gm_arena arena;
    bool exclusive_device;  /* sim/host: nobody else uses the device, so its used bytes are ours */
    gm_hash_map live_blocks; /* address -> allocated block */
    gm_pending_free *pending_head; /* freed blocks waiting for stream events, oldest first */
    gm_pending_free *pending_tail;
    gm_pending_free *spare_pending; /* recycled list nodes */
    uint64_t *spare_events;         /* pooled backend events */
    size_t spare_event_count;
    size_t spare_event_capacity;
    gm_stats own_stats;            /* the statistics, unless they are kept in the published region */
    gm_publisher *publisher;       /* publish:true and its region was made; else NULL */
    gm_seqlock_writer *published;  /* its seqlock, or NULL */
    gm_status publish_status;      /* why there is no publisher */
    char publish_error[512];
    uint32_t publish_countdown;    /* calls until the device-call counts are published again */
    int64_t published_call_ns;     /* the backend's call_ns when they were published last */
    gm_pressure pressure;          /* the pressure policy, level and callbacks (pressure.c) */
    gm_host_cache host_cache;      /* the pinned host memory cache (host_cache.c), under `lock` */
};


/* Lock the allocator and give its arena; gm_unlock_arena ends it. */
gm_arena *gm_lock_arena(gm_allocator *allocator);
void gm_unlock_arena(gm_allocator *allocator);
/* Lock the allocator and open its statistics for change (the published region's seqlock bracket), and
 * the reverse: for changes made outside allocator.c (pressure.c). */
void gm_lock_for_change(gm_allocator *allocator);
void gm_unlock_after_change(gm_allocator *allocator);
/* Wait for the streams of every pending cross-stream free, so that their blocks become free memory
 * (lock held; counted in num_sync_all_streams). */
void gm_wait_for_pending_frees_locked(gm_allocator *allocator);
/* gm_get_stats and gm_get_device_info with the lock held. */
void gm_read_stats_locked(gm_allocator *allocator, gm_stats *stats_out);
gm_status gm_read_device_info_locked(gm_allocator *allocator, gm_device_info *info_out);

#endif
