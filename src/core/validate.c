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

/* Take one event off each pending free's block. The look that puts them back adds one per free, and
 * unsigned arithmetic wraps, so the two cancel exactly whatever the counts were. */
static void take_pending_frees_off_their_blocks(gm_allocator *allocator)
{
    for (const gm_pending_queue *queue = allocator->pending_queues; queue; queue = queue->next)
        for (const gm_pending_free *pending = queue->head; pending; pending = pending->next)
            pending->block->pending_events--;
}

/* The pending frees: each in its stream's queue and of a pending block; each block waits for as many
 * events as it has pending frees, plus one while it is held for a capture (which has none); each
 * block's memory is active, once. Without allocating (gm_validate runs where host memory may have run
 * out) and in one look at each free: the frees' count is taken off their blocks' pending_events, so
 * that a block's count reads 0 in the look that puts them back exactly when they matched, and at its
 * first free then, where its memory is counted. */
static gm_status check_pending_frees(gm_allocator *allocator, gm_stats *recomputed)
{
    size_t keyed = 0;
    for (const gm_pending_queue *queue = allocator->pending_queues; queue; queue = queue->next) {
        uint64_t found = 0, key = (uint64_t)queue->stream + 1;
        if (!queue->head || queue->tail->next ||
            (key && (!gm_hash_map_get(&allocator->queue_of_stream, key, &found) || found != (uintptr_t)queue)))
            return gm_fail(GM_ERROR_CORRUPT, "the pending frees of stream %" PRIu64 " are an empty, unended or unmapped "
                           "queue", (uint64_t)queue->stream);
        keyed += key != 0;
        for (const gm_pending_free *pending = queue->head; pending; pending = pending->next)
            if (pending->block->state != GM_BLOCK_PENDING || pending->stream != queue->stream)
                return gm_fail(GM_ERROR_CORRUPT, "pending free of block 0x%" PRIxPTR " in state %d on stream %" PRIu64
                               " in the queue of stream %" PRIu64, pending->block->address, pending->block->state,
                               (uint64_t)pending->stream, (uint64_t)queue->stream);
    }
    if (keyed != allocator->queue_of_stream.count)
        return gm_fail(GM_ERROR_CORRUPT, "%zu streams map to queues of pending frees, %zu queues exist",
                       allocator->queue_of_stream.count, keyed);
    for (gm_pending_free *held = allocator->held_for_capture; held; held = held->next)
        if (held->block->state != GM_BLOCK_PENDING || held->block->pending_events != 1) /* its hold, no event */
            return gm_fail(GM_ERROR_CORRUPT, "free held for a capture of block 0x%" PRIxPTR " in state %d with %u events",
                           held->block->address, held->block->state, (unsigned)held->block->pending_events);
    take_pending_frees_off_their_blocks(allocator);
    uint64_t unmatched = 0;
    for (const gm_pending_queue *queue = allocator->pending_queues; queue; queue = queue->next)
        for (const gm_pending_free *pending = queue->head; pending; pending = pending->next) {
            gm_block *block = pending->block;
            if (block->pending_events == 0) { /* the block's first free in this look, its count matched */
                gm_stat_change(recomputed->active, block->pool, 1);
                gm_stat_change(recomputed->active_bytes, block->pool, (int64_t)block->size);
            } else if (block->pending_events > UINT32_MAX / 2) { /* fewer events than frees (more: never 0, */
                unmatched = block->address;                     /* so not active, which the stats show) */
            }
            block->pending_events++;
        }
    for (gm_pending_free *held = allocator->held_for_capture; held; held = held->next) {
        gm_stat_change(recomputed->active, held->block->pool, 1);
        gm_stat_change(recomputed->active_bytes, held->block->pool, (int64_t)held->block->size);
    }
    if (unmatched)
        return gm_fail(GM_ERROR_CORRUPT, "block 0x%" PRIx64 " waits for another count of events than its pending frees",
                       unmatched);
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
    gm_status pending_status = check_pending_frees(allocator, &recomputed);
    if (pending_status != GM_OK)
        return pending_status;
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

