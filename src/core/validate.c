/*
 * validate.c -- gm_validate: every current statistic recomputed from the blocks, the live map and the
 * pending frees, and compared with what the front end and the engine counted as they went; the
 * engine checks its own invariants on the way (engine.validate).
 */
#include "core/allocator.h"
#include "base/blocking.h"

#include "base/error.h"

#include <inttypes.h>
#include <string.h>

static gm_status compare_current(const char *name, const gm_stat recorded[GM_POOL_COUNT],
                                 const gm_stat recomputed[GM_POOL_COUNT])
{
    static const char *const pool_names[GM_POOL_COUNT] = {"all", "small_pool", "large_pool"};
    for (int pool = 0; pool < GM_POOL_COUNT; pool++)
        if (recorded[pool].current != recomputed[pool].current)
            return gm_fail(GM_ERROR_CORRUPT, "%s.%s.current is %" PRId64 " but the heap holds %" PRId64, name,
                           pool_names[pool], recorded[pool].current, recomputed[pool].current);
    return GM_OK;
}

/* Every block in a size index is free, marked indexed, of that heap and pool; the counts agree. */
static gm_status validate_indexes(gm_allocator *allocator)
{
    for (size_t h = 0; h < allocator->arena.heap_count; h++) {
        gm_heap *heap = allocator->arena.heaps[h];
        for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE; pool++) {
            const gm_size_index *index = gm_heap_index(heap, pool);
            uint64_t count = 0, bytes = 0;
            gm_index_cursor cursor;
            for (const gm_block *block = gm_size_index_begin(&cursor, index); block;
                 block = gm_size_index_advance(&cursor)) {
                if (block->state != GM_BLOCK_FREE || !block->indexed || block->heap != heap || block->pool != pool)
                    return gm_fail(GM_ERROR_CORRUPT, "size index holds block 0x%" PRIxPTR " in state %d",
                                   block->address, block->state);
                count++;
                bytes += block->size;
            }
            if (count != index->block_count || bytes != index->bytes)
                return gm_fail(GM_ERROR_CORRUPT, "size index counts %" PRIu64 " blocks but holds %" PRIu64,
                               index->block_count, count);
        }
    }
    return GM_OK;
}

static gm_status validate_locked(gm_allocator *allocator)
{
    gm_stats recomputed;
    memset(&recomputed, 0, sizeof recomputed);
    for (size_t i = 0; i < allocator->live_blocks.capacity; i++) {
        if (!allocator->live_blocks.entries[i].key)
            continue;
        gm_block *block = (gm_block *)(uintptr_t)allocator->live_blocks.entries[i].value;
        if (block->state != GM_BLOCK_ALLOCATED || block->address != allocator->live_blocks.entries[i].key)
            return gm_fail(GM_ERROR_CORRUPT, "live map entry 0x%" PRIx64 " is not an allocated block",
                           allocator->live_blocks.entries[i].key);
        gm_stat_change(recomputed.allocation, block->pool, 1);
        gm_stat_change(recomputed.allocated_bytes, block->pool, (int64_t)block->size);
        gm_stat_change(recomputed.requested_bytes, block->pool, (int64_t)block->requested);
        gm_stat_change(recomputed.active, block->pool, 1);
        gm_stat_change(recomputed.active_bytes, block->pool, (int64_t)block->size);
    }
    for (gm_pending_free *pending = allocator->pending_head; pending; pending = pending->next) {
        gm_block *block = pending->block;
        bool first_for_block = true; /* a block with several events counts once */
        for (gm_pending_free *earlier = allocator->pending_head; earlier != pending; earlier = earlier->next)
            first_for_block = first_for_block && earlier->block != block;
        if (block->state != GM_BLOCK_PENDING)
            return gm_fail(GM_ERROR_CORRUPT, "pending free of block 0x%" PRIxPTR " in state %d", block->address, block->state);
        if (first_for_block) {
            gm_stat_change(recomputed.active, block->pool, 1);
            gm_stat_change(recomputed.active_bytes, block->pool, (int64_t)block->size);
        }
    }
    for (gm_pending_free *held = allocator->held_for_capture; held; held = held->next) {
        gm_block *block = held->block;
        if (block->state != GM_BLOCK_PENDING)
            return gm_fail(GM_ERROR_CORRUPT, "free held for a capture of block 0x%" PRIxPTR " in state %d",
                           block->address, block->state);
        bool also_pending = false; /* a block is held once, and has no event while held */
        for (gm_pending_free *pending = allocator->pending_head; pending; pending = pending->next)
            also_pending = also_pending || pending->block == block;
        if (also_pending)
            return gm_fail(GM_ERROR_CORRUPT, "block 0x%" PRIxPTR " is held for a capture and has events", block->address);
        gm_stat_change(recomputed.active, block->pool, 1);
        gm_stat_change(recomputed.active_bytes, block->pool, (int64_t)block->size);
    }
    gm_status status = validate_indexes(allocator);
    if (status == GM_OK)
        status = allocator->arena.engine->validate(&allocator->arena, &recomputed);
    gm_stats_complete(&recomputed);
    gm_stats recorded_copy;
    gm_arena_read_stats(&allocator->arena, &recorded_copy);
    gm_stat *recorded_array, *recomputed_array;
    for (size_t i = 0; status == GM_OK && (recorded_array = gm_stats_array(&recorded_copy, i)); i++) {
        recomputed_array = gm_stats_array(&recomputed, i);
        status = compare_current(gm_stat_name(i), recorded_array, recomputed_array);
    }
    if (status == GM_OK && allocator->exclusive_device && !allocator->arena.backend->source.allocate) {
        uint64_t free_bytes = 0, total_bytes = 0;
        gm_backend_memory_info(allocator->arena.backend, &free_bytes, &total_bytes);
        uint64_t ours = total_bytes - free_bytes - allocator->arena.backend->used_elsewhere;
        if (ours != (uint64_t)recorded_copy.reserved_bytes[GM_POOL_ALL].current)
            status = gm_fail(GM_ERROR_CORRUPT, "the device holds %" PRIu64 " bytes but reserved_bytes is %" PRId64,
                             ours, recorded_copy.reserved_bytes[GM_POOL_ALL].current);
    }
    return status;
}

gm_status gm_validate(gm_allocator *allocator)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_validate: allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    gm_status status = validate_locked(allocator);
    gm_lock_release(&allocator->lock);
    return status;
}

