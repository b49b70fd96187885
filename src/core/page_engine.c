/*
 * page_engine.c -- the "pages" engine: blocks in large virtual ranges, physical memory mapped on
 * demand, and idle physical memory moved to wherever it is needed.
 *
 * Each heap (stream) has, per pool, a region: a virtual address range reserved once, twice the size
 * of the device, so addresses never run short. Blocks tile the region in four states: allocated,
 * pending, free (mapped, in the size index) and unmapped (addresses only). Physical memory comes in
 * chunks (one cuMemCreate each, a whole number of pages), each mapped at exactly one place; the page
 * table of the region says which chunk backs each page.
 *
 * A request is served, in order of cost:
 *   0. a request of a size its stream keeps regrowing goes to the stream's growth lane (below);
 *   1. from a free mapped block: TLSF good fit, no device call;
 *   2. otherwise in a window of free addresses: a run of free and unmapped blocks (free addresses
 *      are free whether mapped or not) where the request needs the fewest new pages -- extending a
 *      free block that borders unmapped addresses, as expandable segments grow, bridging two free
 *      blocks over a hole, or fresh addresses;
 *   3. the new pages come from idle chunks -- chunks lying wholly inside free blocks, anywhere --
 *      unmapped where they lie and mapped here, when new memory would raise reserved memory above
 *      its peak: this is the stitching of GMLake, free memory in the wrong place or in pieces too
 *      small gathered into one contiguous range. Only what the idle chunks cannot cover is made new.
 *
 * Chunk size trades device calls against flexibility: a big chunk costs one cuMemCreate for many
 * pages but stays pinned while any byte of it is live (so no chunk exceeds max_chunk_size, 128 MiB);
 * page-sized chunks can each move the moment they are free. Every allocation earns the engine a
 * little device-call credit (option device_credit_ns); a growth of a few pages is made of page-sized
 * chunks while the credit covers their cost, anything else of as few chunks as max_chunk_size
 * allows. A training loop that grows its memory once gets it in few large chunks; a long-running
 * workload whose tensors keep changing size (generation with a growing KV cache) gets fine-grained
 * chunks as it goes; device-call time stays a small share of the work either way. Under a memory
 * limit below the device's capacity (GPUMEM_CONF memory_limit, or torch's
 * set_per_process_memory_fraction) every chunk is page-sized: fitting matters more than device time
 * there, and only page-sized chunks let all free memory move (on the gpt2 trace the smallest limit
 * that fits drops from the uncapped peak, 26042 MiB, to 25820 MiB); idle chunks are then moved only
 * once memory nears the limit, so that a limit set as a precaution costs no device calls per step.
 *
 * Generation replaces each cached tensor at every step by a copy slightly larger: once a stream has
 * shown enough such regrowths, requests of those sizes go to its growth lane (growth_lane), an
 * engine-private heap of the same stream whose blocks stay in allocation order and move as a
 * conveyor -- each copy just below the oldest block, or wrapping into the free space above the newest
 * when that needs fewer new pages -- so the tensors stay one run with no temporary between them, on
 * page-sized chunks. A copy that would need new memory above the peak takes a fitting free block of
 * the stream's own heap instead, when there is one (lane_place).
 *
 * A chunk cannot be split later. An option (tail_chunk, off by default: one more chunk per growth)
 * makes the last page of a growth a chunk of its own when the request ends inside it, so that a
 * block placed after the request pins one page, not the whole growth.
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

/* The H200's cost of one page-sized chunk (cuMemCreate + cuMemMap + cuMemSetAccess at 2 MiB), to
 * decide whether the credit affords page-sized chunks. */
#define PAGE_CHUNK_COST_NS 40100
/* Growths up to this many pages (the size of a tensor that a workload replaces over and over, such
 * as a KV cache) may be made of page-sized chunks; larger ones (activations, logits) are made of
 * chunks as large as max_chunk_size allows, each costing about what one page-sized chunk does. */
#define FINE_GROWTH_PAGES 16
/* Credit never accumulates beyond this, so a burst after a long calm stays bounded. */
#define CREDIT_LIMIT_NS 200000000

typedef struct page_chunk {
    uintptr_t address; /* where it is mapped */
    uint64_t size;
    uint64_t handle;
    struct page_chunk *previous; /* in the region's chunk list */
    struct page_chunk *next;
} page_chunk;

typedef struct page_region {
    page_chunk **pages; /* page index -> chunk mapped there, or NULL */
    uint64_t page_count;
    page_chunk *chunks;
    gm_block *unmapped; /* unmapped blocks, linked through free_next / free_previous */
} page_region;

typedef struct idle_chunk {
    page_chunk *chunk;
    gm_region *region;
} idle_chunk;

/* A regrowth: a request at most 1/REGROWTH_FRACTION larger than the block freed right after it (a
 * tensor replaced by a slightly longer copy, as torch.cat grows a KV cache). */
#define REGROWTH_FRACTION 16
#define REGROWTH_SIZES 64       /* recent regrowth sizes remembered per stream */
#define LANE_AFTER_REGROWTHS 48 /* regrowths seen on a stream before its lane opens */

/* The engine's state for one heap (heap->engine_data). A stream's heap watches for regrowths and,
 * once LANE_AFTER_REGROWTHS were seen, owns a lane: an engine-private heap of the same stream whose
 * live blocks are kept in allocation order. */
typedef struct page_heap {
    uint64_t quiesce_generation; /* this heap's stream was waited for in growth number ... */
    gm_heap *owner;              /* lane: the stream's heap it serves; NULL for a stream's heap */
    gm_heap *lane;               /* stream's heap: its lane, once made */
    gm_block *last_large;        /* stream's heap: the last large allocation, until the next free */
    uint64_t regrowth_sizes[REGROWTH_SIZES];
    uint64_t regrowths;
    gm_block *oldest; /* lane: live (allocated or pending) blocks, oldest first, */
    gm_block *newest; /* linked through free_next / free_previous */
    uint64_t live;
} page_heap;

typedef struct page_engine {
    uint64_t page_size;
    uint64_t region_size;
    int64_t credit_ns;
    int64_t credit_per_allocation;
    uint64_t max_chunk_size; /* whole pages; UINT64_MAX: no limit */
    uint64_t quiesce_generation; /* heaps already waited for in this growth carry this number */
    idle_chunk *idle;            /* scratch list for the growth path */
    bool keep_peak;              /* placing in a lane: refuse new memory above the peak (lane_place) */
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

static page_heap *state_of(const gm_heap *heap)
{
    return (page_heap *)heap->engine_data;
}

static bool is_lane(const gm_heap *heap)
{
    return heap->engine_private;
}

static uint64_t page_index(const gm_region *region, uintptr_t address, uint64_t page_size)
{
    return (address - region->base) / page_size;
}

static uintptr_t page_floor(uintptr_t address, uint64_t page_size)
{
    return address / page_size * page_size;
}

static uintptr_t page_ceiling(uintptr_t address, uint64_t page_size)
{
    return (address + page_size - 1) / page_size * page_size;
}

/* ---------------------------------------------------------------- block states */

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

/* Take a free or unmapped block out of the structure that holds it. */
static void detach(gm_allocator *allocator, gm_block *block)
{
    if (block->state == GM_BLOCK_FREE)
        gm_unindex_free_block(allocator, block);
    else if (block->state == GM_BLOCK_UNMAPPED)
        unmapped_remove(block->region, block);
}

/* Put a detached free or unmapped block where it belongs. */
static void attach(gm_allocator *allocator, gm_block *block)
{
    if (block->state == GM_BLOCK_FREE)
        gm_index_free_block(allocator, block);
    else
        unmapped_insert(block->region, block);
}

/* Merge the detached `block` with neighbours of its own state (free or unmapped), which are
 * detached and absorbed; the merged block is returned, still detached. */
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

/* Carve [start, end) out of the detached block `block` (which contains it): the pieces before and
 * after keep the old state and are attached; the middle gets `state` and is returned detached.
 * NULL if block metadata ran out (nothing changed then). */
static gm_block *carve(gm_allocator *allocator, gm_block *block, uintptr_t start, uintptr_t end, int state)
{
    gm_block *middle = block, *tail = NULL;
    if (start > block->address && !(middle = gm_split_block(allocator, block, start - block->address)))
        return NULL;
    if (end < middle->address + middle->size && !(tail = gm_split_block(allocator, middle, end - middle->address))) {
        if (middle != block)
            gm_absorb_next(allocator, block);
        return NULL;
    }
    /* The middle takes its state before the pieces are attached: their neighbour is final. */
    middle->state = (uint8_t)state;
    if (tail)
        attach(allocator, tail);
    if (middle != block)
        attach(allocator, block);
    return middle;
}

/* ---------------------------------------------------------------- regions */

static gm_status new_region(gm_allocator *allocator, gm_heap *heap, int pool, gm_region **region_out)
{
    page_engine *engine = engine_of(allocator);
    uint64_t page_count = engine->region_size / engine->page_size;
    gm_region *region = calloc(1, sizeof *region);
    page_region *data = calloc(1, sizeof *data);
    page_chunk **pages = calloc(page_count, sizeof *pages);
    gm_block *block = gm_block_new(&allocator->block_pool);
    uintptr_t base = 0;
    gm_status status = region && data && pages && block
                           ? gm_backend_address_reserve(allocator->backend, engine->region_size, &base)
                           : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a region");
    if (status != GM_OK) {
        free(region);
        free(data);
        free(pages);
        if (block)
            gm_block_delete(&allocator->block_pool, block);
        return status;
    }
    *data = (page_region){.pages = pages, .page_count = page_count};
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

/* Map `chunk` at `address` of `region` and make it accessible. Access is set per mapping: the
 * driver's cost of cuMemSetAccess grows with the number of mappings a range covers (27 us each on the
 * H200, bench/vmm_probe.c), so one call over many chunks would cost no less. */
static gm_status map_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk, uintptr_t address)
{
    gm_status status = gm_backend_map(allocator->backend, address, chunk->size, chunk->handle);
    if (status == GM_OK) {
        status = gm_backend_set_access(allocator->backend, address, chunk->size);
        if (status != GM_OK)
            gm_backend_unmap(allocator->backend, address, chunk->size);
    }
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

/* Make a chunk of `size` bytes and map it at `address` (create_memory has checked the room for it). */
static gm_status create_chunk(gm_allocator *allocator, gm_region *region, uintptr_t address, uint64_t size)
{
    page_chunk *chunk = calloc(1, sizeof *chunk);
    if (!chunk)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a chunk");
    chunk->size = size;
    gm_status status = gm_backend_physical_create(allocator->backend, size, &chunk->handle);
    if (status == GM_OK) {
        status = map_chunk(allocator, region, chunk, address);
        if (status != GM_OK)
            gm_backend_physical_release(allocator->backend, chunk->handle, chunk->size);
    }
    if (status != GM_OK) {
        free(chunk);
        return status;
    }
    gm_count_reserved(allocator, region->pool, (int64_t)size, 1);
    allocator->stats.num_device_alloc++;
    return GM_OK;
}

static void release_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk)
{
    gm_backend_physical_release(allocator->backend, chunk->handle, chunk->size);
    gm_count_reserved(allocator, region->pool, -(int64_t)chunk->size, -1);
    allocator->stats.num_device_free++;
    free(chunk);
}

/* Wait until the work queued so far on `heap`'s stream has finished (once per growth and heap). */
static gm_status quiesce(gm_allocator *allocator, gm_heap *heap)
{
    page_engine *engine = engine_of(allocator);
    page_heap *state = state_of(heap);
    if (state->quiesce_generation == engine->quiesce_generation)
        return GM_OK;
    uint64_t event = 0;
    gm_status status = gm_backend_event_create(allocator->backend, &event);
    if (status != GM_OK)
        return status;
    status = gm_backend_event_record(allocator->backend, event, heap->stream);
    if (status == GM_OK)
        status = gm_backend_event_synchronize(allocator->backend, event);
    gm_backend_event_destroy(allocator->backend, event);
    if (status == GM_OK)
        state->quiesce_generation = engine->quiesce_generation;
    return status;
}

/* The free block of `region` that contains [address, address + size), or NULL: a search of the
 * heap's free blocks of at least `size` bytes. */
static gm_block *free_block_containing(gm_region *region, uintptr_t address, uint64_t size)
{
    gm_index_cursor cursor;
    for (gm_block *block = gm_size_index_begin_at(&cursor, gm_heap_index(region->heap, region->pool), size); block;
         block = gm_size_index_advance(&cursor))
        if (block->region == region && block->address <= address && address + size <= block->address + block->size)
            return block;
    return NULL;
}

/* Unmap an idle chunk from the free block around it; its addresses become unmapped. The chunk keeps
 * its handle and leaves the region. */
static gm_status evict_chunk(gm_allocator *allocator, gm_region *region, page_chunk *chunk)
{
    gm_block *around = free_block_containing(region, chunk->address, chunk->size);
    if (!around)
        return gm_fail(GM_ERROR_CORRUPT, "idle chunk 0x%" PRIxPTR " is not inside a free block", chunk->address);
    gm_status status = quiesce(allocator, region->heap);
    if (status == GM_OK)
        status = unmap_chunk(allocator, region, chunk);
    if (status != GM_OK)
        return status;
    gm_unindex_free_block(allocator, around);
    gm_block *hole = carve(allocator, around, chunk->address, chunk->address + chunk->size, GM_BLOCK_UNMAPPED);
    if (!hole) { /* no metadata for the split: give the chunk its place back */
        gm_index_free_block(allocator, around);
        map_chunk(allocator, region, chunk, chunk->address);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    attach(allocator, merge_alike(allocator, hole));
    return GM_OK;
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
 * pool, except in [keep_start, keep_end) of `keep_region` (the run a growth is using). One pass
 * over the free blocks, following the page table from chunk to chunk. */
static size_t find_idle_chunks(gm_allocator *allocator, const gm_region *keep_region, uintptr_t keep_start,
                               uintptr_t keep_end)
{
    page_engine *engine = engine_of(allocator);
    uint64_t page_size = engine->page_size;
    size_t count = 0;
    for (size_t h = 0; h < allocator->heap_count; h++) {
        for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE; pool++) {
            gm_index_cursor blocks;
            const gm_size_index *index = gm_heap_index(allocator->heaps[h], pool);
            for (gm_block *block = gm_size_index_begin_at(&blocks, index, page_size); block;
                 block = gm_size_index_advance(&blocks)) {
                gm_region *region = block->region;
                if (block->size < page_size ||
                    (region == keep_region && block->address >= keep_start && block->address < keep_end))
                    continue;
                page_chunk **pages = data_of(region)->pages;
                uintptr_t end = block->address + block->size;
                for (uintptr_t cursor = page_ceiling(block->address, page_size); cursor + page_size <= end;) {
                    page_chunk *chunk = pages[page_index(region, cursor, page_size)];
                    if (chunk->address >= block->address && chunk->address + chunk->size <= end &&
                        !remember_idle(engine, &count, chunk, region))
                        return count;
                    cursor = chunk->address + chunk->size;
                }
            }
        }
    }
    return count;
}

static int smaller_chunk_first(const void *left, const void *right)
{
    uint64_t a = ((const idle_chunk *)left)->chunk->size, b = ((const idle_chunk *)right)->chunk->size;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* The next idle chunk to move for `remaining` bytes with at most `room` bytes of space: the smallest
 * that covers what remains, else the largest that does not. The list is sorted by size; taken
 * entries are NULL, and none before `first`. -1 if none fits the room. */
static ptrdiff_t pick_idle_chunk(const idle_chunk *idle, size_t first, size_t count, uint64_t remaining,
                                 uint64_t room)
{
    ptrdiff_t largest_below = -1;
    for (size_t i = first; i < count; i++) {
        const page_chunk *chunk = idle[i].chunk;
        if (!chunk || chunk->size > room)
            continue;
        if (chunk->size >= remaining)
            return (ptrdiff_t)i;
        largest_below = (ptrdiff_t)i;
    }
    return largest_below;
}

/* Every idle chunk outside the window's run (find_idle_chunks), smallest first: their count. */
static size_t sorted_idle_chunks(gm_allocator *allocator, const gm_region *keep_region, uintptr_t keep_start,
                                 uintptr_t keep_end)
{
    page_engine *engine = engine_of(allocator);
    size_t count = find_idle_chunks(allocator, keep_region, keep_start, keep_end);
    if (count > 1)
        qsort(engine->idle, count, sizeof *engine->idle, smaller_chunk_first);
    return count;
}

/* Mark engine->idle[pick] taken; *first moves past the taken entries at the front. */
static void take_idle_chunk(page_engine *engine, ptrdiff_t pick, size_t *first, size_t count)
{
    engine->idle[pick].chunk = NULL;
    while (*first < count && !engine->idle[*first].chunk)
        (*first)++;
}

/* ---------------------------------------------------------------- placement */

/* Free address space is free whether mapped or not: a run is a maximal sequence of free and
 * unmapped blocks. A window is where a request could go inside a run; its cost is the number of
 * unmapped pages it needs backed. */
typedef struct window {
    gm_region *region;
    gm_block *run_first; /* the run's first block */
    uintptr_t run_start;
    uintptr_t run_end;
    uintptr_t start;
    uint64_t pages;
    uintptr_t request_end; /* start + the request's size, once chosen */
} window;

/* The first block of the run of vacant blocks that ends with `last`. */
static gm_block *run_start_of(gm_block *last)
{
    while (last->previous && gm_block_is_vacant(last->previous))
        last = last->previous;
    return last;
}

/* The last block of the run of vacant blocks that begins with `first`. */
static gm_block *run_end_of(gm_block *first)
{
    while (first->next && gm_block_is_vacant(first->next))
        first = first->next;
    return first;
}

/* The part of the unmapped block `block` that [start, end) needs backed, as [from, to). */
static bool part_to_back(const gm_block *block, uintptr_t start, uintptr_t end, uint64_t page_size, uintptr_t *from,
                         uintptr_t *to)
{
    if (block->state != GM_BLOCK_UNMAPPED || block->address >= end || block->address + block->size <= start)
        return false;
    uintptr_t low = page_floor(start, page_size), high = page_ceiling(end, page_size);
    *from = block->address > low ? block->address : low;
    *to = block->address + block->size < high ? block->address + block->size : high;
    return *to > *from;
}

static uint64_t pages_to_back(const gm_block *first, uintptr_t start, uintptr_t end, uint64_t page_size)
{
    uint64_t pages = 0;
    uintptr_t from = 0, to = 0;
    for (const gm_block *block = first; block && block->address < end; block = block->next)
        if (part_to_back(block, start, end, page_size, &from, &to))
            pages += (to - from) / page_size;
    return pages;
}

/* Fewer pages first; then the smaller run (a better fit); then the lower address. */
static void consider_window(window *best, const window *candidate)
{
    uint64_t run = candidate->run_end - candidate->run_start, best_run = best->run_end - best->run_start;
    if (!best->region || candidate->pages < best->pages ||
        (candidate->pages == best->pages &&
         (run < best_run || (run == best_run && candidate->start < best->start))))
        *best = *candidate;
}

/* Every window of `size` bytes in the run [first, last] that starts at a block of it, and the one
 * that ends at the run's end. */
static void consider_run(gm_region *region, gm_block *first, gm_block *last, uint64_t size, uint64_t page_size,
                         window *best)
{
    uintptr_t run_end = last->address + last->size;
    if (run_end - first->address < size)
        return;
    window candidate = {region, first, first->address, run_end, 0, 0, 0};
    for (gm_block *block = first; block->address + size <= run_end; block = block->next) {
        candidate.start = block->address;
        candidate.pages = pages_to_back(first, candidate.start, candidate.start + size, page_size);
        consider_window(best, &candidate);
        if (block == last)
            break;
    }
    candidate.start = run_end - size;
    candidate.pages = pages_to_back(first, candidate.start, run_end, page_size);
    consider_window(best, &candidate);
}

/* The window for `size` bytes needing the fewest new pages, over every run of the heap's pool. */
static window choose_window(gm_heap *heap, int pool, uint64_t size, uint64_t page_size)
{
    window best = {0};
    for (gm_region *region = heap->regions; region; region = region->next) {
        if (region->pool != pool)
            continue;
        for (gm_block *hole = data_of(region)->unmapped; hole; hole = hole->free_next) {
            /* Each run is visited once, from its lowest unmapped block. */
            gm_block *first = hole;
            bool lowest = true;
            while (first->previous && gm_block_is_vacant(first->previous)) {
                first = first->previous;
                lowest = lowest && first->state != GM_BLOCK_UNMAPPED;
            }
            if (lowest)
                consider_run(region, first, run_end_of(hole), size, page_size, &best);
        }
    }
    return best;
}

/* ---------------------------------------------------------------- backing pages */

/* Move idle chunks to `address` of the window's region, back to back, at most `room` bytes, until
 * `need` bytes are covered; chunks inside the window's run stay. Returns the bytes mapped. */
static uint64_t move_idle_chunks(gm_allocator *allocator, const window *where, uintptr_t address, uint64_t need,
                                 uint64_t room, gm_status *status_out)
{
    page_engine *engine = engine_of(allocator);
    gm_region *target = where->region;
    *status_out = GM_OK;
    size_t count = sorted_idle_chunks(allocator, target, where->run_start, where->run_end);
    /* Memory moved into the small pool stays there (small blocks pin it), and a lane takes pages, not
     * large chunks: move only what is needed. */
    uint64_t limit = target->pool == GM_POOL_SMALL || is_lane(target->heap) || room < need ? need : room;
    uint64_t mapped = 0;
    size_t first = 0; /* entries before it are taken: with page-sized chunks each pick is the first */
    ptrdiff_t pick;
    while (mapped < need && (pick = pick_idle_chunk(engine->idle, first, count, need - mapped, limit - mapped)) >= 0) {
        idle_chunk *candidate = &engine->idle[pick];
        page_chunk *chunk = candidate->chunk;
        gm_status status = evict_chunk(allocator, candidate->region, chunk);
        if (status == GM_OK)
            status = map_chunk(allocator, target, chunk, address + mapped);
        if (status != GM_OK) {
            *status_out = status;
            return mapped;
        }
        if (candidate->region->pool != target->pool)
            gm_move_reserved(allocator, candidate->region->pool, target->pool, chunk->size);
        take_idle_chunk(engine, pick, &first, count);
        mapped += chunk->size;
    }
    return mapped;
}

/* Give back idle chunks (outside the window's run) until `need` new bytes no longer lift reserved
 * memory above its peak: for a lane, which takes only what it needs (page-sized chunks, not a large
 * chunk that its blocks would pin in part), idle memory in larger chunks is made anew there in
 * pages. Smallest chunks first. */
static void release_idle_for(gm_allocator *allocator, const window *where, uint64_t need)
{
    page_engine *engine = engine_of(allocator);
    const gm_stat *reserved = allocator->stats.reserved_bytes;
    int64_t excess = gm_stat_total(reserved) + (int64_t)need - reserved[GM_POOL_ALL].peak;
    if (excess <= 0)
        return;
    size_t count = sorted_idle_chunks(allocator, where->region, where->run_start, where->run_end), first = 0;
    ptrdiff_t pick;
    uint64_t released = 0;
    while (released < (uint64_t)excess &&
           (pick = pick_idle_chunk(engine->idle, first, count, (uint64_t)excess - released, UINT64_MAX)) >= 0) {
        idle_chunk *candidate = &engine->idle[pick];
        if (evict_chunk(allocator, candidate->region, candidate->chunk) != GM_OK)
            return;
        released += candidate->chunk->size;
        release_chunk(allocator, candidate->region, candidate->chunk);
        take_idle_chunk(engine, pick, &first, count);
    }
}

/* Whether a memory limit below the device's capacity is set (GPUMEM_CONF memory_limit, or torch's
 * memory fraction): capacity is then what the user is short of. */
static bool memory_is_limited(const gm_allocator *allocator)
{
    return allocator->memory_limit < allocator->backend->total_bytes;
}

/* Bytes of new physical memory that may be made now, whole pages: what the memory limit leaves, and
 * no more than the device reports free (other processes and the CUDA context use it too). A growth
 * that does not fit is refused as a whole before any cuMemCreate, so that a full device is found out
 * here, not by a failing driver call (which tools such as compute-sanitizer report as errors). */
static uint64_t room_for_new_memory(gm_allocator *allocator, uint64_t page_size)
{
    int64_t reserved = gm_stat_total(allocator->stats.reserved_bytes);
    uint64_t room = allocator->memory_limit > (uint64_t)reserved ? allocator->memory_limit - (uint64_t)reserved : 0;
    uint64_t device_free = 0, device_total = 0;
    if (gm_backend_memory_info(allocator->backend, &device_free, &device_total) == GM_OK && device_free < room)
        room = device_free;
    return room / page_size * page_size;
}

/* New memory for [address, address + need): page-sized chunks in the small pool, in a growth lane,
 * under a memory limit set below the device's capacity (capacity is then what the user is short of:
 * every free page must be able to move to where a request needs it, whatever the device calls cost),
 * and for a growth of a few pages while the credit covers them; else chunks of max_chunk_size (the
 * last one smaller), so that a live block left in memory made for a big tensor pins at most a chunk,
 * not all of it (on a gpt2 run at batch 8, one 1.5 GiB logits chunk pinned by a few small tensors cost
 * 16% more memory). With tail_chunk, when the request (ending at `request_end`) ends inside the last
 * page, that page is a chunk of its own: the next block placed after the request starts there, and
 * if it outlives the request it pins that page, not the whole growth.
 * `room` is room_for_new_memory(); a growth beyond it is refused before any device call.
 * *created_out: the bytes made, also on failure. */
static gm_status create_memory(gm_allocator *allocator, gm_region *region, uintptr_t address, uint64_t need,
                               uintptr_t request_end, uint64_t room, uint64_t *created_out)
{
    page_engine *engine = engine_of(allocator);
    uint64_t page_size = engine->page_size, pages = need / page_size;
    bool fine = region->pool == GM_POOL_SMALL || is_lane(region->heap) || memory_is_limited(allocator) ||
                (pages <= FINE_GROWTH_PAGES && engine->credit_ns >= (int64_t)pages * PAGE_CHUNK_COST_NS);
    uint64_t piece = fine ? page_size : need < engine->max_chunk_size ? need : engine->max_chunk_size;
    uintptr_t end = address + need;
    bool own_tail = allocator->options.tail_chunk && !fine && pages >= 2 && request_end > end - page_size &&
                    request_end < end;
    *created_out = 0;
    if (need > room)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no room for %" PRIu64 " bytes of new memory: the memory limit or "
                       "the device's free memory is reached", need);
    gm_status status = GM_OK;
    while (*created_out < need && status == GM_OK) {
        uint64_t size = need - *created_out < piece ? need - *created_out : piece;
        if (own_tail && *created_out + size == need && size > page_size)
            size -= page_size;
        status = create_chunk(allocator, region, address + *created_out, size);
        if (status == GM_OK)
            *created_out += size;
    }
    return status;
}

/* The unmapped block of `region` that contains `address`. */
static gm_block *unmapped_at(gm_region *region, uintptr_t address)
{
    for (gm_block *hole = data_of(region)->unmapped; hole; hole = hole->free_next)
        if (hole->address <= address && address < hole->address + hole->size)
            return hole;
    return NULL;
}

/* Whether a growth of `need` bytes should take idle chunks from elsewhere rather than new memory:
 * when new memory would lift reserved memory above its peak -- and, under a memory limit below the
 * device's capacity, only once that is near the limit (nine tenths): the chunks are page-sized there,
 * and recycling them costs device calls at every step, which a process that set its limit only as a
 * precaution should not pay. */
static bool should_recycle(const gm_allocator *allocator, uint64_t need)
{
    const gm_stat *reserved = allocator->stats.reserved_bytes;
    int64_t after = gm_stat_total(reserved) + (int64_t)need;
    if (after <= reserved[GM_POOL_ALL].peak)
        return false;
    return !memory_is_limited(allocator) || (uint64_t)after > allocator->memory_limit / 10 * 9;
}

/* Back [from, to), inside an unmapped block, with physical memory: idle chunks first when new memory
 * would raise reserved memory past its peak (or the device is full), then new memory. The mapped
 * part is made accessible and turned into free space merged with its neighbours: *opened_out, the
 * merged free block, detached (NULL if nothing could be mapped). */
static gm_status back_part(gm_allocator *allocator, const window *where, uintptr_t from, uintptr_t to,
                           gm_block **opened_out)
{
    page_engine *engine = engine_of(allocator);
    gm_region *region = where->region;
    gm_block *hole = unmapped_at(region, from);
    uint64_t need = to - from, room = hole->address + hole->size - from;
    int64_t spent_before = allocator->backend->modelled_ns;
    uint64_t mapped = 0, created = 0;
    /* Moving idle chunks changes neither reserved memory nor the device's free memory: one reading. */
    uint64_t new_room = room_for_new_memory(allocator, engine->page_size);
    gm_status status = GM_OK;
    if (should_recycle(allocator, need) || need > new_room)
        mapped = move_idle_chunks(allocator, where, from, need, room, &status);
    if (status == GM_OK && mapped < need && is_lane(region->heap) && should_recycle(allocator, need - mapped)) {
        release_idle_for(allocator, where, need - mapped);
        if (engine->keep_peak && should_recycle(allocator, need - mapped))
            status = GM_ERROR_OUT_OF_MEMORY; /* quietly: the caller has another place (lane_place) */
    }
    if (status == GM_OK && mapped < need) {
        status = create_memory(allocator, region, from + mapped, need - mapped, where->request_end, new_room, &created);
        mapped += created;
        if (status == GM_ERROR_OUT_OF_MEMORY) { /* the device is full: any idle memory will do */
            uint64_t moved = move_idle_chunks(allocator, where, from + mapped, need - mapped, need - mapped, &status);
            mapped += moved;
            if (status == GM_OK && mapped < need)
                status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "the device has no room for %" PRIu64 " more bytes",
                                 need - mapped);
        }
    }
    engine->credit_ns -= allocator->backend->modelled_ns - spent_before;
    *opened_out = NULL;
    if (mapped == 0)
        return status;
    hole = unmapped_at(region, from); /* evictions may have merged unmapped blocks */
    unmapped_remove(region, hole);
    gm_block *opened = carve(allocator, hole, from, from + mapped, GM_BLOCK_FREE);
    if (!opened) {
        unmapped_insert(region, hole);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    *opened_out = merge_alike(allocator, opened);
    return status;
}

/* Map what the window `where` needs for `size` bytes; *block_out is the free block (detached) that
 * starts at or before the window and covers it. */
static gm_status open_window(gm_allocator *allocator, window where, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(allocator);
    uint64_t page_size = engine->page_size;
    engine->quiesce_generation++;
    where.request_end = where.start + size;
    uintptr_t end = where.start + size, last_page_end = page_ceiling(end, page_size);
    gm_block *opened = NULL;
    /* The unmapped blocks of the run that the window needs, in address order. Backing one turns it
     * into free space merged with its neighbours (`opened`); the walk goes on after that. */
    for (gm_block *block = where.run_first; block && block->address < last_page_end;) {
        uintptr_t from = 0, to = 0;
        if (!part_to_back(block, where.start, end, page_size, &from, &to)) {
            block = block->next;
            continue;
        }
        if (opened) /* the previous part: indexed; the next part merges it back */
            gm_index_free_block(allocator, opened);
        gm_status status = back_part(allocator, &where, from, to, &opened);
        if (status != GM_OK) {
            if (opened)
                gm_index_free_block(allocator, opened);
            return status;
        }
        block = opened->next;
    }
    if (!opened || opened->address > where.start || opened->address + opened->size < end) {
        if (opened)
            gm_index_free_block(allocator, opened);
        return gm_fail(GM_ERROR_CORRUPT, "growth did not open the window it chose");
    }
    *block_out = opened;
    return GM_OK;
}

/* A new region of `heap`'s `pool` for a request of `size` bytes. */
static gm_status add_region(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_region **region_out)
{
    gm_status status = new_region(allocator, heap, pool, region_out);
    if (status == GM_OK && (*region_out)->size < size)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "a request of %" PRIu64 " bytes exceeds the address range", size);
    return status;
}

/* Cut the detached free block `block` to `size` bytes; the rest goes back to the index. */
static void trim_to_size(gm_allocator *allocator, gm_block *block, uint64_t size)
{
    gm_block *rest = gm_split_block(allocator, block, size);
    if (rest)
        gm_index_free_block(allocator, rest);
}

/* Map the window for `size` bytes that needs the fewest new pages (a new region if none has room);
 * *block_out as for open_window. */
static gm_status grow(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    window where = choose_window(heap, pool, size, engine_of(allocator)->page_size);
    if (!where.region) {
        gm_region *region = NULL;
        gm_status status = add_region(allocator, heap, pool, size, &region);
        if (status != GM_OK)
            return status;
        where = (window){region, region->first_block, region->base, region->base + region->size, region->base, 0, 0};
    }
    return open_window(allocator, where, size, block_out);
}

/* ---------------------------------------------------------------- growth lane */

/* Whether `size` is within 1/REGROWTH_FRACTION of a recent regrowth of the stream `state` watches. */
static bool is_regrowing_size(const page_heap *state, uint64_t size)
{
    uint64_t margin = size / REGROWTH_FRACTION;
    for (size_t i = 0; i < REGROWTH_SIZES; i++)
        if (state->regrowth_sizes[i] && state->regrowth_sizes[i] <= size + margin &&
            state->regrowth_sizes[i] + margin >= size)
            return true;
    return false;
}

/* A free of `block` on the stream `state` watches: a regrowth when it follows the allocation of a
 * block slightly larger (the replacement allocated, then the old one freed). */
static void watch_free(page_heap *state, const gm_block *block, uint64_t page_size)
{
    const gm_block *last = state->last_large;
    state->last_large = NULL;
    if (!last || last == block || block->pool != GM_POOL_LARGE || block->size < page_size ||
        last->size <= block->size || last->size > block->size + block->size / REGROWTH_FRACTION)
        return;
    state->regrowth_sizes[state->regrowths++ % REGROWTH_SIZES] = last->size;
}

/* Whether a request of `size` bytes in `pool`, on the stream `state` watches, goes to its lane. */
static bool goes_to_lane(gm_allocator *allocator, const page_heap *state, int pool, uint64_t size)
{
    return allocator->options.growth_lane && pool == GM_POOL_LARGE && size >= engine_of(allocator)->page_size &&
           state->regrowths >= LANE_AFTER_REGROWTHS && is_regrowing_size(state, size);
}

static gm_status new_heap_state(gm_heap *heap)
{
    heap->engine_data = calloc(1, sizeof(page_heap));
    if (!heap->engine_data)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pages engine's heap state");
    return GM_OK;
}

/* The lane of the stream's heap `heap`, made on first use; NULL without host memory. */
static gm_heap *lane_of(gm_allocator *allocator, gm_heap *heap)
{
    page_heap *state = state_of(heap);
    if (state->lane)
        return state->lane;
    page_heap *lane_state = calloc(1, sizeof *lane_state);
    gm_heap *lane = lane_state ? gm_add_heap(allocator, heap->stream) : NULL;
    if (!lane) {
        free(lane_state);
        return NULL;
    }
    lane_state->owner = heap;
    lane->engine_data = lane_state;
    lane->engine_private = true;
    return state->lane = lane;
}

static void lane_append(page_heap *lane, gm_block *block)
{
    block->free_next = NULL;
    block->free_previous = lane->newest;
    if (lane->newest)
        lane->newest->free_next = block;
    else
        lane->oldest = block;
    lane->newest = block;
    lane->live++;
}

static void lane_remove(page_heap *lane, gm_block *block)
{
    if (block->free_previous)
        block->free_previous->free_next = block->free_next;
    else
        lane->oldest = block->free_next;
    if (block->free_next)
        block->free_next->free_previous = block->free_previous;
    else
        lane->newest = block->free_previous;
    block->free_previous = block->free_next = NULL;
    lane->live--;
}

/* Carve [start, start + size) out of the vacant run that begins at `run_first` and ends at
 * `run_end`, mapping the pages it needs: the block, free and detached, or NULL (*status_out says
 * why, GM_OK when metadata for the split ran out). */
static gm_block *take_in_run(gm_allocator *allocator, gm_block *run_first, uintptr_t run_end, uintptr_t start,
                             uint64_t size, gm_status *status_out)
{
    uint64_t page_size = engine_of(allocator)->page_size;
    window where = {run_first->region, run_first, run_first->address, run_end, start, 0, 0};
    where.pages = pages_to_back(run_first, start, start + size, page_size);
    gm_block *opened = run_first;
    *status_out = GM_OK;
    if (where.pages) {
        if ((*status_out = open_window(allocator, where, size, &opened)) != GM_OK)
            return NULL;
    } else { /* inside one free block: free neighbours merge, and no unmapped page is needed */
        while (opened->address + opened->size <= start)
            opened = opened->next;
        gm_unindex_free_block(allocator, opened);
    }
    gm_block *taken = carve(allocator, opened, start, start + size, GM_BLOCK_FREE);
    if (!taken)
        gm_index_free_block(allocator, opened);
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
    gm_block *oldest = lane->oldest;
    if (!oldest || oldest->size >= size || oldest->size + size / REGROWTH_FRACTION < size || !oldest->previous ||
        !gm_block_is_vacant(oldest->previous))
        return false;
    gm_block *run_first = run_start_of(oldest->previous);
    uint64_t gap = oldest->address - run_first->address, slack = lane->live * (size - oldest->size);
    if (gap < size)
        return false;
    uintptr_t start = gap <= size + slack ? run_first->address : (oldest->address - slack - size) / 512 * 512;
    *spot = (lane_spot){run_first, oldest->address, start, pages_to_back(run_first, start, start + size, page_size)};
    return true;
}

/* Right after the newest block, in the vacant run above it. */
static bool spot_after_newest(const page_heap *lane, uint64_t size, uint64_t page_size, lane_spot *spot)
{
    gm_block *newest = lane->newest;
    if (!newest || !newest->next || !gm_block_is_vacant(newest->next))
        return false;
    gm_block *last = run_end_of(newest->next);
    uintptr_t start = newest->address + newest->size, run_end = last->address + last->size;
    if (run_end - start < size)
        return false;
    *spot = (lane_spot){newest->next, run_end, start, pages_to_back(newest->next, start, start + size, page_size)};
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
static gm_status lane_allocate(gm_allocator *allocator, gm_heap *lane_heap, uint64_t size, gm_block **block_out)
{
    page_heap *lane = state_of(lane_heap);
    uint64_t page_size = engine_of(allocator)->page_size;
    gm_status status = GM_OK;
    lane_spot below, above;
    bool has_below = spot_below_oldest(lane, size, page_size, &below);
    bool has_above = spot_after_newest(lane, size, page_size, &above);
    *block_out = NULL;
    if (has_below && (!has_above || below.pages <= above.pages) &&
        ((*block_out = take_in_run(allocator, below.run_first, below.run_end, below.start, size, &status)) || status))
        return status;
    if (has_above &&
        ((*block_out = take_in_run(allocator, above.run_first, above.run_end, above.start, size, &status)) || status))
        return status;
    /* Where the fewest new pages are needed -- perhaps none: free memory of the lane left between
     * calls (a window in mapped memory, which grow() cannot open) */
    window where = lane_heap->regions ? choose_window(lane_heap, GM_POOL_LARGE, size, page_size) : (window){0};
    if (!where.region) {
        gm_region *region = NULL;
        if ((status = add_region(allocator, lane_heap, GM_POOL_LARGE, size, &region)) != GM_OK)
            return status;
        /* The lane's first block goes to the middle of its range: the conveyor moves down. */
        uintptr_t start = region->next ? region->base : page_floor(region->base + region->size / 2, page_size);
        where = (window){region, region->first_block, region->base, region->base + region->size, start, 0, 0};
    }
    if (!(*block_out = take_in_run(allocator, where.run_first, where.run_end, where.start, size, &status)) && !status)
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    return status;
}

/* ---------------------------------------------------------------- engine operations */

/* Place a request in the stream's lane -- unless that would lift reserved memory above its peak while
 * a free block of the stream's own heap fits the request: GM_ERROR_OUT_OF_MEMORY then, and the request
 * takes that block. (At llm_generate's peak, the end of its first call, a block of 15.9 pages freed by
 * the prefill inside a larger chunk fits the next KV copy, which the lane would make new pages for.) */
static gm_status lane_place(gm_allocator *allocator, gm_heap *heap, gm_heap *lane, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(allocator);
    engine->keep_peak = gm_size_index_find(gm_heap_index(heap, GM_POOL_LARGE), size) != NULL;
    gm_status status = lane_allocate(allocator, lane, size, block_out);
    engine->keep_peak = false;
    return status;
}

/* A free block of exactly `size` bytes in `heap`'s `pool`, detached: a fit, else growth. */
static gm_status fit_or_grow(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    gm_block *block = gm_size_index_find(gm_heap_index(heap, pool), size);
    if (block)
        gm_unindex_free_block(allocator, block);
    else {
        gm_status status = grow(allocator, heap, pool, size, &block);
        if (status != GM_OK)
            return status;
    }
    trim_to_size(allocator, block, size);
    *block_out = block;
    return GM_OK;
}

static gm_status pages_allocate(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(allocator);
    if (engine->credit_ns < CREDIT_LIMIT_NS)
        engine->credit_ns += engine->credit_per_allocation;
    if (!heap->engine_data && new_heap_state(heap) != GM_OK)
        return GM_ERROR_OUT_OF_MEMORY;
    page_heap *state = state_of(heap);
    gm_block *block = NULL;
    gm_heap *lane = goes_to_lane(allocator, state, pool, size) ? lane_of(allocator, heap) : NULL;
    gm_status status = lane ? lane_place(allocator, heap, lane, size, &block) : GM_ERROR_OUT_OF_MEMORY;
    if (status == GM_OK)
        lane_append(state_of(lane), block);
    else if (status != GM_ERROR_OUT_OF_MEMORY) /* a fault, not a lack of room */
        return status;
    else if ((status = fit_or_grow(allocator, heap, pool, size, &block)) != GM_OK) /* the stream's own heap */
        return status;
    block->state = GM_BLOCK_ALLOCATED;
    if (pool == GM_POOL_LARGE && size >= engine->page_size)
        state->last_large = block;
    *block_out = block;
    return GM_OK;
}

static void pages_free_block(gm_allocator *allocator, gm_block *block)
{
    page_heap *state = state_of(block->heap);
    if (state->owner) {
        lane_remove(state, block);
        state = state_of(state->owner);
    }
    watch_free(state, block, engine_of(allocator)->page_size);
    block->state = GM_BLOCK_FREE;
    gm_index_free_block(allocator, merge_alike(allocator, block));
}

static void pages_release_cached(gm_allocator *allocator)
{
    page_engine *engine = engine_of(allocator);
    size_t count = find_idle_chunks(allocator, NULL, 0, 0);
    engine->quiesce_generation++;
    for (size_t i = 0; i < count; i++) {
        idle_chunk *candidate = &engine->idle[i];
        if (evict_chunk(allocator, candidate->region, candidate->chunk) == GM_OK)
            release_chunk(allocator, candidate->region, candidate->chunk);
    }
}

/* A block's pages are mapped exactly when it is not an unmapped block. */
static gm_status check_block_pages(const gm_region *region, const gm_block *block, void *context)
{
    uint64_t page_size = *(const uint64_t *)context;
    const page_region *data = data_of(region);
    uint64_t first = page_index(region, block->address, page_size);
    uint64_t last = page_index(region, block->address + block->size - 1, page_size);
    bool mapped_expected = block->state != GM_BLOCK_UNMAPPED;
    for (uint64_t page = first; page <= last; page++)
        if ((data->pages[page] != NULL) != mapped_expected)
            return gm_fail(GM_ERROR_CORRUPT, "block 0x%" PRIxPTR " (state %d) has page %" PRIu64 " %s", block->address,
                           block->state, page, mapped_expected ? "unmapped" : "mapped");
    return GM_OK;
}

static gm_status validate_region(gm_allocator *allocator, gm_region *region, gm_stats *recomputed)
{
    page_engine *engine = engine_of(allocator);
    page_region *data = data_of(region);
    gm_status status = gm_validate_region_blocks(region, recomputed, check_block_pages, &engine->page_size);
    if (status != GM_OK)
        return status;
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

/* A lane's allocation-order list holds exactly its allocated and pending blocks. */
static gm_status validate_lane(const gm_heap *heap)
{
    const page_heap *lane = state_of(heap);
    uint64_t listed = 0, live = 0;
    for (const gm_block *block = lane->oldest; block && listed <= lane->live; block = block->free_next, listed++)
        if (block->heap != heap || (block->state != GM_BLOCK_ALLOCATED && block->state != GM_BLOCK_PENDING))
            return gm_fail(GM_ERROR_CORRUPT, "lane lists block 0x%" PRIxPTR " in state %d", block->address,
                           block->state);
    for (const gm_region *region = heap->regions; region; region = region->next)
        for (const gm_block *block = region->first_block; block; block = block->next)
            live += block->state == GM_BLOCK_ALLOCATED || block->state == GM_BLOCK_PENDING;
    if (listed != lane->live || live != lane->live)
        return gm_fail(GM_ERROR_CORRUPT, "lane lists %" PRIu64 " blocks, counts %" PRIu64 ", holds %" PRIu64, listed,
                       lane->live, live);
    return GM_OK;
}

static gm_status pages_validate(gm_allocator *allocator, gm_stats *recomputed)
{
    for (size_t h = 0; h < allocator->heap_count; h++) {
        const gm_heap *heap = allocator->heaps[h];
        if (heap->engine_private && heap->engine_data) {
            gm_status status = validate_lane(heap);
            if (status != GM_OK)
                return status;
        }
        for (gm_region *region = allocator->heaps[h]->regions; region; region = region->next) {
            gm_status status = validate_region(allocator, region, recomputed);
            if (status != GM_OK)
                return status;
        }
    }
    return GM_OK;
}

static gm_status pages_create(gm_allocator *allocator)
{
    page_engine *engine = calloc(1, sizeof *engine);
    if (!engine)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pages engine");
    engine->page_size = allocator->backend->page_size;
    /* Twice the usable memory: room for holes left by moved chunks. */
    engine->region_size = gm_round_up(allocator->memory_limit, engine->page_size) * 2;
    engine->credit_per_allocation = allocator->options.device_credit_ns;
    uint64_t max_chunk = allocator->options.max_chunk_size / engine->page_size * engine->page_size;
    engine->max_chunk_size = max_chunk ? max_chunk : allocator->options.max_chunk_size ? engine->page_size : UINT64_MAX;
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
                if (block->indexed)
                    gm_unindex_free_block(allocator, block);
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
        free(allocator->heaps[h]->engine_data);
        allocator->heaps[h]->engine_data = NULL;
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
