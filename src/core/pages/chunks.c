/*
 * chunks.c -- regions, and the chunks of physical memory mapped into them.
 *
 * Each heap has, per pool, a region: a virtual address range reserved once, twice the size of the
 * device's usable memory, so addresses never run short however chunks move. Physical memory comes in
 * chunks (one cuMemCreate each, a whole number of pages), each mapped at exactly one place; the
 * region's page table says which chunk backs each page. A chunk cannot be split later (the driver
 * refuses mappings at an offset into an allocation), so its size is decided when it is made
 * (growth.c).
 *
 * A chunk lying wholly inside free space is idle: it can be unmapped where it lies and mapped where a
 * request needs it, or given back. Before unmapping a chunk the engine waits for the work queued on
 * the chunk's stream (an event), as PyTorch does for expandable segments: unmapping memory that a
 * queued kernel still uses would fault. Only work queued before the chunk's last free can use it (later
 * work would need it allocated again), so a wait for the stream after that free already covers it: a
 * chunk freed before the stream's last wait, or unused since it was mapped, is unmapped without
 * another. One wait covers every heap of the stream (its own, its lane). Events recorded as blocks
 * are freed (progress.c) spare most waits for chunks freed long before, and a chunk that moves within
 * its own stream needs none: it is mapped at its new place before its old mapping goes (aliases.c).
 */
#include "core/pages/pages.h"

#include "base/array.h"
#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

static gm_status new_region(gm_arena *arena, gm_heap *heap, int pool, gm_region **region_out)
{
    page_engine *engine = engine_of(arena);
    uint64_t page_count = engine->region_size / engine->page_size;
    gm_region *region = gm_system_calloc(1, sizeof *region);
    page_region *data = gm_system_calloc(1, sizeof *data);
    page_chunk **pages = gm_system_calloc(page_count, sizeof *pages);
    uint8_t *mapped_in_group = gm_system_calloc(page_count / PAGE_GROUP + 1, 1);
    gm_block *block = gm_block_new(&arena->block_pool);
    uintptr_t base = 0;
    gm_status status = region && data && pages && mapped_in_group && block
                           ? gm_backend_address_reserve(arena->backend, engine->region_size, &base)
                           : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a region");
    if (status != GM_OK) {
        free(region);
        free(data);
        free(pages);
        free(mapped_in_group);
        if (block)
            gm_block_delete(&arena->block_pool, block);
        return status;
    }
    *data = (page_region){.pages = pages, .page_count = page_count, .mapped_in_group = mapped_in_group};
    *region = (gm_region){.base = base, .size = engine->region_size, .heap = heap, .first_block = block,
                          .pool = (uint8_t)pool, .engine_data = data};
    gm_list_push_front(&heap->regions, &region->link);
    *block = (gm_block){.address = base, .size = engine->region_size, .region = region, .heap = heap,
                        .pool = (uint8_t)pool};
    pages_unmapped_insert(region, block);
    *region_out = region;
    return GM_OK;
}


/* ---------------------------------------------------------------- chunks */

static void record_chunk_pages(gm_region *region, page_chunk *chunk, page_chunk *value, uint64_t page_size)
{
    page_region *data = data_of(region);
    uint64_t first = page_index(region, chunk->address, page_size);
    for (uint64_t page = first; page < first + chunk->size / page_size; page++) {
        if (!data->pages[page] && value)
            data->mapped_in_group[page / PAGE_GROUP]++;
        else if (data->pages[page] && !value)
            data->mapped_in_group[page / PAGE_GROUP]--;
        data->pages[page] = value;
    }
}

/* `chunk` in `region`'s books at its address: in its list of chunks, its mapped bytes and its pages. */
static void hold_chunk(gm_region *region, page_chunk *chunk, uint64_t page_size)
{
    gm_list_push_front(&data_of(region)->chunks, &chunk->link);
    data_of(region)->mapped_bytes += chunk->size;
    record_chunk_pages(region, chunk, chunk, page_size);
}

/* `chunk` out of `region`'s books: its list of chunks, its mapped bytes and its pages. */
static void leave_region(gm_region *region, page_chunk *chunk, uint64_t page_size)
{
    gm_list_remove(&data_of(region)->chunks, &chunk->link);
    data_of(region)->mapped_bytes -= chunk->size;
    record_chunk_pages(region, chunk, NULL, page_size);
}

/* Map `chunk`'s memory at `address` with access, once any old mapping still there is gone (aliases.c).
 * Access is set per mapping: the driver charges cuMemSetAccess per mapping that a range covers
 * (bench/vmm_probe.c measures it), so one call over many chunks would cost no less. A refused
 * set-access undoes the mapping; *left_mapped_out says whether that undo was refused too. */
static gm_status map_with_access(gm_arena *arena, const page_chunk *chunk, uintptr_t address, bool *left_mapped_out)
{
    *left_mapped_out = false;
    gm_status status = engine_of(arena)->alias_count ? pages_retire_aliases_in(arena, address, address + chunk->size)
                                                     : GM_OK;
    if (status == GM_OK)
        status = gm_backend_map(arena->backend, address, chunk->size, chunk->handle);
    if (status == GM_OK && (status = gm_backend_set_access(arena->backend, address, chunk->size)) != GM_OK)
        *left_mapped_out = gm_backend_unmap(arena->backend, address, chunk->size) != GM_OK;
    return status;
}

gm_status pages_map_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk, uintptr_t address)
{
    bool left_mapped = false;
    gm_status status = map_with_access(arena, chunk, address, &left_mapped);
    if (left_mapped) {
        chunk->address = address;
        chunk->stray = true;
    }
    if (status != GM_OK)
        return status;
    chunk->address = address;
    chunk->freed_at = 0; /* no block has used it here yet */
    hold_chunk(region, chunk, engine_of(arena)->page_size);
    gm_history_record(arena->history, GM_EVENT_SEGMENT_MAP, address, chunk->size, region->heap->stream,
                      gm_heap_pool_id(region->heap));
    arena->stats->num_page_maps += (int64_t)(chunk->size / engine_of(arena)->page_size);
    return GM_OK;
}

static void close_export(gm_arena *arena, const page_chunk *chunk);

/* A second mapping that the driver left at `address` without access (set-access refused, and the unmap
 * that undoes it too): kept as an old mapping (aliases.c), which no work has used, so that it is unmapped
 * before anything is mapped over those addresses or the chunk goes back to the device. A stitch makes
 * room for it before it maps anything (stitching.c); without room it would stay on the device until the
 * allocator goes. */
static void keep_refused_clone(gm_arena *arena, gm_region *region, const page_chunk *clone, uintptr_t address)
{
    if (!pages_alias_room(arena, 1))
        return;
    page_alias alias = {address, clone->size, clone->handle, region->heap, 0, true, false};
    pages_add_alias(arena, &alias);
}

gm_status pages_map_clone(gm_arena *arena, gm_region *region, page_chunk *clone, uintptr_t address)
{
    bool left_mapped = false;
    /* The last stitch's second mapping of the same chunk may still be there, waiting for its stream:
     * the same mapping serves again, with no call and no wait. */
    gm_status status = pages_adopt_alias(arena, address, clone->size, clone->handle)
                           ? GM_OK
                           : map_with_access(arena, clone, address, &left_mapped);
    if (left_mapped)
        keep_refused_clone(arena, region, clone, address);
    if (status != GM_OK)
        return status;
    clone->address = address;
    hold_chunk(region, clone, engine_of(arena)->page_size);
    arena->stats->num_page_maps += (int64_t)(clone->size / engine_of(arena)->page_size);
    return GM_OK;
}

void pages_unmap_clone(gm_arena *arena, gm_region *region, page_chunk *clone)
{
    page_engine *engine = engine_of(arena);
    leave_region(region, clone, engine->page_size);
    page_alias alias = {clone->address, clone->size, clone->handle, region->heap, engine->frees, false, true};
    bool capturing = pages_stream_capturing(arena, region->heap);
    bool can_wait = capturing && pages_wait_is_capturable(arena, region->heap, alias.freed_at);
    if (can_wait && pages_wait_for_free(arena, region->heap, alias.freed_at) == GM_OK &&
        gm_backend_unmap(arena->backend, alias.address, alias.size) == GM_OK) {
        arena->stats->num_page_unmaps += (int64_t)(alias.size / engine->page_size);
    } else if (pages_alias_room(arena, 1)) { /* the caller made the room: the mapping is never lost */
        pages_add_alias(arena, &alias);
        if (!capturing) /* else retire() waits for the stream once it can */
            pages_mark_after(arena, region->heap, alias.freed_at);
    }
    close_export(arena, clone); /* gm_share of a stitched block exported the clone's handle */
    free(clone);
}

void pages_drop_clone(gm_arena *arena, gm_region *region, page_chunk *clone)
{
    gm_list_remove(&data_of(region)->chunks, &clone->link);
    gm_backend_unmap(arena->backend, clone->address, clone->size);
    close_export(arena, clone);
    free(clone);
}

/* The unmap event comes first: an observer (NCCL's deregistration) needs the memory still mapped. */
gm_status pages_unmap_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk)
{
    gm_pool_id pool = gm_heap_pool_id(region->heap);
    gm_history_record(arena->history, GM_EVENT_SEGMENT_UNMAP, chunk->address, chunk->size, region->heap->stream, pool);
    bool mapped = !chunk->lost || chunk->stray;
    gm_status status = mapped ? gm_backend_unmap(arena->backend, chunk->address, chunk->size) : GM_OK;
    if (status != GM_OK) {
        gm_history_record(arena->history, GM_EVENT_SEGMENT_MAP, chunk->address, chunk->size, region->heap->stream,
                          pool);
        return status;
    }
    engine_of(arena)->lost_chunks -= chunk->lost;
    chunk->lost = chunk->stray = false;
    leave_region(region, chunk, engine_of(arena)->page_size);
    arena->stats->num_page_unmaps += (int64_t)(chunk->size / engine_of(arena)->page_size);
    return GM_OK;
}

void pages_keep_unreachable(gm_arena *arena, gm_region *region, page_chunk *chunk)
{
    chunk->lost = true; /* a stray one stays so: mapped there, only without access */
    engine_of(arena)->lost_chunks++;
    hold_chunk(region, chunk, engine_of(arena)->page_size);
}

gm_status pages_make_chunk(gm_arena *arena, const gm_region *region, uint64_t size, page_chunk **chunk_out)
{
    page_chunk *chunk = gm_system_calloc(1, sizeof *chunk);
    if (!chunk)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a chunk");
    chunk->size = size;
    gm_status status = gm_backend_physical_create(arena->backend, size, &chunk->handle);
    if (status != GM_OK) {
        free(chunk);
        return status;
    }
    gm_count_reserved(arena, region->pool, (int64_t)size, 1);
    arena->stats->num_device_alloc++;
    *chunk_out = chunk;
    return GM_OK;
}

/* Make a chunk of `size` bytes and map it at `address` (create_memory has checked the room for it). */
gm_status pages_create_chunk(gm_arena *arena, gm_region *region, uintptr_t address, uint64_t size)
{
    page_chunk *chunk = NULL;
    gm_status status = pages_make_chunk(arena, region, size, &chunk);
    if (status != GM_OK)
        return status;
    status = pages_map_chunk(arena, region, chunk, address);
    if (status != GM_OK) /* made but not mapped: back to the device (or, refused, to the unreleased list) */
        pages_release_chunk(arena, region, chunk);
    return status;
}

/* A released chunk's memory is gone: so is the descriptor gm_share exported for it, if any. */
static void close_export(gm_arena *arena, const page_chunk *chunk)
{
    if (chunk->exported)
        gm_backend_close_export(arena->backend, chunk->exported - 1);
}

/* The allocator goes: a failed release changes nothing more. */
void pages_release_physical(gm_arena *arena, page_chunk *chunk)
{
    gm_backend_physical_release(arena->backend, chunk->handle, chunk->size);
    close_export(arena, chunk);
    free(chunk);
}

static bool release_now(gm_arena *arena, page_chunk *chunk, int pool)
{
    if (engine_of(arena)->alias_count && pages_retire_aliases_of(arena, chunk->handle) != GM_OK)
        return false; /* an old mapping holds its memory still: released later */
    if (chunk->stray) {
        if (gm_backend_unmap(arena->backend, chunk->address, chunk->size) != GM_OK)
            return false;
        chunk->stray = false;
    }
    if (gm_backend_physical_release(arena->backend, chunk->handle, chunk->size) != GM_OK)
        return false;
    close_export(arena, chunk);
    gm_count_reserved(arena, pool, -(int64_t)chunk->size, -1);
    arena->stats->num_device_free++;
    free(chunk);
    return true;
}

void pages_release_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk)
{
    if (release_now(arena, chunk, region->pool))
        return;
    chunk->pool = region->pool; /* the device still holds it: so do the books */
    gm_list_push_front(&engine_of(arena)->unreleased, &chunk->link);
}

void pages_retry_releases(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    for (gm_link *link = engine->unreleased.first; link;) {
        gm_link *next = link->next;
        page_chunk *chunk = gm_list_item(link, page_chunk, link);
        gm_list_remove(&engine->unreleased, link);
        if (!release_now(arena, chunk, chunk->pool))
            gm_list_push_front(&engine->unreleased, link); /* the list is walked from `next` on: no loop */
        link = next;
    }
}

/* A search of the heap's free blocks of at least `size` bytes. */
gm_block *pages_free_block_containing(gm_region *region, uintptr_t address, uint64_t size)
{
    gm_index_cursor cursor;
    for (gm_block *block = gm_size_index_begin_at(&cursor, gm_heap_index(region->heap, region->pool), size); block;
         block = gm_size_index_advance(&cursor))
        if (block->region == region && block->address <= address && address + size <= block->address + block->size)
            return block;
    return NULL;
}

gm_status pages_give_back_lost_chunks(gm_arena *arena)
{
    for (size_t h = 0; h < arena->heap_count; h++)
        for (gm_region *region = gm_first_region(arena->heaps[h]); region; region = gm_next_region(region))
            for (gm_link *link = data_of(region)->chunks.first; link;) {
                page_chunk *chunk = gm_list_item(link, page_chunk, link);
                link = link->next;
                if (chunk->lost && pages_free_block_containing(region, chunk->address, chunk->size) &&
                    pages_evict_chunk(arena, region, chunk) == GM_OK)
                    pages_release_chunk(arena, region, chunk);
            }
    if (engine_of(arena)->lost_chunks)
        return gm_fail(GM_ERROR_DEVICE, "%" PRIu64 " chunk(s) of device memory lost their mapping in a failed "
                       "compaction and still hold live blocks: no allocation until those blocks are freed",
                       engine_of(arena)->lost_chunks);
    return GM_OK;
}

/* The free block around the idle chunk `chunk` of `region`, with the split's metadata reserved first
 * (pages_carve takes two blocks at most): once the chunk is unmapped its addresses must be marked so,
 * or a fit would place a block on memory that is not there. */
static gm_status block_around(gm_arena *arena, gm_region *region, const page_chunk *chunk, gm_block **around_out)
{
    *around_out = pages_free_block_containing(region, chunk->address, chunk->size);
    if (!*around_out)
        return gm_fail(GM_ERROR_CORRUPT, "idle chunk 0x%" PRIxPTR " is not inside a free block", chunk->address);
    if (!gm_block_pool_reserve(&arena->block_pool, 2))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    return GM_OK;
}

/* Unmap an idle chunk from the free block around it; its addresses become unmapped. The chunk keeps
 * its handle and leaves the region. */
gm_status pages_evict_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk)
{
    gm_block *around = NULL;
    gm_status status = block_around(arena, region, chunk, &around);
    if (status == GM_OK)
        status = pages_wait_for_free(arena, region->heap, chunk->freed_at);
    if (status == GM_OK)
        status = pages_unmap_chunk(arena, region, chunk);
    if (status != GM_OK)
        return status;
    return pages_vacate(arena, around, chunk->address, chunk->address + chunk->size);
}

gm_status pages_move_chunk_ahead(gm_arena *arena, gm_region *from, page_chunk *chunk, gm_region *to,
                                 uintptr_t address)
{
    gm_block *around = NULL;
    gm_status status = block_around(arena, from, chunk, &around);
    if (status != GM_OK)
        return status;
    if (!pages_alias_room(arena, 1))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the list of old mappings");
    uint64_t page_size = engine_of(arena)->page_size;
    page_alias alias = {chunk->address, chunk->size, chunk->handle, from->heap, chunk->freed_at, false, false};
    gm_pool_id pool = gm_heap_pool_id(from->heap);
    gm_history_record(arena->history, GM_EVENT_SEGMENT_UNMAP, alias.address, alias.size, from->heap->stream, pool);
    leave_region(from, chunk, page_size);
    status = pages_map_chunk(arena, to, chunk, address);
    if (status != GM_OK && !chunk->stray) { /* still where it was, as it was */
        chunk->address = alias.address;
        chunk->freed_at = alias.freed_at;
        hold_chunk(from, chunk, page_size);
        gm_history_record(arena->history, GM_EVENT_SEGMENT_MAP, alias.address, alias.size, from->heap->stream, pool);
        return status;
    }
    pages_add_alias(arena, &alias);
    pages_mark_after(arena, from->heap, alias.freed_at);
    if (status == GM_OK) /* the stream's work up to that free may still use it: a move elsewhere waits */
        chunk->freed_at = alias.freed_at;
    gm_status vacated = pages_vacate(arena, around, alias.address, alias.address + alias.size);
    if (status != GM_OK) /* mapped there without access: it goes back once its old mapping goes */
        pages_release_chunk(arena, from, chunk);
    return status != GM_OK ? status : vacated;
}

gm_status pages_vacate(gm_arena *arena, gm_block *around, uintptr_t from, uintptr_t to)
{
    gm_unindex_free_block(arena, around);
    gm_block *hole = pages_carve(arena, around, from, to, GM_BLOCK_UNMAPPED);
    if (!hole) {
        gm_index_free_block(arena, around);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    pages_attach(arena, pages_merge_alike(arena, hole));
    return GM_OK;
}

/* Device `peer` may reach every chunk mapped now: one set-access call each, for that device alone. */
gm_status pages_grant_peer_access(gm_arena *arena, int peer)
{
    for (size_t h = 0; h < arena->heap_count; h++)
        for (gm_region *region = gm_first_region(arena->heaps[h]); region; region = gm_next_region(region))
            for (gm_link *link = data_of(region)->chunks.first; link; link = link->next) {
                const page_chunk *chunk = gm_list_item(link, page_chunk, link);
                gm_status status = gm_backend_grant_access(arena->backend, chunk->address, chunk->size, peer);
                if (status != GM_OK)
                    return status;
            }
    return GM_OK;
}

/* ---------------------------------------------------------------- sharing with other processes */

/* The chunks under `block`, back to back from the first: each exported once, its descriptor kept until
 * the chunk goes back to the device (another process may take it while the block is live). */
gm_status pages_share_block(gm_arena *arena, const gm_block *block, uint64_t *offset_out, gm_shared_piece *pieces,
                            size_t capacity, size_t *count_out)
{
    uint64_t page_size = engine_of(arena)->page_size;
    page_chunk **pages = data_of(block->region)->pages;
    uintptr_t first = 0;
    size_t count = 0;
    for (uintptr_t cursor = block->address; cursor < block->address + block->size; count++) {
        page_chunk *chunk = pages[page_index(block->region, cursor, page_size)];
        if (!count)
            first = chunk->address;
        if (count < capacity) {
            int descriptor = chunk->exported - 1;
            gm_status status = GM_OK;
            if (chunk->exported)
                gm_backend_offer_export(descriptor);
            else
                status = gm_backend_export(arena->backend, chunk->handle, &descriptor);
            if (status != GM_OK)
                return status;
            chunk->exported = descriptor + 1;
            pieces[count] = (gm_shared_piece){chunk->address - first, chunk->size, descriptor};
        }
        cursor = chunk->address + chunk->size;
    }
    *offset_out = block->address - first;
    *count_out = count;
    if (count > capacity)
        return gm_fail(GM_ERROR_BUFFER_TOO_SMALL, "gm_share: the allocation lies in %zu chunks, room for %zu", count,
                       capacity);
    return GM_OK;
}

/* ---------------------------------------------------------------- finding idle chunks */

static bool remember_idle(page_engine *engine, size_t *count, page_chunk *chunk, gm_region *region)
{
    idle_chunk *grown = gm_array_room_for_one(engine->idle, *count, &engine->idle_capacity, sizeof *grown, 64);
    if (!grown)
        return false;
    engine->idle = grown;
    engine->idle[(*count)++] = (idle_chunk){chunk, region, chunk->size};
    return true;
}

/* Whether the idle chunks of `heap` stay where they are in this search for `requester`: moving one
 * waits for the heap's stream (pages_wait_for_free), which stalls the host until the device has caught up with it.
 * While the search is by choice (engine->moving_by_choice), a chunk of another stream that is still at
 * work is not worth that: new memory is made instead. Asked once per heap that has an idle chunk. */
static bool stays_put(gm_arena *arena, const gm_heap *heap, const gm_heap *requester)
{
    return engine_of(arena)->moving_by_choice && requester && heap->stream != requester->stream &&
           pages_stream_busy(arena, heap);
}

/* Collect into engine->idle every chunk that lies wholly inside a free block, in every heap and
 * pool, except those reaching into [keep_start, keep_end) of `keep_region` (the run a growth is
 * using: a free block merged with a part already backed may start before the run), in heaps
 * whose memory is a private pool's (unless keep_region is that pool's) or whose stream is being
 * captured into a CUDA graph (moving a chunk waits for the stream: pages_wait_for_free), in borrowed
 * streams' heaps while any stream is being captured (their wait is for the whole device), and in those
 * that stay put (stays_put). One pass over the free blocks, following the page table from chunk to chunk. */
size_t pages_find_idle_chunks(gm_arena *arena, const gm_region *keep_region, uintptr_t keep_start,
                               uintptr_t keep_end)
{
    page_engine *engine = engine_of(arena);
    uint64_t page_size = engine->page_size;
    size_t count = 0;
    const gm_heap *requester = keep_region ? keep_region->heap : NULL;
    int capturing_anywhere = -1; /* not asked yet: a borrowed stream's memory waits for the whole device */
    for (size_t h = 0; h < arena->heap_count; h++) {
        if (!gm_heap_memory_available(arena->heaps[h], requester) ||
            pages_stream_capturing(arena, arena->heaps[h]))
            continue; /* a pool's memory; or a stream in capture, which moving a chunk would wait for */
        if (pages_stream_borrowed(arena->heaps[h]) &&
            (capturing_anywhere < 0 ? (capturing_anywhere = pages_any_stream_capturing(arena)) : capturing_anywhere))
            continue;
        int busy = -1; /* not asked yet */
        for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE && busy != 1; pool++) {
            gm_index_cursor blocks;
            const gm_size_index *index = gm_heap_index(arena->heaps[h], pool);
            for (gm_block *block = gm_size_index_begin_at(&blocks, index, page_size); block;
                 block = gm_size_index_advance(&blocks)) {
                gm_region *region = block->region;
                if (block->size < page_size)
                    continue;
                page_chunk **pages = data_of(region)->pages;
                uintptr_t end = block->address + block->size;
                for (uintptr_t cursor = page_ceiling(block->address, page_size); cursor + page_size <= end;) {
                    page_chunk *chunk = pages[page_index(region, cursor, page_size)];
                    bool kept = region == keep_region && chunk->address < keep_end &&
                                chunk->address + chunk->size > keep_start;
                    if (!kept && chunk->address >= block->address && chunk->address + chunk->size <= end) {
                        if (busy < 0 && (busy = stays_put(arena, arena->heaps[h], requester)) == 1)
                            break;
                        if (!remember_idle(engine, &count, chunk, region))
                            return count;
                    }
                    cursor = chunk->address + chunk->size;
                }
                if (busy == 1)
                    break;
            }
        }
    }
    return count;
}

static int smaller_chunk_first(const void *left, const void *right)
{
    uint64_t a = ((const idle_chunk *)left)->size, b = ((const idle_chunk *)right)->size;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* The first entry of idle[from, to) whose size is at least `size` (`to` if none): sizes ascend. */
static size_t first_of_size(const idle_chunk *idle, size_t from, size_t to, uint64_t size)
{
    while (from < to) {
        size_t middle = from + (to - from) / 2;
        if (idle[middle].size < size)
            from = middle + 1;
        else
            to = middle;
    }
    return from;
}

/* The next idle chunk to move for `remaining` bytes with at most `room` bytes of space: the smallest
 * that covers what remains, else the largest that does not. The list is sorted by size (taken entries
 * keep theirs); taken entries are NULL, and none before `first` or at `count - 1`. -1 if none fits the
 * room. Binary searches, so that moving many page-sized chunks out of a long list is not quadratic. */
ptrdiff_t pages_pick_idle_chunk(const idle_chunk *idle, size_t first, size_t count, uint64_t remaining,
                                uint64_t room)
{
    size_t fitting_end = room == UINT64_MAX ? count : first_of_size(idle, first, count, room + 1);
    size_t covering = first_of_size(idle, first, fitting_end, remaining);
    for (size_t i = covering; i < fitting_end; i++)
        if (idle[i].chunk)
            return (ptrdiff_t)i;
    for (size_t i = covering; i > first; i--)
        if (idle[i - 1].chunk)
            return (ptrdiff_t)(i - 1);
    return -1;
}

/* Every idle chunk outside the window's run (find_idle_chunks), smallest first: their count. */
size_t pages_sorted_idle_chunks(gm_arena *arena, const gm_region *keep_region, uintptr_t keep_start,
                                 uintptr_t keep_end)
{
    page_engine *engine = engine_of(arena);
    size_t count = pages_find_idle_chunks(arena, keep_region, keep_start, keep_end);
    if (count > 1)
        qsort(engine->idle, count, sizeof *engine->idle, smaller_chunk_first);
    return count;
}

/* Mark engine->idle[pick] taken; *first moves past the taken entries at the front, *count before those
 * at the end (the largest below what remains is taken from the end, over and over). */
void pages_take_idle_chunk(page_engine *engine, ptrdiff_t pick, size_t *first, size_t *count)
{
    engine->idle[pick].chunk = NULL;
    while (*first < *count && !engine->idle[*first].chunk)
        (*first)++;
    while (*count > *first && !engine->idle[*count - 1].chunk)
        (*count)--;
}


/* A new region of `heap`'s `pool` for a request of `size` bytes. A request larger than a region is
 * refused before any address range is reserved: a region made for it would stay, empty, and a program
 * that retries such a request (a batch-size search) would pile them up. */
gm_status pages_add_region(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_region **region_out)
{
    *region_out = NULL;
    if (size > engine_of(arena)->region_size)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "a request of %" PRIu64 " bytes exceeds the address range", size);
    return new_region(arena, heap, pool, region_out);
}
