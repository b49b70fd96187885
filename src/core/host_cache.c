/*
 * host_cache.c -- the pinned host memory cache: gm_host_malloc, gm_host_free, gm_host_record_stream,
 * gm_host_empty_cache, gm_host_get_stats. A simpler PyTorch CachingHostAllocator.
 *
 * Design
 *   Size classes    a request is rounded up to a power of two, at least 512 bytes; class k holds
 *                   blocks of 2^k bytes. No splitting or merging: a block keeps its size for life.
 *   Free lists      one singly linked list of idle blocks per class; gm_host_malloc takes the head
 *                   (a cache hit) or asks the backend for a new block (a miss): cuMemHostAlloc on
 *                   "cuda", ordinary aligned memory on "sim" and "host".
 *   Streams         a live block remembers the streams recorded for it (gm_host_record_stream: the
 *                   streams whose copies read or write it). gm_host_free records one backend event
 *                   on each that still has work queued and parks the block in the pending list; a
 *                   block whose streams are all idle (or that has none) goes to its free list at once. Every gm_host_malloc and
 *                   gm_host_empty_cache first queries the pending blocks' events, oldest first,
 *                   and moves the blocks whose events are all done to their free lists, so a block
 *                   is reused only once the work queued on its streams before the free has
 *                   finished. A stream runs its work in order: once one of its events is not done,
 *                   the later ones on it are not queried (a look costs a query per busy stream, not
 *                   per waiting block).
 *   Limit           host_limit caps the bytes held (reserved). A miss that would pass it first gives
 *                   the idle blocks back (the pending ones cannot be: copies may still use them), then
 *                   fails with GM_ERROR_OUT_OF_MEMORY and a message with the numbers.
 *   Destroy         gm_destroy waits for every pending event and frees every block, live or idle
 *                   (a pending one whose events cannot be waited for too).
 *   Failures        if an event cannot be made or recorded, gm_host_free returns that error and the
 *                   block stays live (never reused while a copy might use it); the caller may retry.
 *
 * Locking: the allocator's mutex, not one of the cache's own. The backend's call counters and its
 * events are guarded by that mutex (allocator.c calls them under it), and the cache calls the backend
 * for events and memory; a second mutex would need to take the allocator's anyway around those calls.
 * Host-memory calls are rare (misses only), so sharing the lock costs little.
 *
 * The backend's host allocations and frees are counted in gm_host_stats (host_allocations,
 * host_frees), not in GM_DEVICE_CALLS, so that the published region's layout stays as it is.
 *
 * Publishing (publish:true): the calls that change the statistics (gm_host_malloc, gm_host_free,
 * gm_host_empty_cache) run inside the published region's seqlock bracket (gm_lock_for_change) and copy
 * gm_host_stats into the region's pinned host part before closing it, so `gpumem stats PID`, `gpumem
 * top` and the exporter see how much page-locked memory the process holds, exact after each call. The
 * statistics stay here rather than in the region (as gm_stats do) because the copy is a few stores on
 * calls far rarer than gm_malloc, and gm_host_get_stats keeps reading the public struct.
 */
#include "core/allocator.h"
#include "base/blocking.h"

#include "base/array.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

enum { smallest_class = 9 }; /* 512 bytes */

static void stat_change(gm_stat *stat, int64_t delta)
{
    stat->current += delta;
    if (delta > 0)
        stat->allocated += delta;
    else
        stat->freed -= delta;
    if (stat->current > stat->peak)
        stat->peak = stat->current;
}

static int size_class_of(uint64_t size)
{
    int size_class = smallest_class;
    while (((uint64_t)1 << size_class) < size)
        size_class++;
    return size_class;
}

bool gm_host_cache_init(gm_host_cache *cache, uint64_t limit)
{
    memset(cache, 0, sizeof *cache);
    cache->limit = limit;
    cache->stats.limit = limit;
    return gm_hash_map_init(&cache->live_blocks, 64);
}

/* Give a block back to the backend and forget it (lock held; it is in no list). */
static void release_block(gm_host_cache *cache, gm_backend *backend, gm_host_block *block)
{
    gm_backend_host_free(backend, block->pointer, block->size);
    cache->stats.host_frees++;
    stat_change(&cache->stats.reserved_bytes, -(int64_t)block->size);
    free(block->streams);
    free(block->events);
    free(block);
}

static void push_free(gm_host_cache *cache, gm_host_block *block)
{
    int size_class = size_class_of(block->size);
    block->next = cache->free_lists[size_class];
    cache->free_lists[size_class] = block;
}

/* Whether the pending block's newest remaining event is done (with `wait`, after waiting for it). */
static bool last_event_done(gm_allocator *allocator, gm_host_block *block, bool wait, gm_busy_streams *busy)
{
    return gm_event_done_locked(allocator, block->events[block->event_count - 1],
                                block->streams[block->event_count - 1], wait, busy);
}

/* Move pending blocks whose events are all done to their free lists (their events back to the
 * allocator's pool), oldest first; with `wait`, wait for them. */
static void process_pending(gm_allocator *allocator, bool wait)
{
    gm_host_cache *cache = &allocator->host_cache;
    gm_busy_streams busy = {.count = 0};
    gm_host_block **link = &cache->pending, *previous = NULL;
    while (*link) {
        gm_host_block *block = *link;
        while (block->event_count && last_event_done(allocator, block, wait, &busy))
            gm_return_event_locked(allocator, block->events[--block->event_count]);
        if (block->event_count) {
            previous = block;
            link = &block->next;
            continue;
        }
        *link = block->next;
        if (cache->pending_tail == block)
            cache->pending_tail = previous;
        cache->stats.pending_blocks--;
        push_free(cache, block);
    }
}

/* Give every idle block back to the backend (lock held). */
static void release_idle(gm_allocator *allocator)
{
    gm_host_cache *cache = &allocator->host_cache;
    process_pending(allocator, false);
    for (int size_class = 0; size_class < GM_HOST_SIZE_CLASS_COUNT; size_class++) {
        while (cache->free_lists[size_class]) {
            gm_host_block *block = cache->free_lists[size_class];
            cache->free_lists[size_class] = block->next;
            release_block(cache, allocator->arena.backend, block);
        }
    }
}

void gm_host_cache_destroy(gm_allocator *allocator)
{
    gm_host_cache *cache = &allocator->host_cache;
    gm_backend *backend = allocator->arena.backend;
    if (!cache->live_blocks.entries)
        return;
    for (size_t i = 0; i < cache->live_blocks.capacity; i++) {
        if (!cache->live_blocks.entries[i].key)
            continue;
        gm_host_block *block = (gm_host_block *)(uintptr_t)cache->live_blocks.entries[i].value;
        stat_change(&cache->stats.allocated_bytes, -(int64_t)block->size);
        stat_change(&cache->stats.allocations, -1);
        release_block(cache, backend, block);
    }
    process_pending(allocator, true);
    while (cache->pending) { /* events that could not be waited for (a capturing stream, a failing device) */
        gm_host_block *block = cache->pending;
        cache->pending = block->next;
        cache->pending_tail = cache->pending ? cache->pending_tail : NULL;
        while (block->event_count)
            gm_backend_event_destroy(backend, block->events[--block->event_count]);
        cache->stats.pending_blocks--;
        release_block(cache, backend, block);
    }
    release_idle(allocator);
    gm_hash_map_free(&cache->live_blocks);
}

/* ---------------------------------------------------------------- the calls */

/* The end of a call that changed the statistics, locked with gm_lock_for_change: with publish:true the
 * region's readers retry until they are copied in and the bracket closes. */
static void unlock_after_change(gm_allocator *allocator)
{
    if (allocator->publisher)
        gm_publisher_set_pinned_host(allocator->publisher, &allocator->host_cache.stats);
    gm_unlock_after_change(allocator);
}

static gm_status take_block_locked(gm_allocator *allocator, size_t size, void **pointer_out)
{
    gm_host_cache *cache = &allocator->host_cache;
    gm_backend *backend = allocator->arena.backend;
    int size_class = size_class_of(size);
    uint64_t class_size = (uint64_t)1 << size_class;
    process_pending(allocator, false);
    gm_host_block *block = cache->free_lists[size_class];
    if (block) {
        cache->free_lists[size_class] = block->next;
        cache->stats.cache_hits++;
    } else {
        if (cache->limit && (uint64_t)cache->stats.reserved_bytes.current + class_size > cache->limit) {
            release_idle(allocator);
            if ((uint64_t)cache->stats.reserved_bytes.current + class_size > cache->limit)
                return gm_fail(GM_ERROR_OUT_OF_MEMORY,
                               "pinned host memory: %zu bytes (a %llu-byte block) would pass host_limit of %llu "
                               "bytes: %lld bytes are held (%lld handed out, %lld waiting for stream events) "
                               "after giving the idle cache back",
                               size, (unsigned long long)class_size, (unsigned long long)cache->limit,
                               (long long)cache->stats.reserved_bytes.current,
                               (long long)cache->stats.allocated_bytes.current,
                               (long long)(cache->stats.reserved_bytes.current -
                                           cache->stats.allocated_bytes.current));
        }
        block = calloc(1, sizeof *block);
        if (!block)
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a pinned block's record");
        gm_status status = gm_backend_host_allocate(backend, class_size, &block->pointer);
        if (status != GM_OK) {
            free(block);
            return status;
        }
        block->size = class_size;
        cache->stats.cache_misses++;
        cache->stats.host_allocations++;
        stat_change(&cache->stats.reserved_bytes, (int64_t)class_size);
    }
    if (!gm_hash_map_put(&cache->live_blocks, (uint64_t)(uintptr_t)block->pointer, (uint64_t)(uintptr_t)block)) {
        push_free(cache, block);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pinned cache's table");
    }
    block->next = NULL;
    block->requested = size;
    block->stream_count = 0;
    stat_change(&cache->stats.allocated_bytes, (int64_t)class_size);
    stat_change(&cache->stats.allocations, 1);
    cache->stats.requested_bytes += (int64_t)size;
    *pointer_out = block->pointer;
    return GM_OK;
}

gm_status gm_host_malloc(gm_allocator *allocator, size_t size, void **pointer_out)
{
    if (!allocator || !pointer_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_malloc: %s is NULL", allocator ? "pointer_out" : "allocator");
    *pointer_out = NULL;
    if (size == 0)
        return GM_OK;
    if ((uint64_t)size > ((uint64_t)1 << 62))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_malloc: %zu bytes is too large", size);
    gm_lock_for_change(allocator);
    gm_status status = take_block_locked(allocator, size, pointer_out);
    unlock_after_change(allocator); /* a failed call may have given idle blocks back: published too */
    return status;
}

static gm_status find_live_locked(gm_allocator *allocator, const char *call, void *pointer, gm_host_block **block_out)
{
    uint64_t value = 0;
    if (!gm_hash_map_get(&allocator->host_cache.live_blocks, (uint64_t)(uintptr_t)pointer, &value))
        return gm_fail(GM_ERROR_INVALID_POINTER,
                       "%s: %p is not a live pinned host allocation (not from gm_host_malloc, or already freed)",
                       call, pointer);
    *block_out = (gm_host_block *)(uintptr_t)value;
    return GM_OK;
}

/* Record one event on each of the block's streams that still has work queued (lock held). A stream
 * with nothing queued has finished everything queued before this free, so it needs no event: one
 * stream query instead of an event's creation, record, later queries and destruction. On failure
 * nothing stays recorded. */
static gm_status record_events_locked(gm_allocator *allocator, gm_host_block *block)
{
    gm_backend *backend = allocator->arena.backend;
    size_t busy = 0;
    for (size_t i = 0; i < block->stream_count; i++)
        if (gm_backend_stream_is_busy(backend, block->streams[i]))
            block->streams[busy++] = block->streams[i];
    block->stream_count = busy;
    if (!block->stream_count)
        return GM_OK;
    uint64_t *events = realloc(block->events, block->stream_count * sizeof *events);
    if (!events)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "gm_host_free: no host memory for the block's events");
    block->events = events;
    for (size_t i = 0; i < block->stream_count; i++) {
        gm_status status = gm_take_event_locked(allocator, &events[i]);
        if (status == GM_OK) {
            status = gm_backend_event_record(backend, events[i], block->streams[i]);
            if (status != GM_OK)
                gm_backend_event_destroy(backend, events[i]); /* not pooled: it may be unusable */
        }
        if (status != GM_OK) {
            while (i)
                gm_return_event_locked(allocator, events[--i]);
            return status;
        }
    }
    block->event_count = block->stream_count;
    return GM_OK;
}

gm_status gm_host_free(gm_allocator *allocator, void *pointer)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_free: allocator is NULL");
    if (!pointer)
        return GM_OK;
    gm_lock_for_change(allocator);
    gm_host_cache *cache = &allocator->host_cache;
    gm_host_block *block = NULL;
    gm_status status = find_live_locked(allocator, "gm_host_free", pointer, &block);
    if (status == GM_OK)
        status = record_events_locked(allocator, block);
    if (status == GM_OK) {
        gm_hash_map_remove(&cache->live_blocks, (uint64_t)(uintptr_t)pointer, NULL);
        stat_change(&cache->stats.allocated_bytes, -(int64_t)block->size);
        stat_change(&cache->stats.allocations, -1);
        cache->stats.requested_bytes -= (int64_t)block->requested;
        if (block->event_count) {
            block->next = NULL;
            if (cache->pending_tail)
                cache->pending_tail->next = block;
            else
                cache->pending = block;
            cache->pending_tail = block;
            cache->stats.pending_blocks++;
        } else {
            push_free(cache, block);
        }
    }
    unlock_after_change(allocator);
    return status;
}

gm_status gm_host_record_stream(gm_allocator *allocator, void *pointer, gm_stream stream)
{
    if (!allocator || !pointer)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_record_stream: %s is NULL", allocator ? "pointer" : "allocator");
    gm_mutex_lock(&allocator->lock);
    gm_host_block *block = NULL;
    gm_status status = find_live_locked(allocator, "gm_host_record_stream", pointer, &block);
    bool known = false;
    for (size_t i = 0; status == GM_OK && i < block->stream_count; i++)
        known = known || block->streams[i] == stream;
    if (status == GM_OK && !known) {
        gm_stream *grown = gm_array_room_for_one(block->streams, block->stream_count, &block->stream_capacity,
                                                 sizeof *grown, 4);
        if (!grown) {
            status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "gm_host_record_stream: no host memory");
        } else {
            block->streams = grown;
            block->streams[block->stream_count++] = stream;
        }
    }
    pthread_mutex_unlock(&allocator->lock);
    return status;
}

gm_status gm_host_empty_cache(gm_allocator *allocator)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_empty_cache: allocator is NULL");
    gm_lock_for_change(allocator);
    release_idle(allocator);
    unlock_after_change(allocator);
    return GM_OK;
}

gm_status gm_host_get_stats(gm_allocator *allocator, gm_host_stats *stats_out)
{
    if (!allocator || !stats_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_get_stats: %s is NULL", allocator ? "stats_out" : "allocator");
    gm_mutex_lock(&allocator->lock);
    *stats_out = allocator->host_cache.stats;
    pthread_mutex_unlock(&allocator->lock);
    return GM_OK;
}
