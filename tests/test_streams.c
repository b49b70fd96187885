/*
 * test_streams.c -- per-stream reuse and record_stream, with PyTorch's meaning: a block freed after
 * being used on another stream is not handed out again until the work queued there before the free
 * has finished. The sim backend's simulated streams decide when work finishes.
 */
#include "test.h"

#include <stdbool.h>

static const char *const engines[] = {"engine:pages,capacity:1GiB", "engine:segments,capacity:1GiB"};

static void freed_block_is_reused_on_its_stream(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        void *first = NULL, *second = NULL;
        CHECK_OK(gm_malloc(allocator, 4u << 20, 1, &first));
        CHECK_OK(gm_free(allocator, first));
        CHECK_OK(gm_malloc(allocator, 4u << 20, 1, &second));
        CHECK(first == second); /* same stream: reused at once, stream order keeps it safe */
        CHECK_OK(gm_free(allocator, second));
        gm_destroy(allocator, NULL);
    }
}

static void streams_do_not_share_cached_blocks(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        void *on_one = NULL, *on_two = NULL;
        CHECK_OK(gm_malloc(allocator, 4u << 20, 1, &on_one));
        CHECK_OK(gm_free(allocator, on_one));
        CHECK_OK(gm_malloc(allocator, 4u << 20, 2, &on_two));
        CHECK(on_one != on_two);
        CHECK_OK(gm_free(allocator, on_two));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void recorded_stream_delays_reuse_until_its_work_finishes(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        void *block = NULL, *other = NULL;
        CHECK_OK(gm_malloc(allocator, 4u << 20, 1, &block));
        CHECK_OK(gm_record_stream(allocator, block, 2));
        CHECK_OK(gm_record_stream(allocator, block, 2)); /* twice is once */
        CHECK_OK(gm_record_stream(allocator, block, 1)); /* its own stream: nothing to wait for */
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* a long kernel on stream 2 uses it */
        CHECK_OK(gm_free(allocator, block));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 0);
        CHECK_EQ_INT(stats.active_bytes[GM_POOL_ALL].current, 4 << 20); /* still active: pending */
        CHECK_EQ_INT(stats.device_calls[GM_CALL_EVENT_RECORD], 1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_malloc(allocator, 4u << 20, 1, &other));
        CHECK(other != block); /* not reused while stream 2 runs */
        CHECK_OK(gm_free(allocator, other));
        CHECK_OK(gm_sim_stream_complete(allocator, 2));
        CHECK_OK(gm_malloc(allocator, 4u << 20, 1, &other));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.active_bytes[GM_POOL_ALL].current, 4 << 20);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, other));
        gm_destroy(allocator, NULL);
    }
}

static void work_queued_after_the_free_does_not_delay_reuse(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    void *block = NULL, *again = NULL;
    CHECK_OK(gm_malloc(allocator, 1000, 1, &block));
    CHECK_OK(gm_record_stream(allocator, block, 2));
    CHECK_OK(gm_free(allocator, block));       /* nothing queued on stream 2 before the free */
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 5)); /* queued after: irrelevant */
    CHECK_OK(gm_malloc(allocator, 1000, 1, &again));
    CHECK(again == block);
    CHECK_OK(gm_free(allocator, again));
    gm_destroy(allocator, NULL);
}

static void several_recorded_streams_all_must_finish(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    void *block = NULL, *other = NULL;
    CHECK_OK(gm_malloc(allocator, 2048, 1, &block));
    CHECK_OK(gm_record_stream(allocator, block, 2));
    CHECK_OK(gm_record_stream(allocator, block, 3));
    CHECK_OK(gm_record_stream(allocator, block, 4));
    CHECK_OK(gm_record_stream(allocator, block, 3)); /* known already */
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 3, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 4, 1));
    CHECK_OK(gm_free(allocator, block));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.device_calls[GM_CALL_EVENT_RECORD], 3); /* one per stream */
    for (gm_stream stream = 2; stream <= 3; stream++) {
        CHECK_OK(gm_sim_stream_complete(allocator, stream));
        CHECK_OK(gm_malloc(allocator, 2048, 1, &other));
        CHECK(other != block); /* stream 4 at least still uses it */
        CHECK_OK(gm_free(allocator, other));
    }
    CHECK_OK(gm_sim_stream_complete(allocator, 4));
    CHECK_OK(gm_malloc(allocator, 2048, 1, &other));
    CHECK(other == block);
    CHECK_OK(gm_free(allocator, other));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void out_of_memory_waits_for_pending_frees(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(e == 0 ? "engine:pages,capacity:64MiB" : "engine:segments,capacity:64MiB", &allocator));
        void *block = NULL, *again = NULL;
        CHECK_OK(gm_malloc(allocator, 60u << 20, 1, &block));
        CHECK_OK(gm_record_stream(allocator, block, 2));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
        CHECK_OK(gm_free(allocator, block));
        /* The only memory is pending on stream 2; a request waits for it rather than failing. */
        CHECK_OK(gm_malloc(allocator, 60u << 20, 1, &again));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.num_sync_all_streams, 1);
        CHECK_EQ_INT(stats.num_ooms, 0);
        CHECK_OK(gm_free(allocator, again));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* A simulated stream finishes its work oldest first (gm_sim_stream_finish_until: what a device behind its
 * host does, gpumem replay --lead), and the work a wait finished early is counted (gm_sim_work_waited_for). */
static void work_finishes_oldest_first_and_waits_count_it(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(e == 0 ? "engine:pages,capacity:64MiB" : "engine:segments,capacity:64MiB", &allocator));
        void *block = NULL, *again = NULL;
        uint64_t waited = 1;
        CHECK_OK(gm_malloc(allocator, 60u << 20, 1, &block));
        CHECK_OK(gm_record_stream(allocator, block, 2));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 3)); /* three kernels on stream 2 use it */
        CHECK_OK(gm_free(allocator, block));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 4)); /* four more, queued after the free */
        CHECK_OK(gm_sim_stream_finish_until(allocator, 2, 5)); /* two of the three finish */
        CHECK_OK(gm_sim_stream_finish_until(allocator, 2, 9)); /* more than is queued: nothing */
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.active_bytes[GM_POOL_ALL].current, 60 << 20); /* pending: one kernel left */
        CHECK_OK(gm_sim_work_waited_for(allocator, &waited));
        CHECK_EQ_INT(waited, 0);
        /* The only memory is pending: the request waits for the one unit before the free, not the four after. */
        CHECK_OK(gm_malloc(allocator, 60u << 20, 1, &again));
        CHECK_OK(gm_sim_work_waited_for(allocator, &waited));
        CHECK_EQ_INT(waited, 1);
        CHECK_OK(gm_free(allocator, again));
        /* Queued work that finishes by itself is not counted. */
        CHECK_OK(gm_sim_stream_finish_until(allocator, 2, 0));
        CHECK_OK(gm_sim_work_waited_for(allocator, &waited));
        CHECK_EQ_INT(waited, 1);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void empty_cache_keeps_pending_blocks(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    void *block = NULL;
    CHECK_OK(gm_malloc(allocator, 30u << 20, 1, &block));
    CHECK_OK(gm_record_stream(allocator, block, 2));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    CHECK_OK(gm_free(allocator, block));
    CHECK_OK(gm_empty_cache(allocator));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 30 << 20); /* in use on stream 2 */
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_destroy(allocator, NULL);
}

/* A stream per request (servers, CuPy's and external streams): idle streams' heaps are forgotten, so
 * neither addresses nor host memory run out, and a busy stream's blocks are untouched. */
static void thousands_of_streams_come_and_go(void)
{
    static const char *const configs[] = {"backend:sim", "backend:sim,engine:segments",
                                          "backend:sim,capacity:1TiB"}; /* the last: addresses run out first */
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        void *kept = NULL;
        CHECK_OK(gm_malloc(allocator, 3 << 20, 1, &kept));
        for (gm_stream stream = 2; stream < 1000; stream++) {
            void *pointer = NULL;
            gm_status status = gm_malloc(allocator, 4 << 20, stream, &pointer);
            if (status != GM_OK) {
                fprintf(stderr, "%s: stream %lu: %s\n", configs[c], (unsigned long)stream, gm_last_error());
                CHECK_OK(status);
                break;
            }
            CHECK_OK(gm_free(allocator, pointer));
        }
        size_t size = 0;
        CHECK_OK(gm_allocation_size(allocator, kept, &size));
        CHECK_EQ_INT(size, 3 << 20);
        CHECK_OK(gm_validate(allocator));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        /* At most the idle heaps kept before forgetting, each with its cache (a 20 MiB segment at most),
         * not one per stream ever seen. */
        CHECK(stats.reserved_bytes[GM_POOL_ALL].current <= (int64_t)(130ull * (20 << 20)));
        CHECK_OK(gm_free(allocator, kept));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
        gm_destroy(allocator, NULL);
    }
}

static int64_t event_queries(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats.device_calls[GM_CALL_EVENT_QUERY];
}

/* Hundreds of frees waiting for a busy stream (a communication stream's long collective): an
 * allocation asks about one of its events, not every one, since a stream runs its work in order;
 * once the stream is done, every waiting free completes. Frees waiting on a stream that is done are
 * not held up by a busy one recorded before them. */
static void waiting_frees_cost_one_query_per_busy_stream(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        enum { waiting = 300 };
        void *blocks[waiting] = {NULL}, *probe = NULL, *quick = NULL;
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* busy until completed */
        for (int i = 0; i < waiting; i++) {
            CHECK_OK(gm_malloc(allocator, 4096, 1, &blocks[i]));
            CHECK_OK(gm_record_stream(allocator, blocks[i], i == waiting / 2 ? 3 : 2));
            CHECK_OK(gm_free(allocator, blocks[i]));
        }
        CHECK_OK(gm_malloc(allocator, 8192, 1, &probe));
        CHECK_OK(gm_free(allocator, probe));
        int64_t before = event_queries(allocator);
        CHECK_OK(gm_malloc(allocator, 8192, 1, &probe)); /* stream 3 was idle: its free completed above */
        CHECK_EQ_INT(event_queries(allocator) - before, 1);
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.active[GM_POOL_ALL].current, waiting - 1 + 1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_sim_stream_complete(allocator, 2));
        before = event_queries(allocator);
        CHECK_OK(gm_malloc(allocator, 4096, 1, &quick));
        CHECK_EQ_INT(event_queries(allocator) - before, waiting - 1);
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.active[GM_POOL_ALL].current, 2);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, quick));
        CHECK_OK(gm_free(allocator, probe));
        gm_destroy(allocator, NULL);
    }
}

/* Frees waiting on many busy streams (more than a look once kept in mind): an allocation asks one event
 * per stream, however many frees wait on each; when one stream finishes, its frees complete and the
 * others' still wait. */
static void waiting_frees_on_many_streams_cost_one_query_per_stream(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        enum { streams = 40, per_stream = 10 };
        void *block = NULL, *probe = NULL;
        for (gm_stream stream = 10; stream < 10 + streams; stream++) {
            CHECK_OK(gm_sim_stream_enqueue(allocator, stream, 1)); /* busy until completed */
            for (int i = 0; i < per_stream; i++) {
                CHECK_OK(gm_malloc(allocator, 4096, 1, &block));
                CHECK_OK(gm_record_stream(allocator, block, stream));
                CHECK_OK(gm_free(allocator, block));
            }
        }
        int64_t before = event_queries(allocator);
        CHECK_OK(gm_malloc(allocator, 8192, 1, &probe));
        CHECK_EQ_INT(event_queries(allocator) - before, streams);
        CHECK_OK(gm_sim_stream_complete(allocator, 10 + streams / 2));
        CHECK_OK(gm_free(allocator, probe));
        before = event_queries(allocator);
        CHECK_OK(gm_malloc(allocator, 8192, 1, &probe));
        CHECK_EQ_INT(event_queries(allocator) - before, streams - 1 + per_stream); /* the done stream's ten */
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.active[GM_POOL_ALL].current, (streams - 1) * per_stream + 1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, probe));
        gm_destroy(allocator, NULL);
    }
}

/* Stream 2 leaves 64 MiB idle and, busy or not, stream 1 then needs 64 MiB: how reserved memory ends,
 * and the unmaps and waits the pages engine spent. */
typedef struct idle_elsewhere {
    int64_t reserved, unmaps, waits;
} idle_elsewhere;

static idle_elsewhere take_idle_memory_of_stream_two(const char *config, bool stream_two_busy)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *on_two = NULL, *on_one = NULL;
    CHECK_OK(gm_malloc(allocator, 64u << 20, 2, &on_two));
    CHECK_OK(gm_free(allocator, on_two));
    if (stream_two_busy)
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* a kernel queued on stream 2 still runs */
    CHECK_OK(gm_malloc(allocator, 64u << 20, 1, &on_one));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, on_one));
    gm_destroy(allocator, NULL);
    return (idle_elsewhere){stats.reserved_bytes[GM_POOL_ALL].current, stats.device_calls[GM_CALL_UNMAP],
                            stats.device_calls[GM_CALL_EVENT_SYNCHRONIZE]};
}

/* Moving an idle chunk waits for its stream (an unmap under running kernels would fault), which stalls
 * the host until the device catches up. The pages engine pays that to keep reserved memory at its peak
 * only when the other stream has finished its work; while it runs, new memory is made, unless none can
 * be had (a memory limit, a full device): then the chunk moves and the wait is paid. */
static void idle_memory_of_a_busy_stream_stays_put(void)
{
    idle_elsewhere idle = take_idle_memory_of_stream_two("engine:pages,capacity:1GiB", false);
    CHECK_EQ_INT(idle.reserved, 64 << 20); /* moved: the chunk was idle and its stream done */
    CHECK(idle.unmaps > 0);
    idle_elsewhere busy = take_idle_memory_of_stream_two("engine:pages,capacity:1GiB", true);
    CHECK_EQ_INT(busy.reserved, 128 << 20); /* new memory: no unmap, no wait */
    CHECK_EQ_INT(busy.unmaps, 0);
    CHECK_EQ_INT(busy.waits, 0);
    idle_elsewhere short_of_memory = take_idle_memory_of_stream_two("engine:pages,capacity:1GiB,memory_limit:100MiB",
                                                                    true);
    CHECK_EQ_INT(short_of_memory.reserved, 64 << 20); /* moved after waiting for stream 2 */
    CHECK(short_of_memory.unmaps > 0);
    CHECK(short_of_memory.waits > 0);
}

RUN_TESTS(TEST_CASE(freed_block_is_reused_on_its_stream), TEST_CASE(thousands_of_streams_come_and_go), TEST_CASE(streams_do_not_share_cached_blocks),
          TEST_CASE(recorded_stream_delays_reuse_until_its_work_finishes),
          TEST_CASE(work_queued_after_the_free_does_not_delay_reuse),
          TEST_CASE(several_recorded_streams_all_must_finish), TEST_CASE(out_of_memory_waits_for_pending_frees),
          TEST_CASE(work_finishes_oldest_first_and_waits_count_it),
          TEST_CASE(empty_cache_keeps_pending_blocks), TEST_CASE(waiting_frees_cost_one_query_per_busy_stream),
          TEST_CASE(waiting_frees_on_many_streams_cost_one_query_per_stream),
          TEST_CASE(idle_memory_of_a_busy_stream_stays_put))
