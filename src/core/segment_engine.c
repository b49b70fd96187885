/*
 * segment_engine.c -- the "segments" engine: PyTorch's caching design on a TLSF index.
 *
 * Device memory comes in segments (cudaMalloc): 2 MiB segments for the small pool, 20 MiB segments
 * for large requests below 10 MiB, and a segment of the request's own size (rounded to 2 MiB) from
 * there on. A segment is tiled by blocks; a request takes the best-fitting free block of its
 * heap's pool and splits off the rest (in the large pool only when the rest exceeds small_size,
 * as PyTorch does, so that big blocks do not crumble); a freed block coalesces with free
 * neighbours. A whole free segment stays cached until empty_cache or an out-of-memory retry. With
 * split_blocks:false nothing is split: a request takes the whole free block or segment it lands in, so
 * no two allocations share a segment (PyTorch's MemPool(no_split=True), for memory registered with
 * NCCL segment by segment).
 *
 * One improvement over PyTorch (release_before_growth, on by default): before a new segment would
 * raise reserved memory above its previous peak, the cached free segments are given back first.
 * This caps the "reserved but unusable" growth that makes PyTorch reserve 3x the live bytes on
 * workloads whose sizes drift (generation with a growing KV cache). Releasing costs device calls,
 * so it is paid from a budget: it starts at RELEASE_CREDIT_INITIAL_NS, each allocation adds
 * RELEASE_CREDIT_NS, each release and the segment made after it spend their modelled device time,
 * and while the budget is spent a growth simply makes a new segment above the peak. A pattern that
 * would free and re-make a segment at every operation (alternating 1 MiB and 64 MiB requests:
 * bench/adversarial.py) so reserves one segment more instead.
 */
#include "core/arena.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

/* Budget of device time for release_before_growth: per allocation, its cap, and what a new allocator
 * starts with (the releases of a program's first steps, which save the most, stay as they were). */
#define RELEASE_CREDIT_NS 250
#define RELEASE_CREDIT_LIMIT_NS 200000000
#define RELEASE_CREDIT_INITIAL_NS 100000000

typedef struct segment_engine {
    int64_t release_credit_ns;
} segment_engine;

static uint64_t segment_size_for(const gm_options *options, int pool, uint64_t size)
{
    if (pool == GM_POOL_SMALL)
        return options->small_segment_size;
    if (size < options->min_large_alloc)
        return options->large_segment_size;
    return gm_round_up(size, 2ull << 20);
}

static bool region_is_free(const gm_region *region)
{
    return region->first_block->state == GM_BLOCK_FREE && region->first_block->size == region->size;
}

/* Give a free segment back to the device; if the device refuses, the segment stays, free, as it was. */
static gm_status release_segment(gm_arena *arena, gm_region *region)
{
    gm_pool_id pool = gm_heap_pool_id(region->heap);
    gm_history_record(arena->history, GM_EVENT_SEGMENT_UNMAP, region->base, region->size, region->heap->stream, pool);
    gm_status status = gm_backend_segment_free(arena->backend, region->base, region->size);
    if (status != GM_OK) {
        gm_history_record(arena->history, GM_EVENT_SEGMENT_MAP, region->base, region->size, region->heap->stream, pool);
        return status;
    }
    gm_block *block = region->first_block;
    gm_unindex_free_block(arena, block);
    gm_block_delete(&arena->block_pool, block);
    gm_count_reserved(arena, region->pool, -(int64_t)region->size, -1);
    arena->stats->num_device_free++;
    gm_list_remove(&region->heap->regions, &region->link);
    free(region);
    return GM_OK;
}

/* Free segments back to the device until reserved memory is at most `keep_bytes`; with `pools`, those
 * of private pools that still have users too (only when the allocator is destroyed). */
static void release_free_segments(gm_arena *arena, uint64_t keep_bytes, bool pools)
{
    for (size_t h = 0; h < arena->heap_count; h++) {
        if (!pools && !gm_heap_memory_available(arena->heaps[h], NULL))
            continue;
        gm_region *region = gm_first_region(arena->heaps[h]);
        while (region) {
            if ((uint64_t)gm_stat_total(arena->stats->reserved_bytes) <= keep_bytes)
                return;
            gm_region *next = gm_next_region(region);
            if (region_is_free(region))
                release_segment(arena, region); /* a refused one stays cached; the others may go */
            region = next;
        }
    }
}

static void segments_release_cached(gm_arena *arena, uint64_t keep_bytes)
{
    release_free_segments(arena, keep_bytes, false);
}

static uint64_t segments_idle_bytes(gm_arena *arena)
{
    uint64_t total = 0;
    for (size_t h = 0; h < arena->heap_count; h++)
        if (gm_heap_memory_available(arena->heaps[h], NULL))
            for (gm_region *region = gm_first_region(arena->heaps[h]); region; region = gm_next_region(region))
                total += region_is_free(region) ? region->size : 0;
    return total;
}

static gm_status new_segment(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    if (!gm_may_reserve(arena, size))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "memory limit of %" PRIu64 " bytes reached", arena->memory_limit);
    gm_region *region = gm_system_calloc(1, sizeof *region);
    gm_block *block = gm_block_new(&arena->block_pool);
    if (!region || !block) {
        free(region);
        if (block)
            gm_block_delete(&arena->block_pool, block);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for allocator metadata");
    }
    uintptr_t address = 0;
    gm_status status = gm_backend_segment_allocate(arena->backend, size, &address);
    if (status != GM_OK) {
        free(region);
        gm_block_delete(&arena->block_pool, block);
        return status;
    }
    *region = (gm_region){.base = address, .size = size, .heap = heap, .first_block = block, .pool = (uint8_t)pool};
    gm_list_push_front(&heap->regions, &region->link);
    *block = (gm_block){.address = address, .size = size, .region = region, .heap = heap,
                        .state = GM_BLOCK_FREE, .pool = (uint8_t)pool};
    gm_count_reserved(arena, pool, (int64_t)size, 1);
    arena->stats->num_device_alloc++;
    gm_history_record(arena->history, GM_EVENT_SEGMENT_MAP, address, size, heap->stream, gm_heap_pool_id(heap));
    *block_out = block;
    return GM_OK;
}

static gm_status segments_allocate(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_block **block_out)
{
    segment_engine *engine = arena->engine_state;
    if (engine->release_credit_ns < RELEASE_CREDIT_LIMIT_NS)
        engine->release_credit_ns += RELEASE_CREDIT_NS;
    gm_block *block = gm_size_index_find(gm_heap_index(heap, pool), size);
    if (block) {
        gm_unindex_free_block(arena, block);
    } else {
        uint64_t segment_size = segment_size_for(arena->options, pool, size);
        const gm_stat *reserved = arena->stats->reserved_bytes;
        bool release = arena->options->release_before_growth && engine->release_credit_ns >= 0 &&
                       gm_stat_total(reserved) + (int64_t)segment_size > gm_arena_reserved_peak(arena);
        int64_t spent_before = arena->backend->modelled_ns;
        if (release)
            segments_release_cached(arena, 0);
        gm_status status = new_segment(arena, heap, pool, segment_size, &block);
        if (release)
            engine->release_credit_ns -= arena->backend->modelled_ns - spent_before;
        if (status != GM_OK)
            return status;
    }
    uint64_t rest_size = block->size - size;
    bool split = arena->options->split_blocks &&
                 (pool == GM_POOL_SMALL ? rest_size >= 512 : rest_size > arena->options->small_size);
    if (split) {
        gm_block *rest = gm_split_block(&arena->block_pool, block, size);
        if (rest)
            gm_index_free_block(arena, rest);
    }
    block->state = GM_BLOCK_ALLOCATED;
    *block_out = block;
    return GM_OK;
}

static void segments_free_block(gm_arena *arena, gm_block *block)
{
    block->state = GM_BLOCK_FREE;
    if (block->previous && block->previous->state == GM_BLOCK_FREE) {
        gm_block *previous = block->previous;
        gm_unindex_free_block(arena, previous);
        gm_absorb_next(&arena->block_pool, previous);
        block = previous;
    }
    if (block->next && block->next->state == GM_BLOCK_FREE) {
        gm_unindex_free_block(arena, block->next);
        gm_absorb_next(&arena->block_pool, block);
    }
    gm_index_free_block(arena, block);
}

static gm_status segments_validate(gm_arena *arena, gm_stats *recomputed)
{
    for (size_t h = 0; h < arena->heap_count; h++)
        for (const gm_region *region = gm_first_region(arena->heaps[h]); region; region = gm_next_region(region)) {
            gm_status status = gm_validate_region_blocks(region, recomputed, NULL, NULL);
            if (status != GM_OK)
                return status;
            gm_stat_change(recomputed->reserved_bytes, region->pool, (int64_t)region->size);
            gm_stat_change(recomputed->segment, region->pool, 1);
        }
    return GM_OK;
}

/* A private pool's heap, all of whose blocks are free: its segments go back, then the heap. */
static gm_status segments_forget_heap(gm_arena *arena, gm_heap *heap)
{
    while (heap->regions.first) {
        gm_region *region = gm_first_region(heap);
        if (!region_is_free(region))
            return gm_fail(GM_ERROR_CORRUPT, "a segment of a forgotten heap still has an allocated block");
        gm_status status = release_segment(arena, region);
        if (status != GM_OK)
            return status;
    }
    gm_remove_heap(arena, heap);
    return GM_OK;
}

static gm_status segments_create(gm_arena *arena)
{
    segment_engine *engine = gm_system_calloc(1, sizeof *engine);
    if (!engine)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the segments engine");
    engine->release_credit_ns = RELEASE_CREDIT_INITIAL_NS;
    arena->engine_state = engine;
    return GM_OK;
}

static void segments_destroy(gm_arena *arena)
{
    /* The front end has freed every block; what is left are whole free segments. One the device
     * refuses to free is dropped from the books anyway: the allocator goes. */
    release_free_segments(arena, 0, true);
    for (size_t h = 0; h < arena->heap_count; h++) {
        while (arena->heaps[h]->regions.first) {
            gm_region *region = gm_first_region(arena->heaps[h]);
            gm_delete_region_blocks(arena, region);
            gm_list_remove(&arena->heaps[h]->regions, &region->link);
            free(region);
        }
    }
    free(arena->engine_state);
    arena->engine_state = NULL;
}

const gm_engine_operations gm_segment_engine = {
    .name = "segments",
    .create = segments_create,
    .destroy = segments_destroy,
    .allocate = segments_allocate,
    .free_block = segments_free_block,
    .release_cached = segments_release_cached,
    .validate = segments_validate,
    .forget_heap = segments_forget_heap,
    .idle_bytes = segments_idle_bytes,
};
