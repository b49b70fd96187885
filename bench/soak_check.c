/*
 * soak_check.c -- the soak benchmark's checks: at each barrier, while every thread waits, the
 * allocator's books against what the threads hold; at the end, that freeing everything, completing all
 * work and emptying the cache leaves nothing allocated, reserved or remembered.
 *
 * The checks use the public API (gm_validate, gm_get_stats, gm_allocation_size, gm_get_device_info),
 * plus, under the allocator's lock, what the backend counts and keeps (faults injected, its records of
 * simulated streams) and the number of heaps, for the report.
 */
#include "soak.h"

#include "backend/device_model.h"
#include "core/allocator.h"
#include "core/arena.h"
#include "monitor/host_memory.h"

#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#define EMPTY_CACHE_ATTEMPTS 1000 /* under faults a release may fail; it is retried by the next call */

typedef struct live_totals {
    int64_t blocks;
    int64_t bytes;
    int64_t requested;
} live_totals;

static double resident_mib(void)
{
    gm_process_memory memory;
    return gm_process_memory_read(NULL, getpid(), &memory) == GM_OK ? (double)memory.rss_bytes / (1024.0 * 1024.0) : 0;
}

/* Every live block of every thread: still live at its size, its data intact; their totals. */
static live_totals check_live_blocks(soak_run *run)
{
    live_totals totals = {0};
    for (unsigned t = 0; t < run->options.threads; t++) {
        const soak_worker *worker = &run->workers[t];
        for (size_t i = 0; i < worker->live_count; i++) {
            const soak_block *block = &worker->live[i];
            size_t size = 0;
            soak_check_status(run, gm_allocation_size(run->allocator, block->pointer, &size), GM_OK,
                              "gm_allocation_size of a live block");
            if (size != block->size)
                soak_violation(run, "block %p is %zu bytes now, %zu at its allocation", (void *)block->pointer, size,
                               block->size);
            if (run->options.check_data && !soak_intact(block->pointer, block->requested, block->identity))
                soak_violation(run, "the data of live block %p (%zu bytes) changed", (void *)block->pointer,
                               block->requested);
            totals.blocks++;
            totals.bytes += (int64_t)block->size;
            totals.requested += (int64_t)block->requested;
        }
    }
    return totals;
}

static void compare(soak_run *run, const char *what, int64_t books, int64_t expected)
{
    if (books != expected)
        soak_violation(run, "%s: the allocator says %" PRId64 ", expected %" PRId64, what, books, expected);
}

/* The statistics against the live blocks, and against the device's own count of used memory. */
static void check_statistics(soak_run *run, const live_totals *live)
{
    gm_stats stats;
    soak_check_status(run, gm_get_stats(run->allocator, &stats), GM_OK, "gm_get_stats");
    compare(run, "allocations", stats.allocation[GM_POOL_ALL].current, live->blocks);
    compare(run, "allocated bytes", stats.allocated_bytes[GM_POOL_ALL].current, live->bytes);
    compare(run, "requested bytes", stats.requested_bytes[GM_POOL_ALL].current, live->requested);
    int64_t active = stats.active_bytes[GM_POOL_ALL].current, reserved = stats.reserved_bytes[GM_POOL_ALL].current;
    if (active < live->bytes || reserved < active)
        soak_violation(run, "active bytes %" PRId64 " not between allocated %" PRId64 " and reserved %" PRId64, active,
                       live->bytes, reserved);
    gm_device_info device;
    soak_check_status(run, gm_get_device_info(run->allocator, &device), GM_OK, "gm_get_device_info");
    compare(run, "reserved bytes against the device's used memory", reserved,
            (int64_t)(device.total_bytes - device.free_bytes));
}

/* What the backend and the arena hold, for the report. */
static double note_footprint(soak_run *run)
{
    gm_arena *arena = gm_lock_arena(run->allocator);
    size_t heaps = arena->heap_count;
    size_t streams = gm_model_footprint_of(arena->backend).streams;
    run->faults_injected = arena->backend->faults_injected;
    run->copies = arena->backend->calls[GM_CALL_COPY];
    run->stitches = arena->stats->num_stitches;
    gm_unlock_arena(run->allocator);
    run->max_heaps = heaps > run->max_heaps ? heaps : run->max_heaps;
    run->max_model_streams = streams > run->max_model_streams ? streams : run->max_model_streams;
    double rss = resident_mib();
    run->peak_rss_mib = rss > run->peak_rss_mib ? rss : run->peak_rss_mib;
    return rss;
}

static void check_books(soak_run *run)
{
    run->barriers_checked++;
    gm_status valid = gm_validate(run->allocator);
    if (valid != GM_OK)
        soak_violation(run, "gm_validate at barrier %" PRIu64 ": %s", run->barriers_checked, gm_last_error());
    live_totals live = check_live_blocks(run);
    check_statistics(run, &live);
    double rss = note_footprint(run);
    if (run->options.verbose)
        fprintf(stderr, "barrier %" PRIu64 ": %" PRId64 " live blocks, %" PRId64 " bytes, %zu heaps (at most), "
                "%zu simulated streams (at most), %" PRId64 " faults injected, rss %.1f MiB, %" PRIu64 " violations\n",
                run->barriers_checked, live.blocks, live.bytes, run->max_heaps, run->max_model_streams,
                run->faults_injected, rss, atomic_load(&run->violations));
}

void soak_barrier(soak_worker *self)
{
    soak_run *run = self->run;
    pthread_barrier_wait(&run->barrier);
    if (self->index == 0)
        check_books(run);
    pthread_barrier_wait(&run->barrier);
}

/* ---------------------------------------------------------------- the end */

static void free_everything(soak_run *run)
{
    for (unsigned t = 0; t < run->options.threads; t++) {
        soak_worker *worker = &run->workers[t];
        for (size_t i = 0; i < worker->live_count; i++) {
            soak_block *block = &worker->live[i];
            if (run->options.check_data && !soak_intact(block->pointer, block->requested, block->identity))
                soak_violation(run, "the data of block %p changed before its free", (void *)block->pointer);
            soak_check_status(run, gm_free(run->allocator, block->pointer), GM_OK, "gm_free");
        }
        worker->live_count = 0;
    }
}

static void complete_all_work(soak_run *run)
{
    for (gm_stream stream = 0; stream <= SOAK_SHARED_STREAMS; stream++)
        soak_check_status(run, gm_sim_stream_complete(run->allocator, stream), GM_OK, "gm_sim_stream_complete");
    for (unsigned t = 0; t < run->options.threads; t++) {
        soak_worker *worker = &run->workers[t];
        soak_check_status(run, gm_sim_stream_complete(run->allocator, worker->own_stream), GM_OK,
                          "gm_sim_stream_complete");
        for (size_t i = 0; i < worker->recent_count; i++)
            soak_check_status(run, gm_sim_stream_complete(run->allocator, worker->recent[i]), GM_OK,
                              "gm_sim_stream_complete");
    }
}

static int64_t reserved_bytes(soak_run *run)
{
    gm_stats stats;
    soak_check_status(run, gm_get_stats(run->allocator, &stats), GM_OK, "gm_get_stats");
    return stats.reserved_bytes[GM_POOL_ALL].current;
}

void soak_drain(soak_run *run)
{
    check_books(run);
    soak_check_status(run, gm_set_memory_limit(run->allocator, 0), GM_OK, "gm_set_memory_limit");
    free_everything(run);
    complete_all_work(run);
    for (int attempt = 0; attempt < EMPTY_CACHE_ATTEMPTS && reserved_bytes(run) != 0; attempt++)
        soak_check_status(run, gm_empty_cache(run->allocator), GM_OK, "gm_empty_cache");
    compare(run, "reserved bytes after freeing everything and emptying the cache", reserved_bytes(run), 0);
    live_totals none = {0};
    check_statistics(run, &none);
    check_books(run);
    gm_arena *arena = gm_lock_arena(run->allocator);
    size_t streams_kept = gm_model_footprint_of(arena->backend).streams;
    gm_unlock_arena(run->allocator);
    compare(run, "simulated streams the device still keeps with all work done", (int64_t)streams_kept, 0);
    size_t live = 0;
    gm_destroy(run->allocator, &live);
    compare(run, "live allocations at gm_destroy", (int64_t)live, 0);
    run->allocator = NULL;
}
