/*
 * bench/peak_excess.c -- where a trace's reserved memory above its live peak comes from (pages engine).
 *
 * A replay's ratio (peak reserved / peak live) compares two moments that need not coincide. This tool
 * replays a trace twice on the sim. The first replay finds the moment each peak is reached and lists
 * every growth of reserved memory after the live bytes first reached their peak, so it says whether the
 * excess was made in the step that set the live peak or in later steps. The second replay stops after
 * one chosen operation (by default the last growth above the live peak's level that a large request
 * made) and sorts the free memory mapped there (--chunks: listing each pinned chunk that holds free pages): whole pages in idle chunks (which can move), whole pages
 * in chunks that live blocks pin (which cannot move without copies), and pieces smaller than a page.
 *
 * --stitch asks, before each growth after the live peak, what a second mapping of pinned chunks could
 * give (the stitch option, on by default, does this: docs/engine.md, "Stitching"; with stitch:false in
 * CONF the lines say what it would spare, with it on what it left): the driver maps one physical allocation at two
 * addresses, so the free end of one pinned chunk, idle chunks and the free start of another (or the
 * same) pinned chunk, mapped back to back somewhere else, are one contiguous range. The line says the
 * largest free end, the idle bytes and the largest free start of the large pool's region, and how much
 * new memory the request would still need.
 *
 *     gpumem_peak_excess TRACE [CONF] [--at OPERATION] [--chunks] [--stitch]
 *
 * CONF is a GPUMEM_CONF string (default "backend:sim"). Exit status 0, 1 on a bad trace or
 * configuration, 2 on bad usage.
 */
#include "base/array.h"
#include "core/allocator.h"
#include "core/pages/pages.h"
#include "tools/trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)
#define GROWTHS_SHOWN 40

static bool list_chunks; /* --chunks: every chunk that live blocks pin with free pages in it */
static bool show_stitching; /* --stitch: what stitching pinned chunks' free ends could give each growth */

/* What a replay watches: the first finds the live peak (the first time it is reached), the second
 * lists the growths after it, the third sorts the memory after one operation. */
typedef enum watch_mode { FINDING_PEAKS, LISTING_GROWTHS, SORTING } watch_mode;

typedef struct replay_watch replay_watch;
struct replay_watch {
    const gm_trace *trace;
    watch_mode mode;
    uint64_t live_peak;
    size_t live_peak_at;
    int64_t reserved_at_live_peak;
    int64_t reserved_peak;
    size_t reserved_peak_at;
    size_t growths_after_live_peak;
    size_t last_large_growth; /* SIZE_MAX: none */
    size_t stop_at;
    bool sorted;
    size_t *growth_at; /* FINDING_PEAKS: the operations that lifted reserved memory, in order */
    size_t growth_count;
    size_t growth_capacity;
    const replay_watch *found; /* LISTING_GROWTHS: the first replay's watch (its growth_at) */
    uint64_t stitch_room[3];   /* before the next growth: largest free end, idle bytes, largest free start */
};

static int64_t reserved_now(gm_allocator *allocator)
{
    gm_stats stats;
    gm_get_stats(allocator, &stats);
    return stats.reserved_bytes[GM_POOL_ALL].current;
}

/* Live bytes of `region`'s blocks inside [start, end), and whole free pages there. */
static void chunk_contents(const gm_region *region, uintptr_t start, uintptr_t end, uint64_t page_size,
                           uint64_t *live_out, uint64_t *free_pages_out)
{
    *live_out = *free_pages_out = 0;
    for (const gm_block *block = region->first_block; block; block = block->next) {
        uintptr_t low = block->address > start ? block->address : start;
        uintptr_t high = block->address + block->size < end ? block->address + block->size : end;
        if (high <= low)
            continue;
        if (block->state == GM_BLOCK_FREE) {
            uintptr_t first = (low + page_size - 1) / page_size * page_size, last = high / page_size * page_size;
            *free_pages_out += last > first ? last - first : 0;
        } else if (block->state != GM_BLOCK_UNMAPPED) {
            *live_out += high - low;
        }
    }
}

/* One region's free memory, sorted. */
static void sort_region(const gm_region *region, uint64_t page_size)
{
    const page_region *data = region->engine_data;
    uint64_t free_bytes = 0, idle = 0, pinned = 0, pinned_by_class[3] = {0}, live_total = 0;
    size_t chunks = 0;
    for (const gm_block *block = region->first_block; block; block = block->next)
        if (block->state == GM_BLOCK_FREE)
            free_bytes += block->size;
    for (gm_link *link = data->chunks.first; link; link = link->next) {
        const page_chunk *chunk = gm_list_item(link, page_chunk, link);
        uint64_t live = 0, free_pages = 0;
        chunk_contents(region, chunk->address, chunk->address + chunk->size, page_size, &live, &free_pages);
        chunks++;
        live_total += live;
        if (!live) {
            idle += free_pages;
            continue;
        }
        pinned += free_pages;
        if (list_chunks && free_pages)
            printf("    chunk at +%.0f MiB of %.0f MiB: %.1f MiB live, %.0f MiB of whole free pages\n",
                   (chunk->address - region->base) / MIB, chunk->size / MIB, live / MIB, free_pages / MIB);
        pinned_by_class[chunk->size <= 8 * (uint64_t)MIB ? 0 : chunk->size <= 32 * (uint64_t)MIB ? 1 : 2] += free_pages;
    }
    printf("  %s pool, stream %#" PRIxPTR ": %.1f MiB mapped in %zu chunks, %.1f MiB live or pending, %.1f MiB free:\n",
           region->pool == GM_POOL_SMALL ? "small" : "large", (uintptr_t)region->heap->stream,
           data->mapped_bytes / MIB, chunks, live_total / MIB, free_bytes / MIB);
    printf("    whole pages in idle chunks %.1f MiB; whole pages in chunks that live blocks pin %.1f MiB "
           "(chunks of at most 8 MiB %.1f, 8-32 MiB %.1f, larger %.1f); pieces of pages %.1f MiB\n",
           idle / MIB, pinned / MIB, pinned_by_class[0] / MIB, pinned_by_class[1] / MIB, pinned_by_class[2] / MIB,
           (free_bytes - idle - pinned) / MIB);
}

static void sort_memory(gm_allocator *allocator)
{
    gm_arena *arena = &allocator->arena;
    uint64_t page_size = ((const page_engine *)arena->engine_state)->page_size;
    printf("reserved %.1f MiB, allocated %.1f MiB\n", reserved_now(allocator) / MIB,
           gm_arena_allocated_bytes(arena) / MIB);
    for (uint32_t index = 0; index < arena->heap_count; index++)
        for (gm_link *link = arena->heaps[index]->regions.first; link; link = link->next) {
            const gm_region *region = gm_list_item(link, gm_region, link);
            if (((const page_region *)region->engine_data)->mapped_bytes)
                sort_region(region, page_size);
        }
}

/* What stitching could gather in `region` (--stitch), as the engine finds it (pages_stitch_reach);
 * room[0..2] (free end, idle, free start) keep the region that gathers the most. */
static void stitch_room_of(const gm_region *region, uint64_t page_size, uint64_t room[3])
{
    uint64_t tail = 0, idle = 0, head = 0;
    pages_stitch_reach(region, page_size, &tail, &head, &idle);
    if (tail + idle + head > room[0] + room[1] + room[2]) {
        room[0] = tail;
        room[1] = idle;
        room[2] = head;
    }
}

/* Whether the first replay saw operation `index` lift reserved memory. */
static bool was_growth(const replay_watch *found, size_t index)
{
    size_t low = 0, high = found->growth_count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (found->growth_at[middle] < index)
            low = middle + 1;
        else
            high = middle;
    }
    return low < found->growth_count && found->growth_at[low] == index;
}

static void measure_stitch_room(gm_allocator *allocator, uint64_t room[3])
{
    room[0] = room[1] = room[2] = 0;
    gm_arena *arena = &allocator->arena;
    uint64_t page_size = ((const page_engine *)arena->engine_state)->page_size;
    for (uint32_t index = 0; index < arena->heap_count; index++)
        for (gm_link *link = arena->heaps[index]->regions.first; link; link = link->next) {
            const gm_region *region = gm_list_item(link, gm_region, link);
            if (region->pool != GM_POOL_SMALL)
                stitch_room_of(region, page_size, room);
        }
}

/* The --stitch part of a growth's line. */
static void print_stitching(const replay_watch *watch, uint64_t request)
{
    const uint64_t *room = watch->stitch_room;
    uint64_t gathered = room[0] + room[1] + room[2], page = 2ull << 20;
    printf("; stitching: free end %.1f + idle %.1f + free start %.1f MiB", room[0] / MIB, room[1] / MIB, room[2] / MIB);
    if (gathered >= request)
        printf(", covers it");
    else
        printf(", %.1f MiB still new", (double)((request - gathered + page - 1) / page * page) / MIB);
}

/* One growth after the live peak (the second replay). */
static void list_growth(replay_watch *watch, size_t index, int64_t reserved, uint64_t live)
{
    const gm_trace_operation *operation = &watch->trace->operations[index];
    if (watch->growths_after_live_peak++ < GROWTHS_SHOWN) {
        printf("  operation %zu: a %.2f MiB request lifts reserved to %.1f MiB with %.1f MiB live", index,
               operation->size / MIB, reserved / MIB, live / MIB);
        if (show_stitching && operation->size >= (uint64_t)MIB) /* smaller requests take the small pool */
            print_stitching(watch, operation->size);
        printf("\n");
    }
    if (operation->size >= (uint64_t)MIB)
        watch->last_large_growth = index;
}

static gm_status after_operation(gm_allocator *allocator, size_t index, uint64_t live, void *context)
{
    replay_watch *watch = context;
    if (watch->mode == SORTING) {
        if (index == watch->stop_at) {
            sort_memory(allocator);
            watch->sorted = true;
        }
        return GM_OK;
    }
    int64_t reserved = reserved_now(allocator);
    bool growth = reserved > watch->reserved_peak;
    if (growth) {
        watch->reserved_peak = reserved;
        watch->reserved_peak_at = index;
    }
    if (watch->mode == FINDING_PEAKS) {
        if (growth && show_stitching) {
            size_t *grown = gm_array_room_for_one(watch->growth_at, watch->growth_count, &watch->growth_capacity,
                                                  sizeof *grown, 64);
            if (grown) {
                watch->growth_at = grown;
                watch->growth_at[watch->growth_count++] = index;
            }
        }
        if (live > watch->live_peak) {
            watch->live_peak = live;
            watch->live_peak_at = index;
            watch->reserved_at_live_peak = reserved;
        }
        return GM_OK;
    }
    if (growth && index > watch->live_peak_at)
        list_growth(watch, index, reserved, live);
    /* The state the next operation finds, if it is a growth to list: the line printed after it says
     * what stitching could have given it. */
    if (show_stitching && index + 1 > watch->live_peak_at && was_growth(watch->found, index + 1))
        measure_stitch_room(allocator, watch->stitch_room);
    return GM_OK;
}

static int replay_once(const gm_trace *trace, const char *conf, replay_watch *watch)
{
    gm_allocator *allocator = NULL;
    if (gm_create_from_environment(conf, &allocator) != GM_OK) {
        fprintf(stderr, "gpumem_peak_excess: %s\n", gm_last_error());
        return 1;
    }
    if (allocator->options.engine != GM_ENGINE_PAGES) {
        fprintf(stderr, "gpumem_peak_excess: only the pages engine's memory is sorted (engine:pages)\n");
        gm_destroy(allocator, NULL);
        return 1;
    }
    gm_replay_hooks hooks = {.after_operation = after_operation, .context = watch};
    gm_replay_result result;
    gm_status status = gm_replay_with_hooks(allocator, trace, &result, &hooks);
    if (status != GM_OK)
        fprintf(stderr, "gpumem_peak_excess: %s\n", gm_last_error());
    else if (watch->mode == SORTING && !watch->sorted)
        fprintf(stderr, "gpumem_peak_excess: the replay did not reach operation %zu\n", watch->stop_at);
    if (watch->mode == SORTING && !watch->sorted)
        status = GM_ERROR_INVALID_ARGUMENT;
    gm_destroy(allocator, NULL);
    return status == GM_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *conf = "backend:sim";
    long at = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--chunks"))
            list_chunks = true;
        else if (!strcmp(argv[i], "--stitch"))
            show_stitching = true;
        else if (!strcmp(argv[i], "--at")) {
            const char *text = i + 1 < argc ? argv[++i] : "";
            char *end = NULL;
            at = strtol(text, &end, 10);
            if (at < 0 || *end || end == text) {
                fprintf(stderr, "gpumem_peak_excess: --at wants an operation number (0 or more), not '%s'\n", text);
                return 2;
            }
        }
        else if (!path)
            path = argv[i];
        else
            conf = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: gpumem_peak_excess TRACE [CONF] [--at OPERATION] [--chunks] [--stitch]\n");
        return 2;
    }
    gm_trace trace;
    if (gm_trace_load(path, &trace) != GM_OK) {
        fprintf(stderr, "gpumem_peak_excess: %s\n", gm_last_error());
        return 1;
    }
    int failed = 0;
    replay_watch peaks = {.trace = &trace, .mode = FINDING_PEAKS};
    if (at >= 0 && (size_t)at >= trace.count) {
        fprintf(stderr, "gpumem_peak_excess: --at %ld: the trace has %zu operations\n", at, trace.count);
        failed = 2;
        goto done;
    }
    failed = replay_once(&trace, conf, &peaks);
    if (failed)
        goto done;
    printf("live peak %.1f MiB at operation %zu, reserved then %.1f MiB (%.4f of it); growths after it:\n",
           peaks.live_peak / MIB, peaks.live_peak_at, peaks.reserved_at_live_peak / MIB,
           (double)peaks.reserved_at_live_peak / (double)peaks.live_peak);
    replay_watch growths = {.trace = &trace, .mode = LISTING_GROWTHS, .live_peak_at = peaks.live_peak_at,
                            .last_large_growth = SIZE_MAX, .found = &peaks};
    if ((failed = replay_once(&trace, conf, &growths)))
        goto done;
    printf("peak reserved %.1f MiB at operation %zu (%.4f of the live peak); %zu growths after the live peak\n",
           peaks.reserved_peak / MIB, peaks.reserved_peak_at, (double)peaks.reserved_peak / (double)peaks.live_peak,
           growths.growths_after_live_peak);
    replay_watch sorting = {.trace = &trace, .mode = SORTING};
    sorting.stop_at = at >= 0 ? (size_t)at : growths.last_large_growth != SIZE_MAX ? growths.last_large_growth
                                                                                   : peaks.reserved_peak_at;
    const gm_trace_operation *operation = &trace.operations[sorting.stop_at];
    printf("after operation %zu (a %.2f MiB %s): ", sorting.stop_at, operation->size / MIB,
           operation->kind == GM_TRACE_ALLOCATE ? "request" : "free");
    failed = replay_once(&trace, conf, &sorting);
done:
    free(peaks.growth_at);
    gm_trace_free(&trace);
    return failed;
}
