/*
 * pending_frees.c -- freed blocks that must wait before their memory is reused.
 *
 * A block used on other streams than its own (gm_record_stream) may still be read or written there
 * when it is freed: an event is recorded on each of those streams at the free, and the block's memory
 * returns to the engine only once every event has completed (PyTorch's record_stream semantics).
 * Events are pooled (gm_take_event_locked, gm_return_event_locked; the pinned host cache uses the same
 * pool): creating one is a driver call. The waiting frees are kept in a queue per stream, in the order
 * their events were recorded there, and a stream runs its work in order, so once one event of a stream
 * is not done, the later ones of that stream are not either: each check (at every allocation) looks at
 * the done frees and at most one more per stream with frees waiting, as PyTorch's allocator does, not
 * at every waiting free (a program that frees thousands of blocks used on a busy communication stream
 * would otherwise pay for each of them at every allocation).
 *
 * During a CUDA graph capture (a private pool being allocated to) no event can be waited for: work
 * queued on a capturing stream does not run, it becomes part of the graph. As PyTorch does, such frees
 * wait without an event until no pool is being allocated to any more; then their events are recorded
 * and they continue as above.
 */
#include "core/allocator.h"

#include "base/array.h"
#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>

/* ---------------------------------------------------------------- events */

gm_status gm_take_event_locked(gm_allocator *allocator, uint64_t *event_out)
{
    if (allocator->spare_event_count) {
        *event_out = allocator->spare_events[--allocator->spare_event_count];
        return GM_OK;
    }
    return gm_backend_event_create(allocator->arena.backend, event_out);
}

void gm_return_event_locked(gm_allocator *allocator, uint64_t event)
{
    uint64_t *grown = gm_array_room_for_one(allocator->spare_events, allocator->spare_event_count,
                                            &allocator->spare_event_capacity, sizeof *grown, 16);
    if (!grown) {
        gm_backend_event_destroy(allocator->arena.backend, event);
        return;
    }
    allocator->spare_events = grown;
    allocator->spare_events[allocator->spare_event_count++] = event;
}

/* ---------------------------------------------------------------- freeing */

/* Memory reserved beyond a lowered memory limit goes back to the device as it becomes free. */
__attribute__((noinline, cold)) static void release_over_limit(gm_arena *arena)
{
    arena->engine->release_cached(arena, arena->memory_limit);
    arena->over_limit = (uint64_t)gm_stat_total(arena->stats->reserved_bytes) > arena->memory_limit;
}

/* A block that is neither allocated nor awaited any more: its memory goes back to the engine. */
void gm_retire_block_locked(gm_allocator *allocator, gm_block *block)
{
    gm_arena *arena = &allocator->arena;
    gm_arena_count(arena, &arena->hot_stats.active, arena->stats->active, block->pool, -1);
    gm_arena_count(arena, &arena->hot_stats.active_bytes, arena->stats->active_bytes, block->pool, -(int64_t)block->size);
    gm_block_forget_streams(block);
    gm_history_record(allocator->arena.history, GM_EVENT_FREE_COMPLETED, block->address, block->requested,
                      block->heap->stream, gm_heap_pool_id(block->heap));
    gm_private_pool *pool = block->heap->private_pool; /* the engine may merge the block away */
    gm_heap *home = block->heap->serves ? block->heap->serves : block->heap;
    home->live_blocks--;
    allocator->arena.engine->free_block(&allocator->arena, block);
    if (pool)
        gm_pool_block_retired_locked(allocator, pool);
    if (__builtin_expect(arena->over_limit, 0))
        release_over_limit(arena);
}

/* A list node for a pending or held free: a recycled one, else new (NULL without host memory); and its
 * return to the spares. */
static gm_pending_free *take_node(gm_allocator *allocator)
{
    gm_pending_free *node = allocator->spare_pending;
    if (node)
        allocator->spare_pending = node->next;
    else
        node = gm_system_malloc(sizeof *node);
    return node;
}

static void give_node_back(gm_allocator *allocator, gm_pending_free *node)
{
    node->next = allocator->spare_pending;
    allocator->spare_pending = node;
}

/* A pending free whose event is done: the event goes back to the pool, the node to the spares, and the
 * block is retired once its last event is done. */
static void complete(gm_allocator *allocator, gm_pending_free *pending)
{
    gm_return_event_locked(allocator, pending->event);
    gm_block *block = pending->block;
    give_node_back(allocator, pending);
    if (--block->pending_events == 0)
        gm_retire_block_locked(allocator, block);
}

static bool event_done(gm_allocator *allocator, uint64_t event, bool wait)
{
    gm_backend *backend = allocator->arena.backend;
    if (wait)
        return gm_backend_event_synchronize(backend, event) == GM_OK;
    bool done = false;
    return gm_backend_event_query(backend, event, &done) == GM_OK && done;
}

/* Complete the queue's frees whose events are done, from its oldest: without `wait`, up to the first
 * that is not (the later ones of its stream are not done either); with `wait`, every one whose wait
 * succeeds. */
static void complete_done_frees(gm_allocator *allocator, gm_pending_queue *queue, bool wait)
{
    gm_pending_free **link = &queue->head;
    gm_pending_free *previous = NULL;
    while (*link) {
        gm_pending_free *pending = *link;
        if (!event_done(allocator, pending->event, wait)) {
            if (!wait)
                return;
            previous = pending;
            link = &pending->next;
            continue;
        }
        *link = pending->next;
        if (queue->tail == pending)
            queue->tail = previous;
        complete(allocator, pending);
    }
}

/* A stream's key in queue_of_stream; 0 (not a key) for the one stream it cannot hold. */
static uint64_t key_of(gm_stream stream)
{
    return (uint64_t)stream + 1;
}

/* Unlink the queue that `link` points to (emptied) and keep it for another stream. */
static void recycle_queue(gm_allocator *allocator, gm_pending_queue **link)
{
    gm_pending_queue *queue = *link;
    uint64_t ignored = 0;
    if (key_of(queue->stream))
        gm_hash_map_remove(&allocator->queue_of_stream, key_of(queue->stream), &ignored);
    *link = queue->next;
    queue->next = allocator->spare_queues;
    allocator->spare_queues = queue;
}

/* Complete pending frees whose events are done; with `wait`, wait for all of them first. */
void gm_process_pending_frees_locked(gm_allocator *allocator, bool wait)
{
    gm_pending_queue **link = &allocator->pending_queues;
    while (*link) {
        complete_done_frees(allocator, *link, wait);
        if ((*link)->head)
            link = &(*link)->next;
        else
            recycle_queue(allocator, link);
    }
}

void gm_drop_pending_frees_locked(gm_allocator *allocator)
{
    while (allocator->pending_queues) {
        gm_pending_queue *queue = allocator->pending_queues;
        while (queue->head) {
            gm_pending_free *pending = queue->head;
            queue->head = pending->next;
            complete(allocator, pending);
        }
        queue->tail = NULL;
        recycle_queue(allocator, &allocator->pending_queues);
    }
}

void gm_free_spare_pending_locked(gm_allocator *allocator)
{
    while (allocator->spare_pending) {
        gm_pending_free *next = allocator->spare_pending->next;
        free(allocator->spare_pending);
        allocator->spare_pending = next;
    }
    while (allocator->spare_queues) {
        gm_pending_queue *next = allocator->spare_queues->next;
        free(allocator->spare_queues);
        allocator->spare_queues = next;
    }
    gm_hash_map_free(&allocator->queue_of_stream);
}

void gm_wait_for_pending_frees_locked(gm_allocator *allocator)
{
    if (!allocator->pending_queues)
        return;
    allocator->arena.stats->num_sync_all_streams++;
    gm_process_pending_frees_locked(allocator, true);
}

/* The queue of `stream`'s pending frees, made (empty, first in the list) if it has none; NULL without
 * host memory. Found through queue_of_stream: a program that frees blocks used on thousands of streams
 * at once pays no search. */
static gm_pending_queue *queue_of(gm_allocator *allocator, gm_stream stream)
{
    uint64_t key = key_of(stream), value = 0;
    if (key && gm_hash_map_get(&allocator->queue_of_stream, key, &value))
        return (gm_pending_queue *)(uintptr_t)value;
    for (gm_pending_queue *queue = allocator->pending_queues; !key && queue; queue = queue->next)
        if (queue->stream == stream)
            return queue;
    gm_pending_queue *queue = allocator->spare_queues;
    if (queue)
        allocator->spare_queues = queue->next;
    else if (!(queue = gm_system_malloc(sizeof *queue)))
        return NULL;
    *queue = (gm_pending_queue){.stream = stream};
    if (key && !gm_hash_map_put(&allocator->queue_of_stream, key, (uint64_t)(uintptr_t)queue)) {
        queue->next = allocator->spare_queues; /* back to the spares */
        allocator->spare_queues = queue;
        return NULL;
    }
    queue->next = allocator->pending_queues;
    allocator->pending_queues = queue;
    return queue;
}

gm_status gm_defer_free_locked(gm_allocator *allocator, gm_block *block, gm_stream stream)
{
    gm_pending_free *pending = take_node(allocator);
    gm_pending_queue *queue = pending ? queue_of(allocator, stream) : NULL;
    gm_status status = queue ? gm_take_event_locked(allocator, &pending->event)
                             : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to defer a free");
    if (status == GM_OK && (status = gm_backend_event_record(allocator->arena.backend, pending->event, stream)) != GM_OK)
        gm_return_event_locked(allocator, pending->event); /* the event is as it was: back to the pool, not lost */
    if (status != GM_OK) {
        if (pending)
            give_node_back(allocator, pending);
        if (queue && !queue->head)
            recycle_queue(allocator, &allocator->pending_queues); /* made just now, first in the list */
        return status;
    }
    pending->block = block;
    pending->stream = stream;
    pending->next = NULL;
    if (queue->tail)
        queue->tail->next = pending;
    else
        queue->head = pending;
    queue->tail = pending;
    block->pending_events++;
    return GM_OK;
}

void gm_free_after_recorded_streams_locked(gm_allocator *allocator, gm_block *block)
{
    gm_status deferred = GM_OK;
    for (uint32_t i = 0; i < block->recorded_count && deferred == GM_OK; i++)
        deferred = gm_defer_free_locked(allocator, block, gm_recorded_stream(block, i));
    if (deferred != GM_OK && block->pending_events) {
        /* An event could not be had: wait for every pending free (this block's too) rather than
         * risk reuse while a stream still runs. */
        allocator->arena.stats->num_sync_all_streams++;
        gm_process_pending_frees_locked(allocator, true);
    } else if (deferred != GM_OK) {
        /* Not one event could be had: the whole device is waited for before the memory is reused. A
         * device that can neither record an event nor be waited for has failed (a sticky error runs no
         * more work), so the block is reused all the same: its books stay exact. */
        allocator->arena.stats->num_sync_all_streams++;
        gm_backend_synchronize(allocator->arena.backend);
        gm_retire_block_locked(allocator, block);
    } else if (block->pending_events == 0) {
        gm_retire_block_locked(allocator, block);
    }
}

/* ---------------------------------------------------------------- frees held during capture */

gm_status gm_hold_free_for_capture_locked(gm_allocator *allocator, gm_block *block)
{
    gm_pending_free *node = take_node(allocator);
    if (!node)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to defer a free during a graph capture");
    node->block = block;
    node->event = 0;
    node->next = allocator->held_for_capture;
    allocator->held_for_capture = node;
    block->pending_events++;
    return GM_OK;
}

void gm_release_frees_held_for_capture_locked(gm_allocator *allocator)
{
    while (allocator->held_for_capture) {
        gm_pending_free *node = allocator->held_for_capture;
        allocator->held_for_capture = node->next;
        gm_block *block = node->block;
        give_node_back(allocator, node);
        block->pending_events--;
        gm_free_after_recorded_streams_locked(allocator, block);
    }
}
