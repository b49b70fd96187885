/*
 * compaction.c -- whole free pages inside pinned chunks given back when a growth would lift reserved
 * memory above its peak (compact_min, off by default).
 *
 * The pages engine's waste is free memory inside chunks that live blocks pin: a chunk is one physical
 * allocation, mapped whole, so one live byte keeps all its pages (docs/engine.md). Only idle chunks can
 * move; smaller chunks and rechunking fix the waste at the price of device calls at every step. Under
 * CUDA's virtual memory a pinned chunk can still be split after the fact: its live pages copied into
 * new physical memory that is then mapped at the same addresses, so that no pointer changes, and the
 * old chunk released with its free pages.
 *
 * When: only when a growth would otherwise lift reserved memory above its peak by more than a
 * two-hundredth (the moment the waste would cost memory; smaller rises are let through, so that later
 * passes settle instead of compacting again at the peak's edge: growth.c). Which: chunks of the shared
 * large pools with at least compact_min bytes of whole free pages (not a private pool's, a lane's, one
 * exported to another process, nor one in the growth's own run), those with the fewest live bytes
 * first, until the growth no longer lifts the peak. Each copy exists beside its chunk for a moment, so
 * a chunk whose copies would lift reserved memory above what the growth reserves anyway is skipped.
 *
 * How, losing nothing if any step fails: each run of touched pages copied into new physical memory
 * while the chunk is still mapped (the backend's copy_into: on CUDA a device-wide wait, since any
 * stream's queued work may use the pages, then a copy through a second mapping); the chunk unmapped,
 * its handle kept; the copies mapped in its place; the chunk released last. A failure before the
 * copies are in place puts the chunk back and lets the growth take new memory instead. No compaction
 * while a stream is being captured into a CUDA graph: the wait would break the capture.
 *
 * On demand too (gm_defragment, pages_defragment): every pinned chunk with at least the given whole free
 * pages, in the same order and the same way, at a moment the program chooses.
 *
 * What the engine cannot see: a kernel that another thread launches while the pages change place
 * would see the old memory or none. So compaction is for programs in which one thread at a time
 * launches work on the device (a training loop: the forward thread and autograd's backward thread take
 * turns), not for a server whose threads launch concurrently (docs/engine.md, "Compaction").
 */
#include "core/pages/pages.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

typedef struct pinned_chunk {
    gm_region *region;
    page_chunk *chunk;
    uint64_t free_bytes; /* its whole free pages */
    const uint8_t *free_pages;
} pinned_chunk;

/* Per page of `region`: 1 where the page lies wholly inside a free block. */
static uint8_t *find_free_pages(const gm_region *region, uint64_t page_size)
{
    uint8_t *free_pages = gm_system_calloc(data_of(region)->page_count ? data_of(region)->page_count : 1, 1);
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

/* Then the most free pages first, then the lowest address: an order that no sort's whims change. */
static int fewest_live_first(const void *a, const void *b)
{
    const pinned_chunk *x = a, *y = b;
    uint64_t left = x->chunk->size - x->free_bytes, right = y->chunk->size - y->free_bytes;
    if (left != right)
        return left < right ? -1 : 1;
    if (x->free_bytes != y->free_bytes)
        return x->free_bytes > y->free_bytes ? -1 : 1;
    return x->chunk->address < y->chunk->address ? -1 : x->chunk->address > y->chunk->address;
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

/* New physical memory for the touched pages [address, address + size), filled with what they hold now
 * (the old chunk is still mapped there). */
static gm_status make_copy(gm_arena *arena, gm_region *region, uintptr_t address, uint64_t size, page_chunk **copy_out)
{
    page_chunk *copy = NULL;
    gm_status status = pages_make_chunk(arena, region, size, &copy);
    if (status != GM_OK)
        return status;
    copy->address = address;
    status = gm_backend_copy_into(arena->backend, copy->handle, size, address);
    if (status != GM_OK) {
        pages_release_chunk(arena, region, copy);
        return status;
    }
    *copy_out = copy;
    return GM_OK;
}

/* The copies given back: those mapped unmapped first (one that cannot be is left stray, unmapped
 * before its release). */
static void drop_copies(gm_arena *arena, gm_region *region, page_chunk **copies, size_t made, size_t mapped)
{
    for (size_t i = 0; i < made; i++) {
        if (i < mapped && pages_unmap_chunk(arena, region, copies[i]) != GM_OK)
            copies[i]->stray = true;
        pages_release_chunk(arena, region, copies[i]);
    }
}

/* A copy could not be mapped after the chunk was unmapped: the chunk put back (*undone_out), else the
 * compaction finished with the copies after all, else the chunk kept unreachable (chunks.c). The
 * copies mapped so far ([0, mapped)) are unmapped before the chunk goes back; one that cannot be is
 * mapped where the chunk was, so only the copies can finish. */
static gm_status recover_failed_map(gm_arena *arena, gm_region *region, page_chunk *old, page_chunk **copies,
                                    size_t made, size_t mapped, bool *undone_out)
{
    while (mapped > 0 && pages_unmap_chunk(arena, region, copies[mapped - 1]) == GM_OK)
        mapped--;
    if (mapped == 0 && pages_map_chunk(arena, region, old, old->address) == GM_OK) {
        drop_copies(arena, region, copies, made, 0);
        *undone_out = true;
        return GM_OK;
    }
    while (mapped < made && pages_map_chunk(arena, region, copies[mapped], copies[mapped]->address) == GM_OK)
        mapped++;
    if (mapped == made) {
        *undone_out = false;
        return GM_OK;
    }
    drop_copies(arena, region, copies, made, mapped);
    pages_keep_unreachable(arena, region, old);
    *undone_out = true;
    return gm_fail(GM_ERROR_DEVICE, "compaction: neither chunk 0x%" PRIxPTR " (%" PRIu64 " bytes) nor its copies "
                   "could be mapped again after a failed map: the live blocks in it stay allocated, but the "
                   "device cannot reach their memory", old->address, old->size);
}

/* How many runs of whole free pages the pinned chunk holds. */
static size_t count_free_runs(const pinned_chunk *pinned, uint64_t page_size)
{
    uintptr_t start = pinned->chunk->address, end = start + pinned->chunk->size;
    size_t free_runs = 0;
    for (uintptr_t page = start; page < end; page = run_end(pinned->region, pinned->free_pages, page, end, page_size))
        free_runs += pinned->free_pages[page_index(pinned->region, page, page_size)];
    return free_runs;
}

/* Each run of touched pages of the pinned chunk copied into new memory (copies[0..*made_out)). */
static gm_status copy_live_runs(gm_arena *arena, const pinned_chunk *pinned, page_chunk **copies, size_t *made_out)
{
    gm_region *region = pinned->region;
    uint64_t page_size = engine_of(arena)->page_size;
    uintptr_t start = pinned->chunk->address, end = start + pinned->chunk->size;
    gm_status status = GM_OK;
    for (uintptr_t page = start; page < end && status == GM_OK;) {
        uintptr_t next = run_end(region, pinned->free_pages, page, end, page_size);
        if (!pinned->free_pages[page_index(region, page, page_size)]) {
            status = make_copy(arena, region, page, next - page, &copies[*made_out]);
            *made_out += status == GM_OK;
        }
        page = next;
    }
    return status;
}

/* Once the old chunk [start, end) is released (pinned->chunk is gone): its runs of whole free pages
 * left unmapped. Cannot run out of block metadata (reserved before the copies were made). */
static gm_status vacate_free_runs(gm_arena *arena, const pinned_chunk *pinned, uintptr_t start, uintptr_t end)
{
    gm_region *region = pinned->region;
    uint64_t page_size = engine_of(arena)->page_size;
    gm_status status = GM_OK;
    for (uintptr_t page = start; page < end && status == GM_OK;) {
        uintptr_t next = run_end(region, pinned->free_pages, page, end, page_size);
        if (pinned->free_pages[page_index(region, page, page_size)]) {
            gm_block *around = pages_free_block_containing(region, page, next - page);
            status = around ? pages_vacate(arena, around, page, next)
                            : gm_fail(GM_ERROR_CORRUPT, "compaction: a free page is not inside a free block");
        }
        page = next;
    }
    return status;
}

/* Split a pinned chunk without losing a byte: each run of touched pages copied into new memory while
 * the chunk is still mapped, the chunk unmapped (its handle kept), the copies mapped in its place,
 * and only then the chunk released and its whole free pages left unmapped. A failure at any step
 * puts the chunk back as it was (*undone_out). */
static gm_status compact_chunk(gm_arena *arena, const pinned_chunk *pinned, bool *undone_out)
{
    gm_region *region = pinned->region;
    page_chunk *old = pinned->chunk;
    uint64_t page_size = engine_of(arena)->page_size;
    uintptr_t start = old->address, end = old->address + old->size;
    /* Host memory first, for the list of copies and for the blocks that will mark the free runs
     * unmapped (each splits its free block in three at most): once the old chunk is released nothing
     * may fail. Without it the chunk stays whole: compaction is only an economy. */
    size_t free_runs = count_free_runs(pinned, page_size);
    /* The copies exist beside the chunk for a moment: reserved memory must stay within the memory limit
     * even then (the callers bound it by the peak, or not at all when the alternative is out of memory). */
    if ((uint64_t)gm_stat_total(arena->stats->reserved_bytes) + old->size - pinned->free_bytes > arena->memory_limit) {
        *undone_out = true;
        return GM_OK;
    }
    page_chunk **copies = gm_system_calloc(old->size / page_size, sizeof *copies);
    *undone_out = !copies || !gm_block_pool_reserve(&arena->block_pool, 2 * free_runs);
    if (*undone_out) {
        free(copies);
        return GM_OK;
    }
    size_t made = 0;
    gm_status status = copy_live_runs(arena, pinned, copies, &made);
    if (status == GM_OK)
        status = pages_unmap_chunk(arena, region, old);
    if (status != GM_OK) { /* the chunk is still mapped: only the copies go */
        drop_copies(arena, region, copies, made, 0);
        free(copies);
        *undone_out = true;
        return GM_OK;
    }
    size_t mapped = 0;
    while (mapped < made && status == GM_OK) {
        status = pages_map_chunk(arena, region, copies[mapped], copies[mapped]->address);
        mapped += status == GM_OK;
    }
    if (status != GM_OK)
        status = recover_failed_map(arena, region, old, copies, made, mapped, undone_out);
    free(copies);
    if (status != GM_OK || *undone_out)
        return status;
    pages_release_chunk(arena, region, old);
    return vacate_free_runs(arena, pinned, start, end);
}

/* Every chunk of the shared large pools (not a private pool's, not a lane's: page-sized chunks) with
 * at least `least` bytes of whole free pages that is not idle, exported, lost (nothing to copy from),
 * nor in [keep_start, keep_end) of `keep_region` (the growth's own run). *free_pages_out: the page maps
 * made, to free. *complete_out (unless NULL): false where host memory ran out and the search stopped
 * short. */
static size_t find_pinned_chunks(gm_arena *arena, uint64_t least, const gm_region *keep_region, uintptr_t keep_start,
                                 uintptr_t keep_end, pinned_chunk **chunks_out, uint8_t ***free_pages_out,
                                 size_t *maps_out, bool *complete_out)
{
    uint64_t page_size = engine_of(arena)->page_size;
    size_t count = 0, capacity = 0, maps = 0;
    pinned_chunk *chunks = NULL;
    uint8_t **free_pages = NULL;
    bool out_of_memory = false; /* without host memory the search stops: compaction is only an economy */
    for (size_t h = 0; h < arena->heap_count && !out_of_memory; h++) {
        gm_heap *heap = arena->heaps[h];
        if (heap->private_pool || !heap->engine_data) /* a lane has no region of its own: its stream's */
            continue;
        for (gm_region *region = gm_first_region(heap); region && !out_of_memory; region = gm_next_region(region)) {
            if (region->pool != GM_POOL_LARGE)
                continue;
            uint8_t **grown_maps = gm_system_realloc(free_pages, (maps + 1) * sizeof *free_pages);
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
                /* A lane's ring lives in the upper part of its stream's range (lane.c): its chunks stay whole. */
                bool ring = state_of(heap)->lane && chunk->address >= pages_ring_floor(region);
                if (free_bytes < least || free_bytes == chunk->size || chunk->exported || chunk->lost || kept || ring ||
                    chunk->clone_of || chunk->clones)
                    continue;
                if (count == capacity) {
                    pinned_chunk *grown = gm_system_realloc(chunks, (capacity ? 2 * capacity : 16) * sizeof *chunks);
                    out_of_memory = !grown;
                    if (out_of_memory)
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
    if (complete_out)
        *complete_out = !out_of_memory;
    return count;
}

/* find_pinned_chunks, the chunks in the order they are split: fewest live bytes first. */
static size_t find_pinned_chunks_in_order(gm_arena *arena, uint64_t least, const gm_region *keep_region,
                                          uintptr_t keep_start, uintptr_t keep_end, pinned_chunk **chunks_out,
                                          uint8_t ***free_pages_out, size_t *maps_out)
{
    size_t count = find_pinned_chunks(arena, least, keep_region, keep_start, keep_end, chunks_out, free_pages_out,
                                      maps_out, NULL);
    if (count)
        qsort(*chunks_out, count, sizeof **chunks_out, fewest_live_first);
    return count;
}

/* What find_pinned_chunks made. */
static void free_found(pinned_chunk *chunks, uint8_t **free_pages, size_t maps)
{
    for (size_t i = 0; i < maps; i++)
        free(free_pages[i]);
    free(free_pages);
    free(chunks);
}

/* Compaction is an economy: one that fails and is undone leaves the growth to new memory. Only what
 * leaves the books wrong is an error: a chunk that could not be put back (GM_ERROR_DEVICE). A rescue
 * (the device or the memory limit has no room for the growth's new memory: without compaction the
 * request fails) may lift reserved memory above its peak for the moment of the copies; the copies'
 * own memory must still be had, else the chunk is put back. */
gm_status pages_compact_for(gm_arena *arena, const window *where, uint64_t need, bool rescue)
{
    if (pages_any_stream_capturing(arena)) /* each copy's device-wide wait would break the capture */
        return GM_OK;
    pinned_chunk *chunks = NULL;
    uint8_t **free_pages = NULL;
    size_t maps = 0;
    size_t count = find_pinned_chunks_in_order(arena, arena->options->compact_min, where->region, where->run_start,
                                               where->run_end, &chunks, &free_pages, &maps);
    gm_status status = GM_OK;
    bool undone = false;
    uint64_t released = 0;
    const gm_stat *reserved = arena->stats->reserved_bytes;
    /* The chunks with the fewest live bytes first: the least to copy, and the shortest moment of copies
     * beside their chunk, which must not rise above what the growth will reserve anyway (the peak, or
     * the excess left after this chunk's free pages). Splitting a chunk changes only its own pages: the
     * other chunks' maps stay true. */
    for (size_t i = 0; i < count && released < need && status == GM_OK && !undone; i++) {
        uint64_t live = chunks[i].chunk->size - chunks[i].free_bytes, left = need - released;
        int64_t allowed = gm_arena_reserved_peak(arena) + (int64_t)(left > chunks[i].free_bytes ? left - chunks[i].free_bytes : 0);
        if (!rescue && gm_stat_total(reserved) + (int64_t)live > allowed)
            continue;
        status = compact_chunk(arena, &chunks[i], &undone);
        released += status == GM_OK && !undone ? chunks[i].free_bytes : 0;
    }
    free_found(chunks, free_pages, maps);
    return status;
}

gm_status pages_defragment(gm_arena *arena, uint64_t least_free, uint64_t *released_out)
{
    if (pages_any_stream_capturing(arena))
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "gm_defragment: a stream of this allocator is being captured into a "
                       "CUDA graph, and the copies' wait for the device would break the capture");
    uint64_t page_size = engine_of(arena)->page_size;
    pinned_chunk *chunks = NULL;
    uint8_t **free_pages = NULL;
    size_t maps = 0;
    size_t count = find_pinned_chunks_in_order(arena, least_free > page_size ? least_free : page_size, NULL, 0, 0,
                                               &chunks, &free_pages, &maps);
    gm_status status = GM_OK;
    for (size_t i = 0; i < count && status == GM_OK; i++) {
        bool undone = false;
        status = compact_chunk(arena, &chunks[i], &undone);
        *released_out += status == GM_OK && !undone ? chunks[i].free_bytes : 0;
    }
    free_found(chunks, free_pages, maps);
    return status;
}

bool pages_pinned_free_bytes(gm_arena *arena, uint64_t *bytes_out)
{
    pinned_chunk *chunks = NULL;
    uint8_t **free_pages = NULL;
    size_t maps = 0;
    bool complete = true;
    size_t count = find_pinned_chunks(arena, engine_of(arena)->page_size, NULL, 0, 0, &chunks, &free_pages, &maps,
                                      &complete);
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += chunks[i].free_bytes;
    free_found(chunks, free_pages, maps);
    *bytes_out = total;
    return complete;
}
