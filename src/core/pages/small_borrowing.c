/*
 * small_borrowing.c -- a small request takes free memory of its stream's large-pool range while the
 * stream's growth lane is empty, rather than pages moved into the small pool.
 *
 * Requests under 1 MiB have a range of their own (the small pool). A generate call whose cached
 * tensors are under 1 MiB (a short prompt, say) keeps replacing them in the small pool, which grows
 * page by page; at the peak each new page is an idle chunk moved there from the large pool's range,
 * and a later call's ring, which needs that memory, moves the pages back: the same pages go back and
 * forth in every replay of the calls. The stream's large-pool range has free memory at those moments:
 * its own part (below pages_ring_floor) holds the prefill's freed temporaries. So while the stream's
 * lane exists but holds no block (the ring's memory unused: such a call, or between two calls), a
 * small request that no free block of the small pool fits, and for which the small pool would grow
 * above the peak, takes a free block of that part: no page moves, and the small pool keeps what it has.
 *
 * Only requests of at least 1/SMALL_BORROW_PAGE_FRACTION of a page borrow: tiny temporaries scattered
 * over the stream's memory would pin pages and split the free runs its large requests need (borrowing
 * every size made reordered generate calls reserve more). Nor is the ring's part lent: small blocks
 * there would lie in the next ring's way. Streams that never opened a lane (training) never borrow.
 */
#include "core/pages/pages.h"

gm_block *pages_borrow_for_small(gm_arena *arena, gm_heap *heap, uint64_t size)
{
    page_engine *engine = engine_of(arena);
    gm_heap *lane = state_of(heap)->lane;
    if (!lane || state_of(lane)->live || size < engine->page_size / SMALL_BORROW_PAGE_FRACTION)
        return NULL;
    const gm_stat *reserved = arena->stats->reserved_bytes;
    if (gm_stat_total(reserved) + (int64_t)engine->page_size <= gm_arena_reserved_peak(arena))
        return NULL; /* a new small-pool page lifts no peak */
    gm_index_cursor cursor;
    for (gm_block *block = gm_size_index_begin_at(&cursor, gm_heap_index(heap, GM_POOL_LARGE), size); block;
         block = gm_size_index_advance(&cursor))
        if (block->size >= size && block->address + size <= pages_ring_floor(block->region))
            return block;
    return NULL;
}
