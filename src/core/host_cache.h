/*
 * host_cache.h -- the pinned host memory cache's state (host_cache.c; its freed blocks that wait for their
 * streams: host_pending.c), one per allocator, guarded by the allocator's lock.
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
    gm_stream *streams;        /* streams recorded while live (gm_host_record_stream); after a look at
                                  the pending block, only those found busy */
    size_t stream_count;
    size_t stream_capacity;
    uint64_t *events;          /* pending: events[i] recorded on streams[i], not yet found done; none
                                  while the block is unchecked (its streams not yet asked) */
    size_t event_count;
    bool held_for_graph;       /* freed while one of its streams was being captured into a CUDA graph,
                                  whose replays may still copy it: pending until gm_destroy */
    struct gm_host_block *next; /* in its size class's free list, or in the pending list */
} gm_host_block;

typedef struct gm_host_cache {
    uint64_t limit;                                         /* host_limit; 0: none */
    gm_hash_map live_blocks;                                /* pointer -> live block */
    gm_host_block *free_lists[GM_HOST_SIZE_CLASS_COUNT];    /* idle blocks, by log2 of their size */
    gm_host_block *pending;                                 /* freed blocks not reusable yet, */
    gm_host_block *pending_tail;                            /* oldest first */
    uint32_t unchecked[GM_HOST_SIZE_CLASS_COUNT];           /* pending blocks of each class not looked at yet */
    uint32_t waiting[GM_HOST_SIZE_CLASS_COUNT];             /* and those waiting for their events */
    gm_host_stats stats;
} gm_host_cache;

bool gm_host_cache_init(gm_host_cache *cache, uint64_t limit);
/* Wait for every pending block's streams and give every block, live or cached, back to the backend. */
void gm_host_cache_destroy(gm_allocator *allocator);

enum { GM_HOST_SMALLEST_CLASS = 9 }; /* 512 bytes */

/* The size class of a request: log2 of the power of two it is rounded up to. */
static inline int gm_host_size_class_of(uint64_t size)
{
    int size_class = GM_HOST_SMALLEST_CLASS;
    while (((uint64_t)1 << size_class) < size)
        size_class++;
    return size_class;
}

static inline void gm_host_push_free(gm_host_cache *cache, gm_host_block *block)
{
    int size_class = gm_host_size_class_of(block->size);
    block->next = cache->free_lists[size_class];
    cache->free_lists[size_class] = block;
}

/* host_pending.c, lock held. A freed block with recorded streams joins the pending list, unchecked, or
 * waiting for its events if it has any (recorded by gm_host_pending_check_at_free, which asks the block's
 * streams now, keeps the busy ones and records an event on each; on failure none stays recorded), or
 * held for good if that check found one of its streams being captured into a graph.
 * A look moves to the free lists the pending blocks found reusable (with `wait`, after waiting for
 * their streams). At gm_destroy, after a waiting look, the blocks it could not wait for are taken out
 * one by one, oldest first, their events destroyed (NULL once none is left). */
void gm_host_pending_add(gm_host_cache *cache, gm_host_block *block);
gm_status gm_host_pending_check_at_free(gm_allocator *allocator, gm_host_block *block);
void gm_host_look_at_pending(gm_allocator *allocator, bool wait);
gm_host_block *gm_host_pending_abandon(gm_allocator *allocator);

#endif
