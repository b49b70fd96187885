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
 *     where a request needs them (the limit is kept, no request fails); a limit that leaves room is
 *     kept too, but the pattern settles in that room instead of moving a page at every pair;
 *   - generate calls replayed on the same allocator (a KV cache in a growth lane, prefill temporaries
 *     taking turns with it) map almost no page in the warm pass.
 */
#include "test.h"

#include <stdbool.h>

#define MIB (1ull << 20)

/* Device calls that make, map, unmap or release memory: the events the engine records and asks to know
 * its streams' progress (a few per thousand frees, modelled as free) are counted by event_calls. */
static int64_t device_calls(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    int64_t total = 0;
    for (int kind = 0; kind < GM_CALL_EVENT_RECORD; kind++)
        total += stats.device_calls[kind];
    return total;
}

static int64_t event_calls(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    int64_t total = 0;
    for (int kind = GM_CALL_EVENT_RECORD; kind < GM_CALL_KIND_COUNT; kind++)
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

/* The alternating pattern on an allocator made with `config`: after `warm_up` pairs, 10000 more make
 * no device call and reserved memory never passes `most_reserved`. The device calls of the warm-up. */
static int64_t alternating_pairs_settle(const char *config, int warm_up, int64_t most_reserved)
{
    gm_allocator *allocator = make_allocator(config);
    REQUIRE(alternate(allocator, warm_up));
    int64_t calls = device_calls(allocator), events = event_calls(allocator);
    REQUIRE(alternate(allocator, 10000));
    CHECK(event_calls(allocator) - events <= 2 * (10000 / 256 + 1)); /* progress marks: a record and a query per 256 frees */
    printf("     warm-up: %lld device calls, reserved %lld MiB; next 10000 pairs: %lld device calls\n",
           (long long)calls, (long long)(reserved_peak(allocator) / (int64_t)MIB),
           (long long)(device_calls(allocator) - calls));
    CHECK_EQ_INT(device_calls(allocator) - calls, 0);
    CHECK(reserved_peak(allocator) <= most_reserved);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved_now(allocator), 0);
    gm_destroy(allocator, NULL);
    return calls;
}

static void alternating_sizes_settle(void)
{
    /* one page more than the live peak */
    CHECK(alternating_pairs_settle("engine:pages,capacity:16GiB", 1000, 66 * MIB) < 100);
}

static void segments_stop_churning(void)
{
    gm_allocator *allocator = make_allocator("engine:segments,capacity:16GiB");
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
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    void *held[5] = {0};
    for (int round = 0; round < 500; round++)
        streams_round(allocator, held, round);
    int64_t calls = device_calls(allocator), events = event_calls(allocator);
    for (int round = 500; round < 3000; round++)
        streams_round(allocator, held, round);
    CHECK(event_calls(allocator) - events <= 2 * (4 * 2500 / 256 + 1)); /* progress marks: 4 frees a round */
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
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB,memory_limit:64MiB");
    CHECK(alternate(allocator, 2000));
    CHECK(reserved_peak(allocator) <= (int64_t)(64 * MIB));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    /* A limit set later, below what is reserved, gives the extra page back. */
    allocator = make_allocator("engine:pages,capacity:16GiB");
    REQUIRE(alternate(allocator, 1000));
    CHECK(reserved_now(allocator) > (int64_t)(64 * MIB));
    CHECK_OK(gm_set_memory_limit(allocator, 64 * MIB));
    CHECK(reserved_now(allocator) <= (int64_t)(64 * MIB));
    CHECK(alternate(allocator, 1000));
    CHECK(reserved_now(allocator) <= (int64_t)(64 * MIB));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* A limit that leaves room (70 MiB for a pattern that needs 64 and a page) is kept, and once the
 * bounce budget is spent the pattern takes that room instead of moving a page at every pair: a
 * process that sets torch's memory fraction a little above its need pays no device call per step. */
static void memory_limit_with_room_settles(void)
{
    alternating_pairs_settle("engine:pages,capacity:16GiB,memory_limit:70MiB", 1000, 70 * MIB);
}

/* ---------------------------------------------------------------- generate calls, replayed */

#define LAYERS 48
#define PREFILL_TEMPORARIES 6

static int64_t page_maps(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.num_page_maps;
}

static int64_t device_ns(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_call_ns;
}

/* One generate call: a prefill (the KV cache's first tensors, and temporaries that take turns with the
 * cache for the same memory), then `steps` decode steps, each replacing every KV tensor by a copy
 * 64 KiB longer (allocated, then the old one freed, as torch.cat does); the cache is freed at the end. */
static void generate(gm_allocator *allocator, uint64_t prompt, int steps)
{
    void *cache[LAYERS], *temporaries[PREFILL_TEMPORARIES];
    uint64_t size = prompt;
    for (int layer = 0; layer < LAYERS; layer++)
        CHECK_OK(gm_malloc(allocator, size, 0, &cache[layer]));
    for (int index = 0; index < PREFILL_TEMPORARIES; index++)
        CHECK_OK(gm_malloc(allocator, 24 * MIB + 512 * (uint64_t)index, 0, &temporaries[index]));
    for (int index = 0; index < PREFILL_TEMPORARIES; index++)
        CHECK_OK(gm_free(allocator, temporaries[index]));
    for (int step = 0; step < steps; step++) {
        for (int layer = 0; layer < LAYERS; layer++) {
            void *copy = NULL;
            CHECK_OK(gm_malloc(allocator, size + (64 << 10), 0, &copy));
            CHECK_OK(gm_free(allocator, cache[layer]));
            cache[layer] = copy;
        }
        size += 64 << 10;
    }
    for (int layer = 0; layer < LAYERS; layer++)
        CHECK_OK(gm_free(allocator, cache[layer]));
}

/* Weights, then generate calls of different prompt lengths; everything freed at the end. */
static void generate_pass(gm_allocator *allocator)
{
    void *weights[8];
    for (int index = 0; index < 8; index++)
        CHECK_OK(gm_malloc(allocator, 24 * MIB, 0, &weights[index]));
    for (int call = 0; call < 4; call++)
        generate(allocator, 2 * MIB + (uint64_t)(call % 2 ? 3 : 1) * (256 << 10), call % 2 ? 30 : 60);
    for (int index = 0; index < 8; index++)
        CHECK_OK(gm_free(allocator, weights[index]));
}

/* A KV cache's growth lane and the prefill's temporaries take turns with the same memory. Replayed
 * on the same allocator, the generate calls find their pages where the first pass left them: the
 * temporaries borrow the lane's idle memory in place and the lane's ring comes back to its own pages,
 * so the warm pass maps almost no page and reserves no more than the first. (Pages moved between the
 * lane and the stream's heap at every change of phase, and a conveyor that took new pages at every
 * decode step, mapped as many pages in the warm pass as in the first.) */
static void generate_calls_replayed_reuse_their_pages(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    generate_pass(allocator);
    int64_t maps = page_maps(allocator), ns = device_ns(allocator), peak = reserved_peak(allocator);
    generate_pass(allocator);
    int64_t warm_maps = page_maps(allocator) - maps, warm_ns = device_ns(allocator) - ns;
    printf("     cold pass: %lld pages mapped, %.1f ms of device calls, peak reserved %lld MiB; warm pass: %lld "
           "pages mapped, %.1f ms\n", (long long)maps, (double)ns / 1e6, (long long)(peak / (int64_t)MIB),
           (long long)warm_maps, (double)warm_ns / 1e6);
    CHECK(warm_maps <= 16);
    CHECK(warm_ns * 20 <= ns);
    CHECK_EQ_INT(reserved_peak(allocator), peak);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved_now(allocator), 0);
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(alternating_sizes_settle), TEST_CASE(streams_freeing_each_other_settle),
          TEST_CASE(memory_limit_still_moves_pages), TEST_CASE(memory_limit_with_room_settles), TEST_CASE(segments_stop_churning),
          TEST_CASE(generate_calls_replayed_reuse_their_pages))
