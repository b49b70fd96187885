/*
 * engine.c -- the "pages" engine's operations: blocks in large virtual ranges, physical memory mapped
 * on demand, and idle physical memory moved to wherever it is needed.
 *
 * A request is served, in order of cost:
 *   0. a request of a size its stream keeps regrowing goes to the stream's growth lane (lane.c);
 *   1. from a free mapped block of the stream's heap: TLSF good fit, no device call (with rechunk_min,
 *      an idle chunk that the fit covers in part is first made anew in two: rechunk.c);
 *   2. otherwise in the window of free addresses needing the fewest new pages (windows.c), backed by
 *      idle chunks moved from elsewhere or by new memory (growth.c).
 * A stream's heap and its lane share one range; the stream's fits and windows keep out of the ring's
 * way (lane_sharing.c). While the lane is empty, a small request that would grow the small pool above
 * the peak may take a free block of the stream's large-pool range instead (small_borrowing.c).
 * A freed block merges with its free neighbours and belongs to its region's heap again; empty_cache
 * unmaps and releases every idle chunk, and records what it releases, so that a next step repeating
 * this one gets it back in few chunks (refill.c).
 * docs/engine.md explains why this reserves less than PyTorch's segments.
 */
#include "core/pages/pages.h"

#include "base/error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* A free block of exactly `size` bytes in `heap`'s `pool`, detached: a fit, else growth in the window
 * needing the fewest new pages -- neither in the way of the stream's lane (lane_sharing.c). A small
 * request may take the stream's large-pool memory instead of growing (small_borrowing.c). */
static gm_status fit_or_grow(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    gm_block *block = pages_fit_beside_lane(heap, pool, size);
    if (!block && pool == GM_POOL_SMALL && (block = pages_borrow_for_small(arena, heap, size)) != NULL) {
        gm_unindex_free_block(arena, block);
    } else if (block) {
        gm_block *remade = NULL; /* the fit with an idle chunk it covers in part made anew (rechunk.c) */
        gm_status status = arena->options->rechunk_min ? pages_rechunk_fit(arena, block, size, &remade) : GM_OK;
        if (status != GM_OK)
            return status;
        if (remade)
            block = remade;
        else
            gm_unindex_free_block(arena, block);
    } else {
        uint64_t page_size = engine_of(arena)->page_size;
        window where = pages_choose_window(heap, pool, size, page_size, pages_run_outside_lane);
        gm_status status = pages_stitch(arena, heap, size, &where, &block);
        if (status == GM_OK && !block)
            status = pages_grow(arena, heap, pool, size, where, &block);
        if (status != GM_OK)
            return status;
    }
    pages_trim_to_size(arena, block, size);
    *block_out = block;
    return GM_OK;
}

static gm_status pages_allocate(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(arena);
    if (engine->credit_ns < CREDIT_LIMIT_NS)
        engine->credit_ns += engine->credit_per_allocation;
    if (engine->bounce_credit_ns < CREDIT_LIMIT_NS)
        engine->bounce_credit_ns += BOUNCE_CREDIT_NS;
    engine->allocations++;
    if (engine->lost_chunks) {
        gm_status given_back = pages_give_back_lost_chunks(arena);
        if (given_back != GM_OK)
            return given_back;
    }
    if (!heap->engine_data && pages_new_heap_state(heap) != GM_OK)
        return GM_ERROR_OUT_OF_MEMORY;
    page_heap *state = state_of(heap);
    gm_block *block = NULL;
    gm_heap *lane = pages_goes_to_lane(arena, state, pool, size) ? pages_lane_of(arena, heap) : NULL;
    gm_status status = lane ? pages_lane_place(arena, heap, lane, size, &block) : GM_ERROR_OUT_OF_MEMORY;
    if (status != GM_OK && status != GM_ERROR_OUT_OF_MEMORY) /* a fault, not a lack of room */
        return status;
    if (status != GM_OK) { /* the stream's own heap */
        if ((status = fit_or_grow(arena, heap, pool, size, &block)) != GM_OK)
            return status;
        block->heap = heap;
    }
    block->state = GM_BLOCK_ALLOCATED;
    if (pool == GM_POOL_LARGE && size >= engine->page_size)
        state->last_large = block;
    *block_out = block;
    return GM_OK;
}

/* Stamp the chunks under a freed block with the free's number: one freed before its stream's last
 * wait is unmapped without another (chunks.c). An allocated block's pages are all mapped. */
static void stamp_freed_chunks(page_engine *engine, const gm_block *block)
{
    const gm_region *region = block->region;
    page_chunk **pages = data_of(region)->pages;
    uintptr_t end = block->address + block->size;
    engine->frees++;
    for (uintptr_t cursor = block->address; cursor < end;) {
        page_chunk *chunk = pages[page_index(region, cursor, engine->page_size)];
        chunk->freed_at = engine->frees;
        cursor = chunk->address + chunk->size;
    }
}

static void pages_free_block(gm_arena *arena, gm_block *block)
{
    stamp_freed_chunks(engine_of(arena), block);
    if (pages_mark_due(block->region->heap))
        pages_mark_progress(arena, block->region->heap);
    page_heap *state = state_of(block->heap);
    if (state->owner) {
        pages_lane_remove(state, block);
        state = state_of(state->owner);
    }
    pages_watch_free(state, block, engine_of(arena)->page_size);
    block->heap = block->region->heap; /* free memory belongs to the heap of its range */
    block->state = GM_BLOCK_FREE;
    gm_block *merged = pages_merge_alike(arena, block);
    gm_index_free_block(arena, merged);
    if (engine_of(arena)->stitch_count)
        pages_unstitch_around(arena, merged);
}

static void pages_release_cached(gm_arena *arena, uint64_t keep_bytes)
{
    page_engine *engine = engine_of(arena);
    pages_retire_passed_aliases(arena);
    pages_retry_releases(arena);
    if (engine->stitch_count)
        pages_undo_unused_stitches(arena);
    if (pages_settle_waiting(arena, NULL) != GM_OK)
        return; /* the engine's state is corrupt: validate says so */
    size_t count = pages_find_idle_chunks(arena, NULL, 0, 0);
    if (keep_bytes == 0) /* an empty_cache: what it releases is what the next step makes again */
        pages_plan_refill(arena, count);
    else /* memory is wanted back: none is made ahead of need */
        pages_drop_plan(engine);
    for (size_t i = 0; i < count && (uint64_t)gm_stat_total(arena->stats->reserved_bytes) > keep_bytes; i++) {
        idle_chunk *candidate = &engine->idle[i];
        if (pages_evict_chunk(arena, candidate->region, candidate->chunk) == GM_OK)
            pages_release_chunk(arena, candidate->region, candidate->chunk);
    }
}

static uint64_t pages_idle_bytes(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    size_t count = pages_find_idle_chunks(arena, NULL, 0, 0);
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += engine->idle[i].chunk->size;
    return total;
}

/* A block's pages are mapped exactly when it is not an unmapped block. */
static gm_status check_block_pages(const gm_region *region, const gm_block *block, void *context)
{
    uint64_t page_size = *(const uint64_t *)context;
    const page_region *data = data_of(region);
    if (gm_block_is_vacant(block) && block->heap != region->heap)
        return gm_fail(GM_ERROR_CORRUPT, "vacant block 0x%" PRIxPTR " belongs to another heap than its region",
                       block->address);
    uint64_t first = page_index(region, block->address, page_size);
    uint64_t last = page_index(region, block->address + block->size - 1, page_size);
    bool mapped_expected = block->state != GM_BLOCK_UNMAPPED;
    for (uint64_t page = first; page <= last; page++) {
        if (!mapped_expected && page % PAGE_GROUP == 0 && page + PAGE_GROUP - 1 <= last &&
            data->mapped_in_group[page / PAGE_GROUP] == 0) {
            page += PAGE_GROUP - 1; /* a whole group with no page mapped: as an unmapped block wants */
            continue;
        }
        if ((data->pages[page] != NULL) != mapped_expected && (mapped_expected || !data->pages[page]->waiting))
            return gm_fail(GM_ERROR_CORRUPT, "block 0x%" PRIxPTR " (state %d) has page %" PRIu64 " %s", block->address,
                           block->state, page, mapped_expected ? "unmapped" : "mapped");
    }
    return GM_OK;
}

/* The group counts that check_block_pages trusts agree with the pages: a group that counts mapped
 * pages holds exactly that many, and the counts add up to the chunks' pages (whose entries
 * validate_region checked), so a chunk's page in a group that counts none leaves the sum short. Only
 * the groups that count some are read page by page; a pointer written into an empty group other than
 * through record_chunk_pages (chunks.c), the one writer of both, is not looked for. */
static gm_status check_page_groups(const gm_region *region, uint64_t page_size)
{
    const page_region *data = data_of(region);
    uint64_t counted = 0;
    for (uint64_t group = 0; group <= (data->page_count - 1) / PAGE_GROUP; group++) {
        counted += data->mapped_in_group[group];
        if (data->mapped_in_group[group] == 0)
            continue;
        uint64_t held = 0;
        for (uint64_t page = group * PAGE_GROUP; page < data->page_count && page < (group + 1) * PAGE_GROUP; page++)
            held += data->pages[page] != NULL;
        if (held != data->mapped_in_group[group])
            return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR " counts %u mapped pages in group %" PRIu64
                           ", holds %" PRIu64, region->base, (unsigned)data->mapped_in_group[group], group, held);
    }
    if (counted * page_size != data->mapped_bytes)
        return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR " counts %" PRIu64 " mapped pages in its groups, its "
                       "chunks hold %" PRIu64, region->base, counted, data->mapped_bytes / page_size);
    return GM_OK;
}

static gm_status validate_region(gm_arena *arena, gm_region *region, gm_stats *recomputed, uint64_t *waiting)
{
    page_engine *engine = engine_of(arena);
    page_region *data = data_of(region);
    gm_status status = gm_validate_region_blocks(region, recomputed, check_block_pages, &engine->page_size);
    if (status != GM_OK)
        return status;
    uint64_t mapped = 0;
    for (gm_link *link = data->chunks.first; link; link = link->next) {
        const page_chunk *chunk = gm_list_item(link, page_chunk, link);
        mapped += chunk->size;
        *waiting += chunk->waiting;
        if (!chunk->clone_of) { /* a second mapping's memory is its chunk's (stitching.c) */
            gm_stat_change(recomputed->reserved_bytes, region->pool, (int64_t)chunk->size);
            gm_stat_change(recomputed->segment, region->pool, 1);
        }
        uint64_t first = page_index(region, chunk->address, engine->page_size);
        for (uint64_t page = first; page < first + chunk->size / engine->page_size; page++)
            if (data->pages[page] != chunk)
                return gm_fail(GM_ERROR_CORRUPT, "page %" PRIu64 " does not point at its chunk", page);
    }
    if (mapped != data->mapped_bytes)
        return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR " counts %" PRIu64 " mapped bytes, holds %" PRIu64,
                       region->base, data->mapped_bytes, mapped);
    return check_page_groups(region, engine->page_size);
}


static gm_status pages_validate(gm_arena *arena, gm_stats *recomputed)
{
    uint64_t waiting = 0;
    for (gm_link *link = engine_of(arena)->unreleased.first; link; link = link->next) {
        const page_chunk *chunk = gm_list_item(link, page_chunk, link);
        gm_stat_change(recomputed->reserved_bytes, chunk->pool, (int64_t)chunk->size);
        gm_stat_change(recomputed->segment, chunk->pool, 1);
    }
    for (size_t h = 0; h < arena->heap_count; h++) {
        const gm_heap *heap = arena->heaps[h];
        if (heap->engine_private && heap->engine_data) {
            gm_status status = pages_validate_lane(heap);
            if (status != GM_OK)
                return status;
        }
        for (gm_region *region = gm_first_region(arena->heaps[h]); region; region = gm_next_region(region)) {
            gm_status status = validate_region(arena, region, recomputed, &waiting);
            if (status != GM_OK)
                return status;
        }
    }
    if (waiting != engine_of(arena)->waiting_bytes)
        return gm_fail(GM_ERROR_CORRUPT, "chunks hold %" PRIu64 " waiting bytes, the engine counts %" PRIu64, waiting,
                       engine_of(arena)->waiting_bytes);
    return GM_OK;
}

/* A snapshot's view of an unmapped block (engine operation unmapped_part_end): its waiting pages
 * (refill.c) are reserved memory, its other pages addresses only. Without waiting pages anywhere the
 * block is one part, and its pages are not looked at. */
static uintptr_t pages_unmapped_part_end(const gm_arena *arena, const gm_block *block, uintptr_t from,
                                         bool *reserved_out)
{
    const page_engine *engine = arena->engine_state;
    uintptr_t end = block->address + block->size;
    *reserved_out = false;
    if (!engine->waiting_bytes)
        return end;
    return pages_waiting_part_end(block->region, from, end, engine->page_size, reserved_out);
}

static gm_status pages_create(gm_arena *arena)
{
    /* On a cache line of its own start: the fields every request reads share one line. */
    page_engine *engine = aligned_alloc(64, gm_round_up(sizeof *engine, 64));
    if (!engine)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pages engine");
    memset(engine, 0, sizeof *engine);
    engine->page_size = arena->backend->page_size;
    /* Twice the usable memory: room for holes left by moved chunks. */
    engine->region_size = gm_round_up(arena->memory_limit, engine->page_size) * 2;
    engine->credit_per_allocation = arena->options->device_credit_ns;
    /* The credit's unit: what making one page-sized chunk costs by the device model. */
    engine->page_chunk_cost_ns = gm_device_call_cost_ns(GM_CALL_PHYSICAL_CREATE, engine->page_size) +
                                 gm_device_call_cost_ns(GM_CALL_MAP, engine->page_size) +
                                 gm_device_call_cost_ns(GM_CALL_SET_ACCESS, engine->page_size);
    uint64_t max_chunk = arena->options->max_chunk_size / engine->page_size * engine->page_size;
    engine->max_chunk_size = max_chunk ? max_chunk : arena->options->max_chunk_size ? engine->page_size : UINT64_MAX;
    arena->engine_state = engine;
    return GM_OK;
}

/* Give back a region none of whose blocks is allocated: its chunks, its addresses, its blocks. */
static gm_status drop_free_region(gm_arena *arena, gm_region *region)
{
    page_region *data = data_of(region);
    gm_status settled = pages_settle_waiting(arena, region);
    if (settled != GM_OK)
        return settled;
    pages_forget_region_plan(engine_of(arena), region);
    gm_status unstitched = engine_of(arena)->stitch_count ? pages_undo_stitches_in(arena, region) : GM_OK;
    if (unstitched != GM_OK)
        return unstitched;
    while (data->chunks.first) {
        page_chunk *chunk = gm_list_item(data->chunks.first, page_chunk, link);
        gm_status status = pages_evict_chunk(arena, region, chunk);
        if (status != GM_OK)
            return status;
        pages_release_chunk(arena, region, chunk);
    }
    gm_status status = pages_retire_aliases_in(arena, region->base, region->base + region->size);
    if (status == GM_OK)
        status = gm_backend_address_free(arena->backend, region->base, region->size);
    if (status != GM_OK)
        return status; /* the region stays, all unmapped, until its addresses can go back */
    gm_delete_region_blocks(arena, region);
    gm_list_remove(&region->heap->regions, &region->link);
    free(data->pages);
    free(data->mapped_in_group);
    free(data);
    free(region);
    return GM_OK;
}

static gm_status forget_one_heap(gm_arena *arena, gm_heap *heap)
{
    while (heap->regions.first) {
        gm_status status = drop_free_region(arena, gm_first_region(heap));
        if (status != GM_OK)
            return status;
    }
    pages_forget_marks(arena, heap);
    free(heap->engine_data);
    heap->engine_data = NULL;
    gm_remove_heap(arena, heap);
    return GM_OK;
}

static gm_status pages_forget_heap(gm_arena *arena, gm_heap *heap)
{
    if (pages_stream_capturing(arena, heap)) /* its chunks' waits would join the graph: kept until the end */
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "the heap's stream is being captured into a CUDA graph");
    gm_heap *lane = heap->engine_data ? state_of(heap)->lane : NULL;
    if (lane && state_of(lane)->live) /* the lane's blocks lie in this heap's range: it stays */
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "the heap's lane still has live blocks");
    if (lane) {
        gm_status status = forget_one_heap(arena, lane);
        if (status != GM_OK)
            return status;
        state_of(heap)->lane = NULL;
    }
    return forget_one_heap(arena, heap);
}

static void pages_destroy(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    if (!engine)
        return;
    /* cuMemUnmap does not wait for work still using the memory (a free is ordered on its stream, the
     * allocator's end is not): the device is waited for first, unless that would break a capture. */
    if (!pages_any_stream_capturing(arena))
        gm_backend_synchronize(arena->backend);
    pages_drop_stitches(arena);
    pages_drop_aliases(arena);
    for (size_t h = 0; h < arena->heap_count; h++) {
        gm_region *region = gm_first_region(arena->heaps[h]);
        while (region) {
            page_region *data = data_of(region);
            while (data->chunks.first) { /* the allocator goes: a failed call changes nothing here */
                page_chunk *chunk = gm_list_item(data->chunks.first, page_chunk, link);
                if (pages_unmap_chunk(arena, region, chunk) != GM_OK)
                    gm_list_remove(&data->chunks, &chunk->link);
                pages_release_physical(arena, chunk);
            }
            gm_backend_address_free(arena->backend, region->base, region->size);
            gm_delete_region_blocks(arena, region);
            gm_region *next = gm_next_region(region);
            free(data->pages);
            free(data->mapped_in_group);
            free(data);
            free(region);
            region = next;
        }
        arena->heaps[h]->regions = (gm_list){0};
        pages_forget_marks(arena, arena->heaps[h]);
        free(arena->heaps[h]->engine_data);
        arena->heaps[h]->engine_data = NULL;
    }
    while (engine->unreleased.first) {
        page_chunk *chunk = gm_list_item(engine->unreleased.first, page_chunk, link);
        gm_list_remove(&engine->unreleased, &chunk->link);
        if (chunk->stray)
            gm_backend_unmap(arena->backend, chunk->address, chunk->size);
        pages_release_physical(arena, chunk);
    }
    free(engine->idle);
    pages_free_refill(engine);
    free(engine);
    arena->engine_state = NULL;
}

const gm_engine_operations gm_page_engine = {
    .name = "pages",
    .create = pages_create,
    .destroy = pages_destroy,
    .allocate = pages_allocate,
    .free_block = pages_free_block,
    .release_cached = pages_release_cached,
    .validate = pages_validate,
    .forget_heap = pages_forget_heap,
    .grant_peer_access = pages_grant_peer_access,
    .share_block = pages_share_block,
    .unmapped_part_end = pages_unmapped_part_end,
    .defragment = pages_defragment,
    .pinned_free_bytes = pages_pinned_free_bytes,
    .idle_bytes = pages_idle_bytes,
};
