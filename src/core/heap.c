/*
 * heap.c -- the heaps of an arena: one per stream, found by the front end for each request, one per
 * stream and private pool (CUDA graphs, MemPools; dropped when the pool is gone), and engine-private
 * ones (the pages engine's growth lanes) added beside them.
 *
 * Streams come and go (a server may make one per request; CuPy and external streams), but nothing
 * says when a stream is gone. So idle stream heaps -- no live block -- are forgotten, least recently
 * used first: when many have piled up, and when an allocation fails (each heap of the pages engine
 * holds a range of addresses twice the device's size, and addresses run out before memory does).
 *
 * Every heap is listed in the arena, so whatever walks the arena (statistics, validation,
 * empty_cache, reports) sees every region. Lookup remembers the heap found last: a workload that
 * allocates on one stream finds its heap without a search.
 */
#include "core/arena.h"
#include "base/system_memory.h"

#include <stdlib.h>
#include <string.h>

gm_heap *gm_add_heap(gm_arena *arena, gm_stream stream)
{
    gm_heap **heaps = gm_system_realloc(arena->heaps, (arena->heap_count + 1) * sizeof *heaps);
    if (!heaps)
        return NULL;
    arena->heaps = heaps;
    gm_heap *heap = gm_system_calloc(1, sizeof *heap);
    if (!heap)
        return NULL;
    heap->stream = stream;
    heaps[arena->heap_count++] = heap;
    return heap;
}

gm_heap *gm_find_heap(gm_arena *arena, gm_stream stream)
{
    for (size_t i = 0; i < arena->heap_count; i++) {
        if (arena->heaps[i]->stream == stream && !arena->heaps[i]->engine_private && !arena->heaps[i]->private_pool) {
            arena->last_heap = arena->heaps[i];
            return arena->last_heap;
        }
    }
    gm_heap *heap = gm_add_heap(arena, stream);
    if (heap)
        arena->last_heap = heap;
    return heap;
}

gm_heap *gm_find_pool_heap(gm_arena *arena, gm_stream stream, gm_private_pool *pool)
{
    for (size_t i = 0; i < arena->heap_count; i++) {
        gm_heap *heap = arena->heaps[i];
        if (heap->stream == stream && heap->private_pool == pool && !heap->engine_private)
            return heap;
    }
    gm_heap *heap = gm_add_heap(arena, stream);
    if (heap)
        heap->private_pool = pool;
    return heap;
}

void gm_remove_heap(gm_arena *arena, gm_heap *heap)
{
    for (size_t i = 0; i < arena->heap_count; i++) {
        if (arena->heaps[i] != heap)
            continue;
        memmove(&arena->heaps[i], &arena->heaps[i + 1], (arena->heap_count - i - 1) * sizeof *arena->heaps);
        arena->heap_count--;
        break;
    }
    if (arena->last_heap == heap)
        arena->last_heap = NULL;
    free(heap);
}

static bool is_idle_stream_heap(const gm_heap *heap, const gm_heap *keep)
{
    return heap != keep && !heap->engine_private && !heap->private_pool && heap->live_blocks == 0;
}

size_t gm_forget_idle_heaps(gm_arena *arena, const gm_heap *keep, size_t idle_kept)
{
    size_t idle = 0, forgotten = 0;
    for (size_t i = 0; i < arena->heap_count; i++)
        idle += is_idle_stream_heap(arena->heaps[i], keep);
    uint64_t failed_before = UINT64_MAX; /* heaps that failed are not tried again in this call */
    while (idle > idle_kept) {
        gm_heap *oldest = NULL;
        for (size_t i = 0; i < arena->heap_count; i++) {
            gm_heap *heap = arena->heaps[i];
            if (is_idle_stream_heap(heap, keep) && heap->last_used < failed_before &&
                (!oldest || heap->last_used < oldest->last_used))
                oldest = heap;
        }
        if (!oldest)
            break;
        uint64_t last_used = oldest->last_used;
        if (arena->engine->forget_heap(arena, oldest) == GM_OK)
            forgotten++;
        else
            failed_before = last_used;
        idle--;
    }
    return forgotten;
}

void gm_free_heaps(gm_arena *arena)
{
    for (size_t i = 0; i < arena->heap_count; i++)
        free(arena->heaps[i]);
    free(arena->heaps);
    arena->heaps = NULL;
    arena->heap_count = 0;
    arena->last_heap = NULL;
}
