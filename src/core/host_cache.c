/*
 * host_cache.c -- the pinned host memory cache: gm_host_malloc, gm_host_free, gm_host_free_with_streams,
 * gm_host_record_stream, gm_host_empty_cache, gm_host_get_stats. A simpler PyTorch CachingHostAllocator.
 *
 * Design
 *   Size classes    a request is rounded up to a power of two, at least 512 bytes; class k holds
 *                   blocks of 2^k bytes. No splitting or merging: a block keeps its size for life.
 *   Free lists      one singly linked list of reusable blocks per class; gm_host_malloc takes the head
 *                   (a cache hit) or asks the backend for a new block (a miss): cuMemHostAlloc on
 *                   "cuda", ordinary aligned memory on "sim" and "host".
 *   Streams         a live block remembers the streams recorded for it (gm_host_record_stream: the
 *                   streams whose copies read or write it). A block freed without streams goes to its
 *                   free list; one whose streams are all the legacy default stream (which the driver
 *                   never destroys and no graph captures) joins the pending list unchecked, and the
 *                   free asks the driver nothing. A look (host_pending.c) asks each stream of the
 *                   pending blocks once: a block whose streams are all idle goes to its free list, one
 *                   with a busy stream gets an event recorded on it and waits for it. A block with any
 *                   other stream, which its owner may destroy once the free returns or capture into a
 *                   graph, is checked at the free the same way, and one freed during a capture of its
 *                   stream is held until gm_destroy. So a block is reused only once the work queued on
 *                   its streams before the free has finished, and never while a graph may copy it.
 *   When to look    gm_host_malloc takes a free block without looking when its class has one. Else it
 *                   looks when a look could give the class a block worth its queries: the class has
 *                   blocks waiting for events, or at least its rotation of unchecked ones; otherwise it
 *                   makes a new block. gm_host_empty_cache, a miss that would pass host_limit and
 *                   gm_destroy always look.
 *   Rotation        K = clamp(64 KiB / class size, 1, 8) unchecked blocks per class: in a loop that
 *                   frees a block per allocation on an idle stream, the class makes K blocks, then one
 *                   look (one query of the stream) makes all K reusable, the next K-1 allocations are
 *                   hits, and so on: a query per K allocations instead of one per free. The rotation
 *                   holds at most K blocks more than the class's live ones, at most 64 KiB: pinned
 *                   memory is locked memory (RLIMIT_MEMLOCK, never swapped), so its bound is in bytes;
 *                   the classes up to 32 KiB (transfer staging, small arrays), where the query is a
 *                   large part of the call, have K >= 2 (448 KiB at most over all of them), and from 64
 *                   KiB on K = 1: a look whenever a freed block of the class is pending, never a block
 *                   more than a look would give. Beyond 8 the query's share of a call is small already.
 *   Limit           host_limit caps the bytes held (reserved). A miss that would pass it first looks
 *                   (a reusable block of its class is then a hit, never a new block), then gives the
 *                   idle blocks back (the pending ones cannot be: copies may still use them), then
 *                   fails with GM_ERROR_OUT_OF_MEMORY and a message with the numbers.
 *   Destroy         gm_destroy looks while waiting for every busy stream's event and frees every
 *                   block, live or idle (a pending one whose events cannot be waited for, and one held
 *                   for a graph, too).
 *   Failures        if an event cannot be made or recorded at a look, the block stays pending
 *                   unchecked (never reused while a copy might use it) and the next look tries again;
 *                   at a free, the free fails and the block stays live (the caller may retry).
 *   Statistics      pending_blocks counts the freed blocks not reusable yet: unchecked ones, those
 *                   waiting for events, and those held for a graph. In a loop on idle streams up to K of a class are pending.
 *
 * Locking: the allocator's mutex, not one of the cache's own. The backend's call counters and its
 * events are guarded by that mutex (allocator.c calls them under it), and the cache calls the backend
 * for events and memory; a second mutex would need to take the allocator's anyway around those calls.
 * Host-memory calls are rare (misses only), so sharing the lock costs little.
 *
 * The backend's host allocations and frees are counted in gm_host_stats (host_allocations,
 * host_frees), not in GM_DEVICE_CALLS, so that the published region's layout stays as it is.
 *
 * Publishing (publish:true): the calls that change the statistics (gm_host_malloc, gm_host_free and
 * gm_host_free_with_streams, gm_host_empty_cache) run inside the published region's seqlock bracket
 * (gm_lock_for_change) and copy gm_host_stats into the region's pinned host part before closing it, so
 * `gpumem stats PID`, `gpumem top` and the exporter see how much page-locked memory the process holds,
 * exact after each call. The statistics stay here rather than in the region (as gm_stats do) because
 * the copy is a few stores on calls far rarer than gm_malloc, and gm_host_get_stats keeps reading the
 * public struct.
 */
#include "core/allocator.h"
#include "base/blocking.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>
#include <string.h>

/* The rotation's bound in bytes and in blocks (the Design's K). */
enum { rotation_bytes = 64 << 10, rotation_most = 8 };

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

/* Give every block of the free lists back to the backend (lock held). */
static void release_free_lists(gm_allocator *allocator)
{
    gm_host_cache *cache = &allocator->host_cache;
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
    gm_host_look_at_pending(allocator, true);
    gm_host_block *block; /* events that could not be made or waited for (a capturing stream, a failing device) */
    while ((block = gm_host_pending_abandon(allocator)))
        release_block(cache, backend, block);
    release_free_lists(allocator);
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

static uint32_t rotation_of(int size_class)
{
    uint64_t blocks = (uint64_t)rotation_bytes >> size_class;
    return blocks < 1 ? 1 : blocks > rotation_most ? rotation_most : (uint32_t)blocks;
}

/* Whether a look could give the class a block worth its queries (the Design's When to look). */
static bool worth_a_look(const gm_host_cache *cache, int size_class)
{
    return cache->waiting[size_class] > 0 || cache->unchecked[size_class] >= rotation_of(size_class);
}

static bool passes_limit(const gm_host_cache *cache, uint64_t class_size)
{
    return cache->limit && (uint64_t)cache->stats.reserved_bytes.current + class_size > cache->limit;
}

/* A reusable block of the class, from its free list, after a look at the pending blocks when the list
 * is empty and a look is worth it or a new block would pass host_limit; NULL if none. */
static gm_host_block *reusable_block(gm_allocator *allocator, int size_class)
{
    gm_host_cache *cache = &allocator->host_cache;
    if (!cache->free_lists[size_class] &&
        (worth_a_look(cache, size_class) || passes_limit(cache, (uint64_t)1 << size_class)))
        gm_host_look_at_pending(allocator, false);
    gm_host_block *block = cache->free_lists[size_class];
    if (block)
        cache->free_lists[size_class] = block->next;
    return block;
}

/* A new block of the class from the backend; past host_limit the idle blocks go back first (the pending
 * ones were just looked at by reusable_block). */
static gm_status new_block(gm_allocator *allocator, size_t size, int size_class, gm_host_block **block_out)
{
    gm_host_cache *cache = &allocator->host_cache;
    uint64_t class_size = (uint64_t)1 << size_class;
    if (passes_limit(cache, class_size)) {
        release_free_lists(allocator);
        if (passes_limit(cache, class_size))
            return gm_fail(GM_ERROR_OUT_OF_MEMORY,
                           "pinned host memory: %zu bytes (a %llu-byte block) would pass host_limit of %llu "
                           "bytes: %lld bytes are held (%lld handed out, %lld waiting for their streams) "
                           "after giving the idle cache back",
                           size, (unsigned long long)class_size, (unsigned long long)cache->limit,
                           (long long)cache->stats.reserved_bytes.current,
                           (long long)cache->stats.allocated_bytes.current,
                           (long long)(cache->stats.reserved_bytes.current - cache->stats.allocated_bytes.current));
    }
    gm_host_block *block = gm_system_calloc(1, sizeof *block);
    if (!block)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a pinned block's record");
    gm_status status = gm_backend_host_allocate(allocator->arena.backend, class_size, &block->pointer);
    if (status != GM_OK) {
        free(block);
        return status;
    }
    block->size = class_size;
    cache->stats.host_allocations++;
    stat_change(&cache->stats.reserved_bytes, (int64_t)class_size);
    *block_out = block;
    return GM_OK;
}

static gm_status take_block_locked(gm_allocator *allocator, size_t size, void **pointer_out)
{
    gm_host_cache *cache = &allocator->host_cache;
    int size_class = gm_host_size_class_of(size);
    gm_host_block *block = reusable_block(allocator, size_class);
    if (block) {
        cache->stats.cache_hits++;
    } else {
        gm_status status = new_block(allocator, size, size_class, &block);
        if (status != GM_OK)
            return status;
        cache->stats.cache_misses++;
    }
    if (!gm_hash_map_put(&cache->live_blocks, (uint64_t)(uintptr_t)block->pointer, (uint64_t)(uintptr_t)block)) {
        gm_host_push_free(cache, block);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pinned cache's table");
    }
    block->next = NULL;
    block->requested = size;
    block->stream_count = 0;
    stat_change(&cache->stats.allocated_bytes, (int64_t)block->size);
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

static bool has_stream(const gm_host_block *block, gm_stream stream)
{
    for (size_t i = 0; i < block->stream_count; i++)
        if (block->streams[i] == stream)
            return true;
    return false;
}

/* Add the streams the block does not have yet (lock held). Room for all of them is made first, so that
 * on failure nothing is added. */
static gm_status add_streams_locked(gm_host_block *block, const char *call, const gm_stream *streams, size_t count)
{
    if (count > SIZE_MAX / (4 * sizeof *block->streams) - block->stream_count)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: %zu streams are more than can be kept", call, count);
    if (block->stream_count + count > block->stream_capacity) {
        size_t capacity = block->stream_capacity ? block->stream_capacity : 4;
        while (capacity < block->stream_count + count)
            capacity *= 2;
        gm_stream *grown = gm_system_realloc(block->streams, capacity * sizeof *grown);
        if (!grown)
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory", call);
        block->streams = grown;
        block->stream_capacity = capacity;
    }
    for (size_t i = 0; i < count; i++)
        if (!has_stream(block, streams[i]))
            block->streams[block->stream_count++] = streams[i];
    return GM_OK;
}

/* The legacy default stream (0, or CU_STREAM_LEGACY): the driver never destroys it, so a look may ask
 * it long after the free, and no graph captures it. The per-thread default stream (CU_STREAM_PER_THREAD,
 * 2) is never destroyed either, but it may be captured. The sim and host backends number their streams
 * alike. */
static bool stream_is_legacy(gm_stream stream)
{
    return stream <= 1;
}

/* Whether the block may join the pending list unchecked: its streams may be asked after the free
 * returns, and none of them can have been captured into a graph (host_pending.c says why). */
static bool streams_may_wait_unchecked(const gm_host_block *block)
{
    for (size_t i = 0; i < block->stream_count; i++)
        if (!stream_is_legacy(block->streams[i]))
            return false;
    return true;
}

/* gm_host_free and gm_host_free_with_streams, lock held: the block leaves the live table, for its free
 * list if it has no streams; else for the pending list, unchecked if its streams are all the legacy
 * default stream, otherwise checked now (host_pending.c). If that check cannot record an event, the call fails
 * and the block stays live, never reused while a copy may use it; the caller may retry. */
static gm_status free_locked(gm_allocator *allocator, const char *call, void *pointer, const gm_stream *streams,
                             size_t count)
{
    gm_host_cache *cache = &allocator->host_cache;
    gm_host_block *block = NULL;
    gm_status status = find_live_locked(allocator, call, pointer, &block);
    if (status == GM_OK && count)
        status = add_streams_locked(block, call, streams, count);
    if (status == GM_OK && block->stream_count && !streams_may_wait_unchecked(block))
        status = gm_host_pending_check_at_free(allocator, block);
    if (status != GM_OK)
        return status;
    gm_hash_map_remove(&cache->live_blocks, (uint64_t)(uintptr_t)pointer, NULL);
    stat_change(&cache->stats.allocated_bytes, -(int64_t)block->size);
    stat_change(&cache->stats.allocations, -1);
    cache->stats.requested_bytes -= (int64_t)block->requested;
    if (block->stream_count)
        gm_host_pending_add(cache, block);
    else
        gm_host_push_free(cache, block);
    return GM_OK;
}

/* gm_host_free and gm_host_free_with_streams, named `call` in their errors. */
static gm_status free_call(const char *call, gm_allocator *allocator, void *pointer, const gm_stream *streams,
                           size_t count)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", call);
    if (count && !streams)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: streams is NULL with a count of %zu", call, count);
    if (!pointer)
        return GM_OK;
    gm_lock_for_change(allocator);
    gm_status status = free_locked(allocator, call, pointer, streams, count);
    unlock_after_change(allocator);
    return status;
}

gm_status gm_host_free(gm_allocator *allocator, void *pointer)
{
    return free_call("gm_host_free", allocator, pointer, NULL, 0);
}

gm_status gm_host_free_with_streams(gm_allocator *allocator, void *pointer, const gm_stream *streams, size_t count)
{
    return free_call("gm_host_free_with_streams", allocator, pointer, streams, count);
}

gm_status gm_host_record_stream(gm_allocator *allocator, void *pointer, gm_stream stream)
{
    if (!allocator || !pointer)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_record_stream: %s is NULL", allocator ? "pointer" : "allocator");
    gm_lock_acquire(&allocator->lock);
    gm_host_block *block = NULL;
    gm_status status = find_live_locked(allocator, "gm_host_record_stream", pointer, &block);
    if (status == GM_OK)
        status = add_streams_locked(block, "gm_host_record_stream", &stream, 1);
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_host_empty_cache(gm_allocator *allocator)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_empty_cache: allocator is NULL");
    gm_lock_for_change(allocator);
    gm_host_look_at_pending(allocator, false);
    release_free_lists(allocator);
    unlock_after_change(allocator);
    return GM_OK;
}

gm_status gm_host_get_stats(gm_allocator *allocator, gm_host_stats *stats_out)
{
    if (!allocator || !stats_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_get_stats: %s is NULL", allocator ? "stats_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    *stats_out = allocator->host_cache.stats;
    gm_lock_release(&allocator->lock);
    return GM_OK;
}
