/*
 * heap.c -- the heaps of an arena: one per stream, found by the front end for each request, one per
 * stream and private pool (CUDA graphs, MemPools; dropped when the pool is gone), and engine-private
 * ones (the pages engine's growth lanes) added beside them.
 *
 * Every heap is listed in the arena, so whatever walks the arena (statistics, validation,
 * empty_cache, reports) sees every region. Lookup remembers the heap found last: a workload that
 * allocates on one stream finds its heap without a search.
 */
#include "core/arena.h"

#include <stdlib.h>
#include <string.h>

gm_heap *gm_add_heap(gm_arena *arena, gm_stream stream)
{
    gm_heap **heaps = realloc(arena->heaps, (arena->heap_count + 1) * sizeof *heaps);
    if (!heaps)
        return NULL;
    arena->heaps = heaps;
    gm_heap *heap = calloc(1, sizeof *heap);
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

void gm_free_heaps(gm_arena *arena)
{
    for (size_t i = 0; i < arena->heap_count; i++)
        free(arena->heaps[i]);
    free(arena->heaps);
    arena->heaps = NULL;
    arena->heap_count = 0;
    arena->last_heap = NULL;
}
