/*
 * test_private_pool.c -- private pools (CUDA graphs, MemPools) on the sim, both engines: requests
 * routed by the stream filter, a pool's memory kept from other allocations and from empty_cache while
 * it has users, reuse inside the pool, shared pools, the pool gone (and its heaps dropped) once it has
 * no users and no live block, data integrity on the host backend, statistics exact throughout
 * (gm_validate), and bad calls.
 */
#include "test.h"

static const char *const configs[] = {"backend:sim,capacity:1GiB", "backend:sim,capacity:1GiB,engine:segments"};
enum { config_count = 2 };
static const gm_pool_id graph_pool = {0, 1}, other_pool = {0, 2};

#define MIB (1u << 20)

static int64_t reserved(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats.reserved_bytes[GM_POOL_ALL].current;
}

static gm_pool_info pool_info(gm_allocator *allocator, gm_pool_id pool)
{
    gm_pool_info info = {0};
    CHECK_OK(gm_get_pool_info(allocator, pool, &info));
    return info;
}

static int only_stream_7(gm_stream stream, void *context)
{
    (*(int *)context)++;
    return stream == 7;
}

static void requests_follow_the_filter(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        int calls = 0;
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, only_stream_7, &calls));
        void *captured = NULL, *elsewhere = NULL;
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 7, &captured));
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 8, &elsewhere));
        CHECK_EQ_INT(calls, 2);
        gm_pool_info info = pool_info(allocator, graph_pool);
        CHECK_EQ_INT(info.users, 1);
        CHECK_EQ_INT(info.live_allocations, 1);
        CHECK(info.reserved_bytes >= 3 * MIB);
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        void *after = NULL;
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 7, &after)); /* no longer routed */
        CHECK_EQ_INT(calls, 2);
        CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, captured));
        CHECK_OK(gm_free(allocator, elsewhere));
        CHECK_OK(gm_free(allocator, after));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        gm_destroy(allocator, NULL);
    }
}

/* A block the capture freed is the graph's: another allocation of that size gets new memory, and
 * empty_cache keeps the pool's cache while the pool has users. */
static void pool_memory_is_kept_for_the_pool(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *captured = NULL;
        CHECK_OK(gm_malloc(allocator, 40 * MIB, 0, &captured));
        CHECK_OK(gm_free(allocator, captured));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        int64_t pool_bytes = reserved(allocator);
        CHECK(pool_bytes >= 40 * MIB);
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_EQ_INT(reserved(allocator), pool_bytes);
        uint64_t free_bytes = 1, largest = 1;
        CHECK_OK(gm_cache_info(allocator, &free_bytes, &largest));
        CHECK_EQ_INT(free_bytes, 0); /* the pool's cache is not for others */
        void *outside = NULL;
        CHECK_OK(gm_malloc(allocator, 40 * MIB, 0, &outside));
        CHECK(outside != captured);
        CHECK(reserved(allocator) >= pool_bytes + 40 * MIB);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, outside));
        /* Inside the pool the freed block is reused. */
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *again = NULL;
        CHECK_OK(gm_malloc(allocator, 40 * MIB, 0, &again));
        CHECK(again == captured);
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_EQ_INT(pool_info(allocator, graph_pool).users, 2);
        CHECK_OK(gm_free(allocator, again));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* A pool marked use_on_oom keeps its memory while others fit elsewhere; an allocation that would
 * otherwise fail takes the pool's free memory; without the mark it fails. */
static void a_pool_lends_its_memory_on_out_of_memory(void)
{
    static const char *const limited[] = {"backend:sim,capacity:64MiB", "backend:sim,capacity:64MiB,engine:segments"};
    for (size_t c = 0; c < config_count; c++) {
        for (int lend = 0; lend <= 1; lend++) {
            gm_allocator *allocator = NULL;
            REQUIRE(gm_create(limited[c], &allocator) == GM_OK);
            CHECK_OK(gm_retain_pool(allocator, other_pool)); /* a MemPool */
            CHECK_OK(gm_begin_allocate_to_pool(allocator, other_pool, NULL, NULL));
            void *pooled = NULL, *small = NULL, *outside = NULL;
            CHECK_OK(gm_malloc(allocator, 40 * MIB, 0, &pooled));
            CHECK_OK(gm_end_allocate_to_pool(allocator, other_pool));
            CHECK_OK(gm_free(allocator, pooled)); /* cached in the pool */
            CHECK_OK(gm_set_pool_use_on_oom(allocator, other_pool, lend));
            CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &small)); /* fits beside the pool: nothing lent */
            CHECK(pool_info(allocator, other_pool).reserved_bytes >= 40 * MIB);
            gm_status status = gm_malloc(allocator, 40 * MIB, 0, &outside);
            CHECK_STATUS(status, lend ? GM_OK : GM_ERROR_OUT_OF_MEMORY);
            if (lend) {
                CHECK(pool_info(allocator, other_pool).reserved_bytes < 40 * MIB);
                CHECK_OK(gm_free(allocator, outside));
            }
            CHECK_OK(gm_validate(allocator));
            CHECK_OK(gm_free(allocator, small));
            CHECK_OK(gm_release_pool(allocator, other_pool));
            gm_destroy(allocator, NULL);
        }
    }
}

/* No users and no live block: the pool is gone and its memory given back; a live block keeps it until
 * its free. */
static void a_released_pool_goes_away_with_its_last_block(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        CHECK_OK(gm_retain_pool(allocator, graph_pool)); /* a MemPool */
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *kept = NULL, *dropped = NULL;
        CHECK_OK(gm_malloc(allocator, 5 * MIB, 3, &kept));
        CHECK_OK(gm_malloc(allocator, 700, 3, &dropped));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_OK(gm_free(allocator, dropped));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        CHECK_EQ_INT(pool_info(allocator, graph_pool).users, 1);
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        gm_pool_info info = pool_info(allocator, graph_pool); /* still there: `kept` is live */
        CHECK_EQ_INT(info.users, 0);
        CHECK_EQ_INT(info.live_allocations, 1);
        CHECK_OK(gm_empty_cache(allocator)); /* its free memory is ordinary cache now */
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, kept));
        gm_pool_info gone;
        CHECK_STATUS(gm_get_pool_info(allocator, graph_pool, &gone), GM_ERROR_INVALID_ARGUMENT);
        CHECK_MESSAGE("no private pool (0, 1)");
        CHECK_EQ_INT(reserved(allocator), 0);
        CHECK_OK(gm_validate(allocator));
        /* The same name again makes a new pool. */
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *next = NULL;
        CHECK_OK(gm_malloc(allocator, 5 * MIB, 3, &next));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        CHECK_OK(gm_free(allocator, next));
        CHECK_EQ_INT(reserved(allocator), 0);
        gm_destroy(allocator, NULL);
    }
}

/* Graph after graph, each in a pool of its own and released: nothing piles up. */
static void many_graphs_leave_nothing_behind(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        for (uint64_t graph = 1; graph <= 2000; graph++) {
            gm_pool_id pool = {0, graph};
            REQUIRE(gm_begin_allocate_to_pool(allocator, pool, NULL, NULL) == GM_OK);
            void *pointer = NULL;
            REQUIRE(gm_malloc(allocator, (graph % 7 + 1) * MIB, graph % 3, &pointer) == GM_OK);
            REQUIRE(gm_end_allocate_to_pool(allocator, pool) == GM_OK);
            REQUIRE(gm_release_pool(allocator, pool) == GM_OK);
            REQUIRE(gm_free(allocator, pointer) == GM_OK);
        }
        CHECK_EQ_INT(reserved(allocator), 0);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* A tensor that keeps growing inside a pool (a KV cache in a captured decoder) opens the pages engine's
 * growth lane for the pool's heap; the lane is the pool's memory too and goes with it. */
static void a_pool_with_a_growth_lane_goes_away_whole(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
    CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
    void *cache = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &cache));
    uintptr_t first = (uintptr_t)cache;
    for (uint64_t step = 1; step <= 120; step++) {
        /* A regrowth is a copy a little larger, allocated just before the old tensor is freed; the
         * scratch comes after, as the step's other work. */
        void *grown = NULL, *scratch = NULL;
        CHECK_OK(gm_malloc(allocator, 4 * MIB + step * 64 * 1024, 0, &grown));
        CHECK_OK(gm_free(allocator, cache));
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &scratch));
        CHECK_OK(gm_free(allocator, scratch));
        cache = grown;
    }
    /* The lane opened: its ring lies in the upper part of the stream's range (the pool's own blocks
     * stay within a few MiB of its first). */
    CHECK((uintptr_t)cache - first > 256 * MIB);
    CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
    void *outside = NULL;
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &outside));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    CHECK_OK(gm_free(allocator, cache));
    gm_pool_info gone;
    CHECK_STATUS(gm_get_pool_info(allocator, graph_pool, &gone), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, outside));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved(allocator), 0);
    gm_destroy(allocator, NULL);
}

/* Two captures at once on different streams, each into its own pool; a pool shared by two graphs. */
static void pools_at_once_and_shared(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        int calls = 0;
        CHECK_OK(gm_begin_allocate_to_pool(allocator, other_pool, NULL, NULL));
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, only_stream_7, &calls));
        void *first = NULL, *second = NULL;
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 7, &first)); /* the newer route takes its stream */
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 9, &second)); /* the older one the rest */
        CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 1);
        CHECK_EQ_INT(pool_info(allocator, other_pool).live_allocations, 1);
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_OK(gm_end_allocate_to_pool(allocator, other_pool));
        /* Nested, both taking every stream: the inner (newer) pool wins until it ends. */
        CHECK_OK(gm_begin_allocate_to_pool(allocator, other_pool, NULL, NULL));
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *inner = NULL, *outer = NULL;
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 9, &inner));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 9, &outer));
        CHECK_OK(gm_end_allocate_to_pool(allocator, other_pool));
        CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 2);
        CHECK_EQ_INT(pool_info(allocator, other_pool).live_allocations, 2);
        CHECK_OK(gm_free(allocator, inner));
        CHECK_OK(gm_free(allocator, outer));
        CHECK_EQ_INT(pool_info(allocator, graph_pool).users, 2);
        CHECK_OK(gm_release_pool(allocator, graph_pool)); /* the users the nested begins added */
        CHECK_OK(gm_release_pool(allocator, other_pool));
        /* A second graph shares the first one's pool, and reuses what the first freed. */
        CHECK_OK(gm_free(allocator, first));
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *shared = NULL;
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 7, &shared));
        CHECK(shared == first);
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_EQ_INT(pool_info(allocator, graph_pool).users, 2);
        CHECK_OK(gm_release_pool(allocator, graph_pool)); /* the first graph goes */
        CHECK_EQ_INT(pool_info(allocator, graph_pool).users, 1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, shared));
        CHECK_OK(gm_free(allocator, second));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        CHECK_OK(gm_release_pool(allocator, other_pool));
        CHECK_EQ_INT(reserved(allocator), 0);
        gm_destroy(allocator, NULL);
    }
}

/* Frees recorded on another stream wait for it, then return to the pool. */
static void cross_stream_frees_return_to_the_pool(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
    CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 1, &pointer));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1000));
    CHECK_OK(gm_record_stream(allocator, pointer, 2));
    CHECK_OK(gm_free(allocator, pointer));
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
    CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 1); /* waits for stream 2 */
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    void *other = NULL;
    CHECK_OK(gm_malloc(allocator, 512, 1, &other)); /* processes the pending free */
    gm_pool_info gone;
    CHECK_STATUS(gm_get_pool_info(allocator, graph_pool, &gone), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_free(allocator, other));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* During a capture nothing may wait for a capturing stream (its work runs only when the graph does):
 * a free used on another stream waits without an event until the capture ends, then as usual. */
static void frees_during_capture_wait_for_its_end(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 5, 1));
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 6, 1)); /* joined into the capture */
    CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
    void *shared = NULL, *plain = NULL, *next = NULL;
    CHECK_OK(gm_malloc(allocator, 6 * MIB, 5, &shared));
    CHECK_OK(gm_record_stream(allocator, shared, 6));
    CHECK_OK(gm_malloc(allocator, 6 * MIB, 5, &plain));
    CHECK_OK(gm_free(allocator, shared));
    CHECK_OK(gm_free(allocator, plain)); /* stream-ordered: reusable in the capture at once */
    CHECK_OK(gm_malloc(allocator, 6 * MIB, 5, &next));
    CHECK(next == plain);
    CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 2); /* `shared` is held */
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.active[GM_POOL_ALL].current, 2);
    CHECK_EQ_INT(stats.num_sync_all_streams, 0);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 5, 0)); /* the capture ends */
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 6, 0));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 6, 10));
    CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool)); /* records the held free's event */
    CHECK_OK(gm_validate(allocator));
    CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 2);
    CHECK_OK(gm_sim_stream_complete(allocator, 6));
    CHECK_OK(gm_free(allocator, next));
    CHECK_OK(gm_empty_cache(allocator)); /* completes the pending free */
    CHECK_EQ_INT(pool_info(allocator, graph_pool).live_allocations, 0);
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    CHECK_EQ_INT(reserved(allocator), 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* A pool growing during its capture takes no idle memory of a capturing stream's heap: moving it would
 * wait for that stream. */
static void growth_during_capture_waits_for_no_capturing_stream(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
    void *before = NULL;
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 5, &before));
    CHECK_OK(gm_free(allocator, before)); /* idle memory in stream 5's heap */
    CHECK_OK(gm_sim_stream_enqueue(allocator, 5, 1)); /* work queued before the capture */
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 5, 1));
    CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
    void *captured = NULL;
    CHECK_OK(gm_malloc(allocator, 48 * MIB, 5, &captured));
    CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 5, 0));
    CHECK(reserved(allocator) >= 112 * MIB); /* new memory, not stream 5's idle chunks */
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, captured));
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    CHECK_OK(gm_sim_stream_complete(allocator, 5));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved(allocator), 0);
    gm_destroy(allocator, NULL);
}

static void data_survives_in_a_pool(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:host,capacity:64MiB", &allocator) == GM_OK);
    CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
    unsigned char *pool_bytes = NULL;
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, (void **)&pool_bytes));
    CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
    memset(pool_bytes, 0xab, 3 * MIB);
    unsigned char *outside = NULL;
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, (void **)&outside));
    memset(outside, 0x11, 3 * MIB);
    CHECK(pool_bytes[0] == 0xab && pool_bytes[3 * MIB - 1] == 0xab);
    CHECK_OK(gm_free(allocator, outside));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK(pool_bytes[12345] == 0xab);
    CHECK_OK(gm_free(allocator, pool_bytes));
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    gm_destroy(allocator, NULL);
}

/* Destroying the allocator with pools alive frees everything (ASan would see a leak). */
static void destroy_with_pools_alive(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 9 * MIB, 0, &pointer));
        CHECK_OK(gm_retain_pool(allocator, other_pool));
        size_t live = 0;
        gm_destroy(allocator, &live);
        CHECK_EQ_INT(live, 1);
    }
}

/* Destroyed during a capture: a free used on the capturing stream was held for the capture's end,
 * which never came, and its event can never be waited for; gm_destroy still frees it (found by
 * fuzz_api: LeakSanitizer reported the pending free's record, left in the pending list). */
static void destroy_during_a_capture(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        int calls = 0;
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, only_stream_7, &calls));
        CHECK_OK(gm_sim_stream_set_capturing(allocator, 7, 1));
        void *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &pointer));
        CHECK_OK(gm_record_stream(allocator, pointer, 7));
        CHECK_OK(gm_free(allocator, pointer));
        CHECK_OK(gm_validate(allocator));
        size_t live = 1;
        gm_destroy(allocator, &live);
        CHECK_EQ_INT(live, 0);
    }
}

static int holds_address(const gm_pool_allocation *allocations, size_t count, const void *pointer)
{
    for (size_t i = 0; i < count; i++)
        if (allocations[i].address == (uint64_t)(uintptr_t)pointer)
            return 1;
    return 0;
}

/* The pool's allocated blocks, exactly (torch.compile's cudagraph trees check them against the tensors
 * they know to be alive): not blocks outside the pool, not freed ones, not ones waiting for a stream. */
static void a_pools_allocations_are_listed(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        size_t count = 99;
        CHECK_OK(gm_get_pool_allocations(allocator, graph_pool, NULL, 0, &count));
        CHECK_EQ_INT(count, 0); /* no such pool: none */
        void *outside = NULL, *inside[4] = {NULL};
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, &outside));
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        const size_t sizes[4] = {512, 3 * MIB, 40 * MIB, 4096};
        for (int i = 0; i < 4; i++)
            CHECK_OK(gm_malloc(allocator, sizes[i], 0, &inside[i]));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_OK(gm_free(allocator, inside[1]));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1000));
        CHECK_OK(gm_record_stream(allocator, inside[2], 2));
        CHECK_OK(gm_free(allocator, inside[2])); /* waits for stream 2: not allocated any more */
        gm_pool_allocation addresses[4] = {{0}};
        CHECK_OK(gm_get_pool_allocations(allocator, graph_pool, addresses, 1, &count));
        CHECK_EQ_INT(count, 2); /* the count even when there is room for fewer */
        CHECK_OK(gm_get_pool_allocations(allocator, graph_pool, addresses, 4, &count));
        CHECK_EQ_INT(count, 2);
        CHECK(holds_address(addresses, count, inside[0]) && holds_address(addresses, count, inside[3]));
        for (size_t i = 0; i < count; i++)
            CHECK(addresses[i].size == 512 ? addresses[i].requested == 512 : addresses[i].requested == 4096);
        CHECK(!holds_address(addresses, count, outside));
        CHECK_STATUS(gm_get_pool_allocations(allocator, graph_pool, NULL, 4, &count), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_get_pool_allocations(allocator, graph_pool, addresses, 4, NULL), GM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(gm_sim_stream_complete(allocator, 2));
        CHECK_OK(gm_free(allocator, inside[0]));
        CHECK_OK(gm_free(allocator, inside[3]));
        CHECK_OK(gm_free(allocator, outside));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static uint64_t address_of(const void *pointer)
{
    return (uint64_t)(uintptr_t)pointer;
}

/* A pool put back to a checkpoint (cudagraph trees): blocks freed since are placed again at their
 * addresses, the statistics count them as allocations, and they free as any other. */
static void a_pool_is_put_back_to_a_checkpoint(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        void *outside = NULL, *kept = NULL, *large = NULL, *small = NULL, *whole = NULL;
        CHECK_OK(gm_malloc(allocator, 6 * MIB, 0, &outside));
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        CHECK_OK(gm_malloc(allocator, MIB, 0, &kept));
        CHECK_OK(gm_malloc(allocator, 3 * MIB + 100, 0, &large));
        CHECK_OK(gm_malloc(allocator, 700, 0, &small));
        CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &whole));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        gm_stats before;
        CHECK_OK(gm_get_stats(allocator, &before));
        CHECK_OK(gm_free(allocator, large));
        CHECK_OK(gm_free(allocator, small));
        CHECK_OK(gm_free(allocator, whole));
        CHECK_OK(gm_pool_allocate_at(allocator, graph_pool, address_of(large), 3 * MIB + 512, 3 * MIB + 100));
        CHECK_OK(gm_pool_allocate_at(allocator, graph_pool, address_of(small), 1024, 700));
        /* a piece in the middle of a free block: the pieces around it stay free memory of the pool */
        CHECK_OK(gm_pool_allocate_at(allocator, graph_pool, address_of(whole) + 2 * MIB, 2 * MIB, 2 * MIB));
        CHECK_OK(gm_validate(allocator));
        gm_stats after;
        CHECK_OK(gm_get_stats(allocator, &after));
        CHECK_EQ_INT(after.allocation[GM_POOL_ALL].current, before.allocation[GM_POOL_ALL].current);
        CHECK_EQ_INT(after.requested_bytes[GM_POOL_ALL].current,
                     before.requested_bytes[GM_POOL_ALL].current - 8 * MIB + 2 * MIB);
        CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, before.reserved_bytes[GM_POOL_ALL].current);
        size_t count = 0;
        CHECK_OK(gm_get_pool_allocations(allocator, graph_pool, NULL, 0, &count));
        CHECK_EQ_INT(count, 4);
        /* what is not free memory of the pool is refused, and nothing changes */
        CHECK_STATUS(gm_pool_allocate_at(allocator, graph_pool, address_of(kept), MIB, MIB), GM_ERROR_INVALID_ARGUMENT);
        CHECK_MESSAGE("is not free memory of pool (0, 1)");
        CHECK_STATUS(gm_pool_allocate_at(allocator, graph_pool, address_of(whole) + 2 * MIB, 512, 512),
                     GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_pool_allocate_at(allocator, graph_pool, address_of(outside), MIB, MIB),
                     GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_pool_allocate_at(allocator, graph_pool, address_of(whole), 1000, 1000),
                     GM_ERROR_INVALID_ARGUMENT);
        CHECK_MESSAGE("is not a block gpumem makes");
        CHECK_STATUS(gm_pool_allocate_at(allocator, graph_pool, address_of(whole), 512, 1024), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_pool_allocate_at(allocator, other_pool, address_of(whole), 512, 512), GM_ERROR_INVALID_ARGUMENT);
        CHECK_MESSAGE("no private pool (0, 2) exists");
        CHECK_OK(gm_get_pool_allocations(allocator, graph_pool, NULL, 0, &count));
        CHECK_EQ_INT(count, 4);
        /* the pool's routed requests still find the free pieces around the placed block */
        CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
        void *front = NULL;
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, &front));
        CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
        CHECK_OK(gm_release_pool(allocator, graph_pool)); /* begun twice: two users */
        CHECK_OK(gm_validate(allocator));
        void *placed[] = {kept, large, small, (void *)(uintptr_t)(address_of(whole) + 2 * MIB), front, outside};
        for (size_t i = 0; i < sizeof placed / sizeof placed[0]; i++)
            CHECK_OK(gm_free(allocator, placed[i]));
        CHECK_OK(gm_release_pool(allocator, graph_pool));
        gm_pool_info gone;
        CHECK_STATUS(gm_get_pool_info(allocator, graph_pool, &gone), GM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(gm_validate(allocator));
        size_t live = 99;
        gm_destroy(allocator, &live);
        CHECK_EQ_INT(live, 0);
    }
}

static void bad_calls_are_clear_errors(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
    gm_pool_id none = {0, 0};
    CHECK_STATUS(gm_begin_allocate_to_pool(allocator, none, NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("(0, 0) names no pool");
    CHECK_STATUS(gm_begin_allocate_to_pool(NULL, graph_pool, NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_end_allocate_to_pool(allocator, graph_pool), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("nothing is being allocated to pool (0, 1)");
    CHECK_STATUS(gm_release_pool(allocator, graph_pool), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no private pool (0, 1) exists");
    CHECK_STATUS(gm_set_pool_use_on_oom(allocator, graph_pool, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("gm_set_pool_use_on_oom: no private pool (0, 1) exists");
    CHECK_STATUS(gm_set_pool_use_on_oom(NULL, graph_pool, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_retain_pool(allocator, none), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_get_pool_info(allocator, graph_pool, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_retain_pool(allocator, graph_pool));
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    CHECK_STATUS(gm_release_pool(allocator, graph_pool), GM_ERROR_INVALID_ARGUMENT); /* gone */
    /* Released while still allocated to: the route must not point at a dropped pool (found by fuzzing). */
    CHECK_OK(gm_begin_allocate_to_pool(allocator, graph_pool, NULL, NULL));
    CHECK_OK(gm_release_pool(allocator, graph_pool));
    void *routed = NULL;
    CHECK_OK(gm_malloc(allocator, 4096, 0, &routed));
    CHECK_OK(gm_free(allocator, routed));
    CHECK_OK(gm_end_allocate_to_pool(allocator, graph_pool));
    gm_pool_info gone;
    CHECK_STATUS(gm_get_pool_info(allocator, graph_pool, &gone), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(requests_follow_the_filter), TEST_CASE(pool_memory_is_kept_for_the_pool),
          TEST_CASE(a_released_pool_goes_away_with_its_last_block), TEST_CASE(many_graphs_leave_nothing_behind),
          TEST_CASE(a_pool_with_a_growth_lane_goes_away_whole),
          TEST_CASE(pools_at_once_and_shared), TEST_CASE(cross_stream_frees_return_to_the_pool),
          TEST_CASE(frees_during_capture_wait_for_its_end),
          TEST_CASE(growth_during_capture_waits_for_no_capturing_stream),
          TEST_CASE(data_survives_in_a_pool), TEST_CASE(destroy_with_pools_alive),
          TEST_CASE(destroy_during_a_capture), TEST_CASE(a_pools_allocations_are_listed),
          TEST_CASE(a_pool_is_put_back_to_a_checkpoint), TEST_CASE(a_pool_lends_its_memory_on_out_of_memory),
          TEST_CASE(bad_calls_are_clear_errors))
