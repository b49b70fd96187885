/*
 * lane_sharing.c -- a stream's heap and its growth lane share one address range.
 *
 * A generate call alternates two kinds of memory: the prefill's temporaries (the stream's heap) and
 * the decode's KV cache (the lane). Were the two kept in ranges of their own, their pages would move
 * (unmapped in one range, mapped in the other) at every change of phase, and again in every later call:
 * the lane's memory lies idle while the prefill needs memory, and the other way round. So the lane's
 * ring lives in the upper part of the stream's own large-pool range (lane.c), and a free block there
 * belongs to the stream's heap like any other: the next prefill fits its temporaries into the pages
 * the last decode used, and the next decode's copies go where the prefill's temporaries were, with no
 * page moved.
 *
 * What keeps the ring one run is that the stream's requests do not land in its way while it has live
 * blocks: a fit skips a free block bordering a live lane block (the room below the ring's head, a gap
 * the ring's next copies need) unless the block leaves RING_FIT_ROOM beside the request, and a growth
 * takes no window in a run enclosed by two lane blocks.
 */
#include "core/pages/pages.h"

static bool is_live_lane_block(const gm_block *block)
{
    return block && block->heap->engine_private &&
           (block->state == GM_BLOCK_ALLOCATED || block->state == GM_BLOCK_PENDING);
}

/* Whether a request of `size` bytes placed in the free block `block` would take the ring's room. */
static bool in_ring_way(const gm_block *block, uint64_t size)
{
    if (!is_live_lane_block(block->next) && !is_live_lane_block(block->previous))
        return false;
    return block->size < size + RING_FIT_ROOM;
}

/* pages_fit_beside_lane's part for a large-pool fit `fit` while the stream's ring has live blocks. */
gm_block *pages_fit_among_lane(gm_heap *heap, gm_block *fit, uint64_t size)
{
    if (!in_ring_way(fit, size))
        return fit;
    const gm_size_index *index = gm_heap_index(heap, GM_POOL_LARGE);
    gm_block *block;
    gm_index_cursor cursor;
    for (block = gm_size_index_begin_at(&cursor, index, size); block; block = gm_size_index_advance(&cursor))
        if (block->size >= size && !in_ring_way(block, size))
            return block;
    return NULL;
}

bool pages_run_outside_lane(const gm_block *first, const gm_block *last)
{
    return !is_live_lane_block(first->previous) || !is_live_lane_block(last->next);
}
