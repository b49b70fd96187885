/*
 * test_host.c -- a million randomized operations (fixed seed) on real host memory: every live
 * allocation carries a data pattern that is checked when it is freed and, all of them, every
 * 10000 operations; any overlap of live allocations, or live memory that the engine unmapped or
 * remapped under them, shows as a broken pattern (or a fault). Both engines; the pages engine
 * with a small capacity so that physical chunks are moved and released often.
 */
#include "test.h"

#include "pattern.h"

#define MAX_LIVE 2048

typedef struct live_allocation {
    char *pointer;
    size_t size;
    uint64_t identity;
} live_allocation;

static live_allocation live[MAX_LIVE];

static size_t random_size(uint64_t *seed)
{
    uint64_t choice = test_random(seed) % 1000;
    if (choice < 700)
        return 1 + test_random(seed) % 2048;
    if (choice < 950)
        return 1 + test_random(seed) % (256u << 10);
    if (choice < 998)
        return (1u << 20) + test_random(seed) % (6u << 20);
    return (16u << 20) + test_random(seed) % (48u << 20);
}

static int verify_all(size_t count)
{
    int broken = 0;
    for (size_t i = 0; i < count; i++)
        broken += !pattern_intact(live[i].pointer, live[i].size, live[i].identity);
    return broken;
}

static void randomized_host_workload(const char *config, int operations, uint64_t seed)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    size_t count = 0;
    uint64_t identity = 0;
    int ooms = 0, broken = 0;
    for (int step = 0; step < operations && !broken; step++) {
        uint64_t action = test_random(&seed) % 100;
        if (action < 52 && count < MAX_LIVE) {
            size_t size = random_size(&seed);
            void *pointer = NULL;
            gm_stream stream = (gm_stream)(test_random(&seed) % 2);
            gm_status status = gm_malloc(allocator, size, stream, &pointer);
            if (status == GM_ERROR_OUT_OF_MEMORY) {
                ooms++;
                continue;
            }
            CHECK_OK(status);
            live[count] = (live_allocation){pointer, size, ++identity};
            pattern_stamp(pointer, size, identity);
            count++;
        } else if (action < 99 && count) {
            size_t victim = test_random(&seed) % count;
            if (!pattern_intact(live[victim].pointer, live[victim].size, live[victim].identity)) {
                fprintf(stderr, "[%s] step %d: allocation %p of %zu bytes was overwritten\n", config, step,
                        (void *)live[victim].pointer, live[victim].size);
                broken++;
            }
            if (test_random(&seed) % 8 == 0) {
                CHECK_OK(gm_record_stream(allocator, live[victim].pointer, 5));
                CHECK_OK(gm_sim_stream_enqueue(allocator, 5, 1));
            }
            CHECK_OK(gm_free(allocator, live[victim].pointer));
            live[victim] = live[--count];
            if (test_random(&seed) % 16 == 0)
                CHECK_OK(gm_sim_stream_complete(allocator, 5));
        } else {
            CHECK_OK(gm_empty_cache(allocator));
        }
        if (step % 10000 == 0) {
            broken += verify_all(count);
            CHECK_OK(gm_validate(allocator));
        }
    }
    CHECK_EQ_INT(broken, 0);
    CHECK(ooms > 0);
    CHECK_EQ_INT(verify_all(count), 0);
    CHECK_OK(gm_validate(allocator));
    for (size_t i = 0; i < count; i++)
        CHECK_OK(gm_free(allocator, live[i].pointer));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].allocated, (int64_t)identity);
    gm_destroy(allocator, NULL);
}

static void million_operations_pages_engine(void)
{
    randomized_host_workload("backend:host,engine:pages,capacity:160MiB", 1000000, 0xC0FFEE);
}

static void operations_pages_engine_small_pages(void)
{
    randomized_host_workload("backend:host,engine:pages,capacity:96MiB,page_size:64KiB", 200000, 0xBEEF);
}

static void operations_segments_engine(void)
{
    randomized_host_workload("backend:host,engine:segments,capacity:160MiB", 300000, 0xFACE);
}

RUN_TESTS(TEST_CASE(million_operations_pages_engine), TEST_CASE(operations_pages_engine_small_pages),
          TEST_CASE(operations_segments_engine))
