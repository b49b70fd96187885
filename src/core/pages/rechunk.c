/*
 * rechunk.c -- an idle chunk that a fit would cover only in part is made anew in two (rechunk_min, off
 * by default).
 *
 * A chunk's size is decided when it is made, for the request that made it (growth.c); once that
 * request is freed its memory serves blocks of other sizes, and a block that covers the first pages of
 * an idle chunk pins all of it: the chunk's other pages can neither move to where a growth needs them
 * nor go back to the device while the block lives. So when a fit (TLSF, in the stream's heap) would
 * leave at least rechunk_min bytes of an idle chunk uncovered, that chunk is unmapped and released,
 * the rest of its pages are made again as one chunk, idle and free to move, and the block's own pages
 * are backed as a growth's are. Reserved memory does not change: the new chunks take the old one's
 * pages. Only the last chunk the block touches can reach past it (the fit starts where its free block
 * starts, so the first chunk it touches is either the one before it, already pinned, or begins with
 * it).
 *
 * Chunk boundaries then follow the blocks placed, and at the peak almost no free page lies in a
 * pinned chunk; but each time costs a release and two chunks (a release, two creates, mappings and
 * access), and a workload whose block sizes change from step to step pays it again at every step
 * (docs/engine.md, "Tried and not adopted").
 */
#include "core/pages/pages.h"

#include "base/error.h"

/* Make a chunk for [from, to) of `region` (unmapped addresses) and turn them into free memory. */
static gm_status remake_part(gm_arena *arena, gm_region *region, uintptr_t from, uintptr_t to)
{
    gm_status status = pages_create_chunk(arena, region, from, to - from);
    if (status != GM_OK)
        return status;
    gm_block *hole = pages_unmapped_at(region, from);
    pages_unmapped_remove(region, hole);
    gm_block *opened = pages_carve(arena, hole, from, to, GM_BLOCK_FREE);
    if (!opened) {
        pages_unmapped_insert(region, hole);
        pages_leave_waiting(arena, region, from, to);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    gm_index_free_block(arena, pages_merge_alike(arena, opened));
    return GM_OK;
}

/* The idle chunk that a block of `size` bytes at the start of the free block `block` would cover in
 * part, leaving at least `least` bytes of it uncovered; NULL if none. */
static page_chunk *chunk_covered_in_part(const gm_block *block, uint64_t size, uint64_t least, uint64_t page_size)
{
    const gm_region *region = block->region;
    uintptr_t end = page_ceiling(block->address + size, page_size);
    page_chunk *chunk = data_of(region)->pages[page_index(region, end - page_size, page_size)];
    uintptr_t chunk_end = chunk->address + chunk->size;
    bool idle = chunk->address >= block->address && chunk_end <= block->address + block->size;
    return idle && chunk_end > end && chunk_end - end >= least ? chunk : NULL;
}

gm_status pages_rechunk_fit(gm_arena *arena, gm_block *block, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(arena);
    uint64_t page_size = engine->page_size, least = arena->options->rechunk_min;
    *block_out = NULL;
    if (block->pool != GM_POOL_LARGE)
        return GM_OK;
    page_chunk *chunk = chunk_covered_in_part(block, size, least, page_size);
    if (!chunk)
        return GM_OK;
    int64_t spent_before = arena->backend->modelled_ns;
    gm_region *region = block->region;
    uintptr_t start = block->address, end = page_ceiling(start + size, page_size);
    uintptr_t chunk_end = chunk->address + chunk->size;
    gm_status status = pages_evict_chunk(arena, region, chunk);
    if (status != GM_OK)
        return status;
    pages_release_chunk(arena, region, chunk);
    /* The rest first: the block's pages then need no more than the released chunk gave back, so they
     * are new memory below the peak, not idle chunks moved from elsewhere. Should the rest not be made
     * again (a full device), its addresses stay unmapped: free space, backed when a request needs it. */
    remake_part(arena, region, end, chunk_end);
    engine->credit_ns -= arena->backend->modelled_ns - spent_before;
    gm_block *hole = pages_unmapped_at(region, end - page_size);
    gm_block *first = pages_run_start_of(hole), *last = pages_run_end_of(hole);
    window where = {region, first, first->address, last->address + last->size, start,
                    pages_needed(first, start, start + size, page_size), 0};
    status = pages_open_window(arena, where, size, block_out);
    if (status == GM_OK && (*block_out)->address != start) {
        gm_index_free_block(arena, *block_out);
        *block_out = NULL;
        return gm_fail(GM_ERROR_CORRUPT, "a remade fit does not start where its free block did");
    }
    return status;
}
