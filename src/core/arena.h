/*
 * arena.h -- what the engines work on: the device (a backend), heaps of regions tiled by blocks,
 * block metadata, the statistics and the memory limit.
 *
 * Vocabulary (docs/design.md has the picture):
 *   region   a contiguous range of device addresses the blocks tile: a device segment (segments
 *            engine) or a reserved virtual range (pages engine).
 *   heap     everything of one stream: its regions and one size index of free blocks per pool.
 *   pool     small (requests up to options.small_size) or large, as in PyTorch.
 *   engine   the back end that finds a block for a size and gets memory from the backend.
 *
 * The front end (allocator.c) owns an arena and guards it with its mutex; engines see the arena and
 * nothing of the front end (the live map, pending frees, locking).
 */
#ifndef GM_ARENA_H
#define GM_ARENA_H

#include "gpumem.h"

#include "backend/backend.h"
#include "base/list.h"
#include "base/options.h"
#include "core/block.h"
#include "core/history.h"
#include "core/size_index.h"
#include "core/statistics.h"

#include <stdbool.h>
#include <stdint.h>

struct gm_region {
    uintptr_t base;
    uint64_t size;
    gm_heap *heap;
    gm_link link; /* in the heap's list of regions */
    gm_block *first_block;
    uint8_t pool;
    void *engine_data;
};

/* A private pool (gpumem.h): its heaps' memory belongs to it while it has users. The front end
 * (private_pool.c) owns these; heaps point at theirs. */
typedef struct gm_private_pool {
    gm_pool_id id;
    uint32_t users;           /* retains and begins not yet released */
    uint64_t live_blocks;     /* blocks allocated in it and not yet retired */
    bool use_on_oom;          /* its free memory may serve others when they would fail (MemPool(use_on_oom)) */
    bool lending;             /* ...and they are being retried now: its free memory is anyone's */
    struct gm_private_pool *next;
} gm_private_pool;

struct gm_heap {
    gm_stream stream;
    gm_private_pool *private_pool; /* NULL: the shared memory of the stream */
    gm_size_index free_blocks[GM_POOL_COUNT]; /* [GM_POOL_SMALL], [GM_POOL_LARGE] */
    gm_list regions;
    void *engine_data;
    bool engine_private; /* made by the engine for its own placement (the pages engine's growth lane):
                            never the heap that a stream's requests are looked up in */
    gm_heap *serves;     /* an engine-private heap: the heap whose requests it takes; else NULL */
    bool borrowed;       /* its stream's owner may destroy it at any time (gm_malloc_on_borrowed_stream): the
                            stream is never named in a driver call (pages engine: progress.c) */
    uint64_t live_blocks; /* blocks allocated through this heap (or its engine-private ones), not retired */
    uint64_t last_used;  /* the arena's clock at its last request: the least recently used goes first */
};

typedef struct gm_engine_operations gm_engine_operations;

typedef struct gm_arena {
    /* Read by every request: first, in one cache line. */
    const gm_options *options;
    const gm_engine_operations *engine;
    void *engine_state;
    gm_stats *stats; /* the front end's, or the published region's (publish:true), where other processes
                        read them: change them only inside the front end's publication bracket */
    gm_heap *last_heap; /* the stream's heap found last */
    uint32_t heap_count;
    bool stats_published; /* publish:true: the hot statistics too are kept in *stats (the region), not in
                             hot_stats, for the region's readers to see every call's result */
    bool over_limit;      /* reserved memory above a memory limit lowered under it: every free gives back
                             what it can until it is not (gm_set_memory_limit) */
    uint64_t clock;     /* counts requests, for gm_heap.last_used */
    gm_history *history; /* the event ring, NULL when history is off */

    gm_backend *backend;
    uint64_t memory_limit; /* reserved bytes never exceed this */
    gm_block_pool block_pool;
    gm_heap **heaps;
    /* The statistics every allocation and free changes, kept here rather than in *stats (one cache
     * line each) unless they are published; written into a gm_stats when the statistics are read. */
    gm_hot_stats hot_stats;
    /* The engine's own peaks: what reserved and allocated bytes reached before the last
     * gm_reset_peak_stats. A program that resets the peaks it reads (torch.cuda.reset_peak_memory_stats
     * at every step) must not change where its memory goes: the engine's rules ("new memory only above
     * the peak") weigh the most the process has held, which no reset lowers. */
    int64_t reserved_peak_before_reset;
    int64_t allocated_peak_before_reset;
} gm_arena;

/* Change one of the hot statistics by `amount` in `pool`: `hot` (in hot_stats) or, while the statistics
 * are published, `stat` (the same statistic in *stats). Keeping them in one place or the other spares a
 * publishing allocator a copy of all five at the end of every call. */
static inline void gm_arena_count(gm_arena *arena, gm_hot_stat *hot, gm_stat stat[GM_POOL_COUNT], int pool,
                                  int64_t amount)
{
    if (__builtin_expect(arena->stats_published, 0))
        gm_stat_change(stat, pool, amount);
    else
        gm_hot_stat_change(hot, pool, amount);
}

/* The bytes allocated now, in every pool. */
static inline int64_t gm_arena_allocated_bytes(const gm_arena *arena)
{
    return arena->stats_published ? gm_stat_total(arena->stats->allocated_bytes)
                                  : arena->hot_stats.allocated_bytes.all_current;
}

/* The peak of the bytes allocated in every pool since the allocator was made (no reset lowers it). */
static inline int64_t gm_arena_allocated_peak(const gm_arena *arena)
{
    int64_t peak = arena->stats_published ? arena->stats->allocated_bytes[GM_POOL_ALL].peak
                                          : arena->hot_stats.allocated_bytes.all_peak;
    return peak > arena->allocated_peak_before_reset ? peak : arena->allocated_peak_before_reset;
}

/* The peak of the bytes reserved from the device since the allocator was made (no reset lowers it). */
static inline int64_t gm_arena_reserved_peak(const gm_arena *arena)
{
    int64_t peak = arena->stats->reserved_bytes[GM_POOL_ALL].peak;
    return peak > arena->reserved_peak_before_reset ? peak : arena->reserved_peak_before_reset;
}

/* The arena's statistics, every reading filled in (the hot ones and the all-pools sums). */
static inline void gm_arena_read_stats(const gm_arena *arena, gm_stats *stats_out)
{
    *stats_out = *arena->stats;
    if (!arena->stats_published)
        gm_hot_stats_write(&arena->hot_stats, stats_out);
    gm_stats_complete(stats_out);
}

struct gm_engine_operations {
    const char *name;
    gm_status (*create)(gm_arena *arena);
    void (*destroy)(gm_arena *arena);
    /* Find or make a block of exactly `size` bytes (a multiple of 512) in `heap`'s `pool`, marked
     * allocated. GM_ERROR_OUT_OF_MEMORY when the device (or memory_limit) has no room. */
    gm_status (*allocate)(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_block **block_out);
    /* Take back a block that is no longer allocated nor pending. */
    void (*free_block)(gm_arena *arena, gm_block *block);
    /* Give entirely free, cached pieces of memory back to the device until reserved memory is at most
     * `keep_bytes` (0: every one), in the order the engine finds them. */
    void (*release_cached)(gm_arena *arena, uint64_t keep_bytes);
    /* Check the engine's invariants and add the engine's recomputed statistics (reserved, segments,
     * inactive split) to *recomputed. */
    gm_status (*validate)(gm_arena *arena, gm_stats *recomputed);
    /* Give back every region of `heap` (and of heaps the engine made for it), all of whose blocks are
     * free, and drop the heaps from the arena (gm_remove_heap): a private pool that is gone. On a failed
     * device call the heap stays, whole, and the status says why. */
    gm_status (*forget_heap)(gm_arena *arena, gm_heap *heap);
    /* Let device `peer` reach every mapping the engine holds now (the backend's peer list already
     * covers later ones); NULL for an engine of plain segments, which the driver's peer access covers. */
    gm_status (*grant_peer_access)(gm_arena *arena, int peer);
    /* The physical memory under a live block for another process (gm_share); NULL: the engine has none
     * to give (plain segments). */
    gm_status (*share_block)(gm_arena *arena, const gm_block *block, uint64_t *offset_out, gm_shared_piece *pieces,
                             size_t capacity, size_t *count_out);
    /* For snapshots: an unmapped block may lie over memory the engine made ahead of need (the pages
     * engine's waiting pages), mapped and counted as reserved though no block holds it yet. The end of
     * the part of the unmapped `block` that begins at `from`, all of whose pages are such memory
     * (*reserved_out true) or all addresses without memory; parts taken from the block's start on tile
     * it. NULL: the engine makes no memory ahead of need (its unmapped blocks, if any, hold none). */
    uintptr_t (*unmapped_part_end)(const gm_arena *arena, const gm_block *block, uintptr_t from, bool *reserved_out);
    /* gm_defragment: split every chunk that live blocks pin with at least `least_free` bytes of whole
     * free pages around its live pages, adding the bytes given back to *released_out. NULL: the engine
     * cannot split its memory (plain segments). */
    gm_status (*defragment)(gm_arena *arena, uint64_t least_free, uint64_t *released_out);
    /* The whole free pages inside chunks that live blocks pin: what defragment could give back (for the
     * out-of-memory report), in *bytes_out; false where host memory ran out before all were counted.
     * NULL: the engine has none to tell (plain segments). */
    bool (*pinned_free_bytes)(gm_arena *arena, uint64_t *bytes_out);
    /* The cached memory that release_cached(0) would give back (wholly free chunks or segments, outside
     * private pools): what a request beyond the room under the memory limit can still be served from. */
    uint64_t (*idle_bytes)(gm_arena *arena);
};

extern const gm_engine_operations gm_segment_engine;
extern const gm_engine_operations gm_page_engine;

/* ---------------------------------------------------------------- heaps (heap.c) */

/* The heap of `stream` that its requests are served from, made on first use; NULL without host
 * memory. The heap found last answers without a search. */
gm_heap *gm_find_heap(gm_arena *arena, gm_stream stream);
static inline gm_heap *gm_heap_for_stream(gm_arena *arena, gm_stream stream)
{
    if (arena->last_heap && arena->last_heap->stream == stream)
        return arena->last_heap;
    return gm_find_heap(arena, stream);
}
/* A new heap for `stream`, listed with the arena's heaps (so statistics, snapshots, validation and
 * empty_cache see its regions); NULL without host memory. */
gm_heap *gm_add_heap(gm_arena *arena, gm_stream stream);
/* The heap of `stream` in private pool `pool`, made on first use; NULL without host memory. */
gm_heap *gm_find_pool_heap(gm_arena *arena, gm_stream stream, gm_private_pool *pool);
/* Drop `heap` from the arena's list and free it (its regions are the engine's and already gone). */
void gm_remove_heap(gm_arena *arena, gm_heap *heap);
/* Free every heap struct (their regions are the engine's and already gone). */
void gm_free_heaps(gm_arena *arena);
/* Forget the least recently used idle stream heaps (no live or pending block; not a private pool's),
 * other than `keep`, until at most `idle_kept` idle ones are left: their memory and addresses go back
 * (engine.forget_heap), their structs are freed. A heap whose memory cannot be given back now (a
 * failed device call) stays. Returns how many were forgotten. */
size_t gm_forget_idle_heaps(gm_arena *arena, const gm_heap *keep, size_t idle_kept);

/* Whether free memory of `heap` may serve `requester` (NULL: may be given back to the device): not
 * while it belongs to a private pool with users, except to that pool's own heaps, or to anyone while a
 * pool that lends on out of memory does so. */
static inline bool gm_heap_memory_available(const gm_heap *heap, const gm_heap *requester)
{
    const gm_private_pool *pool = heap->private_pool;
    return !pool || pool->users == 0 || pool->lending || (requester && requester->private_pool == pool);
}

/* The name of the private pool `heap` belongs to ({0, 0}: none), for events. */
static inline gm_pool_id gm_heap_pool_id(const gm_heap *heap)
{
    return heap && heap->private_pool ? heap->private_pool->id : GM_NO_POOL;
}

/* The heap's size index for a pool. */
static inline gm_size_index *gm_heap_index(gm_heap *heap, int pool)
{
    return &heap->free_blocks[pool];
}

static inline gm_region *gm_region_of(gm_link *link)
{
    return gm_list_item(link, gm_region, link);
}

/* A heap's regions, newest first: for (gm_region *r = gm_first_region(heap); r; r = gm_next_region(r)) */
static inline gm_region *gm_first_region(const gm_heap *heap)
{
    return gm_region_of(heap->regions.first);
}

static inline gm_region *gm_next_region(const gm_region *region)
{
    return gm_region_of(region->link.next);
}

/* ---------------------------------------------------------------- free blocks and accounting (block.c) */

/* Put a free block into its heap's size index, counting it as inactive-split if it has neighbours.
 * Inline, as its twin below: every malloc and free runs them. */
static inline void gm_index_free_block(gm_arena *arena, gm_block *block)
{
    gm_size_index_insert(gm_heap_index(block->heap, block->pool), block);
    block->indexed = 1;
    block->counted_split = gm_block_is_split(block);
    if (block->counted_split) {
        gm_stat_change(arena->stats->inactive_split, block->pool, 1);
        gm_stat_change(arena->stats->inactive_split_bytes, block->pool, (int64_t)block->size);
    }
}

/* Take a free block out of its size index (undoing the inactive-split count). */
static inline void gm_unindex_free_block(gm_arena *arena, gm_block *block)
{
    gm_size_index_remove(gm_heap_index(block->heap, block->pool), block);
    block->indexed = 0;
    if (block->counted_split) {
        gm_stat_change(arena->stats->inactive_split, block->pool, -1);
        gm_stat_change(arena->stats->inactive_split_bytes, block->pool, -(int64_t)block->size);
    }
}
/* Check the blocks of `region`: they tile it in address order, no two free (or two unmapped) blocks
 * touch, every free block is indexed; free blocks with neighbours are added to the inactive-split
 * statistics of *recomputed. `check` (may be NULL) then sees every block, for an engine's own rules. */
gm_status gm_validate_region_blocks(const gm_region *region, gm_stats *recomputed,
                                    gm_status (*check)(const gm_region *region, const gm_block *block, void *context),
                                    void *context);
/* Delete every block of a region that is going away (unindexing the free ones). */
void gm_delete_region_blocks(gm_arena *arena, gm_region *region);
/* The device memory a region holds: its blocks but the unmapped ones (which are whole pages). */
uint64_t gm_region_reserved_bytes(const gm_region *region);
/* Whether reserving `size` more bytes keeps within memory_limit. */
bool gm_may_reserve(const gm_arena *arena, uint64_t size);
/* What can still be reserved, in whole pages: the room under memory_limit, at most what the device has
 * free -- counting `releasable` bytes of reserved memory as given back (0: none). The status of the
 * device's answer; without one, *room_out is the room under the limit alone. */
gm_status gm_room_to_reserve(gm_arena *arena, uint64_t releasable, uint64_t *room_out);
/* Record reserved memory coming (positive) or going (negative) in a pool, as `segments` segments. */
void gm_count_reserved(gm_arena *arena, int pool, int64_t bytes, int64_t segments);
/* Move reserved memory (one segment of `bytes`) from one pool to the other; the total is unchanged. */
void gm_move_reserved(gm_arena *arena, int from_pool, int to_pool, uint64_t bytes);

#endif
