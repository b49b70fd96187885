/*
 * private_pool.c -- memory that belongs to one owner: a captured CUDA graph, or a torch.cuda.MemPool.
 *
 * A CUDA graph's replays write to the addresses its capture was given, so those addresses must stay
 * the graph's for as long as it can run: nothing else may be placed there, not even in memory the
 * capture freed again (its replay uses it at that point of the graph). PyTorch calls that a private
 * pool; gpumem gives each pool heaps of its own, one per stream, beside the streams' shared heaps.
 * The engines keep a pool's memory to the pool while it has users (gm_heap_memory_available): its
 * free chunks are not moved to other heaps, empty_cache keeps them; blocks freed inside the pool are
 * reused by its own later allocations, which is what lets a capture run in the memory of one step.
 *
 * Routing: between gm_begin_allocate_to_pool and gm_end_allocate_to_pool, a request on a stream that
 * the pool's filter accepts goes to the pool's heap of that stream (PyTorch passes a filter that
 * accepts the streams of the capture under way, so other threads' work is not captured into it). Of
 * several routes that accept a stream the last begun wins (a MemPool used inside another, a graph
 * captured inside a MemPool's use), as in PyTorch's allocator.
 *
 * Lifetime: users are counted (graphs may share a pool; a MemPool retains it). At no users the pool's
 * free memory is ordinary cache again: other heaps may take it and empty_cache gives it back. Once
 * none of its blocks is live either, the pool is gone: its heaps give their memory and addresses back
 * (engine.forget_heap) and are dropped, so programs that capture many graphs do not pile up heaps.
 * A heap is never dropped while an allocation waits, lock released, for pressure callbacks: then the
 * pool is marked and dropped at the end of that allocation.
 *
 * Lending: a pool marked use_on_oom (torch.cuda.MemPool(use_on_oom=True)) keeps its memory to itself
 * too, except for the last retry of an allocation elsewhere that would fail: then its free memory is
 * anyone's, for that retry only (gm_lend_pools_locked), and what the retry took is no longer the pool's.
 *
 * Checkpoints: torch.compile's cudagraph trees replay graphs without the allocator and, to record a new
 * branch after a replay, put the pool back to the allocations it had after a recording. The pool's
 * allocations can be listed (gm_get_pool_allocations) and a block placed at a given address of the
 * pool's free memory (gm_pool_allocate_at): the free block holding it is cut in three.
 */
#include "core/allocator.h"
#include "base/blocking.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

static bool same_id(gm_pool_id a, gm_pool_id b)
{
    return a.first == b.first && a.second == b.second;
}

static gm_private_pool *find_pool(const gm_allocator *allocator, gm_pool_id id)
{
    for (gm_private_pool *pool = allocator->private_pools; pool; pool = pool->next)
        if (same_id(pool->id, id))
            return pool;
    return NULL;
}

static gm_status no_such_pool(const char *call, gm_pool_id id)
{
    return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: no private pool (%" PRIu64 ", %" PRIu64 ") exists", call, id.first,
                   id.second);
}

/* The pool named `id` with one more user, made if new; NULL without host memory. */
static gm_private_pool *retain(gm_allocator *allocator, gm_pool_id id)
{
    gm_private_pool *pool = find_pool(allocator, id);
    if (!pool) {
        pool = gm_system_calloc(1, sizeof *pool);
        if (!pool)
            return NULL;
        pool->id = id;
        pool->next = allocator->private_pools;
        allocator->private_pools = pool;
    }
    pool->users++;
    return pool;
}

static void unlink_pool(gm_allocator *allocator, gm_private_pool *pool)
{
    for (gm_private_pool **link = &allocator->private_pools; *link; link = &(*link)->next) {
        if (*link == pool) {
            *link = pool->next;
            return;
        }
    }
}

/* Whether requests are still routed to the pool (between gm_begin_allocate_to_pool and its end). */
static bool allocated_to(const gm_allocator *allocator, const gm_private_pool *pool)
{
    for (size_t i = 0; i < allocator->pool_route_count; i++)
        if (allocator->pool_routes[i].pool == pool)
            return true;
    return false;
}

/* Drop the pool if it is gone (no users, no live block, not allocated to: a pool released before its
 * gm_end_allocate_to_pool stays until then) and no allocation holds one of its heaps. */
static void forget_if_gone(gm_allocator *allocator, gm_private_pool *pool)
{
    if (pool->users || pool->live_blocks || allocator->destroying || allocated_to(allocator, pool))
        return;
    if (allocator->unlocked_allocations) {
        allocator->pools_to_forget = true;
        return;
    }
    gm_arena *arena = &allocator->arena;
    for (size_t h = 0; h < arena->heap_count;) {
        gm_heap *heap = arena->heaps[h];
        if (heap->private_pool != pool || heap->engine_private) {
            h++;
            continue;
        }
        if (arena->engine->forget_heap(arena, heap) != GM_OK)
            return; /* a device call failed: the pool stays, to be tried again at the next free */
        h = 0;      /* the list changed */
    }
    unlink_pool(allocator, pool);
    free(pool);
}

void gm_forget_gone_pools_locked(gm_allocator *allocator)
{
    allocator->pools_to_forget = false;
    for (gm_private_pool *pool = allocator->private_pools; pool;) {
        gm_private_pool *next = pool->next;
        forget_if_gone(allocator, pool);
        pool = next;
    }
}

/* The routes searched last begun first ("Routing" above). */
gm_heap *gm_heap_for_request_locked(gm_allocator *allocator, gm_stream stream)
{
    for (size_t i = allocator->pool_route_count; i-- > 0;) {
        const gm_pool_route *route = &allocator->pool_routes[i];
        if (!route->filter || route->filter(stream, route->context))
            return gm_find_pool_heap(&allocator->arena, stream, route->pool);
    }
    return gm_heap_for_stream(&allocator->arena, stream);
}

void gm_pool_block_retired_locked(gm_allocator *allocator, gm_private_pool *pool)
{
    pool->live_blocks--;
    forget_if_gone(allocator, pool);
}

void gm_free_private_pools(gm_allocator *allocator)
{
    while (allocator->private_pools) {
        gm_private_pool *next = allocator->private_pools->next;
        free(allocator->private_pools);
        allocator->private_pools = next;
    }
    free(allocator->pool_routes);
    allocator->pool_routes = NULL;
    allocator->pool_route_count = allocator->pool_route_capacity = 0;
}

/* ---------------------------------------------------------------- the API */

static gm_status check_arguments(const char *call, const gm_allocator *allocator, gm_pool_id id)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", call);
    if (id.first == 0 && id.second == 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: the pool id (0, 0) names no pool", call);
    return GM_OK;
}

static gm_status add_route(gm_allocator *allocator, gm_private_pool *pool, gm_stream_filter filter, void *context)
{
    if (allocator->pool_route_count == allocator->pool_route_capacity) {
        size_t capacity = allocator->pool_route_capacity ? 2 * allocator->pool_route_capacity : 4;
        gm_pool_route *grown = gm_system_realloc(allocator->pool_routes, capacity * sizeof *grown);
        if (!grown)
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to allocate to a private pool");
        allocator->pool_routes = grown;
        allocator->pool_route_capacity = capacity;
    }
    allocator->pool_routes[allocator->pool_route_count++] = (gm_pool_route){pool, filter, context};
    return GM_OK;
}

gm_status gm_begin_allocate_to_pool(gm_allocator *allocator, gm_pool_id id, gm_stream_filter filter, void *context)
{
    gm_status status = check_arguments("gm_begin_allocate_to_pool", allocator, id);
    if (status != GM_OK)
        return status;
    gm_lock_acquire(&allocator->lock);
    gm_private_pool *pool = retain(allocator, id);
    status = pool ? add_route(allocator, pool, filter, context)
                  : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a private pool");
    if (status != GM_OK && pool) {
        pool->users--;
        forget_if_gone(allocator, pool);
    }
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_end_allocate_to_pool(gm_allocator *allocator, gm_pool_id id)
{
    gm_status status = check_arguments("gm_end_allocate_to_pool", allocator, id);
    if (status != GM_OK)
        return status;
    gm_lock_acquire(&allocator->lock);
    size_t i = 0;
    while (i < allocator->pool_route_count && !same_id(allocator->pool_routes[i].pool->id, id))
        i++;
    if (i == allocator->pool_route_count) {
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT,
                         "gm_end_allocate_to_pool: nothing is being allocated to pool (%" PRIu64 ", %" PRIu64 ")",
                         id.first, id.second);
    } else {
        for (; i + 1 < allocator->pool_route_count; i++)
            allocator->pool_routes[i] = allocator->pool_routes[i + 1];
        allocator->pool_route_count--;
        if (!allocator->pool_route_count)
            gm_release_frees_held_for_capture_locked(allocator); /* their events can be recorded now */
        gm_forget_gone_pools_locked(allocator); /* one released before its end may be gone now */
    }
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_retain_pool(gm_allocator *allocator, gm_pool_id id)
{
    gm_status status = check_arguments("gm_retain_pool", allocator, id);
    if (status != GM_OK)
        return status;
    gm_lock_acquire(&allocator->lock);
    if (!retain(allocator, id))
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a private pool");
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_release_pool(gm_allocator *allocator, gm_pool_id id)
{
    gm_status status = check_arguments("gm_release_pool", allocator, id);
    if (status != GM_OK)
        return status;
    gm_lock_acquire(&allocator->lock);
    gm_private_pool *pool = find_pool(allocator, id);
    if (!pool || pool->users == 0) {
        status = no_such_pool("gm_release_pool", id);
    } else {
        pool->users--;
        forget_if_gone(allocator, pool);
    }
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_set_pool_use_on_oom(gm_allocator *allocator, gm_pool_id id, int use_on_oom)
{
    gm_status status = check_arguments("gm_set_pool_use_on_oom", allocator, id);
    if (status != GM_OK)
        return status;
    gm_lock_acquire(&allocator->lock);
    gm_private_pool *pool = find_pool(allocator, id);
    if (!pool)
        status = no_such_pool("gm_set_pool_use_on_oom", id);
    else
        pool->use_on_oom = use_on_oom != 0;
    gm_lock_release(&allocator->lock);
    return status;
}

bool gm_lend_pools_locked(gm_allocator *allocator, bool lend)
{
    bool any = false;
    for (gm_private_pool *pool = allocator->private_pools; pool; pool = pool->next) {
        pool->lending = lend && pool->use_on_oom;
        any = any || pool->use_on_oom;
    }
    return any;
}

gm_status gm_get_pool_info(gm_allocator *allocator, gm_pool_id id, gm_pool_info *info_out)
{
    gm_status status = check_arguments("gm_get_pool_info", allocator, id);
    if (status == GM_OK && !info_out)
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_pool_info: info_out is NULL");
    if (status != GM_OK)
        return status;
    gm_lock_acquire(&allocator->lock);
    gm_private_pool *pool = find_pool(allocator, id);
    if (!pool) {
        status = no_such_pool("gm_get_pool_info", id);
    } else {
        *info_out = (gm_pool_info){.users = pool->users, .live_allocations = pool->live_blocks};
        for (size_t h = 0; h < allocator->arena.heap_count; h++) {
            const gm_heap *heap = allocator->arena.heaps[h];
            for (const gm_region *region = heap->private_pool == pool ? gm_first_region(heap) : NULL; region;
                 region = gm_next_region(region))
                info_out->reserved_bytes += gm_region_reserved_bytes(region);
        }
    }
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_get_pool_allocations(gm_allocator *allocator, gm_pool_id id, gm_pool_allocation *allocations,
                                  size_t capacity, size_t *count_out)
{
    gm_status status = check_arguments("gm_get_pool_allocations", allocator, id);
    if (status == GM_OK && (!count_out || (capacity && !allocations)))
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_pool_allocations: count_out or allocations is NULL");
    if (status != GM_OK)
        return status;
    size_t count = 0;
    gm_lock_acquire(&allocator->lock);
    gm_private_pool *pool = find_pool(allocator, id);
    for (size_t h = 0; pool && h < allocator->arena.heap_count; h++) {
        const gm_heap *heap = allocator->arena.heaps[h];
        for (const gm_region *region = heap->private_pool == pool ? gm_first_region(heap) : NULL; region;
             region = gm_next_region(region))
            for (const gm_block *block = region->first_block; block; block = block->next)
                if (block->state == GM_BLOCK_ALLOCATED && count++ < capacity)
                    allocations[count - 1] = (gm_pool_allocation){block->address, block->size, block->requested};
    }
    gm_lock_release(&allocator->lock);
    *count_out = count;
    return GM_OK;
}

/* The pool's free block (mapped, in a heap of the pool that requests are served from) that holds
 * [address, address + size), or NULL. */
static gm_block *pool_free_block_holding(gm_arena *arena, const gm_private_pool *pool, uint64_t address,
                                         uint64_t size)
{
    for (size_t h = 0; h < arena->heap_count; h++) {
        const gm_heap *heap = arena->heaps[h];
        if (heap->private_pool != pool || heap->engine_private)
            continue;
        for (gm_region *region = gm_first_region(heap); region; region = gm_next_region(region)) {
            if (address < region->base || address - region->base >= region->size)
                continue;
            for (gm_block *block = region->first_block; block; block = block->next)
                if (block->address <= address && address - block->address < block->size)
                    return block->state == GM_BLOCK_FREE && size <= block->address + block->size - address ? block
                                                                                                          : NULL;
        }
    }
    return NULL;
}

/* Cut [address, address + size) out of the free block `block`: the pieces before and after stay free
 * (indexed), the middle is returned, detached. NULL without host memory for the pieces (nothing
 * changed then). */
static gm_block *cut_out(gm_arena *arena, gm_block *block, uint64_t address, uint64_t size)
{
    gm_unindex_free_block(arena, block);
    gm_block *middle = block;
    if (address > block->address && !(middle = gm_split_block(&arena->block_pool, block, address - block->address))) {
        gm_index_free_block(arena, block);
        return NULL;
    }
    if (middle->size > size) {
        gm_block *tail = gm_split_block(&arena->block_pool, middle, size);
        if (!tail) {
            if (middle != block)
                gm_absorb_next(&arena->block_pool, block);
            gm_index_free_block(arena, block);
            return NULL;
        }
        gm_index_free_block(arena, tail);
    }
    if (middle != block)
        gm_index_free_block(arena, block);
    return middle;
}

gm_status gm_pool_allocate_at(gm_allocator *allocator, gm_pool_id id, uint64_t address, uint64_t size,
                              size_t requested)
{
    gm_status status = check_arguments("gm_pool_allocate_at", allocator, id);
    if (status == GM_OK && (size == 0 || size % 512 || requested > size || address % 512))
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_pool_allocate_at: a block of %" PRIu64 " bytes at 0x%" PRIx64
                         " for %zu requested bytes is not a block gpumem makes", size, address, requested);
    if (status != GM_OK)
        return status;
    gm_lock_for_change(allocator);
    gm_arena *arena = &allocator->arena;
    gm_private_pool *pool = find_pool(allocator, id);
    gm_block *block = pool ? pool_free_block_holding(arena, pool, address, size) : NULL;
    if (!pool)
        status = no_such_pool("gm_pool_allocate_at", id);
    else if (!block)
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_pool_allocate_at: [0x%" PRIx64 ", +%" PRIu64 ") is not free "
                         "memory of pool (%" PRIu64 ", %" PRIu64 ")", address, size, id.first, id.second);
    else if (!(block = cut_out(arena, block, address, size)))
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    else if (!gm_hash_map_put(&allocator->live_blocks, block->address, (uint64_t)(uintptr_t)block)) {
        arena->engine->free_block(arena, block);
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to record the allocation");
    } else {
        gm_heap *heap = block->region->heap;
        block->heap = heap;
        block->state = GM_BLOCK_ALLOCATED;
        gm_count_new_allocation_locked(allocator, heap, block, requested, heap->stream);
    }
    gm_unlock_after_change(allocator);
    return status;
}
