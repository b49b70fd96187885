/*
 * heap.c -- the heaps of an arena: one per stream, found by the front end for each request, and
 * engine-private ones (the pages engine's growth lanes) added beside them.
 *
 * Every heap is listed in the arena, so whatever walks the arena (statistics, validation,
 * empty_cache, reports) sees every region. Lookup remembers the heap found last: a workload that
 * allocates on one stream finds its heap without a search.
 */
#include "core/arena.h"

#include <stdlib.h>

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
        if (arena->heaps[i]->stream == stream && !arena->heaps[i]->engine_private) {
            arena->last_heap = arena->heaps[i];
            return arena->last_heap;
        }
    }
    gm_heap *heap = gm_add_heap(arena, stream);
    if (heap)
        arena->last_heap = heap;
    return heap;
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
