/*
 * test_event_observer.c -- the event observer (gm_set_event_observer): every event reaches it as it
 * happens, with or without a history ring, carrying the private pool it concerns; an unmap reaches it
 * while the memory is still mapped (NCCL deregisters memory from PyTorch's trace trackers before it
 * goes); switching the ring on and off keeps the observer, and removing the observer leaves no history
 * behind; an observer coming or going keeps the ring's events. Snapshots name the private pool of each region.
 */
#include "test.h"

#include <string.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define MOST_EVENTS 256

typedef struct seen {
    gm_event events[MOST_EVENTS];
    int count;
    int unmapped_while_unreadable; /* unmap events whose memory could no longer be read */
    int pipe[2];                   /* to probe memory without faulting (write() says EFAULT) */
    int probe_memory;              /* real memory (the host backend): probe it at each unmap */
    const struct source *source;   /* with a segment source: how many segments it had handed back */
    int source_frees_at_unmap[MOST_EVENTS];
} seen;

typedef struct source {
    int frees;
} source;

/* Whether the first byte at `address` can be read: the kernel copies it into a pipe, or says EFAULT. */
static int readable(seen *log, uint64_t address)
{
    char byte;
    if (write(log->pipe[1], (const void *)(uintptr_t)address, 1) != 1)
        return 0;
    return read(log->pipe[0], &byte, 1) == 1;
}

static void record(const gm_event *event, void *context)
{
    seen *log = context;
    if (log->probe_memory && event->kind == GM_EVENT_SEGMENT_UNMAP && !readable(log, event->address))
        log->unmapped_while_unreadable++;
    if (log->count < MOST_EVENTS) {
        log->source_frees_at_unmap[log->count] = log->source ? log->source->frees : 0;
        log->events[log->count++] = *event;
    }
}

static int count_kind(const seen *log, gm_event_kind kind)
{
    int count = 0;
    for (int i = 0; i < log->count; i++)
        count += log->events[i].kind == kind;
    return count;
}

static int same_pool(gm_pool_id a, gm_pool_id b)
{
    return a.first == b.first && a.second == b.second;
}

static void open_log(seen *log)
{
    memset(log, 0, sizeof *log);
    REQUIRE(pipe(log->pipe) == 0);
}

static void close_log(seen *log)
{
    close(log->pipe[0]);
    close(log->pipe[1]);
}

/* No history kept: the observer still sees allocations, frees, chunks mapped and unmapped (each while
 * its memory is still readable), and the out-of-memory failure, in order. */
static void every_event_reaches_the_observer_without_history(void)
{
    seen log;
    open_log(&log);
    log.probe_memory = 1;
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:host,capacity:64MiB", &allocator));
    CHECK_OK(gm_set_event_observer(allocator, record, &log));
    void *block = NULL, *huge = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 5, &block));
    memset(block, 7, 4 * MIB);
    CHECK_OK(gm_free(allocator, block));
    CHECK_STATUS(gm_malloc(allocator, 512 * MIB, 5, &huge), GM_ERROR_OUT_OF_MEMORY);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK(count_kind(&log, GM_EVENT_SEGMENT_MAP) >= 1);
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_ALLOC), 1);
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_FREE_COMPLETED), 1);
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_OOM), 1);
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_SEGMENT_UNMAP), count_kind(&log, GM_EVENT_SEGMENT_MAP));
    CHECK_EQ_INT(log.unmapped_while_unreadable, 0);
    for (int i = 0; i < log.count; i++) {
        CHECK(same_pool(log.events[i].pool, (gm_pool_id){0, 0}));
        CHECK(i == 0 || log.events[i].time_ns >= log.events[i - 1].time_ns);
    }
    size_t count = 1;
    CHECK_STATUS(gm_history_read(allocator, NULL, 0, &count, NULL), GM_ERROR_NOT_SUPPORTED);
    CHECK_EQ_INT(count, 0);
    gm_destroy(allocator, NULL);
    close_log(&log);
}

static gm_status source_allocate(void *context, uint64_t size, void **address_out)
{
    (void)context;
    *address_out = malloc(size);
    return *address_out ? GM_OK : GM_ERROR_OUT_OF_MEMORY;
}

static void source_free(void *context, void *address, uint64_t size)
{
    (void)size;
    ((source *)context)->frees++;
    free(address);
}

/* With memory from a source (the segments engine), the segment's unmap event comes before the source
 * takes the segment back. */
static void a_segment_is_announced_before_it_goes(void)
{
    seen log;
    open_log(&log);
    source counted = {0};
    log.source = &counted;
    gm_segment_source segments = {source_allocate, source_free, &counted};
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create_with_source("capacity:1GiB", &segments, &allocator));
    CHECK_OK(gm_set_event_observer(allocator, record, &log));
    void *block = NULL;
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &block));
    CHECK_OK(gm_free(allocator, block));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(counted.frees, 1);
    int unmaps = 0;
    for (int i = 0; i < log.count; i++)
        if (log.events[i].kind == GM_EVENT_SEGMENT_UNMAP) {
            unmaps++;
            CHECK_EQ_INT(log.source_frees_at_unmap[i], 0);
        }
    CHECK_EQ_INT(unmaps, 1);
    gm_destroy(allocator, NULL);
    close_log(&log);
}

/* Events and snapshot regions of a private pool carry its name; the stream's own memory carries none. */
static void events_and_regions_name_their_private_pool(void)
{
    static const char *const configs[] = {"capacity:1GiB", "capacity:1GiB,engine:segments"};
    const gm_pool_id graph = {7, 1};
    for (int c = 0; c < 2; c++) {
        seen log;
        open_log(&log);
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(configs[c], &allocator));
        CHECK_OK(gm_set_event_observer(allocator, record, &log));
        void *inside = NULL, *outside = NULL;
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph, NULL, NULL));
        CHECK_OK(gm_malloc(allocator, 6 * MIB, 0, &inside));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph));
        CHECK_OK(gm_malloc(allocator, 6 * MIB, 0, &outside));
        int pooled_allocs = 0, pooled_maps = 0, plain_allocs = 0;
        for (int i = 0; i < log.count; i++) {
            const gm_event *event = &log.events[i];
            int pooled = same_pool(event->pool, graph);
            CHECK(pooled || same_pool(event->pool, (gm_pool_id){0, 0}));
            pooled_allocs += event->kind == GM_EVENT_ALLOC && pooled;
            plain_allocs += event->kind == GM_EVENT_ALLOC && !pooled;
            pooled_maps += event->kind == GM_EVENT_SEGMENT_MAP && pooled;
            if (event->kind == GM_EVENT_ALLOC)
                CHECK((event->address == (uint64_t)(uintptr_t)inside) == pooled);
        }
        CHECK_EQ_INT(pooled_allocs, 1);
        CHECK_EQ_INT(plain_allocs, 1);
        CHECK(pooled_maps >= 1);
        gm_snapshot *snapshot = NULL;
        CHECK_OK(gm_snapshot_take(allocator, &snapshot));
        REQUIRE(snapshot);
        int pooled_regions = 0;
        for (size_t r = 0; r < snapshot->region_count; r++) {
            const gm_snapshot_region *region = &snapshot->regions[r];
            uint64_t start = region->address, end = region->address + region->size;
            int holds_inside = (uint64_t)(uintptr_t)inside >= start && (uint64_t)(uintptr_t)inside < end;
            int holds_outside = (uint64_t)(uintptr_t)outside >= start && (uint64_t)(uintptr_t)outside < end;
            pooled_regions += same_pool(region->private_pool, graph);
            if (holds_inside)
                CHECK(same_pool(region->private_pool, graph));
            if (holds_outside)
                CHECK(same_pool(region->private_pool, (gm_pool_id){0, 0}));
        }
        CHECK(pooled_regions >= 1);
        gm_snapshot_free(snapshot);
        CHECK_OK(gm_free(allocator, inside));
        CHECK_OK(gm_free(allocator, outside));
        CHECK_OK(gm_release_pool(allocator, graph));
        gm_destroy(allocator, NULL);
        close_log(&log);
    }
}

static uint64_t constant_tag(void *context)
{
    (void)context;
    return 42;
}

/* The ring switched on and off keeps the observer and the tagger; removing the observer without a
 * ring leaves no history (reading it and setting a tagger are refused again). */
static void the_observer_outlives_history_changes(void)
{
    seen log;
    open_log(&log);
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    CHECK_STATUS(gm_set_event_observer(NULL, record, &log), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_set_event_observer(allocator, record, &log));
    CHECK_OK(gm_set_history_tagger(allocator, constant_tag, NULL)); /* an observer's history takes a tagger */
    CHECK_OK(gm_set_history(allocator, 8));
    void *block = NULL;
    CHECK_OK(gm_malloc(allocator, 1000, 0, &block));
    CHECK_OK(gm_set_history(allocator, 0));
    CHECK_OK(gm_free(allocator, block));
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_ALLOC), 1);
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_FREE_COMPLETED), 1);
    for (int i = 0; i < log.count; i++)
        CHECK_EQ_INT(log.events[i].tag, 42);
    size_t count = 0;
    CHECK_STATUS(gm_history_read(allocator, NULL, 0, &count, NULL), GM_ERROR_NOT_SUPPORTED);
    CHECK_OK(gm_set_event_observer(allocator, NULL, NULL));
    int before = log.count;
    CHECK_OK(gm_malloc(allocator, 1000, 0, &block));
    CHECK_OK(gm_free(allocator, block));
    CHECK_EQ_INT(log.count, before);
    CHECK_STATUS(gm_set_history_tagger(allocator, constant_tag, NULL), GM_ERROR_NOT_SUPPORTED);
    CHECK_OK(gm_set_event_observer(allocator, NULL, NULL)); /* removing none is fine */
    gm_destroy(allocator, NULL);
    close_log(&log);
}

/* The events already in the ring stay there when an observer comes and when it goes (memory history
 * recorded first, then NCCL's trace tracker attached: neither may cost the other its events). */
static void an_observer_keeps_the_rings_events(void)
{
    seen log;
    open_log(&log);
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB,history:8", &allocator));
    void *block = NULL;
    CHECK_OK(gm_malloc(allocator, 1000, 0, &block));
    gm_event events[8];
    size_t count = 0;
    CHECK_OK(gm_history_read(allocator, events, 8, &count, NULL));
    size_t before = count;
    CHECK(before >= 1);
    CHECK_OK(gm_set_event_observer(allocator, record, &log));
    CHECK_OK(gm_history_read(allocator, events, 8, &count, NULL));
    CHECK_EQ_INT(count, before);
    uintptr_t address = (uintptr_t)block;
    CHECK_OK(gm_free(allocator, block));
    CHECK_EQ_INT(count_kind(&log, GM_EVENT_FREE_COMPLETED), 1);
    CHECK_OK(gm_set_event_observer(allocator, NULL, NULL));
    CHECK_OK(gm_history_read(allocator, events, 8, &count, NULL));
    CHECK(count > before); /* the alloc (and the mapping before it), and the free's events */
    int allocs = 0;
    for (size_t i = 0; i < count; i++)
        allocs += events[i].kind == GM_EVENT_ALLOC && events[i].address == address;
    CHECK_EQ_INT(allocs, 1);
    gm_destroy(allocator, NULL);
    close_log(&log);
}

RUN_TESTS(TEST_CASE(every_event_reaches_the_observer_without_history), TEST_CASE(a_segment_is_announced_before_it_goes),
          TEST_CASE(events_and_regions_name_their_private_pool), TEST_CASE(the_observer_outlives_history_changes),
          TEST_CASE(an_observer_keeps_the_rings_events))
