/*
 * test_snapshot.c -- snapshots and the history ring: a snapshot's blocks tile its regions and agree
 * with the statistics (allocated, pending, mapped) under both engines, live blocks with their
 * requests, also while the pages engine holds memory made ahead of need (shown as free where it
 * lies); the ring keeps the newest N events in order, with the caller's tags, and costs nothing when
 * off; the JSON forms are written.
 */
#include "test.h"

#define MiB (1ull << 20)

static const char *const engines[] = {"engine:pages,capacity:1GiB", "engine:segments,capacity:1GiB"};

/* Blocks tile each region; allocated and pending bytes and mapped bytes agree with the statistics. */
static void check_snapshot_against_stats(gm_allocator *allocator, uint64_t pending_expected)
{
    gm_snapshot *snapshot = NULL;
    CHECK_OK(gm_snapshot_take(allocator, &snapshot));
    REQUIRE(snapshot);
    uint64_t allocated = 0, requested = 0, pending = 0, mapped = 0, blocks = 0;
    for (size_t r = 0; r < snapshot->region_count; r++) {
        const gm_snapshot_region *region = &snapshot->regions[r];
        uint64_t expected_address = region->address, region_mapped = 0;
        for (size_t b = 0; b < region->block_count; b++) {
            const gm_snapshot_block *block = &snapshot->blocks[region->first_block + b];
            CHECK(block->address == expected_address);
            expected_address += block->size;
            allocated += block->kind == GM_BLOCK_KIND_ALLOCATED ? block->size : 0;
            requested += block->kind == GM_BLOCK_KIND_ALLOCATED ? block->requested : 0;
            pending += block->kind == GM_BLOCK_KIND_PENDING ? block->size : 0;
            /* a live block (allocated, or freed while another stream still uses it) shows its request,
             * memory that no block holds none */
            if (block->kind == GM_BLOCK_KIND_ALLOCATED || block->kind == GM_BLOCK_KIND_PENDING)
                CHECK(block->requested > 0 && block->requested <= block->size);
            else
                CHECK_EQ_INT(block->requested, 0);
            region_mapped += block->kind == GM_BLOCK_KIND_UNMAPPED ? 0 : block->size;
        }
        CHECK(expected_address == region->address + region->size);
        CHECK_EQ_INT(region->mapped_bytes, region_mapped);
        mapped += region_mapped;
        blocks += region->block_count;
    }
    CHECK_EQ_INT(blocks, snapshot->block_count);
    CHECK_EQ_INT(allocated, snapshot->stats.allocated_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(requested, snapshot->stats.requested_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(pending, pending_expected);
    CHECK_EQ_INT(allocated + pending, snapshot->stats.active_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(mapped, snapshot->stats.reserved_bytes[GM_POOL_ALL].current);
    CHECK(snapshot->device.total_bytes == 1024 * MiB);
    char *json = NULL;
    CHECK_OK(gm_snapshot_json(snapshot, &json));
    REQUIRE(json);
    CHECK(strstr(json, "\"format\": \"gpumem-snapshot\"") != NULL);
    CHECK((strstr(json, "\"state\": \"allocated\"") != NULL) == (allocated > 0));
    CHECK(strstr(json, "\"allocated_bytes.all.current\": ") != NULL);
    gm_json_free(json);
    gm_snapshot_free(snapshot);
}

static void snapshot_agrees_with_the_statistics(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        void *pointers[6] = {0};
        size_t sizes[6] = {1000, 3 * MiB, 700 * 1024, 25 * MiB, 5 * MiB + 1, 64};
        for (int i = 0; i < 6; i++)
            CHECK_OK(gm_malloc(allocator, sizes[i], (gm_stream)(i % 2), &pointers[i]));
        CHECK_OK(gm_free(allocator, pointers[1]));
        /* A block freed while stream 2 still uses it is pending. */
        CHECK_OK(gm_record_stream(allocator, pointers[3], 2));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
        size_t pending_size = 0;
        CHECK_OK(gm_allocation_size(allocator, pointers[3], &pending_size));
        CHECK_OK(gm_free(allocator, pointers[3]));
        check_snapshot_against_stats(allocator, pending_size);
        CHECK_OK(gm_sim_stream_complete(allocator, 2));
        for (int i = 0; i < 6; i++)
            if (i != 1 && i != 3)
                CHECK_OK(gm_free(allocator, pointers[i]));
        CHECK_OK(gm_empty_cache(allocator));
        check_snapshot_against_stats(allocator, 0);
        gm_destroy(allocator, NULL);
    }
}

/* Memory made ahead of need after an empty_cache (pages engine, refill.c): two kept blocks of 100 MiB
 * with 600 MiB of addresses between them, where five steps each take three blocks of 200 MiB and
 * empty the cache. The sixth step's first block makes the whole 600 MiB (one group); the 400 MiB it
 * does not take wait, mapped and counted as reserved, and the snapshot shows them as free memory
 * where they lie -- in its blocks, its mapped bytes and its JSON -- until the step's blocks take them. */
static void a_snapshot_shows_memory_made_ahead_as_free(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("engine:pages,capacity:1GiB", &allocator));
    char *low = NULL, *between = NULL, *high = NULL;
    CHECK_OK(gm_malloc(allocator, 100 * MiB, 0, (void **)&low));
    CHECK_OK(gm_malloc(allocator, 600 * MiB, 0, (void **)&between));
    CHECK_OK(gm_malloc(allocator, 100 * MiB, 0, (void **)&high));
    CHECK_OK(gm_free(allocator, between));
    CHECK_OK(gm_empty_cache(allocator));
    void *blocks[3];
    for (int step = 0; step < 6; step++) {
        for (int i = 0; i < 3; i++) {
            CHECK_OK(gm_malloc(allocator, 200 * MiB, 0, &blocks[i]));
            CHECK(blocks[i] == between + (uint64_t)i * 200 * MiB);
            if (step < 5)
                continue;
            gm_stats stats;
            CHECK_OK(gm_get_stats(allocator, &stats));
            CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 800 * MiB); /* the group made whole */
            check_snapshot_against_stats(allocator, 0);
            gm_snapshot *snapshot = NULL;
            CHECK_OK(gm_snapshot_take(allocator, &snapshot));
            REQUIRE(snapshot);
            uint64_t waiting_start = (uint64_t)(uintptr_t)(between + (i + 1) * 200 * MiB);
            char waiting_json[160];
            snprintf(waiting_json, sizeof waiting_json, "{\"address\": %" PRIu64 ", \"size\": %" PRIu64
                     ", \"requested\": 0, \"state\": \"free\"}", waiting_start, (uint64_t)((2 - i) * 200 * MiB));
            char *json = NULL;
            CHECK_OK(gm_snapshot_json(snapshot, &json));
            REQUIRE(json);
            CHECK((strstr(json, waiting_json) != NULL) == (i < 2));
            gm_json_free(json);
            gm_snapshot_free(snapshot);
        }
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, blocks[i]));
        CHECK_OK(gm_empty_cache(allocator));
    }
    check_snapshot_against_stats(allocator, 0);
    CHECK_OK(gm_free(allocator, low));
    CHECK_OK(gm_free(allocator, high));
    gm_destroy(allocator, NULL);
}

static uint64_t counting_tagger(void *context)
{
    return ++*(uint64_t *)context;
}

static void history_keeps_the_newest_events_in_order(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB,history:5,chunk_room_share:0", &allocator)); /* a's memory one chunk */
    uint64_t tags = 100;
    CHECK_OK(gm_set_history_tagger(allocator, counting_tagger, &tags));
    void *a = NULL, *b = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MiB, 3, &a)); /* segment_map, alloc */
    CHECK_OK(gm_malloc(allocator, 1000, 3, &b));    /* segment_map (small pool), alloc */
    CHECK_OK(gm_free(allocator, a));                /* free_requested, free_completed */
    void *huge = NULL; /* the retry gives a's idle chunk back (segment_unmap), then oom */
    CHECK_STATUS(gm_malloc(allocator, 2048 * MiB, 3, &huge), GM_ERROR_OUT_OF_MEMORY);
    gm_event events[8];
    size_t count = 0;
    uint64_t dropped = 0;
    CHECK_OK(gm_history_read(allocator, NULL, 0, &count, &dropped));
    CHECK_EQ_INT(count, 5);
    CHECK_OK(gm_history_read(allocator, events, 8, &count, &dropped));
    CHECK_EQ_INT(count, 5);
    CHECK_EQ_INT(dropped, 3); /* 8 events: both segment_maps and a's alloc are gone */
    static const gm_event_kind expected[5] = {GM_EVENT_ALLOC, GM_EVENT_FREE_REQUESTED, GM_EVENT_FREE_COMPLETED,
                                              GM_EVENT_SEGMENT_UNMAP, GM_EVENT_OOM};
    for (size_t i = 0; i < count; i++) {
        CHECK_EQ_INT(events[i].kind, expected[i]);
        CHECK_EQ_INT(events[i].tag, 104 + i);
        CHECK_EQ_INT(events[i].stream, 3);
        CHECK(i == 0 || events[i].time_ns >= events[i - 1].time_ns);
    }
    CHECK(events[0].address == (uint64_t)(uintptr_t)b && events[0].size == 1000);
    CHECK(events[1].address == (uint64_t)(uintptr_t)a && events[1].size == 4 * MiB);
    CHECK(events[3].address == (uint64_t)(uintptr_t)a && events[3].size == 4 * MiB);
    gm_stats stats; /* the oom event carries the device's free bytes then, as PyTorch's trace entry */
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(events[4].address, 1024 * MiB - (uint64_t)stats.reserved_bytes[GM_POOL_ALL].current);
    CHECK(events[4].size == 2048 * MiB);
    CHECK(!strcmp(gm_event_name(GM_EVENT_FREE_REQUESTED), "free_requested"));
    char *json = NULL;
    CHECK_OK(gm_history_json(allocator, &json));
    REQUIRE(json);
    CHECK(strstr(json, "\"dropped\": 3") != NULL && strstr(json, "\"action\": \"oom\"") != NULL);
    gm_json_free(json);
    CHECK_OK(gm_free(allocator, b));
    gm_destroy(allocator, NULL);
}

static void history_is_off_by_default(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    size_t count = 9;
    CHECK_STATUS(gm_history_read(allocator, NULL, 0, &count, NULL), GM_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE("history:N");
    CHECK_EQ_INT(count, 0);
    CHECK_STATUS(gm_set_history_tagger(allocator, counting_tagger, NULL), GM_ERROR_NOT_SUPPORTED);
    char *json = NULL;
    CHECK_STATUS(gm_history_json(allocator, &json), GM_ERROR_NOT_SUPPORTED);
    CHECK(json == NULL);
    size_t capacity = 7;
    CHECK_OK(gm_history_capacity(allocator, &capacity));
    CHECK_EQ_INT(capacity, 0);
    CHECK_OK(gm_resize_history(allocator, 9));
    CHECK_OK(gm_history_capacity(allocator, &capacity));
    CHECK_EQ_INT(capacity, 9);
    CHECK_STATUS(gm_history_capacity(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("capacity_out");
    CHECK_STATUS(gm_history_capacity(NULL, &capacity), GM_ERROR_INVALID_ARGUMENT);
    gm_destroy(allocator, NULL);
    CHECK_OK(gm_create("capacity:1GiB,history:5", &allocator));
    CHECK_OK(gm_history_capacity(allocator, &capacity));
    CHECK_EQ_INT(capacity, 5);
    CHECK_OK(gm_set_history(allocator, 0));
    CHECK_OK(gm_history_capacity(allocator, &capacity));
    CHECK_EQ_INT(capacity, 0);
    gm_destroy(allocator, NULL);
    CHECK_STATUS(gm_create("history:2000000", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_STATUS(gm_snapshot_take(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
}

static void history_switches_on_and_off_while_running(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    void *before = NULL, *during = NULL;
    CHECK_OK(gm_malloc(allocator, 1000, 0, &before));
    CHECK_OK(gm_set_history(allocator, 16));
    CHECK_OK(gm_free(allocator, before));
    CHECK_OK(gm_malloc(allocator, 2000, 0, &during));
    gm_event events[16];
    size_t count = 0;
    CHECK_OK(gm_history_read(allocator, events, 16, &count, NULL));
    CHECK_EQ_INT(count, 3); /* free_requested, free_completed of `before`, alloc of `during` */
    CHECK_EQ_INT(events[0].kind, GM_EVENT_FREE_REQUESTED);
    CHECK_EQ_INT(events[2].kind, GM_EVENT_ALLOC);
    CHECK_OK(gm_set_history(allocator, 4)); /* a new ring: what was held is dropped */
    CHECK_OK(gm_history_read(allocator, events, 16, &count, NULL));
    CHECK_EQ_INT(count, 0);
    CHECK_OK(gm_set_history(allocator, 0));
    CHECK_STATUS(gm_history_read(allocator, events, 16, &count, NULL), GM_ERROR_NOT_SUPPORTED);
    CHECK_STATUS(gm_set_history(allocator, ((size_t)1 << 20) + 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("more than");
    CHECK_OK(gm_free(allocator, during));
    gm_destroy(allocator, NULL);
}

/* A resized ring keeps the newest events that fit, in order, and counts the rest as dropped. */
static void a_resized_history_keeps_its_newest_events(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB,history:4", &allocator));
    void *blocks[3] = {NULL};
    for (int i = 0; i < 3; i++) /* the first also maps memory: four events */
        CHECK_OK(gm_malloc(allocator, 1000 * (uint64_t)(i + 1), 0, &blocks[i]));
    gm_event before[4], after[8];
    size_t held = 0, count = 0;
    uint64_t dropped = 0;
    CHECK_OK(gm_history_read(allocator, before, 4, &held, &dropped));
    CHECK_EQ_INT(held, 4);
    CHECK_OK(gm_resize_history(allocator, 8));
    CHECK_OK(gm_history_read(allocator, after, 8, &count, &dropped));
    CHECK_EQ_INT(count, 4);
    CHECK_EQ_INT(dropped, 0);
    for (size_t i = 0; i < count; i++)
        CHECK(after[i].address == before[i].address && after[i].kind == before[i].kind);
    CHECK_OK(gm_free(allocator, blocks[2])); /* two more: free_requested, free_completed */
    CHECK_OK(gm_history_read(allocator, after, 8, &count, NULL));
    CHECK_EQ_INT(count, 6);
    CHECK_EQ_INT(after[5].kind, GM_EVENT_FREE_COMPLETED);
    CHECK_OK(gm_resize_history(allocator, 2)); /* only the newest two fit */
    CHECK_OK(gm_history_read(allocator, after, 8, &count, &dropped));
    CHECK_EQ_INT(count, 2);
    CHECK_EQ_INT(dropped, 4); /* six recorded, two held */
    CHECK_EQ_INT(after[0].kind, GM_EVENT_FREE_REQUESTED);
    CHECK_EQ_INT(after[1].kind, GM_EVENT_FREE_COMPLETED);
    CHECK_OK(gm_resize_history(allocator, 8)); /* larger again: still the two it kept, no empty slots */
    CHECK_OK(gm_history_read(allocator, after, 8, &count, &dropped));
    CHECK_EQ_INT(count, 2);
    CHECK_EQ_INT(dropped, 4);
    CHECK_EQ_INT(after[0].kind, GM_EVENT_FREE_REQUESTED);
    CHECK_OK(gm_set_history(allocator, 8)); /* set, not resize: nothing is kept */
    CHECK_OK(gm_history_read(allocator, after, 8, &count, NULL));
    CHECK_EQ_INT(count, 0);
    CHECK_STATUS(gm_resize_history(NULL, 8), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("gm_resize_history");
    CHECK_OK(gm_free(allocator, blocks[0]));
    CHECK_OK(gm_free(allocator, blocks[1]));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(a_resized_history_keeps_its_newest_events), TEST_CASE(history_switches_on_and_off_while_running), TEST_CASE(snapshot_agrees_with_the_statistics),
          TEST_CASE(a_snapshot_shows_memory_made_ahead_as_free), TEST_CASE(history_keeps_the_newest_events_in_order),
          TEST_CASE(history_is_off_by_default))
