/*
 * lane_sharing.c -- a stream's heap borrows its growth lane's mapped memory in place.
 *
 * A generate call alternates two kinds of memory: the prefill's temporaries (the stream's heap) and
 * the decode's KV cache (the lane). Were the two heaps' ranges kept apart, their pages would move
 * (unmapped there, mapped here) at every change of phase, and again in every later call: the lane's
 * memory lies idle while the prefill needs memory, and the other way round. So while the lane's live
 * blocks take at most 1/LANE_LENDS_BELOW of its mapped memory (between calls, at a call's start), a
 * request of the stream's heap whose best window in its own range would need new pages may take a
 * window of the lane's range that needs fewer, mapped memory the lane is not using (what pages it
 * still needs are backed as the lane's are, page by page). The block is the stream's while allocated
 * (freeing it goes through the stream's heap); once freed, its memory is the lane's free memory again,
 * since a free block always belongs to its region's heap. Runs enclosed by lane blocks are not lent:
 * they are the room the lane's ring needs next.
 */
#include "core/pages/pages.h"

static bool is_live_lane_block(const gm_block *block)
{
    return block && block->heap->engine_private &&
           (block->state == GM_BLOCK_ALLOCATED || block->state == GM_BLOCK_PENDING);
}

/* A run that is not a gap between two of the lane's live blocks. */
static bool is_not_between_lane_blocks(const gm_block *first, const gm_block *last)
{
    return !is_live_lane_block(first->previous) || !is_live_lane_block(last->next);
}

/* Whether the lane has mapped memory to lend: its live blocks take at most 1/LANE_LENDS_BELOW of it. */
static bool lane_has_memory_to_lend(gm_heap *lane_heap)
{
    uint64_t mapped = 0;
    for (gm_region *region = gm_first_region(lane_heap); region; region = gm_next_region(region))
        mapped += data_of(region)->mapped_bytes;
    return state_of(lane_heap)->live_bytes * LANE_LENDS_BELOW <= mapped;
}

/* The window for a request of the stream's heap `heap`: `own`, the best window of its own regions,
 * or one of its lane's region that needs fewer new pages, when the lane has memory to lend. */
window pages_window_with_lane(gm_heap *heap, int pool, uint64_t size, uint64_t page_size, window own)
{
    gm_heap *lane = heap->engine_data ? state_of(heap)->lane : NULL;
    if (!lane || pool != GM_POOL_LARGE || !own.region || own.pages == 0 || !lane_has_memory_to_lend(lane))
        return own;
    window lent = pages_choose_window(lane, pool, size, page_size, is_not_between_lane_blocks);
    return lent.region && lent.pages < own.pages ? lent : own;
}
