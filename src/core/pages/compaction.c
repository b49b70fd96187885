/*
 * compaction.c -- whole free pages inside pinned chunks given back when a growth would lift reserved
 * memory above its peak (compact_min; an experiment of the simulated device, off by default).
 *
 * The pages engine's waste is free memory inside chunks that live blocks pin: a chunk is one physical
 * allocation, mapped whole, so one live byte keeps all its pages (docs/engine.md). Only idle chunks can
 * move; smaller chunks and rechunking fix the waste at the price of device calls at every step. Under
 * CUDA's virtual memory a pinned chunk can still be split after the fact: its live pages copied into
 * new physical memory that is then mapped at the same addresses, so that no pointer changes, and the
 * old chunk released with its free pages. This file decides when and which: only when a growth would
 * otherwise lift reserved memory above its peak by more than a two-hundredth (the moment the waste
 * would cost memory; smaller rises are let through, so that later passes settle instead of compacting
 * again at the peak's edge: growth.c), the chunks with the most whole free pages first, until the
 * growth no longer lifts the peak. Each costs the
 * chunk's unmap and release, a chunk (create, map, access) per run of pages that live blocks touch,
 * and the copy of those pages.
 *
 * What it would take on a real device is not built: a wait until no queued work uses the chunk (every
 * stream, not only the blocks' own), the copy through a second mapping of the new memory, and a chunk
 * exported to another process left alone (it is). A kernel another thread launches while the pages
 * change place would see the old memory or none: real devices would need a rule for that too. So the
 * key is refused on every backend but sim (options.c), where no data exists: it measures what such a
 * compaction would reserve and what its device calls would cost (docs/engine.md, "Compaction").
 */
#include "core/pages/pages.h"

#include "base/error.h"

#include <stdlib.h>

/* The modelled speed of the device-to-device copy of live pages (the H200's copy bandwidth, rounded
 * down). */
#define COPY_BYTES_PER_NS 1500

typedef struct pinned_chunk {
    gm_region *region;
    page_chunk *chunk;
    uint64_t free_bytes; /* its whole free pages */
    const uint8_t *free_pages;
} pinned_chunk;

/* Per page of `region`: 1 where the page lies wholly inside a free block. */
static uint8_t *find_free_pages(const gm_region *region, uint64_t page_size)
{
    uint8_t *free_pages = calloc(data_of(region)->page_count ? data_of(region)->page_count : 1, 1);
    if (!free_pages)
        return NULL;
    for (const gm_block *block = region->first_block; block; block = block->next) {
        if (block->state != GM_BLOCK_FREE)
            continue;
        uintptr_t end = page_floor(block->address + block->size, page_size);
        for (uintptr_t page = page_ceiling(block->address, page_size); page + page_size <= end; page += page_size)
            free_pages[page_index(region, page, page_size)] = 1;
    }
    return free_pages;
}

static int most_free_first(const void *a, const void *b)
{
    uint64_t x = ((const pinned_chunk *)a)->free_bytes, y = ((const pinned_chunk *)b)->free_bytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The end of the run of pages from `page` (below `end`) that are alike: all free or all touched. */
static uintptr_t run_end(const gm_region *region, const uint8_t *free_pages, uintptr_t page, uintptr_t end,
                         uint64_t page_size)
{
    uint8_t kind = free_pages[page_index(region, page, page_size)];
    while (page < end && free_pages[page_index(region, page, page_size)] == kind)
        page += page_size;
    return page;
}

/* Split a pinned chunk: released, each run of touched pages made anew (and its data copied, as
 * modelled time), each run of free pages left unmapped. */
static gm_status compact_chunk(gm_arena *arena, const pinned_chunk *pinned)
{
    gm_region *region = pinned->region;
    page_chunk *chunk = pinned->chunk;
    uint64_t page_size = engine_of(arena)->page_size;
    uintptr_t start = chunk->address, end = chunk->address + chunk->size;
    gm_status status = pages_unmap_chunk(arena, region, chunk);
    if (status != GM_OK)
        return status;
    pages_release_chunk(arena, region, chunk);
    for (uintptr_t page = start; page < end && status == GM_OK;) {
        uintptr_t next = run_end(region, pinned->free_pages, page, end, page_size);
        if (pinned->free_pages[page_index(region, page, page_size)]) {
            gm_block *around = pages_free_block_containing(region, page, next - page);
            status = around ? pages_vacate(arena, around, page, next)
                            : gm_fail(GM_ERROR_CORRUPT, "compaction: a free page is not inside a free block");
        } else {
            status = pages_create_chunk(arena, region, page, next - page);
            arena->backend->modelled_ns += (int64_t)((next - page) / COPY_BYTES_PER_NS);
        }
        page = next;
    }
    return status;
}

/* Every chunk of the shared large pools (not a private pool's, not a lane's: page-sized chunks) with
 * at least compact_min bytes of whole free pages that is not idle, exported, nor in [keep_start,
 * keep_end) of `keep_region` (the growth's own run). *free_pages_out: the page maps made, to free. */
static size_t find_pinned_chunks(gm_arena *arena, const gm_region *keep_region, uintptr_t keep_start,
                                 uintptr_t keep_end, pinned_chunk **chunks_out, uint8_t ***free_pages_out,
                                 size_t *maps_out)
{
    uint64_t page_size = engine_of(arena)->page_size, least = arena->options->compact_min;
    size_t count = 0, capacity = 0, maps = 0;
    pinned_chunk *chunks = NULL;
    uint8_t **free_pages = NULL;
    bool out_of_memory = false; /* without host memory the search stops: compaction is only an economy */
    for (size_t h = 0; h < arena->heap_count && !out_of_memory; h++) {
        gm_heap *heap = arena->heaps[h];
        if (heap->private_pool || is_lane(heap) || !heap->engine_data)
            continue;
        for (gm_region *region = gm_first_region(heap); region && !out_of_memory; region = gm_next_region(region)) {
            if (region->pool != GM_POOL_LARGE)
                continue;
            uint8_t **grown_maps = realloc(free_pages, (maps + 1) * sizeof *free_pages);
            uint8_t *map = grown_maps ? find_free_pages(region, page_size) : NULL;
            free_pages = grown_maps ? grown_maps : free_pages;
            out_of_memory = !map;
            if (out_of_memory)
                continue;
            free_pages[maps++] = map;
            for (gm_link *link = data_of(region)->chunks.first; link; link = link->next) {
                page_chunk *chunk = gm_list_item(link, page_chunk, link);
                uint64_t free_bytes = 0;
                for (uintptr_t page = chunk->address; page < chunk->address + chunk->size; page += page_size)
                    free_bytes += map[page_index(region, page, page_size)] ? page_size : 0;
                bool kept = region == keep_region && chunk->address < keep_end && chunk->address + chunk->size > keep_start;
                if (free_bytes < least || free_bytes == chunk->size || chunk->exported || kept)
                    continue;
                if (count == capacity) {
                    pinned_chunk *grown = realloc(chunks, (capacity ? 2 * capacity : 16) * sizeof *chunks);
                    if (!grown)
                        break;
                    chunks = grown, capacity = capacity ? 2 * capacity : 16;
                }
                chunks[count++] = (pinned_chunk){region, chunk, free_bytes, map};
            }
        }
    }
    *chunks_out = chunks;
    *free_pages_out = free_pages;
    *maps_out = maps;
    return count;
}

gm_status pages_compact_for(gm_arena *arena, const window *where, uint64_t need)
{
    pinned_chunk *chunks = NULL;
    uint8_t **free_pages = NULL;
    size_t maps = 0;
    size_t count = find_pinned_chunks(arena, where->region, where->run_start, where->run_end, &chunks, &free_pages, &maps);
    if (count)
        qsort(chunks, count, sizeof *chunks, most_free_first);
    gm_status status = GM_OK;
    uint64_t released = 0;
    /* Splitting a chunk changes only its own pages: the other chunks' maps stay true. */
    for (size_t i = 0; i < count && released < need && status == GM_OK; i++) {
        status = compact_chunk(arena, &chunks[i]);
        released += chunks[i].free_bytes;
    }
    for (size_t i = 0; i < maps; i++)
        free(free_pages[i]);
    free(free_pages);
    free(chunks);
    return status;
}
