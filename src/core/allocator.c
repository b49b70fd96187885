/*
 * allocator.c -- the front end: the public calls, their locking, and what every engine shares.
 *
 * A request flows: gm_malloc validates and rounds the size (to 512 bytes, as PyTorch), picks the
 * pool (small up to options.small_size) and the stream's heap, completes any frees whose stream
 * events are done, and asks the engine for a block. If the engine finds no room it retries twice:
 * after waiting for the pending cross-stream frees, then after releasing all cached memory
 * (counted in num_alloc_retries); if it still fails and pressure callbacks are registered, they are
 * called (level critical, the lock released) and the allocation retried once more; if it still fails
 * the call returns GM_ERROR_OUT_OF_MEMORY with a report that names the cause (oom_report.c). The
 * block's address goes into the live map, which is how gm_free finds size, stream and pool without
 * the caller passing them.
 *
 * With a pressure policy watching reserved or allocated bytes (pressure.c), the calls that change them
 * compare those with the watched bounds (pressure_crossed), and when one is crossed end in
 * finish_under_pressure: the level's evaluation, its ladder, and the callbacks once the lock is
 * released. Without a policy the calls pay a single branch on `pressure.watching`.
 *
 * gm_free of a block used on other streams (gm_record_stream) records one event per such stream
 * and parks the block in the pending list; it becomes free memory when all its events complete.
 *
 * With publish:true the statistics live in a shared-memory region that other processes read
 * (monitor/publish.c), made by gm_create and removed by gm_destroy; every call that changes them does
 * so between begin_change and end_change, the region's seqlock.
 *
 * One mutex guards everything (pressure.c adds its own, never held with it across a callback); no call
 * but gm_create and gm_destroy does I/O, except an out-of-memory report (it reads /proc/meminfo), and the
 * steady state allocates no host memory.
 */
#include "core/arena.h"
#include "base/blocking.h"

#include "base/error.h"
#include "base/hash_map.h"
#include "core/allocator.h"
#include "core/oom_report.h"
#include "monitor/publish.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GM_MAX_REQUEST (1ull << 60)
#define GM_UNLIKELY(condition) __builtin_expect(!!(condition), 0)
#define GM_PUBLISH_ALL_EVERY 256 /* calls between publications of the device-call counts without a memory call */
/* Idle stream heaps are forgotten, least recently used first, once there are more heaps than this
 * (lanes and private pools' included), down to IDLE_HEAPS_KEPT idle ones: in batches, so that a
 * program cycling through many streams does not pay device calls on every request. */
#define HEAPS_BEFORE_FORGETTING 128
#define IDLE_HEAPS_KEPT 64

/* ---------------------------------------------------------------- publishing (monitor/publish.c) */

static void add_device_calls(const gm_backend *backend, gm_stats *stats)
{
    memcpy(stats->device_calls, backend->calls, sizeof stats->device_calls);
    stats->device_call_ns = backend->call_ns;
    memcpy(stats->device_call_ns_by_kind, backend->call_ns_by_kind, sizeof stats->device_call_ns_by_kind);
}

/* The device-call counts, and the cache's shape (a walk of the size indexes, too slow for every call). */
static void publish_device_calls(gm_allocator *allocator)
{
    add_device_calls(allocator->arena.backend, allocator->arena.stats);
    uint64_t free_bytes, largest_block;
    gm_cache_info_locked(allocator, &free_bytes, &largest_block);
    gm_publisher_set_cache(allocator->publisher, free_bytes, largest_block);
    allocator->published_memory_calls = allocator->arena.backend->memory_calls;
    allocator->publish_countdown = GM_PUBLISH_ALL_EVERY;
}

/* Before a call changes the statistics: with publish:true they are the region's, and its readers
 * retry until end_change. */
static inline void begin_change(gm_allocator *allocator)
{
    if (allocator->published)
        gm_publish_begin(allocator->published);
}

/* After: the device-call counts go in too when a call reserved, made, mapped or freed memory, and every
 * GM_PUBLISH_ALL_EVERY calls for the rest: the event calls of cross-stream frees are frequent and cheap,
 * and publishing (a copy of the counts and a walk of every heap's size indexes) would cost such a call
 * more than the event does. */
static inline void end_change(gm_allocator *allocator)
{
    if (!allocator->published)
        return;
    if (allocator->arena.backend->memory_calls != allocator->published_memory_calls ||
        --allocator->publish_countdown == 0)
        publish_device_calls(allocator);
    gm_publish_end(allocator->published);
}

void gm_lock_for_change(gm_allocator *allocator)
{
    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
}

void gm_unlock_after_change(gm_allocator *allocator)
{
    end_change(allocator);
    gm_lock_release(&allocator->lock);
}

/* Whether a call that changed the byte readings crossed a bound that a pressure policy watches (lock held):
 * without a policy, one branch. */
static inline bool pressure_crossed(const gm_allocator *allocator)
{
    return GM_UNLIKELY(allocator->pressure.watching) && gm_pressure_crossed(&allocator->pressure, &allocator->arena);
}

/* The end of such a call (lock held, statistics open): evaluate the level (a rise runs the ladder), then
 * release the lock and tell the callbacks. */
__attribute__((noinline, cold)) static gm_status finish_under_pressure(gm_allocator *allocator, gm_status status)
{
    gm_pressure_readings event;
    bool changed = gm_pressure_evaluate_locked(allocator, &event);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    if (changed)
        gm_pressure_dispatch(allocator, &event);
    return status;
}

static void start_publishing(gm_allocator *allocator)
{
    if (!allocator->options.publish) {
        allocator->publish_status = GM_ERROR_NOT_SUPPORTED;
        snprintf(allocator->publish_error, sizeof allocator->publish_error,
                 "statistics are not published (the allocator was created without publish:true)");
        return;
    }
    gm_backend *backend = allocator->arena.backend;
    gm_publish_identity identity = {.device = allocator->options.device, .backend = backend->operations->name,
                                    .engine = allocator->arena.engine->name, .page_size = backend->page_size,
                                    .device_total_bytes = backend->total_bytes};
    add_device_calls(backend, allocator->arena.stats);
    gm_hot_stats_write(&allocator->arena.hot_stats, allocator->arena.stats);
    allocator->publish_status = gm_publisher_open(&identity, allocator->arena.stats, &allocator->host_cache.stats,
                                                  &allocator->publisher);
    if (allocator->publish_status != GM_OK) {
        snprintf(allocator->publish_error, sizeof allocator->publish_error, "%s", gm_last_error());
        return;
    }
    allocator->arena.stats = gm_publisher_stats(allocator->publisher); /* from now on kept there */
    allocator->arena.stats_published = true; /* the hot ones too (they were just written there) */
    allocator->published = gm_publisher_seqlock(allocator->publisher);
    allocator->published_memory_calls = backend->memory_calls;
    allocator->publish_countdown = GM_PUBLISH_ALL_EVERY;
}

/* Back to the allocator's own statistics, and the region removed. */
static void stop_publishing(gm_allocator *allocator)
{
    if (!allocator->publisher)
        return;
    allocator->own_stats = *allocator->arena.stats;
    allocator->arena.stats = &allocator->own_stats;
    allocator->published = NULL;
    gm_publisher_close(allocator->publisher);
    allocator->publisher = NULL;
}

gm_status gm_publish_status(gm_allocator *allocator, char *path_out, size_t path_size)
{
    if (!allocator || (!path_out && path_size))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_publish_status: %s",
                       allocator ? "path_out is NULL but path_size is not 0" : "allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    gm_status status = allocator->publish_status;
    if (status != GM_OK)
        gm_fail(status, "%s", allocator->publish_error);
    else if (path_size <= strlen(gm_publisher_path(allocator->publisher)))
        status = gm_fail(GM_ERROR_BUFFER_TOO_SMALL, "gm_publish_status: the path needs %zu bytes",
                         strlen(gm_publisher_path(allocator->publisher)) + 1);
    else
        snprintf(path_out, path_size, "%s", gm_publisher_path(allocator->publisher));
    gm_lock_release(&allocator->lock);
    return status;
}

/* ---------------------------------------------------------------- creation */

/* The backend the allocator's options name, its memory limit and the engine that suits it. */
static gm_status open_device(gm_allocator *allocator, const gm_segment_source *source)
{
    const gm_options *options = &allocator->options;
    gm_backend_config backend_config = gm_backend_config_of(options);
    gm_status status = gm_backend_open(&backend_config, &allocator->arena.backend);
    if (status != GM_OK)
        return status;
    gm_backend *backend = allocator->arena.backend;
    allocator->exclusive_device = backend->operations->stream_enqueue != NULL;
    allocator->arena.memory_limit = backend->total_bytes;
    if (options->memory_limit && options->memory_limit < allocator->arena.memory_limit)
        allocator->arena.memory_limit = options->memory_limit;
    allocator->arena.engine = options->engine == GM_ENGINE_PAGES ? &gm_page_engine : &gm_segment_engine;
    if (allocator->arena.engine == &gm_page_engine && !backend->supports_virtual_memory)
        allocator->arena.engine = &gm_segment_engine;
    if (source) { /* the source's memory comes in segments: nothing to map */
        backend->source = *source;
        allocator->arena.engine = &gm_segment_engine;
        allocator->options.engine = GM_ENGINE_SEGMENTS;
    }
    allocator->arena.stats->device_total_bytes = backend->total_bytes;
    allocator->arena.stats->page_size = backend->page_size;
    return GM_OK;
}

static gm_status create_with_options(const gm_options *options, const gm_segment_source *source,
                                     gm_allocator **allocator_out)
{
    /* Aligned as the struct asks (its hot fields a cache line each): calloc promises less. */
    gm_allocator *allocator = aligned_alloc(_Alignof(gm_allocator), sizeof *allocator);
    if (!allocator)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the allocator");
    memset(allocator, 0, sizeof *allocator);
    allocator->options = *options;
    allocator->arena.stats = &allocator->own_stats;
    allocator->arena.options = &allocator->options;
    gm_status status = open_device(allocator, source);
    if (status != GM_OK) {
        free(allocator);
        return status;
    }
    if (!gm_hash_map_init(&allocator->live_blocks, 1024)) {
        gm_backend_close(allocator->arena.backend);
        free(allocator);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the allocator");
    }
    gm_pressure_init(&allocator->pressure);
    if (!gm_host_cache_init(&allocator->host_cache, options->host_limit)) {
        gm_destroy(allocator, NULL);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the pinned host cache");
    }
    if (options->history && !(allocator->arena.history = gm_history_create((size_t)options->history))) {
        gm_destroy(allocator, NULL);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a history of %d events", options->history);
    }
    status = allocator->arena.engine->create(&allocator->arena);
    if (status != GM_OK) {
        gm_destroy(allocator, NULL);
        return status;
    }
    start_publishing(allocator);
    if (options->pressure_high > 0) {
        gm_pressure_policy policy = {.high = options->pressure_high, .low = gm_options_pressure_low(options),
                                     .signals = options->pressure_signals,
                                     .interval_ms = (uint32_t)options->pressure_interval_ms,
                                     .psi_high = options->pressure_psi_high, .psi_low = options->pressure_psi_low};
        gm_set_pressure_policy(allocator, &policy); /* the options were checked: it cannot fail */
    }
    *allocator_out = allocator;
    return GM_OK;
}

/* The defaults, then `config`'s keys. */
static gm_status create_from_config(const char *config, const gm_segment_source *source, gm_allocator **allocator_out)
{
    gm_options options;
    gm_options_default(&options);
    gm_status status = gm_options_parse(&options, config);
    if (status != GM_OK)
        return status;
    return create_with_options(&options, source, allocator_out);
}

gm_status gm_create(const char *config, gm_allocator **allocator_out)
{
    if (!allocator_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_create: allocator_out is NULL");
    return create_from_config(config, NULL, allocator_out);
}

gm_status gm_create_with_source(const char *config, const gm_segment_source *source, gm_allocator **allocator_out)
{
    if (!allocator_out || !source || !source->allocate || !source->free)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_create_with_source: %s",
                       !allocator_out ? "allocator_out is NULL" : "the source needs an allocate and a free function");
    return create_from_config(config, source, allocator_out);
}

/* GPUMEM_CONF, then `overrides` on top: the keys gm_create_from_environment applies. */
static gm_status parse_environment(const char *overrides, gm_options *options)
{
    gm_options_default(options);
    gm_status status = gm_options_parse(options, getenv("GPUMEM_CONF"));
    if (status != GM_OK) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", gm_last_error());
        return gm_fail(status, "GPUMEM_CONF: %s", reason);
    }
    return gm_options_parse(options, overrides);
}

gm_status gm_create_from_environment(const char *overrides, gm_allocator **allocator_out)
{
    if (!allocator_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_create_from_environment: allocator_out is NULL");
    gm_options options;
    gm_status status = parse_environment(overrides, &options);
    if (status != GM_OK)
        return status;
    return create_with_options(&options, NULL, allocator_out);
}

gm_status gm_check_configuration(const char *overrides)
{
    gm_options options;
    return parse_environment(overrides, &options);
}

/* ---------------------------------------------------------------- malloc */

/* The engine found no room: wait for the pending cross-stream frees and retry, then release all cached
 * memory and retry. */
static gm_status retry_allocation(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size,
                                  gm_block **block_out, gm_oom_attempts *attempts)
{
    const gm_engine_operations *engine = allocator->arena.engine;
    gm_status status;
    if (allocator->pending_queues) {
        attempts->waited_for_streams = true;
        gm_wait_for_pending_frees_locked(allocator);
        status = engine->allocate(&allocator->arena, heap, pool, size, block_out);
        if (status != GM_ERROR_OUT_OF_MEMORY)
            return status;
    }
    int64_t reserved_before = gm_stat_total(allocator->arena.stats->reserved_bytes);
    engine->release_cached(&allocator->arena, 0);
    if (!allocator->unlocked_allocations) /* addresses too: other streams' idle heaps go */
        gm_forget_idle_heaps(&allocator->arena, heap, 0);
    attempts->released_bytes += (uint64_t)(reserved_before - gm_stat_total(allocator->arena.stats->reserved_bytes));
    attempts->retried = true;
    allocator->arena.stats->num_alloc_retries++;
    status = engine->allocate(&allocator->arena, heap, pool, size, block_out);
    if (status == GM_ERROR_OUT_OF_MEMORY && gm_lend_pools_locked(allocator, true)) {
        engine->release_cached(&allocator->arena, 0); /* the lending pools' free memory goes too */
        status = engine->allocate(&allocator->arena, heap, pool, size, block_out);
        gm_lend_pools_locked(allocator, false);
    }
    return status;
}

/* After the retries: the pressure callbacks (level critical) with the lock released, one more round of
 * retries, and if that fails too, the report. The heap stays valid: heaps live as long as the allocator. */
__attribute__((noinline, cold)) static gm_status allocate_after_failure(gm_allocator *allocator, gm_heap *heap,
                                                                       int pool, uint64_t size, gm_block **block_out)
{
    gm_oom_attempts attempts = {.host_root = allocator->pressure.policy_set ? allocator->pressure.root : NULL};
    allocator->arena.backend->address_space_failed = false; /* said only when the retries run out of it */
    gm_status status = retry_allocation(allocator, heap, pool, size, block_out, &attempts);
    gm_pressure_readings event;
    if (status == GM_ERROR_OUT_OF_MEMORY &&
        gm_pressure_begin_critical_locked(allocator, size, heap->stream, attempts.released_bytes, &event)) {
        allocator->unlocked_allocations++; /* keeps `heap` (a private pool's, perhaps) from being dropped */
        end_change(allocator);
        gm_lock_release(&allocator->lock);
        attempts.callbacks_called = gm_pressure_dispatch(allocator, &event);
        gm_lock_acquire(&allocator->lock);
        begin_change(allocator);
        allocator->unlocked_allocations--;
        gm_pressure_end_critical_locked(allocator);
        attempts.called_callbacks = true;
        status = allocator->arena.engine->allocate(&allocator->arena, heap, pool, size, block_out);
        if (status == GM_ERROR_OUT_OF_MEMORY)
            status = retry_allocation(allocator, heap, pool, size, block_out, &attempts);
    }
    if (status == GM_ERROR_OUT_OF_MEMORY) {
        allocator->arena.stats->num_ooms++;
        uint64_t device_free = gm_write_oom_report(&allocator->arena, heap, size, &attempts);
        gm_history_record(allocator->arena.history, GM_EVENT_OOM, device_free, size, heap->stream,
                          gm_heap_pool_id(heap));
    }
    return status;
}

static gm_status allocate_with_retries(gm_allocator *allocator, gm_heap *heap, int pool, uint64_t size,
                                       gm_block **block_out)
{
    gm_status status = allocator->arena.engine->allocate(&allocator->arena, heap, pool, size, block_out);
    if (status != GM_ERROR_OUT_OF_MEMORY)
        return status;
    return allocate_after_failure(allocator, heap, pool, size, block_out);
}

/* Inlined at both calls, so that the sign is a constant and the statistics' branches on it fold. */
static inline __attribute__((always_inline)) void count_allocation(gm_allocator *allocator, gm_block *block,
                                                                   int64_t sign)
{
    int pool = block->pool;
    gm_arena *arena = &allocator->arena;
    gm_arena_count(arena, &arena->hot_stats.allocation, arena->stats->allocation, pool, sign);
    gm_arena_count(arena, &arena->hot_stats.allocated_bytes, arena->stats->allocated_bytes, pool,
                   sign * (int64_t)block->size);
    gm_arena_count(arena, &arena->hot_stats.requested_bytes, arena->stats->requested_bytes, pool,
                   sign * (int64_t)block->requested);
}

/* Inlined into gm_malloc, whose code it then shares: a call less, and fewer lines of code to fetch. */
static inline __attribute__((always_inline)) void count_new_allocation(gm_allocator *allocator, gm_heap *heap,
                                                                       gm_block *block, size_t requested,
                                                                       gm_stream stream)
{
    block->requested = requested;
    count_allocation(allocator, block, 1);
    gm_arena *arena = &allocator->arena;
    gm_arena_count(arena, &arena->hot_stats.active, arena->stats->active, block->pool, 1);
    gm_arena_count(arena, &arena->hot_stats.active_bytes, arena->stats->active_bytes, block->pool, (int64_t)block->size);
    gm_history_record(allocator->arena.history, GM_EVENT_ALLOC, block->address, requested, stream,
                      gm_heap_pool_id(block->heap));
    heap->live_blocks++;
    heap->last_used = ++allocator->arena.clock;
    if (heap->private_pool)
        heap->private_pool->live_blocks++;
}

void gm_count_new_allocation_locked(gm_allocator *allocator, gm_heap *heap, gm_block *block, size_t requested,
                                    gm_stream stream)
{
    count_new_allocation(allocator, heap, block, requested, stream);
}

/* A request above GM_MAX_REQUEST fits no device: it is refused as out of memory (what PyTorch reports for
 * it too) with its real size, before any engine rounds it or the cache is released for nothing. */
__attribute__((noinline, cold)) static gm_status refuse_impossible_request(gm_allocator *allocator, uint64_t size,
                                                                          gm_stream stream)
{
    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
    allocator->arena.stats->num_ooms++;
    uint64_t device_free = gm_write_impossible_request_report(&allocator->arena, stream, size, GM_MAX_REQUEST);
    gm_history_record(allocator->arena.history, GM_EVENT_OOM, device_free, size, stream, GM_NO_POOL);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return GM_ERROR_OUT_OF_MEMORY;
}

/* gm_malloc and gm_malloc_on_borrowed_stream, `borrowed` a constant in each. */
static inline __attribute__((always_inline)) gm_status malloc_on(gm_allocator *allocator, size_t size,
                                                                  gm_stream stream, bool borrowed, void **pointer_out)
{
    if (!allocator || !pointer_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", borrowed ? "gm_malloc_on_borrowed_stream" : "gm_malloc",
                       allocator ? "pointer_out" : "allocator");
    *pointer_out = NULL;
    if (size == 0)
        return GM_OK;
    if (GM_UNLIKELY(size > GM_MAX_REQUEST))
        return refuse_impossible_request(allocator, size, stream);
    uint64_t rounded = gm_round_up(size, 512);
    int pool = rounded <= allocator->options.small_size ? GM_POOL_SMALL : GM_POOL_LARGE;

    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
    if (allocator->pending_queues)
        gm_process_pending_frees_locked(allocator, false);
    gm_heap *heap = allocator->pool_route_count ? gm_heap_for_request_locked(allocator, stream)
                                                : gm_heap_for_stream(&allocator->arena, stream);
    if (allocator->arena.heap_count > HEAPS_BEFORE_FORGETTING && heap && !allocator->unlocked_allocations)
        gm_forget_idle_heaps(&allocator->arena, heap, IDLE_HEAPS_KEPT);
    if (borrowed && heap)
        heap->borrowed = true; /* for as long as the heap is kept */
    gm_block *block = NULL;
    gm_status status = heap ? allocate_with_retries(allocator, heap, pool, rounded, &block)
                            : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a stream heap");
    if (status == GM_OK && !gm_hash_map_put(&allocator->live_blocks, block->address, (uint64_t)(uintptr_t)block)) {
        allocator->arena.engine->free_block(&allocator->arena, block);
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to record the allocation");
    }
    if (status == GM_OK) {
        count_new_allocation(allocator, heap, block, size, stream);
        *pointer_out = (void *)block->address;
    }
    if (allocator->pools_to_forget && !allocator->unlocked_allocations)
        gm_forget_gone_pools_locked(allocator);
    if (pressure_crossed(allocator))
        return finish_under_pressure(allocator, status);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_malloc(gm_allocator *allocator, size_t size, gm_stream stream, void **pointer_out)
{
    return malloc_on(allocator, size, stream, false, pointer_out);
}

gm_status gm_malloc_on_borrowed_stream(gm_allocator *allocator, size_t size, gm_stream stream, void **pointer_out)
{
    return malloc_on(allocator, size, stream, true, pointer_out);
}

/* ---------------------------------------------------------------- free and record_stream */

static gm_block *find_live_block(gm_allocator *allocator, const void *pointer)
{
    uint64_t value = 0;
    if (!gm_hash_map_get(&allocator->live_blocks, (uint64_t)(uintptr_t)pointer, &value))
        return NULL;
    return (gm_block *)(uintptr_t)value;
}

static gm_status not_live(const char *call, const void *pointer)
{
    return gm_fail(GM_ERROR_INVALID_POINTER, "%s: %p is not a live allocation of this allocator (never returned "
                   "by gm_malloc, or already freed)", call, pointer);
}

/* The start of every free that goes ahead (lock held, the block out of the live map): the statistics
 * opened and counted, the block pending, the request in the history. */
static inline void begin_free(gm_allocator *allocator, gm_block *block)
{
    begin_change(allocator);
    count_allocation(allocator, block, -1);
    block->state = GM_BLOCK_PENDING;
    gm_history_record(allocator->arena.history, GM_EVENT_FREE_REQUESTED, block->address, block->requested,
                      block->heap->stream, gm_heap_pool_id(block->heap));
}

/* The end of every free: the pressure watch, the statistics published, the lock released. */
static inline gm_status finish_free(gm_allocator *allocator)
{
    if (pressure_crossed(allocator))
        return finish_under_pressure(allocator, GM_OK);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

/* The free of a block that record_stream gave other streams (lock held, the block out of the live map):
 * its memory waits for their events, or, while a graph is captured, for the capture's end. Out of
 * gm_free's line, so that the common free's code stays a few cache lines. */
__attribute__((noinline)) static gm_status free_used_elsewhere(gm_allocator *allocator, gm_block *block, uint64_t key)
{
    /* While a graph is captured no event can be waited for: the block waits for the capture to end
     * before its events are recorded (pending_frees.c). */
    bool held = allocator->pool_route_count != 0;
    if (held && gm_hold_free_for_capture_locked(allocator, block) != GM_OK) {
        /* Nothing changed: the block goes back into the map, which just lost it, so the put needs no
         * room and cannot fail. */
        gm_hash_map_put(&allocator->live_blocks, key, (uint64_t)(uintptr_t)block);
        gm_lock_release(&allocator->lock);
        return GM_ERROR_OUT_OF_MEMORY;
    }
    begin_free(allocator, block);
    if (held) /* counted as pending; released by gm_end_allocate_to_pool */
        return finish_free(allocator);
    gm_free_after_recorded_streams_locked(allocator, block);
    return finish_free(allocator);
}

gm_status gm_free(gm_allocator *allocator, void *pointer)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_free: allocator is NULL");
    if (!pointer)
        return GM_OK;
    gm_lock_acquire(&allocator->lock);
    uint64_t key = (uint64_t)(uintptr_t)pointer, value = 0;
    if (!gm_hash_map_remove(&allocator->live_blocks, key, &value)) { /* one probe finds and removes */
        gm_lock_release(&allocator->lock);
        return not_live("gm_free", pointer);
    }
    gm_block *block = (gm_block *)(uintptr_t)value;
    if (GM_UNLIKELY(block->recorded_count))
        return free_used_elsewhere(allocator, block, key);
    begin_free(allocator, block);
    if (block->pending_events == 0)
        gm_retire_block_locked(allocator, block);
    return finish_free(allocator);
}

static gm_status add_recorded_stream(gm_block *block, gm_stream stream)
{
    if (block->recorded_count == 0) {
        block->recorded_first = stream;
    } else {
        gm_stream *grown = gm_system_realloc(block->recorded_more, block->recorded_count * sizeof *grown);
        if (!grown)
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to record a stream");
        block->recorded_more = grown;
        grown[block->recorded_count - 1] = stream;
    }
    block->recorded_count++;
    return GM_OK;
}

gm_status gm_record_stream(gm_allocator *allocator, void *pointer, gm_stream stream)
{
    if (!allocator || !pointer)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_record_stream: %s is NULL", allocator ? "pointer" : "allocator");
    gm_status status = GM_OK;
    gm_lock_acquire(&allocator->lock);
    gm_block *block = find_live_block(allocator, pointer);
    if (!block) {
        status = not_live("gm_record_stream", pointer);
    } else if (stream != block->heap->stream) {
        bool known = false;
        for (uint32_t i = 0; i < block->recorded_count; i++)
            known = known || gm_recorded_stream(block, i) == stream;
        if (!known)
            status = add_recorded_stream(block, stream);
    }
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_allocation_size(gm_allocator *allocator, const void *pointer, size_t *size_out)
{
    if (!allocator || !pointer || !size_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_allocation_size: %s is NULL",
                       !allocator ? "allocator" : !pointer ? "pointer" : "size_out");
    gm_lock_acquire(&allocator->lock);
    gm_block *block = find_live_block(allocator, pointer);
    if (block)
        *size_out = block->size;
    gm_lock_release(&allocator->lock);
    return block ? GM_OK : not_live("gm_allocation_size", pointer);
}

int gm_owns(gm_allocator *allocator, const void *pointer)
{
    if (!allocator || !pointer)
        return 0;
    gm_lock_acquire(&allocator->lock);
    int owned = find_live_block(allocator, pointer) != NULL;
    gm_lock_release(&allocator->lock);
    return owned;
}

gm_status gm_empty_cache(gm_allocator *allocator)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_empty_cache: allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
    if (allocator->pending_queues)
        gm_process_pending_frees_locked(allocator, false);
    allocator->arena.engine->release_cached(&allocator->arena, 0);
    if (pressure_crossed(allocator))
        return finish_under_pressure(allocator, GM_OK);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_status gm_set_memory_limit(gm_allocator *allocator, uint64_t bytes)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_memory_limit: allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
    uint64_t total = allocator->arena.backend->total_bytes;
    allocator->arena.memory_limit = bytes && bytes < total ? bytes : total;
    if ((uint64_t)gm_stat_total(allocator->arena.stats->reserved_bytes) > allocator->arena.memory_limit)
        allocator->arena.engine->release_cached(&allocator->arena, 0);
    /* What could not go back now (live, or cached in a private pool) goes as it becomes free. */
    allocator->arena.over_limit =
        (uint64_t)gm_stat_total(allocator->arena.stats->reserved_bytes) > allocator->arena.memory_limit;
    gm_pressure_limit_changed_locked(allocator); /* the watermarks are fractions of the limit */
    if (pressure_crossed(allocator))
        return finish_under_pressure(allocator, GM_OK);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_status gm_get_memory_limit(gm_allocator *allocator, uint64_t *bytes_out)
{
    if (!allocator || !bytes_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_memory_limit: %s is NULL", allocator ? "bytes_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    *bytes_out = allocator->arena.memory_limit;
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

/* ---------------------------------------------------------------- statistics */

void gm_read_stats_locked(gm_allocator *allocator, gm_stats *stats_out)
{
    gm_arena_read_stats(&allocator->arena, stats_out);
    add_device_calls(allocator->arena.backend, stats_out);
}

gm_status gm_get_stats(gm_allocator *allocator, gm_stats *stats_out)
{
    if (!allocator || !stats_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_stats: %s is NULL", allocator ? "stats_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    gm_read_stats_locked(allocator, stats_out);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_status gm_reset_peak_stats(gm_allocator *allocator)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_reset_peak_stats: allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
    allocator->arena.reserved_peak_before_reset = gm_arena_reserved_peak(&allocator->arena);
    allocator->arena.allocated_peak_before_reset = gm_arena_allocated_peak(&allocator->arena);
    gm_stats_reset_peaks(allocator->arena.stats);
    gm_hot_stats_reset_peaks(&allocator->arena.hot_stats);
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_status gm_reset_accumulated_stats(gm_allocator *allocator)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_reset_accumulated_stats: allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    begin_change(allocator);
    gm_stats_reset_accumulated(allocator->arena.stats);
    gm_hot_stats_reset_accumulated(&allocator->arena.hot_stats);
    memset(allocator->arena.backend->calls, 0, sizeof allocator->arena.backend->calls);
    memset(allocator->arena.backend->call_ns_by_kind, 0, sizeof allocator->arena.backend->call_ns_by_kind);
    allocator->arena.backend->call_ns = 0;
    end_change(allocator);
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_arena *gm_lock_arena(gm_allocator *allocator)
{
    gm_lock_acquire(&allocator->lock);
    return &allocator->arena;
}

void gm_unlock_arena(gm_allocator *allocator)
{
    gm_lock_release(&allocator->lock);
}

/* ---------------------------------------------------------------- destruction */

void gm_destroy(gm_allocator *allocator, size_t *live_allocations_out)
{
    if (live_allocations_out)
        *live_allocations_out = 0;
    if (!allocator)
        return;
    gm_pressure_stop(allocator); /* joins the sampling thread, which may be waiting for the lock */
    gm_lock_acquire(&allocator->lock);
    allocator->destroying = true;
    stop_publishing(allocator);
    if (live_allocations_out)
        *live_allocations_out = allocator->live_blocks.count;
    for (size_t i = 0; i < allocator->live_blocks.capacity; i++) {
        if (!allocator->live_blocks.entries[i].key)
            continue;
        gm_block *block = (gm_block *)(uintptr_t)allocator->live_blocks.entries[i].value;
        count_allocation(allocator, block, -1);
        gm_retire_block_locked(allocator, block);
    }
    gm_release_frees_held_for_capture_locked(allocator);
    gm_process_pending_frees_locked(allocator, true);
    gm_drop_pending_frees_locked(allocator); /* those whose events could not be waited for */
    if (allocator->arena.engine)
        allocator->arena.engine->destroy(&allocator->arena);
    gm_host_cache_destroy(allocator); /* gives its events back to the pool */
    while (allocator->spare_event_count)
        gm_backend_event_destroy(allocator->arena.backend, allocator->spare_events[--allocator->spare_event_count]);
    gm_destroy_named_streams(allocator);
    gm_close_all_shared(allocator);
    gm_backend_close(allocator->arena.backend);
    gm_free_heaps(&allocator->arena);
    gm_free_private_pools(allocator);
    free(allocator->spare_events);
    gm_free_spare_pending_locked(allocator);
    gm_hash_map_free(&allocator->live_blocks);
    gm_block_pool_free_all(&allocator->arena.block_pool);
    gm_history_destroy(allocator->arena.history);
    gm_lock_release(&allocator->lock);
    gm_pressure_destroy(&allocator->pressure);
    free(allocator);
}
