/*
 * cache_info.c -- what a library that sizes its own scratch memory may ask: how much the cache holds
 * free, and how large a single allocation can be had right now.
 *
 * cuDNN, through PyTorch's cacheInfo, sizes the workspaces of the convolution plans it will consider
 * by the second answer: a plan whose workspace is larger is left out. PyTorch's own allocator answers
 * with the device's free memory or its largest cached block, whichever is larger, so with
 * torch.backends.cudnn.benchmark on every plan is a candidate. Answering with the largest cached
 * block alone would leave cuDNN only the plans without a workspace whenever the cache is empty (after
 * empty_cache, at the start of a run) and fix that choice for the rest of the process: the faster
 * plans, which trade memory for time, would never be tried. So the answer counts the memory that can
 * still be reserved too -- under the memory limit, within what the device has free, and with the idle
 * cached memory that a growth takes first -- as a request would get it.
 */
#include "core/allocator.h"

#include "base/error.h"

void gm_cache_info_locked(gm_allocator *allocator, uint64_t *free_bytes_out, uint64_t *largest_block_out)
{
    *free_bytes_out = 0;
    *largest_block_out = 0;
    for (size_t h = 0; h < allocator->arena.heap_count; h++) {
        if (!gm_heap_memory_available(allocator->arena.heaps[h], NULL))
            continue; /* a private pool's: not for other allocations */
        for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE; pool++) {
            const gm_size_index *index = gm_heap_index(allocator->arena.heaps[h], pool);
            const gm_block *largest = gm_size_index_largest(index);
            *free_bytes_out += index->bytes;
            if (largest && largest->size > *largest_block_out)
                *largest_block_out = largest->size;
        }
    }
}

gm_status gm_cache_info(gm_allocator *allocator, uint64_t *free_bytes_out, uint64_t *largest_block_out)
{
    if (!allocator || !free_bytes_out || !largest_block_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_cache_info: %s is NULL",
                       !allocator ? "allocator" : !free_bytes_out ? "free_bytes_out" : "largest_block_out");
    gm_lock_acquire(&allocator->lock);
    gm_cache_info_locked(allocator, free_bytes_out, largest_block_out);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

/* What a request can have beyond the free blocks: what can still be reserved with the idle cached
 * memory (wholly free chunks or segments, which a growth moves or gives back first) counted as given
 * back, in whole pages (memory is reserved in pages: a request for the odd rest would not fit). */
static uint64_t room_to_reserve_locked(gm_allocator *allocator)
{
    gm_arena *arena = &allocator->arena;
    uint64_t idle = arena->engine->idle_bytes ? arena->engine->idle_bytes(arena) : 0, room = 0;
    if (gm_room_to_reserve(arena, idle, &room) != GM_OK)
        return 0; /* the device cannot say: count on the cache alone */
    return room;
}

gm_status gm_largest_allocation(gm_allocator *allocator, uint64_t *bytes_out)
{
    if (!allocator || !bytes_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_largest_allocation: %s is NULL", allocator ? "bytes_out" : "allocator");
    uint64_t free_bytes = 0, largest_block = 0;
    gm_lock_acquire(&allocator->lock);
    gm_cache_info_locked(allocator, &free_bytes, &largest_block);
    uint64_t room = room_to_reserve_locked(allocator);
    gm_lock_release(&allocator->lock);
    *bytes_out = room > largest_block ? room : largest_block;
    return GM_OK;
}
