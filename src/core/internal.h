/*
 * internal.h -- the allocator's state, shared by the front end and the engines.
 *
 * Vocabulary (docs/design.md has the picture):
 *   block    a contiguous piece of device addresses: allocated to the user, free (cached, in a size
 *            index), pending (freed, but in use by a stream until its events complete) or, in the
 *            pages engine, unmapped (addresses with no physical memory behind them).
 *   region   a contiguous range of device addresses the blocks tile: a device segment (segments
 *            engine) or a reserved virtual range (pages engine). Blocks know their address
 *            neighbours in the region, for splitting and coalescing.
 *   heap     everything of one stream: its regions and one size index of free blocks per pool.
 *   pool     small (requests up to options.small_size) or large, as in PyTorch.
 *   engine   the back end that finds a block for a size and gets memory from the backend.
 *
 * All state lives in gm_allocator and is guarded by its one mutex.
 */
#ifndef GM_INTERNAL_H
#define GM_INTERNAL_H

#include "gpumem.h"

#include "../backend/backend.h"
#include "hash_map.h"
#include "options.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct gm_block gm_block;
typedef struct gm_region gm_region;
typedef struct gm_heap gm_heap;

typedef enum gm_block_state {
    GM_BLOCK_FREE = 0,
    GM_BLOCK_ALLOCATED = 1,
    GM_BLOCK_PENDING = 2,
    GM_BLOCK_UNMAPPED = 3,
} gm_block_state;

struct gm_block {
    uintptr_t address;
    uint64_t size;
    uint64_t requested;          /* bytes the caller asked for (allocated blocks) */
    gm_block *previous;          /* address neighbours in the region, or NULL */
    gm_block *next;
    gm_block *free_previous;     /* links in a size-index list (free blocks), in the pages engine's list of
                                    unmapped blocks, or in its growth lane's allocation order (lane blocks
                                    while allocated or pending) */
    gm_block *free_next;
    gm_region *region;
    gm_heap *heap;
    gm_stream *recorded_streams; /* streams given to record_stream, other than the heap's own */
    uint32_t recorded_count;
    uint32_t pending_events;     /* events still to complete before a pending block is free */
    uint8_t state;               /* gm_block_state */
    uint8_t pool;                /* GM_POOL_SMALL or GM_POOL_LARGE */
    uint8_t indexed;             /* in a size index */
    uint8_t counted_split;       /* counted as inactive split when it was indexed */
};

/* ---------------------------------------------------------------- size index (TLSF) */

/* Sizes are indexed in units of 512 bytes: first level = position of the highest bit, second level
 * = the next GM_INDEX_SECOND_BITS bits, so each list holds sizes within 1/32 of each other. */
#define GM_INDEX_SECOND_BITS 5
#define GM_INDEX_SECOND_COUNT (1 << GM_INDEX_SECOND_BITS)
#define GM_INDEX_FIRST_COUNT 48

typedef struct gm_size_index {
    uint64_t first_bitmap;
    uint32_t second_bitmaps[GM_INDEX_FIRST_COUNT];
    gm_block *lists[GM_INDEX_FIRST_COUNT][GM_INDEX_SECOND_COUNT];
    uint64_t block_count;
    uint64_t bytes;
} gm_size_index;

void gm_size_index_insert(gm_size_index *index, gm_block *block);
void gm_size_index_remove(gm_size_index *index, gm_block *block);
/* A free block of at least `size` bytes, close to the smallest such (the exact-size list is searched
 * for the best fit, larger lists give their first block), or NULL. */
gm_block *gm_size_index_find(const gm_size_index *index, uint64_t size);
/* Every block of an index, list by list:
 *     gm_index_cursor cursor;
 *     for (gm_block *block = gm_size_index_begin(&cursor, index); block; block = gm_size_index_advance(&cursor))
 * The index must not change during the walk. */
typedef struct gm_index_cursor {
    const gm_size_index *index;
    unsigned first;
    unsigned second;
    gm_block *block;
} gm_index_cursor;
gm_block *gm_size_index_begin(gm_index_cursor *cursor, const gm_size_index *index);
/* The same from the list that holds blocks of `size` bytes: every block of at least `size` bytes is
 * visited (and some smaller ones of that first list). */
gm_block *gm_size_index_begin_at(gm_index_cursor *cursor, const gm_size_index *index, uint64_t size);
gm_block *gm_size_index_advance(gm_index_cursor *cursor);
/* The largest block in the index, or NULL (for reports). */
gm_block *gm_size_index_largest(const gm_size_index *index);

/* ---------------------------------------------------------------- block metadata */

typedef struct gm_block_pool {
    gm_block *free_list;
    void **chunks;
    size_t chunk_count;
} gm_block_pool;

gm_block *gm_block_new(gm_block_pool *pool);
void gm_block_delete(gm_block_pool *pool, gm_block *block);
void gm_block_pool_free_all(gm_block_pool *pool);

/* ---------------------------------------------------------------- regions and heaps */

struct gm_region {
    uintptr_t base;
    uint64_t size;
    gm_heap *heap;
    gm_region *previous; /* in the heap's list */
    gm_region *next;
    gm_block *first_block;
    uint8_t pool;
    void *engine_data;
};

struct gm_heap {
    gm_stream stream;
    gm_size_index free_blocks[GM_POOL_COUNT]; /* [GM_POOL_SMALL], [GM_POOL_LARGE] */
    gm_region *regions;
    void *engine_data;
    bool engine_private; /* made by the engine for its own placement (the pages engine's growth lane):
                            never the heap that a stream's requests are looked up in */
};

/* A new heap for `stream`, listed with the allocator's heaps (so statistics, snapshots, validation
 * and empty_cache see its regions); NULL without host memory. */
gm_heap *gm_add_heap(gm_allocator *allocator, gm_stream stream);

/* ---------------------------------------------------------------- engines */

typedef struct gm_engine_operations {
    const char *name;
    gm_status (*create)(gm_allocator *allocator);
    void (*destroy)(gm_allocator *allocator);
    /* Find or make a block of exactly `size` bytes (a multiple of 512) in `heap`'s `pool`, marked
     * allocated. GM_ERROR_OUT_OF_MEMORY when the device (or memory_limit) has no room. */
    gm_status (*allocate)(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_block **block_out);
    /* Take back a block that is no longer allocated nor pending. */
    void (*free_block)(gm_allocator *allocator, gm_block *block);
    /* Give every entirely free, cached piece of memory back to the device. */
    void (*release_cached)(gm_allocator *allocator);
    /* Check the engine's invariants and add the engine's recomputed statistics (reserved, segments,
     * inactive split) to *recomputed. */
    gm_status (*validate)(gm_allocator *allocator, gm_stats *recomputed);
} gm_engine_operations;

extern const gm_engine_operations gm_segment_engine;
extern const gm_engine_operations gm_page_engine;

/* ---------------------------------------------------------------- the allocator */

typedef struct gm_pending_free {
    gm_block *block;
    uint64_t event;
    struct gm_pending_free *next;
} gm_pending_free;

struct gm_allocator {
    pthread_mutex_t lock;
    gm_options options;
    gm_backend *backend;
    const gm_engine_operations *engine;
    void *engine_state;
    uint64_t memory_limit; /* reserved bytes never exceed this */
    bool exclusive_device; /* sim/host: nobody else uses the device, so its used bytes are ours */
    gm_stats stats;
    gm_hash_map live_blocks; /* address -> allocated block */
    gm_block_pool block_pool;
    gm_heap **heaps;
    size_t heap_count;
    gm_heap *last_heap;
    gm_pending_free *pending_head; /* freed blocks waiting for stream events, oldest first */
    gm_pending_free *pending_tail;
    gm_pending_free *spare_pending; /* recycled list nodes */
    uint64_t *spare_events;         /* pooled backend events */
    size_t spare_event_count;
    size_t spare_event_capacity;
};

/* ---------------------------------------------------------------- helpers for engines */

static inline uint64_t gm_round_up(uint64_t value, uint64_t multiple)
{
    return (value + multiple - 1) / multiple * multiple;
}

/* Add `amount` (may be negative) to one reading of a statistic. */
static inline void gm_stat_add(gm_stat *stat, int64_t amount)
{
    stat->current += amount;
    if (amount > 0)
        stat->allocated += amount;
    else
        stat->freed -= amount;
    if (stat->current > stat->peak)
        stat->peak = stat->current;
}

/* The all-pools current reading of a statistic. */
static inline int64_t gm_stat_total(const gm_stat stat[GM_POOL_COUNT])
{
    return stat[GM_POOL_SMALL].current + stat[GM_POOL_LARGE].current;
}

/* Add `amount` to a statistic of `pool`. Only the pools' readings are kept on this hot path, and the
 * all-pools peak: the all-pools current, allocated and freed readings are sums, filled in when the
 * statistics are read (gm_stats_complete). */
static inline void gm_stat_change(gm_stat stat[GM_POOL_COUNT], int pool, int64_t amount)
{
    gm_stat_add(&stat[pool], amount);
    if (amount <= 0)
        return;
    int64_t total = gm_stat_total(stat);
    if (total > stat[GM_POOL_ALL].peak)
        stat[GM_POOL_ALL].peak = total;
}

/* Every gm_stat array of a gm_stats, by index; NULL past the last. */
gm_stat *gm_stats_array(gm_stats *stats, size_t index);
/* Fill in the all-pools current, allocated and freed readings of every statistic. */
void gm_stats_complete(gm_stats *stats);

/* Free addresses: a free block, or (pages engine) an unmapped one. */
static inline bool gm_block_is_vacant(const gm_block *block)
{
    return block->state == GM_BLOCK_FREE || block->state == GM_BLOCK_UNMAPPED;
}

/* Whether a free block counts as inactive split (PyTorch's "non-releasable"): it shares its segment
 * with a block in use. Unmapped neighbours (pages engine) hold no memory and do not count. */
static inline bool gm_block_is_split(const gm_block *block)
{
    return (block->previous && block->previous->state != GM_BLOCK_UNMAPPED) ||
           (block->next && block->next->state != GM_BLOCK_UNMAPPED);
}

/* Put a free block into its heap's size index, counting it as inactive-split if it has neighbours. */
void gm_index_free_block(gm_allocator *allocator, gm_block *block);
/* Take a free block out of its size index (undoing the inactive-split count). */
void gm_unindex_free_block(gm_allocator *allocator, gm_block *block);
/* Split `block` so that it keeps `size` bytes; the rest becomes a new block after it, in the same
 * state, returned (NULL if there is no rest). Neither is (re)indexed. */
gm_block *gm_split_block(gm_allocator *allocator, gm_block *block, uint64_t size);
/* Absorb `next` (block->next) into `block`; `next` is deleted. Neither may be indexed. */
void gm_absorb_next(gm_allocator *allocator, gm_block *block);
/* Check the blocks of `region`: they tile it in address order, no two free (or two unmapped) blocks
 * touch, every free block is indexed; free blocks with neighbours are added to the inactive-split
 * statistics of *recomputed. `check` (may be NULL) then sees every block, for an engine's own rules. */
gm_status gm_validate_region_blocks(const gm_region *region, gm_stats *recomputed,
                                    gm_status (*check)(const gm_region *region, const gm_block *block, void *context),
                                    void *context);
/* Whether reserving `size` more bytes keeps within memory_limit. */
bool gm_may_reserve(const gm_allocator *allocator, uint64_t size);
/* Record reserved memory coming (positive) or going (negative) in a pool, as `segments` segments. */
void gm_count_reserved(gm_allocator *allocator, int pool, int64_t bytes, int64_t segments);
/* Move reserved memory (one segment of `bytes`) from one pool to the other; the total is unchanged. */
void gm_move_reserved(gm_allocator *allocator, int from_pool, int to_pool, uint64_t bytes);
/* The heap's size index for a pool. */
static inline gm_size_index *gm_heap_index(gm_heap *heap, int pool)
{
    return &heap->free_blocks[pool];
}

#endif
