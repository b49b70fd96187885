/*
 * test_device_cost.c -- the pages engine spends device calls only where they buy memory that is
 * needed (issue 16, "bounded device-call cost"), exact counts on the sim:
 *   - alternating 1 MiB / 64 MiB alloc+free pairs make no device call at all after warm-up (the
 *     engine used to move one page at every pair to keep reserved memory at exactly 64 MiB);
 *   - streams that free each other's memory settle, each keeping its own, with no device call after
 *     warm-up;
 *   - the segments engine's release_before_growth stops freeing and re-making a segment at every
 *     pair once its budget of device time is spent;
 *   - empty_cache still gives every idle page back, and under a memory limit pages still move to
 *     where a request needs them (the limit is kept, no request fails).
 */
#include "test.h"

#include <stdbool.h>

#define MIB (1ull << 20)

static gm_allocator *make(const char *config)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator != NULL);
    return allocator;
}

static int64_t device_calls(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    int64_t total = 0;
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        total += stats.device_calls[kind];
    return total;
}

static int64_t reserved_now(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.reserved_bytes[GM_POOL_ALL].current;
}

static int64_t reserved_peak(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.reserved_bytes[GM_POOL_ALL].peak;
}

/* `pairs` alloc+free pairs alternating 1 MiB and 64 MiB on stream 0; false if one failed. */
static bool alternate(gm_allocator *allocator, int pairs)
{
    for (int pair = 0; pair < pairs; pair++) {
        void *pointer = NULL;
        if (gm_malloc(allocator, pair % 2 ? 64 * MIB : 1 * MIB, 0, &pointer) != GM_OK)
            return false;
        CHECK_OK(gm_free(allocator, pointer));
    }
    return true;
}

static void alternating_sizes_settle(void)
{
    gm_allocator *allocator = make("engine:pages,capacity:16GiB");
    REQUIRE(alternate(allocator, 1000));
    int64_t calls = device_calls(allocator);
    REQUIRE(alternate(allocator, 10000));
    printf("     warm-up: %lld device calls, reserved %lld MiB; next 10000 pairs: %lld device calls\n",
           (long long)calls, (long long)(reserved_peak(allocator) / (int64_t)MIB),
           (long long)(device_calls(allocator) - calls));
    CHECK_EQ_INT(device_calls(allocator) - calls, 0);
    CHECK(calls < 100);
    CHECK(reserved_peak(allocator) <= (int64_t)(66 * MIB)); /* one page more than the live peak */
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved_now(allocator), 0);
    gm_destroy(allocator, NULL);
}

static void segments_stop_churning(void)
{
    gm_allocator *allocator = make("engine:segments,capacity:16GiB");
    REQUIRE(alternate(allocator, 4000)); /* spends the initial budget (100 ms of modelled time) */
    int64_t calls = device_calls(allocator);
    REQUIRE(alternate(allocator, 10000));
    printf("     warm-up: %lld device calls; next 10000 pairs: %lld\n", (long long)calls,
           (long long)(device_calls(allocator) - calls));
    CHECK_EQ_INT(device_calls(allocator) - calls, 0);
    CHECK(reserved_peak(allocator) <= (int64_t)(66 * MIB));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved_now(allocator), 0);
    gm_destroy(allocator, NULL);
}

/* Four streams; each frees what the previous stream allocated, then allocates on its own stream. */
static void streams_round(gm_allocator *allocator, void *held[5], int round)
{
    for (int stream = 1; stream <= 4; stream++) {
        int giver = stream > 1 ? stream - 1 : 4;
        if (held[giver]) {
            CHECK_OK(gm_free(allocator, held[giver]));
            held[giver] = NULL;
        }
        uint64_t size = (16 + 4 * (uint64_t)((round + stream) % 5)) * MIB;
        CHECK_OK(gm_malloc(allocator, size, (gm_stream)stream, &held[stream]));
    }
}

static void streams_freeing_each_other_settle(void)
{
    gm_allocator *allocator = make("engine:pages,capacity:16GiB");
    void *held[5] = {0};
    for (int round = 0; round < 500; round++)
        streams_round(allocator, held, round);
    int64_t calls = device_calls(allocator);
    for (int round = 500; round < 3000; round++)
        streams_round(allocator, held, round);
    printf("     warm-up: %lld device calls, reserved %lld MiB; next 2500 rounds: %lld device calls\n",
           (long long)calls, (long long)(reserved_peak(allocator) / (int64_t)MIB),
           (long long)(device_calls(allocator) - calls));
    CHECK_EQ_INT(device_calls(allocator) - calls, 0);
    CHECK_OK(gm_validate(allocator));
    for (int stream = 1; stream <= 4; stream++)
        if (held[stream])
            CHECK_OK(gm_free(allocator, held[stream]));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved_now(allocator), 0);
    gm_destroy(allocator, NULL);
}

/* Under a memory limit of 64 MiB the alternating pattern still fits: the page moves again. */
static void memory_limit_still_moves_pages(void)
{
    gm_allocator *allocator = make("engine:pages,capacity:16GiB,memory_limit:64MiB");
    CHECK(alternate(allocator, 2000));
    CHECK(reserved_peak(allocator) <= (int64_t)(64 * MIB));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    /* A limit set later, below what is reserved, gives the extra page back. */
    allocator = make("engine:pages,capacity:16GiB");
    REQUIRE(alternate(allocator, 1000));
    CHECK(reserved_now(allocator) > (int64_t)(64 * MIB));
    CHECK_OK(gm_set_memory_limit(allocator, 64 * MIB));
    CHECK(reserved_now(allocator) <= (int64_t)(64 * MIB));
    CHECK(alternate(allocator, 1000));
    CHECK(reserved_now(allocator) <= (int64_t)(64 * MIB));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(alternating_sizes_settle), TEST_CASE(streams_freeing_each_other_settle),
          TEST_CASE(memory_limit_still_moves_pages), TEST_CASE(segments_stop_churning))
