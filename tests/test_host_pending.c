/*
 * test_host_pending.c -- the pinned host cache's freed blocks that wait for their streams
 * (core/host_pending.c) on the sim backend: a block is never handed out before its streams were seen
 * idle after its free (or an event recorded after it is done); an alloc/free loop on an idle stream asks
 * the stream once per rotation of a small class, not once per free, and holds at most the rotation's
 * blocks; large classes hold one; host_limit and gm_host_empty_cache with waiting blocks; failing events;
 * a stream being captured, and a block freed during its stream's capture; gm_host_free_with_streams.
 */
#include "test.h"

#include "core/allocator.h"

#include <stdint.h>

static const char *const config = "backend:sim,capacity:1GiB";

static int64_t stream_queries(gm_allocator *allocator)
{
    return allocator->arena.backend->stream_queries; /* read between calls, from this thread only */
}

static gm_host_stats host_stats(gm_allocator *allocator)
{
    gm_host_stats stats;
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    return stats;
}

/* One alloc/free of `size` bytes used on `stream`; the block's address. */
static void *use_once(gm_allocator *allocator, size_t size, gm_stream stream)
{
    void *block = NULL;
    CHECK_OK(gm_host_malloc(allocator, size, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, stream));
    CHECK_OK(gm_host_free(allocator, block));
    return block;
}

/* A block freed while a copy on its stream is queued is handed out by none of the allocations that
 * follow (those that make new blocks without looking, those that look and find the stream busy), and
 * by one of the next looks once the copy is done. */
static void a_block_freed_on_a_busy_stream_waits_for_it(void)
{
    static const size_t sizes[] = {4096, 32u << 10, 1u << 20}; /* rotations of 8, 2 and 1 blocks */
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(config, &allocator));
        void *busy = NULL;
        CHECK_OK(gm_host_malloc(allocator, sizes[s], &busy));
        CHECK_OK(gm_host_record_stream(allocator, busy, 2));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* a copy from it */
        CHECK_OK(gm_host_free(allocator, busy));
        for (int i = 0; i < 40; i++)
            CHECK(use_once(allocator, sizes[s], 0) != busy); /* the legacy default stream is idle */
        CHECK(host_stats(allocator).pending_blocks >= 1);
        CHECK_OK(gm_sim_stream_complete(allocator, 2));
        bool reused = false;
        for (int i = 0; i < 20 && !reused; i++)
            reused = use_once(allocator, sizes[s], 0) == busy;
        CHECK(reused);
        gm_destroy(allocator, NULL);
    }
}

/* The rotation of a class: the blocks an idle alloc/free loop makes before it asks the stream. */
typedef struct rotation {
    size_t size;
    int64_t blocks;
} rotation;

static const rotation rotations[] = {{512, 8}, {4096, 8}, {8192, 8}, {16u << 10, 4}, {32u << 10, 2}, {64u << 10, 1},
                                     {1u << 20, 1}, {64u << 20, 1}};

/* Freed on an idle stream, a small class's blocks are checked K at a time: one stream query per K
 * allocations, and K blocks held; a large class (K = 1) holds its one block and asks at each reuse. */
static void an_idle_loop_asks_once_per_rotation(void)
{
    enum { iterations = 100 };
    for (size_t r = 0; r < sizeof rotations / sizeof rotations[0]; r++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(config, &allocator));
        int64_t before = stream_queries(allocator);
        for (int i = 0; i < iterations; i++)
            use_once(allocator, rotations[r].size, 0);
        int64_t blocks = rotations[r].blocks, queries = stream_queries(allocator) - before;
        gm_host_stats stats = host_stats(allocator);
        if (queries > (iterations - 1) / blocks || stats.host_allocations != blocks)
            fprintf(stderr, "  %zu bytes: %lld stream queries, %lld blocks made in %d alloc/free\n", rotations[r].size,
                    (long long)queries, (long long)stats.host_allocations, iterations);
        CHECK(queries <= (iterations - 1) / blocks);
        CHECK_EQ_INT(stats.host_allocations, blocks);
        CHECK_EQ_INT(stats.reserved_bytes.peak, blocks * (int64_t)(rotations[r].size < 512 ? 512 : rotations[r].size));
        CHECK_EQ_INT(stats.cache_hits + stats.cache_misses, iterations);
        CHECK(stats.pending_blocks <= blocks);
        gm_destroy(allocator, NULL);
    }
}

/* A block held the whole time does not stop the rotation: it counts the freed blocks waiting, not the
 * live ones (CuPy keeps a transfer's staging block until its copy is done, while the next is made). */
static void a_held_block_leaves_the_rotation_alone(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *held = NULL;
    CHECK_OK(gm_host_malloc(allocator, 4096, &held));
    int64_t before = stream_queries(allocator);
    for (int i = 0; i < 81; i++)
        use_once(allocator, 4096, 0);
    CHECK(stream_queries(allocator) - before <= 10);
    CHECK_EQ_INT(host_stats(allocator).host_allocations, 1 + 8);
    CHECK_OK(gm_host_free(allocator, held));
    gm_destroy(allocator, NULL);
}

/* host_limit: the rotation never makes a block past it (the waiting blocks are checked and reused
 * first, none given back); a miss that cannot fit fails with the message once the idle blocks of other
 * classes are given back, and the blocks still waiting for a busy stream are kept. */
static void host_limit_checks_waiting_blocks_first(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB,host_limit:16KiB", &allocator));
    for (int i = 0; i < 50; i++)
        use_once(allocator, 4096, 0);
    gm_host_stats stats = host_stats(allocator);
    CHECK_EQ_INT(stats.reserved_bytes.peak, 16 << 10);
    CHECK_EQ_INT(stats.host_frees, 0);
    CHECK_OK(gm_host_empty_cache(allocator));
    CHECK_EQ_INT(host_stats(allocator).reserved_bytes.current, 0);

    void *busy[3], *idle = NULL, *refused = &refused;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_host_malloc(allocator, 4096, &busy[i]));
        CHECK_OK(gm_host_record_stream(allocator, busy[i], 2));
    }
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_host_free(allocator, busy[i]));
    idle = use_once(allocator, 2048, 3); /* 12 KiB waiting, 2 KiB unchecked */
    CHECK_STATUS(gm_host_malloc(allocator, 8192, &refused), GM_ERROR_OUT_OF_MEMORY);
    CHECK_MESSAGE("host_limit");
    CHECK(refused == NULL);
    stats = host_stats(allocator);
    CHECK_EQ_INT(stats.reserved_bytes.current, 12 << 10); /* the 2 KiB block, found idle, went back */
    CHECK_EQ_INT(stats.pending_blocks, 3);
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    CHECK_OK(gm_host_malloc(allocator, 8192, &idle)); /* the three go back, then it fits */
    CHECK_EQ_INT(host_stats(allocator).reserved_bytes.current, 8 << 10);
    CHECK_OK(gm_host_free(allocator, idle));
    gm_destroy(allocator, NULL);
}

/* gm_host_empty_cache checks the unchecked blocks: those on idle streams go back, those on a busy one
 * stay until it is done. */
static void empty_cache_releases_checked_blocks_and_keeps_busy_ones(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *busy = NULL;
    CHECK_OK(gm_host_malloc(allocator, 4096, &busy));
    CHECK_OK(gm_host_record_stream(allocator, busy, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 1, 1));
    CHECK_OK(gm_host_free(allocator, busy));
    use_once(allocator, 4096, 0);
    use_once(allocator, 1u << 20, 0);
    CHECK_EQ_INT(host_stats(allocator).pending_blocks, 3);
    CHECK_OK(gm_host_empty_cache(allocator));
    gm_host_stats stats = host_stats(allocator);
    CHECK_EQ_INT(stats.reserved_bytes.current, 4096);
    CHECK_EQ_INT(stats.pending_blocks, 1);
    CHECK_EQ_INT(stats.host_frees, 2);
    CHECK_OK(gm_sim_stream_complete(allocator, 1));
    CHECK_OK(gm_host_empty_cache(allocator));
    stats = host_stats(allocator);
    CHECK_EQ_INT(stats.reserved_bytes.current, 0);
    CHECK_EQ_INT(stats.pending_blocks, 0);
    gm_destroy(allocator, NULL);
}

/* An event that cannot be recorded at a look leaves the block unchecked, never handed out; the next
 * look records it, and the block is reused once the stream is done. */
static void a_failed_event_keeps_the_block_waiting(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *busy = NULL;
    CHECK_OK(gm_host_malloc(allocator, 1u << 20, &busy));
    CHECK_OK(gm_host_record_stream(allocator, busy, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 1, 1));
    CHECK_OK(gm_host_free(allocator, busy));
    CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_EVENT_RECORD, 0, 3));
    for (int i = 0; i < 6; i++)
        CHECK(use_once(allocator, 1u << 20, 0) != busy);
    CHECK_EQ_INT(host_stats(allocator).pending_blocks, 2); /* it, and the last one freed (unchecked) */
    CHECK_OK(gm_sim_stream_complete(allocator, 1));
    bool reused = false;
    for (int i = 0; i < 4 && !reused; i++)
        reused = use_once(allocator, 1u << 20, 0) == busy;
    CHECK(reused);
    gm_destroy(allocator, NULL);
}

/* gm_destroy with blocks never checked, on a busy stream whose events cannot be waited for: every block
 * is still given back. */
static void destroy_gives_back_unchecked_blocks(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *block = NULL;
    CHECK_OK(gm_host_malloc(allocator, 4096, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 1, 1));
    CHECK_OK(gm_host_free(allocator, block));
    use_once(allocator, 4096, 0);
    CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_EVENT_SYNCHRONIZE, 0, UINT64_MAX));
    gm_destroy(allocator, NULL); /* AddressSanitizer's leak check sees a block left behind */
}

static int64_t event_records(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[GM_CALL_EVENT_RECORD];
}

/* gm_host_free_with_streams is gm_host_record_stream for each stream, then gm_host_free: the same errors
 * (an error changes nothing), a stream given twice or recorded before counts once, none is a plain free. */
static void free_with_streams_records_then_frees(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    gm_stream twice[] = {1, 1}, legacy_two[] = {0, 1};
    int local = 0;
    CHECK_STATUS(gm_host_free_with_streams(NULL, &local, twice, 2), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("gm_host_free_with_streams: allocator is NULL");
    CHECK_OK(gm_host_free_with_streams(allocator, NULL, twice, 2));
    CHECK_STATUS(gm_host_free_with_streams(allocator, &local, twice, 2), GM_ERROR_INVALID_POINTER);
    CHECK_MESSAGE("gm_host_free_with_streams: ");
    CHECK_MESSAGE("not a live pinned host allocation");
    void *block = NULL, *other = NULL, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, 1u << 20, &block));
    CHECK_STATUS(gm_host_free_with_streams(allocator, block, NULL, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("streams is NULL");
    CHECK_EQ_INT(host_stats(allocator).allocations.current, 1); /* still live */

    CHECK_OK(gm_sim_stream_enqueue(allocator, 1, 1));
    CHECK_OK(gm_host_free_with_streams(allocator, block, twice, 2));
    CHECK_EQ_INT(host_stats(allocator).pending_blocks, 1);
    CHECK_STATUS(gm_host_free_with_streams(allocator, block, twice, 2), GM_ERROR_INVALID_POINTER);
    CHECK_MESSAGE("already freed");
    int64_t asked = stream_queries(allocator), recorded = event_records(allocator);
    CHECK_OK(gm_host_malloc(allocator, 1u << 20, &other)); /* the look: stream 1 asked once, one event */
    CHECK(other != block);
    CHECK_EQ_INT(stream_queries(allocator) - asked, 1);
    CHECK_EQ_INT(event_records(allocator) - recorded, 1);

    CHECK_OK(gm_host_free_with_streams(allocator, other, NULL, 0)); /* no streams: reusable at once */
    CHECK_EQ_INT(host_stats(allocator).pending_blocks, 1);
    CHECK_OK(gm_host_malloc(allocator, 1u << 20, &again));
    CHECK(again == other);
    CHECK_OK(gm_host_record_stream(allocator, again, 0));
    CHECK_OK(gm_host_free_with_streams(allocator, again, legacy_two, 2)); /* streams 0 and 1 */
    asked = stream_queries(allocator);
    CHECK_OK(gm_host_empty_cache(allocator));
    CHECK_EQ_INT(stream_queries(allocator) - asked, 2);
    gm_host_stats stats = host_stats(allocator);
    CHECK_EQ_INT(stats.reserved_bytes.current, 2 << 20); /* `block` and `again` wait for stream 1 */
    CHECK_EQ_INT(stats.allocations.allocated, 3);
    CHECK_EQ_INT(stats.allocations.current, 0);
    CHECK_EQ_INT(stats.requested_bytes, 0);
    gm_destroy(allocator, NULL);
}

/* A stream its owner may destroy once the free returns (any but the legacy default stream, 0 and 1) is
 * asked at the free and never after: idle, the block is reusable at once; busy, an event is recorded on
 * it at the free, and the looks ask the event, not the stream. If the event cannot be recorded the free
 * fails and the block stays live, until a free that can. */
static void a_stream_its_owner_may_destroy_is_asked_at_the_free(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *block = NULL, *again = NULL, *other = NULL;
    CHECK_OK(gm_host_malloc(allocator, 4096, &block));
    int64_t asked = stream_queries(allocator);
    gm_stream own = 7;
    CHECK_OK(gm_host_free_with_streams(allocator, block, &own, 1)); /* stream 7 idle */
    CHECK_EQ_INT(stream_queries(allocator) - asked, 1);
    CHECK_EQ_INT(host_stats(allocator).pending_blocks, 0);
    CHECK_OK(gm_host_malloc(allocator, 4096, &again));
    CHECK(again == block);
    CHECK_EQ_INT(stream_queries(allocator) - asked, 1);

    CHECK_OK(gm_sim_stream_enqueue(allocator, 7, 1)); /* a copy from it */
    int64_t recorded = event_records(allocator);
    CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_EVENT_RECORD, 0, 1));
    CHECK(gm_host_free_with_streams(allocator, again, &own, 1) != GM_OK);
    CHECK_EQ_INT(host_stats(allocator).allocations.current, 1); /* still live */
    CHECK_OK(gm_host_free_with_streams(allocator, again, &own, 1));
    CHECK_EQ_INT(event_records(allocator) - recorded, 1);
    CHECK_EQ_INT(host_stats(allocator).pending_blocks, 1);
    asked = stream_queries(allocator);
    for (int i = 0; i < 20; i++) { /* the stream is never asked again: it may be gone */
        CHECK_OK(gm_host_malloc(allocator, 4096, &other));
        CHECK(other != block);
        CHECK_OK(gm_host_free(allocator, other));
    }
    CHECK_OK(gm_host_empty_cache(allocator));
    CHECK_EQ_INT(stream_queries(allocator) - asked, 0);
    CHECK_OK(gm_sim_stream_complete(allocator, 7));
    CHECK_OK(gm_host_malloc(allocator, 4096, &other));
    CHECK(other == block);
    CHECK_EQ_INT(stream_queries(allocator) - asked, 0);
    CHECK_OK(gm_host_free(allocator, other));
    gm_destroy(allocator, NULL);
}

/* The legacy stream while it reads as capturing (another stream's capture makes it unusable) is not
 * asked (the query would break the capture) and gets no event (it would be a node of the graph): its
 * blocks, freed before, stay unchecked until a look after the capture. */
static void a_capturing_stream_is_left_alone(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    void *block = NULL, *held[3] = {NULL}, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, 1u << 20, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, 0));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1));
    CHECK_OK(gm_host_free(allocator, block));
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 1));
    int64_t asked = stream_queries(allocator), recorded = event_records(allocator);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_host_malloc(allocator, 1u << 20, &held[i])); /* each looks: stream 0 is not asked */
        CHECK(held[i] != block);
    }
    CHECK_EQ_INT(stream_queries(allocator) - asked, 0);
    CHECK_EQ_INT(event_records(allocator) - recorded, 0);
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 0));
    CHECK_OK(gm_sim_stream_complete(allocator, 0));
    CHECK_OK(gm_host_malloc(allocator, 1u << 20, &again));
    CHECK(again == block);
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_host_free(allocator, held[i]));
    CHECK_OK(gm_host_free(allocator, again));
    gm_destroy(allocator, NULL);
}

/* A block freed while one of its streams is being captured into a CUDA graph (the per-thread default
 * stream, 2, or any other) may be copied by the graph at every replay: the free neither asks the stream
 * nor records an event on it, and the block is never handed out again, not after the capture, not once
 * the stream is idle, not by an empty_cache; gm_destroy gives it back (AddressSanitizer's leak check). A
 * block freed on the same stream once the capture is over is reused as usual. */
static void a_block_freed_during_its_streams_capture_is_held_for_the_graph(void)
{
    static const gm_stream captured[] = {2, 7};
    for (size_t s = 0; s < sizeof captured / sizeof captured[0]; s++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(config, &allocator));
        gm_stream stream = captured[s];
        void *block = NULL, *other = NULL, *after = NULL, *again = NULL;
        CHECK_OK(gm_host_malloc(allocator, 4096, &block));
        CHECK_OK(gm_sim_stream_set_capturing(allocator, stream, 1));
        int64_t asked = stream_queries(allocator), recorded = event_records(allocator);
        CHECK_OK(gm_host_free_with_streams(allocator, block, &stream, 1));
        CHECK_EQ_INT(stream_queries(allocator) - asked, 0);
        CHECK_EQ_INT(event_records(allocator) - recorded, 0);
        CHECK_EQ_INT(host_stats(allocator).pending_blocks, 1);
        CHECK_OK(gm_sim_stream_set_capturing(allocator, stream, 0));
        for (int i = 0; i < 40; i++)
            CHECK(use_once(allocator, 4096, 0) != block);
        CHECK_OK(gm_host_empty_cache(allocator));
        gm_host_stats stats = host_stats(allocator);
        CHECK_EQ_INT(stats.pending_blocks, 1);
        CHECK_EQ_INT(stats.reserved_bytes.current, 4096);
        CHECK_OK(gm_host_malloc(allocator, 4096, &other));
        CHECK(other != block);
        CHECK_OK(gm_host_free_with_streams(allocator, other, &stream, 1)); /* after the capture: idle */
        CHECK_OK(gm_host_malloc(allocator, 4096, &after));
        CHECK(after == other);
        CHECK_OK(gm_host_malloc(allocator, 4096, &again));
        CHECK(again != block);
        CHECK_OK(gm_host_free(allocator, after));
        CHECK_OK(gm_host_free(allocator, again));
        gm_destroy(allocator, NULL);
    }
}

RUN_TESTS(TEST_CASE(a_block_freed_on_a_busy_stream_waits_for_it), TEST_CASE(an_idle_loop_asks_once_per_rotation),
          TEST_CASE(a_held_block_leaves_the_rotation_alone), TEST_CASE(host_limit_checks_waiting_blocks_first),
          TEST_CASE(empty_cache_releases_checked_blocks_and_keeps_busy_ones),
          TEST_CASE(a_failed_event_keeps_the_block_waiting), TEST_CASE(destroy_gives_back_unchecked_blocks),
          TEST_CASE(free_with_streams_records_then_frees),
          TEST_CASE(a_stream_its_owner_may_destroy_is_asked_at_the_free), TEST_CASE(a_capturing_stream_is_left_alone),
          TEST_CASE(a_block_freed_during_its_streams_capture_is_held_for_the_graph))
