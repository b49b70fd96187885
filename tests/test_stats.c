/*
 * test_stats.c -- statistics against values recomputed from the live set, after every operation.
 *
 * A randomized workload (fixed seed) of allocations of mixed sizes on several streams, frees,
 * record_stream with simulated stream work, empty_cache and out-of-memory failures runs on the sim
 * backend under each engine. After every operation: gm_validate (which recomputes every current
 * statistic from the heap and compares), and the test's own model of the live set gives the
 * allocation count, allocated, requested and active bytes. Live allocations never overlap.
 */
#include "test.h"

#define MAX_LIVE 4096

typedef struct live_allocation {
    char *pointer;
    size_t size;
} live_allocation;

static live_allocation live[MAX_LIVE];
static size_t live_count;

static size_t random_size(uint64_t *seed)
{
    uint64_t choice = test_random(seed) % 100;
    if (choice < 55)
        return 1 + test_random(seed) % 4096;
    if (choice < 80)
        return 1 + test_random(seed) % (1u << 20);
    if (choice < 98)
        return (1u << 20) + test_random(seed) % (24u << 20);
    return (64u << 20) + test_random(seed) % (400u << 20); /* sometimes too large to fit */
}

static int compare_pointers(const void *left, const void *right)
{
    const live_allocation *a = left, *b = right;
    return a->pointer < b->pointer ? -1 : a->pointer > b->pointer;
}

static void check_against_model(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    int64_t requested = 0, allocated = 0;
    for (size_t i = 0; i < live_count; i++) {
        size_t usable = 0;
        CHECK_OK(gm_allocation_size(allocator, live[i].pointer, &usable));
        CHECK(usable >= live[i].size && usable % 512 == 0);
        requested += (int64_t)live[i].size;
        allocated += (int64_t)usable;
    }
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].current, live_count);
    CHECK_EQ_INT(stats.requested_bytes[GM_POOL_ALL].current, requested);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, allocated);
    CHECK(stats.active_bytes[GM_POOL_ALL].current >= allocated);
    CHECK(stats.reserved_bytes[GM_POOL_ALL].current >= stats.active_bytes[GM_POOL_ALL].current);
    CHECK(stats.reserved_bytes[GM_POOL_ALL].peak >= stats.reserved_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current,
                 stats.allocated_bytes[GM_POOL_SMALL].current + stats.allocated_bytes[GM_POOL_LARGE].current);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].allocated - stats.allocated_bytes[GM_POOL_ALL].freed,
                 stats.allocated_bytes[GM_POOL_ALL].current);
}

static void check_no_overlap(gm_allocator *allocator)
{
    static live_allocation sorted[MAX_LIVE];
    memcpy(sorted, live, live_count * sizeof *live);
    qsort(sorted, live_count, sizeof *sorted, compare_pointers);
    for (size_t i = 1; i < live_count; i++) {
        size_t usable = 0;
        gm_allocation_size(allocator, sorted[i - 1].pointer, &usable);
        CHECK(sorted[i - 1].pointer + usable <= sorted[i].pointer);
    }
}

static void run_workload(const char *config, uint64_t seed, int operations)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    live_count = 0;
    int ooms = 0;
    for (int step = 0; step < operations; step++) {
        uint64_t action = test_random(&seed) % 100;
        gm_stream stream = (gm_stream)(test_random(&seed) % 3);
        if (action < 50 && live_count < MAX_LIVE) {
            size_t size = random_size(&seed);
            void *pointer = NULL;
            gm_status status = gm_malloc(allocator, size, stream, &pointer);
            if (status == GM_ERROR_OUT_OF_MEMORY) {
                ooms++;
                CHECK(pointer == NULL);
                CHECK_MESSAGE("out of memory");
            } else {
                CHECK_OK(status);
                live[live_count++] = (live_allocation){pointer, size};
            }
        } else if (action < 92 && live_count) {
            size_t victim = test_random(&seed) % live_count;
            CHECK_OK(gm_free(allocator, live[victim].pointer));
            live[victim] = live[--live_count];
        } else if (action < 96 && live_count) {
            /* Use on another stream, with work queued there that finishes later. */
            size_t target = test_random(&seed) % live_count;
            gm_stream other = (gm_stream)(3 + test_random(&seed) % 2);
            CHECK_OK(gm_record_stream(allocator, live[target].pointer, other));
            CHECK_OK(gm_sim_stream_enqueue(allocator, other, 1));
        } else if (action < 98) {
            CHECK_OK(gm_sim_stream_complete(allocator, (gm_stream)(3 + test_random(&seed) % 2)));
        } else {
            CHECK_OK(gm_empty_cache(allocator));
        }
        gm_status valid = gm_validate(allocator);
        if (valid != GM_OK) {
            fprintf(stderr, "[%s] step %d: %s\n", config, step, gm_last_error());
            test_failures++;
            break;
        }
        check_against_model(allocator);
        if (step % 64 == 0)
            check_no_overlap(allocator);
    }
    CHECK(ooms > 0); /* the workload is sized to reach the capacity */
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.num_ooms, ooms);
    for (size_t i = 0; i < live_count; i++)
        CHECK_OK(gm_free(allocator, live[i].pointer));
    live_count = 0;
    CHECK_OK(gm_sim_stream_complete(allocator, 3));
    CHECK_OK(gm_sim_stream_complete(allocator, 4));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(stats.active_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
    size_t leaked = 1;
    gm_destroy(allocator, &leaked);
    CHECK_EQ_INT(leaked, 0);
}

static void stats_follow_the_live_set_pages(void)
{
    run_workload("engine:pages,capacity:512MiB", 0x1234, 20000);
}

static void stats_follow_the_live_set_pages_small_pages(void)
{
    run_workload("engine:pages,capacity:256MiB,page_size:64KiB", 0x777, 20000);
}

static void stats_follow_the_live_set_segments(void)
{
    run_workload("engine:segments,capacity:512MiB", 0x1234, 20000);
}

static void stats_follow_the_live_set_segments_no_release(void)
{
    run_workload("engine:segments,capacity:512MiB,release_before_growth:false", 0x99, 20000);
}

static void stats_follow_the_live_set_memory_limit(void)
{
    run_workload("engine:pages,capacity:4GiB,memory_limit:300MiB", 0x4242, 20000);
}

/* The statistics lists of gpumem.h are what the names, the struct and the summary follow: every
 * statistic is named in order (gm_stat_name, gm_counter_name, which the Python binding builds gm_stats
 * from), the struct holds exactly the listed fields, and each has its row in the summary. */
static void every_listed_statistic_is_named_shown_and_validated(void)
{
#define POOL_NAME(field, label, unit, origin) #field,
#define POOL_LABEL(field, label, unit, origin) label,
    static const char *const names[] = {GM_POOL_STATISTICS(POOL_NAME)};
    static const char *const labels[] = {GM_POOL_STATISTICS(POOL_LABEL)};
#define COUNTER_NAME(field, label, origin) #field,
    static const char *const counters[] = {GM_COUNTERS(COUNTER_NAME)};
    size_t count = sizeof names / sizeof names[0], counter_count = sizeof counters / sizeof counters[0];
    for (size_t i = 0; i < count; i++)
        CHECK(gm_stat_name(i) && !strcmp(gm_stat_name(i), names[i]));
    CHECK(gm_stat_name(count) == NULL);
    for (size_t i = 0; i < counter_count; i++)
        CHECK(gm_counter_name(i) && !strcmp(gm_counter_name(i), counters[i]));
    CHECK(gm_counter_name(counter_count) == NULL);
    CHECK_EQ_INT(gm_device_call_count(), GM_CALL_KIND_COUNT);
    CHECK_EQ_INT(sizeof(gm_stats), (count * GM_POOL_COUNT * sizeof(gm_stat)) + counter_count * sizeof(int64_t) +
                                       (2 * GM_CALL_KIND_COUNT + 1) * sizeof(int64_t) + 2 * sizeof(uint64_t));

    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, 3 << 20, 0, &pointer));
    char table[8192];
    CHECK_OK(gm_summary(allocator, table, sizeof table, NULL));
    for (size_t i = 0; i < count; i++)
        CHECK(strstr(table, labels[i]) != NULL);
    CHECK(strstr(table, "Pages mapped") != NULL && strstr(table, "Pages unmapped") != NULL);
    CHECK_OK(gm_free(allocator, pointer));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(every_listed_statistic_is_named_shown_and_validated), TEST_CASE(stats_follow_the_live_set_pages), TEST_CASE(stats_follow_the_live_set_pages_small_pages),
          TEST_CASE(stats_follow_the_live_set_segments), TEST_CASE(stats_follow_the_live_set_segments_no_release),
          TEST_CASE(stats_follow_the_live_set_memory_limit))
