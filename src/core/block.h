/*
 * block.h -- a block: a contiguous piece of device addresses, and the metadata pool blocks come from.
 *
 * A block is allocated to the user, free (cached, in a size index), pending (freed, but in use by a
 * stream until its events complete) or, in the pages engine, unmapped (addresses with no physical
 * memory behind them). Blocks tile a region and know their address neighbours in it, for splitting
 * and coalescing.
 */
#ifndef GM_BLOCK_H
#define GM_BLOCK_H

#include "gpumem.h"

#include "base/list.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct gm_region gm_region;
typedef struct gm_heap gm_heap;

typedef enum gm_block_state {
    GM_BLOCK_FREE = 0,
    GM_BLOCK_ALLOCATED = 1,
    GM_BLOCK_PENDING = 2,
    GM_BLOCK_UNMAPPED = 3,
    GM_BLOCK_HELD = 4, /* pages engine: mapped, but its memory is reached at another address (stitching.c):
                          a free end or start lent to a stitched range, or the part of a second mapping
                          outside it */
} gm_block_state;

typedef struct gm_block {
    uintptr_t address;
    uint64_t size;
    uint64_t requested;          /* bytes the caller asked for (allocated blocks) */
    struct gm_block *previous;   /* address neighbours in the region, or NULL */
    struct gm_block *next;
    gm_link link;                /* in the list its state puts it in: a size-index list (free), the
                                    region's unmapped list (unmapped), the pool's spare list (unused) */
    gm_link order;               /* in a growth lane's allocation order (pages engine; allocated or
                                    pending lane blocks) */
    gm_region *region;
    gm_heap *heap;
    gm_stream recorded_first;    /* streams given to record_stream, other than the heap's own: the first */
    gm_stream *recorded_more;    /* and the others (a block used on three streams or more), so the common
                                    case, one other stream, allocates nothing */
    uint32_t recorded_count;
    uint32_t pending_events;     /* events still to complete before a pending block is free */
    uint8_t state;               /* gm_block_state */
    uint8_t pool;                /* GM_POOL_SMALL or GM_POOL_LARGE */
    uint8_t indexed;             /* in a size index */
    uint8_t counted_split;       /* counted as inactive split when it was indexed */
} gm_block;

/* The i-th stream given to record_stream for `block` (i < recorded_count). */
static inline gm_stream gm_recorded_stream(const gm_block *block, uint32_t i)
{
    return i ? block->recorded_more[i - 1] : block->recorded_first;
}

/* Forget the streams given to record_stream (a block retired or given back to the pool). The C library
 * is called only for a block used on three streams or more: a call there costs lines of code that the
 * common free need not fetch. */
static inline void gm_block_forget_streams(gm_block *block)
{
    if (block->recorded_more) {
        free(block->recorded_more);
        block->recorded_more = NULL;
    }
    block->recorded_count = 0;
}

static inline gm_block *gm_block_of(gm_link *link)
{
    return gm_list_item(link, gm_block, link);
}

/* Block structs from a pool that grows by chunks of blocks and recycles through a spare list, so the
 * steady state allocates nothing. */
typedef struct gm_block_pool {
    gm_list spare;
    size_t spare_count;
    void **chunks;
    size_t chunk_count;
} gm_block_pool;

/* A zeroed block, or NULL without host memory. */
gm_block *gm_block_new(gm_block_pool *pool);
void gm_block_delete(gm_block_pool *pool, gm_block *block);
/* At least `count` spare blocks, so that the next `count` gm_block_new cannot fail (a change that must
 * not stop halfway, such as compaction's, takes its metadata first). False without host memory. */
bool gm_block_pool_reserve(gm_block_pool *pool, size_t count);
void gm_block_pool_free_all(gm_block_pool *pool);
/* For tests, process-wide: blocks taken from the C library `blocks` at a time (0: the default). */
void gm_block_pool_set_chunk_blocks(size_t blocks);

/* Split `block` so that it keeps `size` bytes; the rest becomes a new block after it, in the same
 * state, returned (NULL if there is no rest, or no metadata for it: the block then stays whole, which
 * is still correct). Neither is (re)indexed. */
gm_block *gm_split_block(gm_block_pool *pool, gm_block *block, uint64_t size);
/* Absorb `next` (block->next) into `block`; `next` is deleted. Neither may be indexed. */
void gm_absorb_next(gm_block_pool *pool, gm_block *block);

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

static inline uint64_t gm_round_up(uint64_t value, uint64_t multiple)
{
    return (value + multiple - 1) / multiple * multiple;
}

#endif
