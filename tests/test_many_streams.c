/*
 * test_many_streams.c -- a hundred thousand streams, each used once and abandoned, leave no trace.
 *
 * A server may make a stream per request, and nothing tells the allocator when a stream is gone. Each
 * stream here gets a block of its own (a heap, and on the pages engine a reserved address range) and
 * a block of the shared stream recorded on it (a cross-stream free: an event on the new stream, work
 * queued there and finished), then everything is freed and the cache emptied. Whatever the allocator
 * and the simulated device keep per stream must go once the stream holds nothing: the heaps, the
 * reservations, the device model's record of the stream, the sim's list of returned addresses. The
 * process's resident memory after all the streams may exceed what it was after the first tenth only by
 * a small bound, and the books stay exact (gm_validate). On the host backend each block holds a
 * pattern, checked before it is freed.
 *
 * The time of the last tenth of the streams may not be much more than the first tenth's.
 *
 * GPUMEM_MANY_STREAMS sets the number of streams on the sim (default 100000; the sanitizer build's
 * CTest sets fewer). The host backend runs a tenth of them: each of its streams costs real mappings,
 * page faults and a memfd (most of the test's time when it ran them all), and what it adds to the
 * sim's run -- the data of every block, and host resources (open descriptors are counted: the memfds
 * must all be closed; resident memory bounds the rest) -- shows within that many. A last test checks
 * that address frees that fail leave no reservation behind.
 */
#include "test.h"

#include "backend/device_model.h"
#include "core/allocator.h"
#include "core/arena.h"
#include "monitor/host_memory.h"
#include "pattern.h"

#include <dirent.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_STREAMS 100000
#define FIRST_STREAM 1000
#define SHARED_STREAM 0
#define MIB (1ull << 20)
/* Resident memory may grow by this much between the first tenth of the streams and the end. */
#define RSS_GROWTH_BOUND (8 * MIB)
#define TIME_SLACK_SECONDS 1.0
/* AddressSanitizer keeps freed memory in quarantine and its own books beside it: resident memory says
 * nothing about the allocator's then, and only the counts are checked. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_IS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_IS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_IS_MEANINGFUL
#define RSS_IS_MEANINGFUL 1
#endif
/* Heaps the allocator may hold at once: its forgetting threshold plus the batch's slack. */
#define HEAP_BOUND 160

typedef struct footprint {
    uint64_t resident_bytes;
    size_t descriptors; /* open file descriptors of the process */
    size_t heaps;
    gm_model_footprint model;
    double seconds; /* since the start */
} footprint;

/* The streams for a backend: GPUMEM_MANY_STREAMS (or the default) on the sim, a tenth on the host. */
static size_t stream_count(int on_host)
{
    const char *text = getenv("GPUMEM_MANY_STREAMS");
    long count = text ? strtol(text, NULL, 10) : DEFAULT_STREAMS;
    size_t streams = count >= 100 ? (size_t)count : DEFAULT_STREAMS;
    return on_host ? streams / 10 : streams;
}

static uint64_t resident_bytes(void)
{
    gm_process_memory memory;
    return gm_process_memory_read(NULL, getpid(), &memory) == GM_OK ? (uint64_t)memory.rss_bytes : 0;
}

static size_t open_descriptors(void)
{
    DIR *folder = opendir("/proc/self/fd");
    size_t count = 0;
    if (!folder)
        return 0;
    while (readdir(folder))
        count++;
    closedir(folder);
    return count;
}

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

static footprint measure(gm_allocator *allocator, const struct timespec *start)
{
    footprint now = {.resident_bytes = resident_bytes(), .descriptors = open_descriptors(),
                     .seconds = seconds_since(start)};
    gm_arena *arena = gm_lock_arena(allocator);
    now.heaps = arena->heap_count;
    now.model = gm_model_footprint_of(arena->backend);
    gm_unlock_arena(allocator);
    return now;
}

/* One stream's life: a block of its own, a shared block used on it and freed across streams, all
 * freed, the cache emptied. Returns the number of failed checks. */
static int use_one_stream(gm_allocator *allocator, gm_stream stream, size_t index, int check_data)
{
    int failures = 0;
    size_t own_size = 64 * 1024 + (index % 7) * 512, shared_size = 4096;
    void *own = NULL, *shared = NULL;
    failures += gm_malloc(allocator, own_size, stream, &own) != GM_OK;
    failures += gm_malloc(allocator, shared_size, SHARED_STREAM, &shared) != GM_OK;
    if (failures)
        return failures;
    if (check_data) {
        pattern_stamp(own, own_size, index * 2 + 1);
        pattern_stamp(shared, shared_size, index * 2 + 2);
    }
    failures += gm_record_stream(allocator, shared, stream) != GM_OK;
    failures += gm_sim_stream_enqueue(allocator, stream, 1) != GM_OK;
    if (check_data)
        failures += !pattern_intact(shared, shared_size, index * 2 + 2);
    failures += gm_free(allocator, shared) != GM_OK;
    failures += gm_sim_stream_complete(allocator, stream) != GM_OK;
    if (check_data)
        failures += !pattern_intact(own, own_size, index * 2 + 1);
    failures += gm_free(allocator, own) != GM_OK;
    failures += gm_empty_cache(allocator) != GM_OK;
    return failures;
}

static void print_footprint(const char *config, const char *when, const footprint *at)
{
    printf("  %s after %s streams: rss %.1f MiB, %zu heaps, model: %zu streams, %zu events, %zu reservations, "
           "%zu returned ranges; %.2f s\n", config, when, (double)at->resident_bytes / (double)MIB, at->heaps,
           at->model.streams, at->model.events, at->model.reservations, at->model.returned_ranges, at->seconds);
}

static void check_bounded(const footprint *at)
{
    CHECK(at->heaps <= HEAP_BOUND);
    CHECK(at->model.streams <= 4);
    CHECK(at->model.events <= 4 + 4); /* and the progress marks of the shared stream's heap: at most 4
                                         (core/pages/progress.c); the streams used once free too little
                                         to be marked */
    CHECK(at->model.reservations <= 2 * HEAP_BOUND);
    CHECK(at->model.returned_ranges <= 2 * HEAP_BOUND);
}

static void many_streams(const char *config, int on_host)
{
    size_t streams = stream_count(on_host), tenth = streams / 10;
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create(config, &allocator) == GM_OK);
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    footprint tenths[10] = {{0}};
    int failures = 0;
    for (size_t i = 0; i < 10 * tenth && failures == 0; i++) {
        failures += use_one_stream(allocator, FIRST_STREAM + i, i, on_host);
        if ((i + 1) % tenth == 0) {
            tenths[i / tenth] = measure(allocator, &start);
            check_bounded(&tenths[i / tenth]);
        }
    }
    CHECK_EQ_INT(failures, 0);
    CHECK_OK(gm_validate(allocator));
    char tenth_text[32];
    snprintf(tenth_text, sizeof tenth_text, "%zu", tenth);
    print_footprint(config, tenth_text, &tenths[0]);
    print_footprint(config, "all", &tenths[9]);
    printf("  %s: first tenth %.2f s, last tenth %.2f s\n", config, tenths[0].seconds,
           tenths[9].seconds - tenths[8].seconds);
    CHECK(!RSS_IS_MEANINGFUL || tenths[9].resident_bytes <= tenths[0].resident_bytes + RSS_GROWTH_BOUND);
    CHECK(tenths[0].descriptors > 0);
    CHECK_EQ_INT(tenths[9].descriptors, tenths[0].descriptors);
    /* Work per stream that grew with the streams seen (a search of every stream ever used) would make
     * the last tenth many times slower than the first; the slack allows for a busy machine. */
    CHECK(tenths[9].seconds - tenths[8].seconds <= 3 * tenths[0].seconds + TIME_SLACK_SECONDS);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
    size_t live = 1;
    gm_destroy(allocator, &live);
    CHECK_EQ_INT(live, 0);
}

static size_t snapshot_regions(gm_allocator *allocator)
{
    gm_snapshot *snapshot = NULL;
    REQUIRE(gm_snapshot_take(allocator, &snapshot) == GM_OK);
    size_t regions = snapshot->region_count;
    gm_snapshot_free(snapshot);
    return regions;
}

/* Address frees that fail while idle heaps are forgotten: the heap keeps its region (and its
 * reservation) until one succeeds, so the device never holds a reservation the allocator forgot. */
static void reservations_outlive_failed_address_frees(void)
{
    static const char *const configs[] = {"backend:sim,capacity:8GiB", "backend:host,capacity:1GiB"};
    for (size_t c = 0; c < 2; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_ADDRESS_FREE, 0, UINT64_MAX));
        int failures = 0;
        for (size_t i = 0; i < 400; i++)
            failures += use_one_stream(allocator, FIRST_STREAM + i, i, 0);
        CHECK_EQ_INT(failures, 0);
        gm_arena *arena = gm_lock_arena(allocator);
        size_t reservations = gm_model_footprint_of(arena->backend).reservations;
        gm_unlock_arena(allocator);
        CHECK_EQ_INT(reservations, snapshot_regions(allocator));
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_ADDRESS_FREE, 0, 0));
        for (size_t i = 400; i < 800; i++)
            failures += use_one_stream(allocator, FIRST_STREAM + i, i, 0);
        CHECK_EQ_INT(failures, 0);
        arena = gm_lock_arena(allocator);
        reservations = gm_model_footprint_of(arena->backend).reservations;
        size_t heaps = arena->heap_count;
        gm_unlock_arena(allocator);
        CHECK_EQ_INT(reservations, snapshot_regions(allocator));
        CHECK(heaps <= HEAP_BOUND);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* gm_holds_stream: a stream used lately is held, one abandoned long ago is let go (its heap forgotten),
 * a stream with a live block is held however old, and no more streams are held than heaps kept. */
static void held_streams_are_the_ones_with_heaps(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:8GiB", &allocator) == GM_OK);
    gm_stream kept = FIRST_STREAM - 1;
    void *live = NULL;
    CHECK_OK(gm_malloc(allocator, 4096, kept, &live));
    int failures = 0;
    for (size_t i = 0; i < 400; i++)
        failures += use_one_stream(allocator, FIRST_STREAM + i, i, 0);
    CHECK_EQ_INT(failures, 0);
    int held = -1;
    CHECK_OK(gm_holds_stream(allocator, FIRST_STREAM + 399, &held));
    CHECK_EQ_INT(held, 1);
    CHECK_OK(gm_holds_stream(allocator, FIRST_STREAM, &held));
    CHECK_EQ_INT(held, 0);
    CHECK_OK(gm_holds_stream(allocator, kept, &held));
    CHECK_EQ_INT(held, 1);
    size_t held_count = 0;
    for (size_t i = 0; i < 400; i++) {
        CHECK_OK(gm_holds_stream(allocator, FIRST_STREAM + i, &held));
        held_count += (size_t)held;
    }
    CHECK(held_count > 0 && held_count <= HEAP_BOUND);
    CHECK_STATUS(gm_holds_stream(allocator, kept, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_holds_stream(NULL, kept, &held), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_free(allocator, live));
    gm_destroy(allocator, NULL);
}

static void pages_engine_on_sim(void)
{
    many_streams("backend:sim,capacity:8GiB", 0);
}

static void segments_engine_on_sim(void)
{
    many_streams("backend:sim,capacity:8GiB,engine:segments", 0);
}

static void pages_engine_on_host(void)
{
    many_streams("backend:host,capacity:1GiB", 1);
}

static void segments_engine_on_host(void)
{
    many_streams("backend:host,capacity:1GiB,engine:segments", 1);
}

RUN_TESTS(TEST_CASE(pages_engine_on_sim), TEST_CASE(segments_engine_on_sim), TEST_CASE(pages_engine_on_host),
          TEST_CASE(segments_engine_on_host), TEST_CASE(reservations_outlive_failed_address_frees),
          TEST_CASE(held_streams_are_the_ones_with_heaps))
