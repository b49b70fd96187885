/*
 * page_engine.c -- the "pages" engine: blocks in large virtual ranges, physical memory mapped on
 * demand, and free physical chunks moved to wherever they are needed.
 *
 * Each heap (stream) has, per pool, a region: a virtual address range reserved once and far larger
 * than the device, so addresses never run short. Blocks tile the region in four states: allocated,
 * pending, free (mapped, in the size index) and unmapped (addresses only). Physical memory comes in
 * chunks (one cuMemCreate each, a whole number of pages), each mapped at exactly one place; the
 * page table of the region says which chunk backs each page.
 *
 * A request is served, in order of cost:
 *   1. from a free mapped block (TLSF good fit; no device call);
 *   2. by mapping pages next to free space: the placement that needs the fewest new pages, either
 *      extending a free block that borders unmapped addresses (as expandable segments grow) or in
 *      fresh addresses;
 *   3. the pages come from idle chunks (chunks that lie wholly inside free blocks, anywhere),
 *      unmapped there and mapped here -- this is the stitching of GMLake: free memory that is in
 *      the wrong place or in pieces too small is gathered into one contiguous range -- when making
 *      new memory would raise reserved memory above its previous peak; otherwise from one new chunk
 *      of exactly the pages needed (one create, one map, one set-access).
 * So reserved memory only grows past its peak when the idle chunks cannot cover a request, and the
 * device calls (each costing tens of microseconds) happen only on growth, never on the fast path.
 *
 * Before unmapping a chunk the engine waits for the work queued on the chunk's stream (an event),
 * as PyTorch does for expandable segments: unmapping memory that a queued kernel still uses would
 * fault. empty_cache unmaps and releases every idle chunk.
 */
#include "internal.h"

#include "error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct page_chunk {
    uintptr_t address; /* where it is mapped */
    uint64_t size;
    uint64_t handle;
    struct page_chunk *previous; /* in the region's chunk list */
    struct page_chunk *next;
} page_chunk;

typedef struct page_region {
    page_chunk **pages;     /* page index -> chunk mapped there, or NULL */
    uint64_t page_count;
    page_chunk *chunks;
    gm_block *unmapped;     /* unmapped blocks, linked through free_next / free_previous */
} page_region;

/* An idle chunk found in a free block. */
typedef struct idle_chunk {
    page_chunk *chunk;
    gm_region *region;
} idle_chunk;

typedef struct page_engine {
    uint64_t page_size;
    uint64_t region_size;
    idle_chunk *idle;       /* scratch list for the growth path */
    size_t idle_capacity;
} page_engine;

static page_engine *engine_of(gm_allocator *allocator)
{
    return (page_engine *)allocator->engine_state;
}

static page_region *data_of(const gm_region *region)
{
    return (page_region *)region->engine_data;
}

static uint64_t page_index(const gm_region *region, uintptr_t address, uint64_t page_size)
{
    return (address - region->base) / page_size;
}

/* ---------------------------------------------------------------- unmapped-block list */

static void unmapped_insert(gm_region *region, gm_block *block)
{
    page_region *data = data_of(region);
    block->state = GM_BLOCK_UNMAPPED;
    block->free_previous = NULL;
    block->free_next = data->unmapped;
    if (data->unmapped)
        data->unmapped->free_previous = block;
    data->unmapped = block;
}

static void unmapped_remove(gm_region *region, gm_block *block)
{
    page_region *data = data_of(region);
    if (block->free_previous)
        block->free_previous->free_next = block->free_next;
    else
        data->unmapped = block->free_next;
    if (block->free_next)
        block->free_next->free_previous = block->free_previous;
    block->free_previous = block->free_next = NULL;
}

/* Take `block` out of whatever structure holds it (size index or unmapped list). */
static void detach(gm_allocator *allocator, gm_block *block)
{
    if (block->state == GM_BLOCK_FREE)
        gm_unindex_free_block(allocator, block);
    else if (block->state == GM_BLOCK_UNMAPPED)
        unmapped_remove(block->region, block);
}

/* Merge `block` (detached) with neighbours of the same state (free or unmapped), which are detached
 * and absorbed; returns the merged block, still detached. */
static gm_block *merge_alike(gm_allocator *allocator, gm_block *block)
{
    if (block->previous && block->previous->state == block->state) {
        gm_block *previous = block->previous;
        detach(allocator, previous);
        gm_absorb_next(allocator, previous);
        block = previous;
    }
    if (block->next && block->next->state == block->state) {
        detach(allocator, block->next);
        gm_absorb_next(allocator, block);
    }
    return block;
}

/* Put a detached free or unmapped block where it belongs. */
static void attach(gm_allocator *allocator, gm_block *block)
{
    if (block->state == GM_BLOCK_FREE)
        gm_index_free_block(allocator, block);
    else
        unmapped_insert(block->region, block);
}

/* Carve [start, end) out of the detached block `block` (which contains it): the pieces before and
 * after keep the old state and are attached; the middle gets `state` and is returned detached.
 * NULL if block metadata ran out (nothing changed then). */
static gm_block *carve(gm_allocator *allocator, gm_block *block, uintptr_t start, uintptr_t end, int state)
{
    gm_block *middle = block;
    if (start > block->address && !(middle = gm_split_block(allocator, block, start - block->address)))
        return NULL;
    if (end < middle->address + middle->size) {
        gm_block *tail = gm_split_block(allocator, middle, end - middle->address);
        if (!tail) {
            if (middle != block)
                gm_absorb_next(allocator, block);
            return NULL;
        }
        attach(allocator, tail);
    }
    if (middle != block)
        attach(allocator, block);
    middle->state = (uint8_t)state;
    return middle;
}

/* ---------------------------------------------------------------- regions */

static gm_status new_region(gm_allocator *allocator, gm_heap *heap, int pool, gm_region **region_out)
{
    page_engine *engine = engine_of(allocator);
    gm_region *region = calloc(1, sizeof *region);
    page_region *data = calloc(1, sizeof *data);
    gm_block *block = gm_block_new(&allocator->block_pool);
    uint64_t page_count = engine->region_size / engine->page_size;
    page_chunk **pages = calloc(page_count, sizeof *pages);
    uintptr_t base = 0;
    gm_status status = region && data && block && pages ? GM_OK
                                                        : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a region");
    if (status == GM_OK)
        status = gm_backend_address_reserve(allocator->backend, engine->region_size, &base);
    if (status != GM_OK) {
        free(region);
        free(data);
        free(pages);
        if (block)
            gm_block_delete(&allocator->block_pool, block);
        return status;
    }
    data->pages = pages;
    data->page_count = page_count;
    *region = (gm_region){.base = base, .size = engine->region_size, .heap = heap, .next = heap->regions,
                          .first_block = block, .pool = (uint8_t)pool, .engine_data = data};
    if (heap->regions)
        heap->regions->previous = region;
    heap->regions = region;
    *block = (gm_block){.address = base, .size = engine->region_size, .region = region, .heap = heap,
                        .pool = (uint8_t)pool};
    unmapped_insert(region, block);
    *region_out = region;
    return GM_OK;
}

/* ---------------------------------------------------------------- chunks */

static void record_chunk_pages(gm_region *region, page_chunk *chunk, page_chunk *value, uint64_t page_size)
{
    page_region *data = data_of(region);
    uint64_t first = page_index(region, chunk->address, page_size);
    for (uint64_t page = first; page < first + chunk->size / page_size; page++)
        data->pages[page] = value;
}

static void link_chunk(gm_region *region, page_chunk *chunk)
{
    page_region *data = data_of(region);
    chunk->previous = NULL;
    chunk->next = data->chunks;
    if (data->chunks)
        data->chunks->previous = chunk;
    data->chunks = chunk;
}

static void unlink_chunk(gm_region *region, page_chunk *chunk)
{
    page_region *data = data_of(region);
    if (chunk->previous)
        chunk->previous->next = chunk->next;
    else
        data->chunks = chunk->next;
    if (chunk->next)
        chunk->next->previous = chunk->previous;
}

/* Map `chunk` at `address` of `region` (not made accessible yet). */
static gm_status map_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk, uintptr_t address)
{
    gm_status status = gm_backend_map(allocator->backend, address, chunk->size, chunk->handle);
    if (status != GM_OK)
        return status;
    chunk->address = address;
    link_chunk(region, chunk);
    record_chunk_pages(region, chunk, chunk, engine_of(allocator)->page_size);
    allocator->stats.num_page_maps += (int64_t)(chunk->size / engine_of(allocator)->page_size);
    return GM_OK;
}

static gm_status unmap_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk)
{
    gm_status status = gm_backend_unmap(allocator->backend, chunk->address, chunk->size);
    if (status != GM_OK)
        return status;
    unlink_chunk(region, chunk);
    record_chunk_pages(region, chunk, NULL, engine_of(allocator)->page_size);
    allocator->stats.num_page_unmaps += (int64_t)(chunk->size / engine_of(allocator)->page_size);
    return GM_OK;
}

/* Wait until the work queued so far on `heap`'s stream has finished. */
static gm_status quiesce(gm_allocator *allocator, gm_heap *heap)
{
    uint64_t event = 0;
    gm_status status = gm_backend_event_create(allocator->backend, &event);
    if (status != GM_OK)
        return status;
    status = gm_backend_event_record(allocator->backend, event, heap->stream);
    if (status == GM_OK)
        status = gm_backend_event_synchronize(allocator->backend, event);
    gm_backend_event_destroy(allocator->backend, event);
    return status;
}

/* The free block of `region` that contains [address, address + size), or NULL. */
static gm_block *free_block_containing(gm_allocator *allocator, gm_region *region, uintptr_t address, uint64_t size)
{
    gm_size_index *index = gm_heap_index(region->heap, region->pool);
    for (unsigned first = 0; first < GM_INDEX_FIRST_COUNT; first++) {
        if (!(index->first_bitmap & (1ull << first)))
            continue;
        for (unsigned second = 0; second < GM_INDEX_SECOND_COUNT; second++)
            for (gm_block *block = index->lists[first][second]; block; block = block->free_next)
                if (block->region == region && block->address <= address &&
                    address + size <= block->address + block->size)
                    return block;
    }
    (void)allocator;
    return NULL;
}

/* Unmap an idle chunk from the free block around it; its addresses become unmapped. The chunk
 * keeps its handle and is unlinked from the region. */
static gm_status evict_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk)
{
    gm_block *around = free_block_containing(allocator, region, chunk->address, chunk->size);
    if (!around)
        return gm_fail(GM_ERROR_CORRUPT, "idle chunk 0x%" PRIxPTR " is not inside a free block", chunk->address);
    gm_status status = unmap_chunk(allocator, region, chunk);
    if (status != GM_OK)
        return status;
    gm_unindex_free_block(allocator, around);
    gm_block *hole = carve(allocator, around, chunk->address, chunk->address + chunk->size, GM_BLOCK_UNMAPPED);
    if (!hole) { /* no metadata: keep the addresses as they were; the pages are simply gone */
        gm_index_free_block(allocator, around);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    hole = merge_alike(allocator, hole);
    attach(allocator, hole);
    return GM_OK;
}

static gm_status release_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk)
{
    gm_status status = gm_backend_physical_release(allocator->backend, chunk->handle);
    gm_count_reserved(allocator, region->pool, -(int64_t)chunk->size, -1);
    allocator->stats.num_device_free++;
    free(chunk);
    return status;
}

/* ---------------------------------------------------------------- finding idle chunks */

static bool remember_idle(page_engine *engine, size_t *count, page_chunk *chunk, gm_region *region)
{
    if (*count == engine->idle_capacity) {
        size_t capacity = engine->idle_capacity ? engine->idle_capacity * 2 : 64;
        idle_chunk *grown = realloc(engine->idle, capacity * sizeof *grown);
        if (!grown)
            return false;
        engine->idle = grown;
        engine->idle_capacity = capacity;
    }
    engine->idle[(*count)++] = (idle_chunk){chunk, region};
    return true;
}

/* Collect into engine->idle every chunk that lies wholly inside a free block, in every heap and
 * pool, except inside the free blocks `keep_left` and `keep_right` (the neighbours a growth plan
 * counts on). One pass over the free blocks, following the page table from chunk to chunk. */
static size_t find_idle_chunks(gm_allocator *allocator, const gm_block *keep_left, const gm_block *keep_right)
{
    page_engine *engine = engine_of(allocator);
    uint64_t page_size = engine->page_size;
    size_t count = 0;
    for (size_t h = 0; h < allocator->heap_count; h++) {
        for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE; pool++) {
            gm_size_index *index = gm_heap_index(allocator->heaps[h], pool);
            uint64_t firsts = index->first_bitmap;
            while (firsts) {
                unsigned first = (unsigned)__builtin_ctzll(firsts);
                firsts &= firsts - 1;
                for (unsigned second = 0; second < GM_INDEX_SECOND_COUNT; second++) {
                    for (gm_block *block = index->lists[first][second]; block; block = block->free_next) {
                        if (block->size < page_size || block == keep_left || block == keep_right)
                            continue;
                        gm_region *region = block->region;
                        page_chunk **pages = data_of(region)->pages;
                        uintptr_t end = block->address + block->size;
                        uintptr_t cursor = region->base + gm_round_up(block->address - region->base, page_size);
                        while (cursor + page_size <= end) {
                            page_chunk *chunk = pages[page_index(region, cursor, page_size)];
                            if (chunk->address >= block->address && chunk->address + chunk->size <= end &&
                                !remember_idle(engine, &count, chunk, region))
                                return count;
                            cursor = chunk->address + chunk->size;
                        }
                    }
                }
            }
        }
    }
    return count;
}

static int larger_chunk_first(const void *left, const void *right)
{
    uint64_t a = ((const idle_chunk *)left)->chunk->size, b = ((const idle_chunk *)right)->chunk->size;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* ---------------------------------------------------------------- growth */

/* Where to map: pages [map_start, map_start + pages * page_size) inside the unmapped block `hole`. */
typedef struct placement {
    gm_block *hole;
    uintptr_t map_start;
    uint64_t pages;
} placement;

/* The placement for `size` bytes around `hole` that needs the fewest pages. */
static placement place_in_hole(gm_block *hole, uint64_t size, uint64_t page_size)
{
    placement best = {NULL, 0, UINT64_MAX};
    gm_block *left = hole->previous && hole->previous->state == GM_BLOCK_FREE ? hole->previous : NULL;
    gm_block *right = hole->next && hole->next->state == GM_BLOCK_FREE ? hole->next : NULL;
    uint64_t left_size = left ? left->size : 0, right_size = right ? right->size : 0;
    uint64_t hole_pages = hole->size / page_size;
    /* Grow the left free block (or start at the hole) upwards. */
    uint64_t need = size > left_size ? size - left_size : 0;
    uint64_t pages = (need + page_size - 1) / page_size;
    if (pages <= hole_pages)
        best = (placement){hole, hole->address, pages};
    else if (right && hole_pages * page_size + left_size + right_size >= size)
        best = (placement){hole, hole->address, hole_pages};
    /* Grow the right free block downwards. */
    if (right) {
        need = size > right_size ? size - right_size : 0;
        pages = (need + page_size - 1) / page_size;
        if (pages < best.pages && pages <= hole_pages)
            best = (placement){hole, hole->address + hole->size - pages * page_size, pages};
    }
    return best;
}

static placement choose_placement(gm_heap *heap, int pool, uint64_t size, uint64_t page_size)
{
    placement best = {NULL, 0, UINT64_MAX};
    for (gm_region *region = heap->regions; region; region = region->next) {
        if (region->pool != pool)
            continue;
        for (gm_block *hole = data_of(region)->unmapped; hole; hole = hole->free_next) {
            placement candidate = place_in_hole(hole, size, page_size);
            if (candidate.pages < best.pages ||
                (candidate.pages == best.pages && candidate.hole && candidate.map_start < best.map_start))
                best = candidate;
        }
    }
    return best;
}

/* Map idle chunks back to back from `address` for up to `room` bytes, until `need` bytes are
 * covered. Returns the bytes mapped. */
static uint64_t map_idle_chunks(gm_allocator *allocator, gm_region *target, uintptr_t address, uint64_t need,
                                uint64_t room, size_t idle_count, gm_status *status_out)
{
    page_engine *engine = engine_of(allocator);
    uint64_t mapped = 0;
    for (size_t i = 0; i < idle_count && mapped < need; i++) {
        idle_chunk *candidate = &engine->idle[i];
        page_chunk *chunk = candidate->chunk;
        if (!chunk || chunk->size > room - mapped)
            continue;
        gm_status status = quiesce(allocator, candidate->region->heap);
        if (status == GM_OK)
            status = evict_chunk(allocator, candidate->region, chunk);
        if (status == GM_OK)
            status = map_chunk(allocator, target, chunk, address + mapped);
        if (status != GM_OK) {
            *status_out = status;
            return mapped;
        }
        if (candidate->region->pool != target->pool)
            gm_move_reserved(allocator, candidate->region->pool, target->pool, chunk->size);
        candidate->chunk = NULL;
        mapped += chunk->size;
    }
    *status_out = GM_OK;
    return mapped;
}

static gm_status create_chunk(gm_allocator *allocator, gm_region *region, uintptr_t address, uint64_t size)
{
    if (!gm_may_reserve(allocator, size))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "memory limit of %" PRIu64 " bytes reached", allocator->memory_limit);
    page_chunk *chunk = calloc(1, sizeof *chunk);
    if (!chunk)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a chunk");
    chunk->size = size;
    gm_status status = gm_backend_physical_create(allocator->backend, size, &chunk->handle);
    if (status == GM_OK) {
        status = map_chunk(allocator, region, chunk, address);
        if (status != GM_OK)
            gm_backend_physical_release(allocator->backend, chunk->handle);
    }
    if (status != GM_OK) {
        free(chunk);
        return status;
    }
    gm_count_reserved(allocator, region->pool, (int64_t)size, 1);
    allocator->stats.num_device_alloc++;
    return GM_OK;
}

/* Back [start, start + pages) of the unmapped block `hole` with physical memory: idle chunks when new
 * memory would raise reserved memory past its peak, else one new chunk. Returns the bytes mapped
 * (which may exceed the request when idle chunks were larger), made accessible. */
static gm_status back_pages(gm_allocator *allocator, placement *where, uint64_t *mapped_out)
{
    page_engine *engine = engine_of(allocator);
    gm_region *region = where->hole->region;
    uint64_t need = where->pages * engine->page_size;
    uint64_t room = where->hole->address + where->hole->size - where->map_start;
    const gm_stat *reserved = &allocator->stats.reserved_bytes[GM_POOL_ALL];
    uint64_t mapped = 0;
    gm_status status = GM_OK;
    if (reserved->current + (int64_t)need > reserved->peak || !gm_may_reserve(allocator, need)) {
        size_t idle_count = find_idle_chunks(allocator, where->hole->previous, where->hole->next);
        if (idle_count > 1)
            qsort(engine->idle, idle_count, sizeof *engine->idle, larger_chunk_first);
        mapped = map_idle_chunks(allocator, region, where->map_start, need, room, idle_count, &status);
    }
    if (status == GM_OK && mapped < need) {
        status = create_chunk(allocator, region, where->map_start + mapped, need - mapped);
        if (status == GM_OK)
            mapped = need;
    }
    if (mapped) {
        gm_status access = gm_backend_set_access(allocator->backend, where->map_start, mapped);
        status = status == GM_OK ? access : status;
    }
    *mapped_out = mapped;
    return status;
}

/* Turn the mapped part [start, start + mapped) of the unmapped block `hole` into free space merged
 * with its free neighbours; returns the merged free block, detached. */
static gm_block *open_mapped(gm_allocator *allocator, gm_block *hole, uintptr_t start, uint64_t mapped)
{
    unmapped_remove(hole->region, hole);
    hole->state = GM_BLOCK_UNMAPPED;
    gm_block *opened = carve(allocator, hole, start, start + mapped, GM_BLOCK_FREE);
    if (!opened)
        return NULL;
    return merge_alike(allocator, opened);
}

static gm_status grow(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(allocator);
    placement where = choose_placement(heap, pool, size, engine->page_size);
    if (!where.hole) {
        gm_region *region = NULL;
        gm_status status = new_region(allocator, heap, pool, &region);
        if (status != GM_OK)
            return status;
        where = place_in_hole(region->first_block, size, engine->page_size);
        if (!where.hole)
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "request of %" PRIu64 " bytes exceeds a region", size);
    }
    uint64_t mapped = 0;
    gm_status status = back_pages(allocator, &where, &mapped);
    if (mapped == 0)
        return status;
    gm_block *opened = open_mapped(allocator, where.hole, where.map_start, mapped);
    if (!opened)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    if (status != GM_OK || opened->size < size) {
        gm_index_free_block(allocator, opened);
        return status != GM_OK ? status : gm_fail(GM_ERROR_OUT_OF_MEMORY, "growth fell short");
    }
    *block_out = opened;
    return GM_OK;
}

/* ---------------------------------------------------------------- engine operations */

static gm_status pages_allocate(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    gm_block *block = gm_size_index_find(gm_heap_index(heap, pool), size);
    if (block) {
        gm_unindex_free_block(allocator, block);
    } else {
        gm_status status = grow(allocator, heap, pool, size, &block);
        if (status != GM_OK)
            return status;
    }
    gm_block *rest = gm_split_block(allocator, block, size);
    if (rest)
        gm_index_free_block(allocator, rest);
    block->state = GM_BLOCK_ALLOCATED;
    *block_out = block;
    return GM_OK;
}

static void pages_free_block(gm_allocator *allocator, gm_block *block)
{
    block->state = GM_BLOCK_FREE;
    block = merge_alike(allocator, block);
    gm_index_free_block(allocator, block);
}

static void pages_release_cached(gm_allocator *allocator)
{
    size_t idle_count = find_idle_chunks(allocator, NULL, NULL);
    page_engine *engine = engine_of(allocator);
    for (size_t i = 0; i < idle_count; i++) {
        idle_chunk *candidate = &engine->idle[i];
        if (quiesce(allocator, candidate->region->heap) != GM_OK ||
            evict_chunk(allocator, candidate->region, candidate->chunk) != GM_OK)
            continue;
        release_chunk(allocator, candidate->region, candidate->chunk);
    }
}

static gm_status validate_region(gm_allocator *allocator, gm_region *region, gm_stats *recomputed)
{
    page_engine *engine = engine_of(allocator);
    page_region *data = data_of(region);
    uintptr_t expected = region->base;
    const gm_block *previous = NULL;
    for (const gm_block *block = region->first_block; block; previous = block, block = block->next) {
        if (block->address != expected || block->previous != previous || block->region != region)
            return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR ": block 0x%" PRIxPTR " out of place", region->base,
                           block->address);
        if ((block->state == GM_BLOCK_FREE || block->state == GM_BLOCK_UNMAPPED) && previous &&
            previous->state == block->state)
            return gm_fail(GM_ERROR_CORRUPT, "two adjacent blocks of state %d at 0x%" PRIxPTR, block->state,
                           block->address);
        uint64_t first = page_index(region, block->address, engine->page_size);
        uint64_t last = page_index(region, block->address + block->size - 1, engine->page_size);
        bool mapped_expected = block->state != GM_BLOCK_UNMAPPED;
        for (uint64_t page = first; page <= last; page++)
            if ((data->pages[page] != NULL) != mapped_expected)
                return gm_fail(GM_ERROR_CORRUPT, "block 0x%" PRIxPTR " (state %d) has page %" PRIu64 " %s",
                               block->address, block->state, page, mapped_expected ? "unmapped" : "mapped");
        if (block->state == GM_BLOCK_FREE) {
            if (!block->indexed)
                return gm_fail(GM_ERROR_CORRUPT, "free block 0x%" PRIxPTR " is not indexed", block->address);
            if (gm_block_is_split(block)) {
                gm_stat_change(recomputed->inactive_split, region->pool, 1);
                gm_stat_change(recomputed->inactive_split_bytes, region->pool, (int64_t)block->size);
            }
        }
        expected += block->size;
    }
    if (expected != region->base + region->size)
        return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR ": blocks cover %" PRIu64 " of %" PRIu64 " bytes",
                       region->base, (uint64_t)(expected - region->base), region->size);
    for (const page_chunk *chunk = data->chunks; chunk; chunk = chunk->next) {
        gm_stat_change(recomputed->reserved_bytes, region->pool, (int64_t)chunk->size);
        gm_stat_change(recomputed->segment, region->pool, 1);
        uint64_t first = page_index(region, chunk->address, engine->page_size);
        for (uint64_t page = first; page < first + chunk->size / engine->page_size; page++)
            if (data->pages[page] != chunk)
                return gm_fail(GM_ERROR_CORRUPT, "page %" PRIu64 " does not point at its chunk", page);
    }
    return GM_OK;
}

static gm_status pages_validate(gm_allocator *allocator, gm_stats *recomputed)
{
    for (size_t h = 0; h < allocator->heap_count; h++)
        for (gm_region *region = allocator->heaps[h]->regions; region; region = region->next) {
            gm_status status = validate_region(allocator, region, recomputed);
            if (status != GM_OK)
                return status;
        }
    return GM_OK;
}

static gm_status pages_create(gm_allocator *allocator)
{
    page_engine *engine = calloc(1, sizeof *engine);
    if (!engine)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pages engine");
    engine->page_size = allocator->backend->page_size;
    /* Twice the usable memory: room for holes left by moved chunks, never more than needed. */
    engine->region_size = gm_round_up(allocator->memory_limit, engine->page_size) * 2;
    allocator->engine_state = engine;
    return GM_OK;
}

static void pages_destroy(gm_allocator *allocator)
{
    page_engine *engine = engine_of(allocator);
    if (!engine)
        return;
    for (size_t h = 0; h < allocator->heap_count; h++) {
        gm_region *region = allocator->heaps[h]->regions;
        while (region) {
            page_region *data = data_of(region);
            while (data->chunks) {
                page_chunk *chunk = data->chunks;
                unmap_chunk(allocator, region, chunk);
                release_chunk(allocator, region, chunk);
            }
            gm_backend_address_free(allocator->backend, region->base, region->size);
            for (gm_block *block = region->first_block; block;) {
                gm_block *next = block->next;
                gm_block_delete(&allocator->block_pool, block);
                block = next;
            }
            gm_region *next = region->next;
            free(data->pages);
            free(data);
            free(region);
            region = next;
        }
        allocator->heaps[h]->regions = NULL;
    }
    free(engine->idle);
    free(engine);
    allocator->engine_state = NULL;
}

const gm_engine_operations gm_page_engine = {
    .name = "pages",
    .create = pages_create,
    .destroy = pages_destroy,
    .allocate = pages_allocate,
    .free_block = pages_free_block,
    .release_cached = pages_release_cached,
    .validate = pages_validate,
};
