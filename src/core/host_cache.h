/*
 * host_cache.h -- the pinned host memory cache's state (host_cache.c), one per allocator, guarded by
 * the allocator's lock.
 */
#ifndef GM_HOST_CACHE_H
#define GM_HOST_CACHE_H

#include "gpumem.h"

#include "backend/backend.h"
#include "base/hash_map.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_HOST_SIZE_CLASS_COUNT 64

typedef struct gm_host_block {
    void *pointer;
    uint64_t size;             /* a power of two: the size class's size */
    uint64_t requested;        /* what the live allocation asked for */
    gm_stream *streams;        /* streams recorded while live (gm_host_record_stream) */
    size_t stream_count;
    size_t stream_capacity;
    uint64_t *events;          /* after the free: events[i] recorded on streams[i], not yet done */
    size_t event_count;
    struct gm_host_block *next; /* in its size class's free list, or in the pending list */
} gm_host_block;

typedef struct gm_host_cache {
    uint64_t limit;                                         /* host_limit; 0: none */
    gm_hash_map live_blocks;                                /* pointer -> live block */
    gm_host_block *free_lists[GM_HOST_SIZE_CLASS_COUNT];    /* idle blocks, by log2 of their size */
    gm_host_block *pending;                                 /* freed blocks waiting for their events, */
    gm_host_block *pending_tail;                            /* oldest first */
    gm_host_stats stats;
} gm_host_cache;

bool gm_host_cache_init(gm_host_cache *cache, uint64_t limit);
/* Wait for every pending event and give every block, live or cached, back to the backend. */
void gm_host_cache_destroy(gm_allocator *allocator);

#endif
