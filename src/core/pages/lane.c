/*
 * lane.c -- the growth lane: a stream's tensors that keep being replaced by slightly larger copies.
 *
 * Generation replaces each cached tensor at every step by a copy slightly larger (torch.cat grows a
 * KV cache: the copy is allocated, then the old tensor freed). Best fit would scatter the copies over
 * holes each slightly too small for the next copy. Once a stream has shown LANE_AFTER_REGROWTHS such
 * regrowths, requests of those sizes go to its lane, an engine-private heap of the same stream whose
 * blocks stay in allocation order and move as a conveyor: each copy just below the oldest block, or
 * wrapping into the free space above the newest when that needs fewer new pages, so the tensors stay
 * one run with no temporary between them, on page-sized chunks. A copy that would need new memory
 * above the peak takes a fitting free block of the stream's own heap instead, when there is one.
 */
#include "core/pages/pages.h"

#include "base/error.h"

#include <inttypes.h>
#include <stdlib.h>

gm_status pages_new_heap_state(gm_heap *heap)
{
    heap->engine_data = calloc(1, sizeof(page_heap));
    if (!heap->engine_data)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pages engine's heap state");
    return GM_OK;
}

/* The lane of the stream's heap `heap`, made on first use; NULL without host memory. */
gm_heap *pages_lane_of(gm_arena *arena, gm_heap *heap)
{
    page_heap *state = state_of(heap);
    if (state->lane)
        return state->lane;
    page_heap *lane_state = calloc(1, sizeof *lane_state);
    gm_heap *lane = lane_state ? gm_add_heap(arena, heap->stream) : NULL;
    if (!lane) {
        free(lane_state);
        return NULL;
    }
    lane_state->owner = heap;
    lane->engine_data = lane_state;
    lane->engine_private = true;
    lane->private_pool = heap->private_pool; /* a pool's lane is the pool's memory too */
    lane->serves = heap;
    return state->lane = lane;
}

static gm_block *lane_block_of(gm_link *link)
{
    return gm_list_item(link, gm_block, order);
}

static void lane_append(page_heap *lane, gm_block *block)
{
    gm_queue_push_back(&lane->order, &block->order);
    lane->live++;
}

void pages_lane_remove(page_heap *lane, gm_block *block)
{
    gm_queue_remove(&lane->order, &block->order);
    lane->live--;
}

/* Carve [start, start + size) out of the vacant run that begins at `run_first` and ends at
 * `run_end`, mapping the pages it needs: the block, free and detached, or NULL (*status_out says
 * why, GM_OK when metadata for the split ran out). */
static gm_block *take_in_run(gm_arena *arena, gm_block *run_first, uintptr_t run_end, uintptr_t start,
                             uint64_t size, gm_status *status_out)
{
    uint64_t page_size = engine_of(arena)->page_size;
    window where = {run_first->region, run_first, run_first->address, run_end, start, 0, 0};
    where.pages = pages_needed(run_first, start, start + size, page_size);
    gm_block *opened = run_first;
    *status_out = GM_OK;
    if (where.pages) {
        if ((*status_out = pages_open_window(arena, where, size, &opened)) != GM_OK)
            return NULL;
    } else { /* inside one free block: free neighbours merge, and no unmapped page is needed */
        while (opened->address + opened->size <= start)
            opened = opened->next;
        gm_unindex_free_block(arena, opened);
    }
    gm_block *taken = pages_carve(arena, opened, start, start + size, GM_BLOCK_FREE);
    if (!taken)
        gm_index_free_block(arena, opened);
    return taken;
}

/* A place in the lane: [start, start + size) inside the vacant run from `run_first` to `run_end`. */
typedef struct lane_spot {
    gm_block *run_first;
    uintptr_t run_end;
    uintptr_t start;
    uint64_t pages; /* new pages it needs */
} lane_spot;

/* Below the oldest block, which the request replaces: at the start of the vacant run there when that
 * leaves no more room than the other blocks' next growth (they stay one run), else just below the
 * oldest with that room left. false if the oldest is not a smaller block of the request's kind or
 * the run is too short. */
static bool spot_below_oldest(const page_heap *lane, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    gm_block *oldest = lane_block_of(lane->order.first);
    if (!oldest || oldest->size >= size || oldest->size + size / REGROWTH_FRACTION < size || !oldest->previous ||
        !gm_block_is_vacant(oldest->previous))
        return false;
    gm_block *run_first = pages_run_start_of(oldest->previous);
    uint64_t gap = oldest->address - run_first->address, slack = lane->live * (size - oldest->size);
    if (gap < size)
        return false;
    uintptr_t start = gap <= size + slack ? run_first->address : (oldest->address - slack - size) / 512 * 512;
    *spot = (lane_spot){run_first, oldest->address, start, pages_needed(run_first, start, start + size, page_size)};
    return true;
}

/* Right after the newest block, in the vacant run above it. */
static bool spot_after_newest(const page_heap *lane, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    gm_block *newest = lane_block_of(lane->order.last);
    if (!newest || !newest->next || !gm_block_is_vacant(newest->next))
        return false;
    gm_block *last = pages_run_end_of(newest->next);
    uintptr_t start = newest->address + newest->size, run_end = last->address + last->size;
    if (run_end - start < size)
        return false;
    *spot = (lane_spot){newest->next, run_end, start, pages_needed(newest->next, start, start + size, page_size)};
    return true;
}

/* Place a request of `size` bytes in `lane_heap`. The lane's blocks are a conveyor: the oldest is
 * the next to be replaced, by a copy slightly larger, so the copy goes just below the oldest (see
 * spot_below_oldest) and the run moves down by about one block a round. The copy goes after the
 * newest block instead when that needs fewer new pages: once the run has left mapped free space above
 * it, the conveyor wraps around into it rather than moving pages from the top to the bottom.
 * Otherwise (no conveyor end has room: an empty lane between two calls) the request goes where the
 * fewest new pages are needed. Free blocks inside the lane are never fitted by size: they are room
 * the conveyor needs. */
static gm_status lane_allocate(gm_arena *arena, gm_heap *lane_heap, uint64_t size, gm_block **block_out)
{
    page_heap *lane = state_of(lane_heap);
    uint64_t page_size = engine_of(arena)->page_size;
    gm_status status = GM_OK;
    lane_spot below, above;
    bool has_below = spot_below_oldest(lane, size, page_size, &below);
    bool has_above = spot_after_newest(lane, size, page_size, &above);
    *block_out = NULL;
    if (has_below && (!has_above || below.pages <= above.pages) &&
        ((*block_out = take_in_run(arena, below.run_first, below.run_end, below.start, size, &status)) || status))
        return status;
    if (has_above &&
        ((*block_out = take_in_run(arena, above.run_first, above.run_end, above.start, size, &status)) || status))
        return status;
    /* Where the fewest new pages are needed -- perhaps none: free memory of the lane left between
     * calls (a window in mapped memory, which pages_grow() cannot open) */
    window where = lane_heap->regions.first ? pages_choose_window(lane_heap, GM_POOL_LARGE, size, page_size) : (window){0};
    if (!where.region) {
        gm_region *region = NULL;
        if ((status = pages_add_region(arena, lane_heap, GM_POOL_LARGE, size, &region)) != GM_OK)
            return status;
        /* The lane's first block goes to the middle of its range: the conveyor moves down. */
        uintptr_t start = gm_next_region(region) ? region->base : page_floor(region->base + region->size / 2, page_size);
        where = (window){region, region->first_block, region->base, region->base + region->size, start, 0, 0};
    }
    if (!(*block_out = take_in_run(arena, where.run_first, where.run_end, where.start, size, &status)) && !status)
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    return status;
}

/* Place a request in the stream's lane -- unless that would lift reserved memory above its peak while
 * a free block of the stream's own heap fits the request: GM_ERROR_OUT_OF_MEMORY then, and the request
 * takes that block (a prefill can leave such a block inside a chunk that a later buffer pins, and the
 * lane would otherwise make new pages beside it). */
gm_status pages_lane_place(gm_arena *arena, gm_heap *heap, gm_heap *lane, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(arena);
    engine->keep_peak = gm_size_index_find(gm_heap_index(heap, GM_POOL_LARGE), size) != NULL;
    gm_status status = lane_allocate(arena, lane, size, block_out);
    engine->keep_peak = false;
    if (status == GM_OK)
        lane_append(state_of(lane), *block_out);
    return status;
}

/* A lane's allocation-order list holds exactly its allocated and pending blocks. */
gm_status pages_validate_lane(const gm_heap *heap)
{
    const page_heap *lane = state_of(heap);
    uint64_t listed = 0, live = 0;
    for (const gm_block *block = lane_block_of(lane->order.first); block && listed <= lane->live;
         block = lane_block_of(block->order.next), listed++)
        if (block->heap != heap || (block->state != GM_BLOCK_ALLOCATED && block->state != GM_BLOCK_PENDING))
            return gm_fail(GM_ERROR_CORRUPT, "lane lists block 0x%" PRIxPTR " in state %d", block->address,
                           block->state);
    for (const gm_region *region = gm_first_region(heap); region; region = gm_next_region(region))
        for (const gm_block *block = region->first_block; block; block = block->next)
            live += block->state == GM_BLOCK_ALLOCATED || block->state == GM_BLOCK_PENDING;
    if (listed != lane->live || live != lane->live)
        return gm_fail(GM_ERROR_CORRUPT, "lane lists %" PRIu64 " blocks, counts %" PRIu64 ", holds %" PRIu64, listed,
                       lane->live, live);
    return GM_OK;
}
