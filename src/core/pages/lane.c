/*
 * lane.c -- the growth lane: a stream's tensors that keep being replaced by slightly larger copies.
 *
 * Generation replaces each cached tensor at every step by a copy slightly larger (torch.cat grows a
 * KV cache: the copy is allocated, then the old tensor freed). Best fit would scatter the copies over
 * holes each slightly too small for the next copy. Once a stream has shown LANE_AFTER_REGROWTHS such
 * regrowths, requests of those sizes go to its lane, an engine-private heap of the same stream whose
 * blocks stay in allocation order and are placed as a ring below the lane's top: each copy directly
 * below the newest block, so the head moves down while the oldest blocks are freed above it, and the
 * tensors stay one run (two while the ring wraps) with no temporary between them.
 *
 * The ring runs in memory already mapped wherever it can, so that the pages a generate call used are
 * still where the next call -- or the same call replayed -- needs them. Where the head would need new
 * pages, it jumps to a free block of the lane's mapped memory with room for RING_JUMP_COPIES copies,
 * or wraps to the mapped free space above the oldest block. Only when the lane's memory is too small
 * does a copy take new pages: above the oldest block by what the lap's growth needs (the top rises)
 * or below the newest, the pages moved from elsewhere or made. A conveyor that moved the run down by
 * a tensor every step needed new pages at every step, moved from the top of the run to its bottom.
 * A copy that would need new memory above the peak takes a fitting free block of the stream's own
 * heap instead, when there is one.
 *
 * The lane has no range of its own: the ring lives in the upper part of its stream's large-pool range
 * (from pages_ring_floor up; the stream's own blocks start at the range's base), its top first in the
 * range's middle, and its free memory is the stream's free memory (lane_sharing.c). The ring's jumps
 * stay in that upper part.
 */
#include "core/pages/pages.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

gm_status pages_new_heap_state(gm_heap *heap)
{
    heap->engine_data = gm_system_calloc(1, sizeof(page_heap));
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
    page_heap *lane_state = gm_system_calloc(1, sizeof *lane_state);
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
    lane->live_bytes += block->size;
}

void pages_lane_remove(page_heap *lane, gm_block *block)
{
    gm_queue_remove(&lane->order, &block->order);
    lane->live--;
    lane->live_bytes -= block->size;
}

/* A place in the lane: [start, start + size) inside the vacant run from `run_first` to `run_end`. */
typedef struct lane_spot {
    gm_block *run_first;
    uintptr_t run_end;
    uintptr_t start;
    uint64_t pages; /* new pages it needs */
} lane_spot;

/* Carve the spot out of its run, mapping the pages it needs: the block, free and detached, or NULL
 * (*status_out says why: GM_OK when metadata for the split ran out). */
static gm_block *take_spot(gm_arena *arena, const lane_spot *spot, uint64_t size, gm_status *status_out)
{
    window where = {spot->run_first->region, spot->run_first, spot->run_first->address, spot->run_end, spot->start,
                    spot->pages, 0};
    /* The run below the ring reaches down to the stream's own blocks: the idle chunks the stream's
     * part of it holds may still move to the ring (only those of the ring's part stay, as in any run). */
    uintptr_t floor = pages_ring_floor(where.region);
    if (where.run_start < floor && spot->start >= floor)
        where.run_start = floor;
    gm_block *opened = NULL;
    if ((*status_out = pages_open_window(arena, where, size, &opened)) != GM_OK)
        return NULL;
    gm_block *taken = pages_carve(arena, opened, spot->start, spot->start + size, GM_BLOCK_FREE);
    if (!taken)
        gm_index_free_block(arena, opened);
    return taken;
}

/* Directly below the block `above`, in the vacant run there. */
static bool spot_below(gm_block *above, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    if (!above->previous || !gm_block_is_vacant(above->previous))
        return false;
    gm_block *run_first = pages_run_start_of(above->previous);
    if (above->address - run_first->address < size)
        return false;
    uintptr_t start = above->address - size;
    *spot = (lane_spot){run_first, above->address, start, pages_needed(run_first, start, above->address, page_size)};
    return true;
}

/* The large-pool region of the lane's stream that holds the address just below `end`, or NULL. */
static gm_region *region_below(gm_heap *lane_heap, uintptr_t end)
{
    for (gm_region *region = gm_first_region(state_of(lane_heap)->owner); region; region = gm_next_region(region))
        if (region->pool == GM_POOL_LARGE && end > region->base && end <= region->base + region->size)
            return region;
    return NULL;
}

/* The block of `region` that holds the address just below `end`. */
static gm_block *block_below(gm_region *region, uintptr_t end)
{
    gm_block *block = region->first_block;
    while (block->address + block->size < end)
        block = block->next;
    return block;
}

/* Ending at `end`, in the vacant run that holds the address just below it. */
static bool spot_ending_at(gm_heap *lane_heap, uintptr_t end, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    gm_region *region = region_below(lane_heap, end);
    gm_block *block = region ? block_below(region, end) : NULL;
    if (!block || !gm_block_is_vacant(block))
        return false;
    gm_block *run_first = pages_run_start_of(block), *run_last = pages_run_end_of(block);
    if (end - run_first->address < size)
        return false;
    *spot = (lane_spot){run_first, run_last->address + run_last->size, end - size,
                        pages_needed(run_first, end - size, end, page_size)};
    return true;
}

/* The highest free block of the ring's part of the range (pages_ring_floor) from `from` down to `stop`
 * (not included) with `room` bytes below `top`: the stream's own blocks lie below. */
static gm_block *free_block_below(gm_block *from, const gm_block *stop, uintptr_t top, uint64_t room)
{
    uintptr_t floor = from ? pages_ring_floor(from->region) : 0;
    for (gm_block *block = from; block && block != stop && block->address + block->size > floor;
         block = block->previous) {
        uintptr_t end = block->address + block->size < top ? block->address + block->size : top;
        if (block->state == GM_BLOCK_FREE && end >= block->address + room)
            return block;
    }
    return NULL;
}

/* A jump of the head: the first free block of the lane's mapped memory, under its top, with room for
 * RING_JUMP_COPIES copies and the lap's growth, going down from the newest block (NULL: from the top)
 * and on from the top, as a ring does; the copy at its upper end. */
static bool spot_in_free_block(gm_heap *lane_heap, const gm_block *newest, uint64_t size, uint64_t slack,
                               lane_spot *spot)
{
    page_heap *lane = state_of(lane_heap);
    gm_region *region = region_below(lane_heap, lane->top);
    if (!region)
        return false;
    uint64_t room = RING_JUMP_COPIES * size > size + slack ? RING_JUMP_COPIES * size : size + slack;
    bool below_newest = newest && newest->region == region;
    gm_block *block = below_newest ? free_block_below(newest->previous, NULL, lane->top, room) : NULL;
    if (!block)
        block = free_block_below(block_below(region, lane->top), below_newest ? newest : NULL, lane->top, room);
    if (!block)
        return false;
    uintptr_t end = block->address + block->size < lane->top ? block->address + block->size : lane->top;
    *spot = (lane_spot){block, end, end - size, 0};
    return true;
}

/* A wrap of the ring: into the mapped free space directly above the oldest block, up to the top, the
 * copy at its upper end when that space holds the copy and the lap's growth (`slack`: the other
 * blocks grow by as much before the head comes back); else `slack` above the oldest block, new pages
 * extending the space (the caller raises the top). */
static bool spot_above_oldest(const page_heap *lane, gm_block *oldest, uint64_t size, uint64_t slack,
                              uint64_t page_size, lane_spot *spot)
{
    if (oldest->address >= lane->top || !oldest->next || !gm_block_is_vacant(oldest->next))
        return false;
    gm_block *first = oldest->next, *last = pages_run_end_of(first);
    uintptr_t run_start = first->address, run_end = last->address + last->size, mapped_end = run_start;
    if (first->state == GM_BLOCK_FREE) /* free blocks never touch: one, then unmapped space */
        mapped_end = first->address + first->size;
    if (mapped_end > lane->top)
        mapped_end = lane->top;
    uintptr_t end = mapped_end >= run_start + slack + size ? mapped_end : run_start + slack + size;
    if (end > run_end)
        return false;
    *spot = (lane_spot){first, run_end, end - size, pages_needed(first, end - size, end, page_size)};
    return true;
}

/* Below the lowest live block of the lane (the head met the oldest blocks: the ring's memory is full). */
static bool spot_below_lowest(const page_heap *lane, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    gm_block *lowest = NULL;
    for (gm_link *link = lane->order.first; link; link = link->next)
        if (!lowest || lane_block_of(link)->address < lowest->address)
            lowest = lane_block_of(link);
    return lowest && spot_below(lowest, size, page_size, spot);
}

/* Where the fewest new pages are needed, anywhere in the stream's large-pool range. */
static bool spot_anywhere(gm_heap *lane_heap, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    window where = pages_choose_window(state_of(lane_heap)->owner, GM_POOL_LARGE, size, page_size, NULL);
    if (!where.region)
        return false;
    *spot = (lane_spot){where.run_first, where.run_end, where.start, where.pages};
    return true;
}

/* Where the ring puts a request of `size` bytes (see the top of the file). A wrap that extends the
 * space above the oldest block past the top raises the top, even if the copy then goes to the stream's
 * heap (pages_lane_place): the ring's room is what the lap needs. */
static bool choose_spot(gm_heap *lane_heap, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    page_heap *lane = state_of(lane_heap);
    gm_block *newest = lane_block_of(lane->order.last), *oldest = lane_block_of(lane->order.first);
    lane_spot head;
    if (!newest) { /* an empty lane (between two generate calls) starts again at its top */
        bool at_top = spot_ending_at(lane_heap, lane->top, size, page_size, &head);
        if (at_top && head.pages == 0) {
            *spot = head;
            return true;
        }
        if (spot_in_free_block(lane_heap, NULL, size, 0, spot))
            return true;
        if (at_top) {
            *spot = head;
            return true;
        }
        return spot_anywhere(lane_heap, size, page_size, spot);
    }
    uint64_t slack = oldest->size < size ? lane->live * (size - oldest->size) : 0;
    bool has_head = newest->address + newest->size <= lane->top && spot_below(newest, size, page_size, &head);
    if (has_head && head.pages == 0) {
        *spot = head;
        return true;
    }
    if (spot_in_free_block(lane_heap, newest, size, slack, spot))
        return true;
    if (spot_above_oldest(lane, oldest, size, slack, page_size, spot)) {
        if (spot->start + size > lane->top)
            lane->top = spot->start + size;
        return true;
    }
    if (has_head) {
        *spot = head;
        return true;
    }
    return spot_below_lowest(lane, size, page_size, spot) || spot_anywhere(lane_heap, size, page_size, spot);
}

/* Place a request of `size` bytes in `lane_heap`; the lane's first request puts the ring's top in the
 * middle of the stream's large-pool range (made if the stream has none yet), far above the stream's
 * own blocks. */
static gm_status lane_allocate(gm_arena *arena, gm_heap *lane_heap, uint64_t size, gm_block **block_out)
{
    page_heap *lane = state_of(lane_heap);
    uint64_t page_size = engine_of(arena)->page_size;
    gm_status status = GM_OK;
    if (!lane->top) {
        gm_region *region = gm_first_region(lane->owner);
        while (region && region->pool != GM_POOL_LARGE)
            region = gm_next_region(region);
        if (!region && (status = pages_add_region(arena, lane->owner, GM_POOL_LARGE, size, &region)) != GM_OK)
            return status;
        lane->top = page_floor(region->base + region->size / 2, page_size);
    }
    lane_spot spot;
    if (!choose_spot(lane_heap, size, page_size, &spot))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no room in the growth lane's range");
    if (!(*block_out = take_spot(arena, &spot, size, &status)))
        return status != GM_OK ? status : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    return GM_OK;
}

/* Place a request in the stream's lane -- unless that would lift reserved memory above its peak while
 * a free block of the stream's own heap fits the request: GM_ERROR_OUT_OF_MEMORY then, and the request
 * takes that block (a prefill can leave such a block inside a chunk that a later buffer pins, and the
 * lane would otherwise make new pages beside it). */
gm_status pages_lane_place(gm_arena *arena, gm_heap *heap, gm_heap *lane, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(arena);
    engine->keep_peak = pages_fit_beside_lane(heap, GM_POOL_LARGE, size) != NULL;
    engine->placing_lane = true;
    gm_status status = lane_allocate(arena, lane, size, block_out);
    engine->placing_lane = false;
    engine->keep_peak = false;
    if (status == GM_OK) {
        (*block_out)->heap = lane; /* it lies in the stream's range: the lane's while allocated */
        lane_append(state_of(lane), *block_out);
    }
    return status;
}

/* A lane's allocation-order list holds exactly its allocated and pending blocks, which lie in its
 * stream's regions (lane_sharing.c). */
gm_status pages_validate_lane(const gm_heap *heap)
{
    const page_heap *lane = state_of(heap);
    uint64_t listed = 0, live = 0, bytes = 0;
    for (const gm_block *block = lane_block_of(lane->order.first); block && listed <= lane->live;
         block = lane_block_of(block->order.next), listed++) {
        if (block->heap != heap || (block->state != GM_BLOCK_ALLOCATED && block->state != GM_BLOCK_PENDING))
            return gm_fail(GM_ERROR_CORRUPT, "lane lists block 0x%" PRIxPTR " in state %d", block->address,
                           block->state);
        bytes += block->size;
    }
    for (const gm_region *region = gm_first_region(lane->owner); region; region = gm_next_region(region))
        for (const gm_block *block = region->first_block; block; block = block->next)
            live += block->heap == heap && (block->state == GM_BLOCK_ALLOCATED || block->state == GM_BLOCK_PENDING);
    if (listed != lane->live || live != lane->live || bytes != lane->live_bytes)
        return gm_fail(GM_ERROR_CORRUPT, "lane lists %" PRIu64 " blocks, counts %" PRIu64 ", holds %" PRIu64, listed,
                       lane->live, live);
    return GM_OK;
}
