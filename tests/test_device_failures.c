/*
 * test_device_failures.c -- every device call may fail, and a failure never corrupts the allocator.
 *
 * A workload that makes every kind of device call (growth, moves of idle memory between streams, a
 * memory limit, cross-stream frees with events, empty_cache, new address ranges) runs once cleanly to
 * count its calls of each kind; then, for each kind and each position, once more with that one call
 * failing (gm_inject_device_failures). Each run must see only clean results (OK, out of memory or a
 * device error), keep its books exact (gm_validate after every step), then run the workload again
 * without failures, give everything back (empty_cache leaves nothing reserved) and be destroyed
 * without a leak or a double free (ASan/UBSan in CI). Both engines; the sim and host backends.
 */
#include "failure_workload.h"
#include "host_memory_held.h"

#include "backend/device_model.h"
#include "core/allocator.h"
#include "core/pages/pages.h"

/* One workload with call `kind` failing at `position` (or none when position < 0), then a clean one. */
static void run_with_failure(const char *config, gm_device_call kind, int64_t position, int64_t *calls_out)
{
    run r = {0};
    REQUIRE(gm_create(config, &r.allocator) == GM_OK);
    if (position >= 0)
        CHECK_OK(gm_inject_device_failures(r.allocator, kind, (uint64_t)position, 1));
    workload(&r);
    if (calls_out) {
        gm_stats stats;
        REQUIRE(gm_get_stats(r.allocator, &stats) == GM_OK);
        *calls_out = stats.device_calls[kind];
    }
    CHECK_OK(gm_inject_device_failures(r.allocator, kind, 0, 0));
    char failure[96];
    snprintf(failure, sizeof failure, "%s failing at call %" PRId64, gm_device_call_name(kind), position);
    run_again_and_destroy(&r, config, failure);
}

/* About 40 positions per kind, or fewer under the sanitizers (GPUMEM_DEVICE_FAILURE_POSITIONS, set by
 * tests/CMakeLists.txt: they run the workload ten times slower, and the plain build covers the 40). */
static void every_call_may_fail(const char *config)
{
    int64_t positions = count_from_environment("GPUMEM_DEVICE_FAILURE_POSITIONS", 40);
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++) {
        int64_t calls = 0;
        run_with_failure(config, (gm_device_call)kind, -1, &calls);
        int64_t step = calls > positions ? calls / positions : 1; /* first and last included */
        for (int64_t position = 0; position < calls; position += step)
            run_with_failure(config, (gm_device_call)kind, position, NULL);
        if (calls > 1)
            run_with_failure(config, (gm_device_call)kind, calls - 1, NULL);
    }
}

static void pages_engine_on_sim(void)
{
    every_call_may_fail("backend:sim,capacity:4GiB");
}

static void segments_engine_on_sim(void)
{
    every_call_may_fail("backend:sim,capacity:4GiB,engine:segments");
}

static void pages_engine_on_host(void)
{
    every_call_may_fail("backend:host,capacity:512MiB");
}

/* Chunks of 64 MiB, so that the workload's stitch is made: its lending, laying out and undoing with
 * each call failing in turn (found untested: the workload made no stitch under the configurations above). */
static void pages_engine_stitching(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB," WHOLE_CHUNKS,
                                          "backend:host,capacity:1GiB," WHOLE_CHUNKS};
    for (size_t c = 0; c < 2; c++) {
        CHECK(stitches_made(configs[c]) >= 1);
        every_call_may_fail(configs[c]);
    }
}

/* The workload's key-value caches open their stream's growth lane, so that its failures reach lane.c. */
static void the_workload_opens_a_growth_lane(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB", "backend:host,capacity:1GiB"};
    for (size_t c = 0; c < 2; c++) {
        run r = {0};
        REQUIRE(gm_create(configs[c], &r.allocator) == GM_OK);
        grow_caches(&r);
        gm_arena *arena = gm_lock_arena(r.allocator);
        int lanes = 0;
        for (size_t i = 0; i < arena->heap_count; i++)
            lanes += arena->heaps[i]->engine_data && state_of(arena->heaps[i])->lane;
        gm_unlock_arena(r.allocator);
        CHECK_EQ_INT(lanes, 1);
        workload(&r); /* frees the caches too */
        run_again_and_destroy(&r, configs[c], "nothing failing");
    }
}

/* Idle chunks remade in two when a fit covers them in part (rechunk.c), with each call failing in turn. */
static void pages_engine_rechunking(void)
{
    every_call_may_fail("backend:sim,capacity:4GiB," WHOLE_CHUNKS ",rechunk_min:4MiB");
}

/* A device that stops working for good (every call of a kind failing from some point on, until and
 * during gm_destroy): clean errors, exact books, and a destroy that frees everything once (the unmap
 * that failed used to leave a freed chunk in its region's list: a double free at destroy). On the host
 * backend the memory that failed releases and unmaps kept from the host goes back when the backend
 * closes: no descriptor or mapping outlives the allocator (found by fuzz_api, whose long runs ran out of
 * mappings when each such input kept a few). */
static void failures_until_destroy(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB", "backend:sim,capacity:4GiB,engine:segments",
                                          "backend:host,capacity:512MiB"};
    for (size_t c = 0; c < 3; c++) {
        for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++) {
            for (uint64_t after = 0; after < 40; after += 13) {
                int held_before = host_memory_held();
                run r = {0};
                REQUIRE(gm_create(configs[c], &r.allocator) == GM_OK);
                CHECK_OK(gm_inject_device_failures(r.allocator, (gm_device_call)kind, after, UINT64_MAX));
                workload(&r);
                CHECK_EQ_INT(r.unclean, 0);
                CHECK_EQ_INT(r.invalid, 0);
                gm_destroy(r.allocator, NULL);
                CHECK_EQ_INT(host_memory_held(), held_before);
            }
        }
    }
}

/* fault_rate in GPUMEM_CONF: a share of all device calls fail, drawn from a seed. */
static void random_faults_keep_the_books_exact(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB,fault_rate:0.05,fault_seed:%d",
                                          "backend:sim,capacity:4GiB,engine:segments,fault_rate:0.05,fault_seed:%d",
                                          "backend:host,capacity:512MiB,fault_rate:0.02,fault_seed:%d"};
    for (size_t c = 0; c < 3; c++) {
        for (int seed = 1; seed <= 8; seed++) {
            char config[128];
            snprintf(config, sizeof config, configs[c], seed);
            run r = {0};
            REQUIRE(gm_create(config, &r.allocator) == GM_OK);
            workload(&r);
            if (r.unclean || r.invalid)
                fprintf(stderr, "[%s] %s\n", test_current, config);
            CHECK_EQ_INT(r.unclean, 0);
            CHECK_EQ_INT(r.invalid, 0);
            gm_stats stats;
            CHECK_OK(gm_get_stats(r.allocator, &stats));
            CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].current, 0);
            gm_destroy(r.allocator, NULL);
        }
    }
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("backend:sim,fault_rate:0", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_STATUS(gm_create("backend:sim,fault_rate:1.5", &allocator), GM_ERROR_BAD_CONFIG);
}

/* A new chunk whose access cannot be set, and whose mapping then cannot be undone either: it stays
 * counted as reserved until the device has it back (found by fuzz_api on the release before fault_rate,
 * which fixed it: the chunk was released while still mapped, so the device held memory that
 * reserved_bytes no longer counted). */
static void a_mapping_that_cannot_be_undone(void)
{
    static const char *const configs[] = {"backend:sim,capacity:1GiB", "backend:host,capacity:256MiB"};
    for (size_t c = 0; c < 2; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_SET_ACCESS, 0, 1));
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_UNMAP, 0, 1));
        void *pointer = NULL;
        CHECK_STATUS(gm_malloc(allocator, 3 * MIB, 0, &pointer), GM_ERROR_DEVICE);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &pointer));
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, pointer));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_validate(allocator));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
        gm_destroy(allocator, NULL);
    }
}

/* A cross-stream free still pending at gm_destroy, device memory and a pinned host block, their events
 * never completing because waiting for them fails: destroy frees them all the same (found by fuzz_api:
 * the device free's record stayed in the pending list, the host block in the cache's, both leaked). */
static void pending_frees_at_a_failing_destroy(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB", "backend:sim,capacity:4GiB,engine:segments",
                                          "backend:host,capacity:512MiB"};
    for (size_t c = 0; c < 3; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        void *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &pointer));
        CHECK_OK(gm_record_stream(allocator, pointer, 5));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 5, 10));
        CHECK_OK(gm_free(allocator, pointer));
        void *host = NULL;
        CHECK_OK(gm_host_malloc(allocator, 4096, &host));
        CHECK_OK(gm_host_record_stream(allocator, host, 5));
        CHECK_OK(gm_host_free(allocator, host));
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_EVENT_SYNCHRONIZE, 0, UINT64_MAX));
        CHECK_OK(gm_validate(allocator));
        size_t live = 1;
        gm_destroy(allocator, &live);
        CHECK_EQ_INT(live, 0);
    }
}

/* The events the simulated device holds for `allocator`. */
static size_t device_events(gm_allocator *allocator)
{
    gm_arena *arena = gm_lock_arena(allocator);
    size_t events = gm_model_footprint_of(arena->backend).events;
    gm_unlock_arena(allocator);
    return events;
}

/* A cross-stream free whose event cannot be recorded waits for the whole device before its memory is
 * reused (the stream's queued work is finished, not raced); the event goes back to the pool, and the
 * next such free takes it rather than making another (it was lost once). */
static void an_event_that_cannot_be_recorded_is_kept(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:4GiB,engine:segments", &allocator) == GM_OK);
    for (int round = 0; round < 3; round++) {
        void *pointer = NULL;
        uint64_t waited_before = 0, waited_after = 0;
        CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &pointer));
        CHECK_OK(gm_record_stream(allocator, pointer, 5));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 5, 10));
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_EVENT_RECORD, 0, 1));
        CHECK_OK(gm_sim_work_waited_for(allocator, &waited_before));
        CHECK_OK(gm_free(allocator, pointer));
        CHECK_OK(gm_sim_work_waited_for(allocator, &waited_after));
        CHECK_EQ_INT(waited_after - waited_before, 10);
        CHECK_OK(gm_validate(allocator));
        CHECK_EQ_INT(device_events(allocator), 1);
    }
    gm_destroy(allocator, NULL);
}

static void bad_injection_calls(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim", &allocator) == GM_OK);
    CHECK_STATUS(gm_inject_device_failures(NULL, GM_CALL_MAP, 0, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_inject_device_failures(allocator, GM_CALL_KIND_COUNT, 0, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no device call of kind");
    CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_PHYSICAL_CREATE, 1, 1));
    void *first = NULL, *second = NULL, *third = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &first));
    CHECK_STATUS(gm_malloc(allocator, 64 * MIB, 0, &second), GM_ERROR_DEVICE);
    CHECK_MESSAGE("physical_create failed (injected: fault_rate or gm_inject_device_failures)");
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &third));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, first));
    CHECK_OK(gm_free(allocator, third));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(bad_injection_calls), TEST_CASE(pages_engine_on_sim), TEST_CASE(segments_engine_on_sim),
          TEST_CASE(pages_engine_on_host), TEST_CASE(pages_engine_stitching), TEST_CASE(pages_engine_rechunking),
          TEST_CASE(the_workload_opens_a_growth_lane), TEST_CASE(failures_until_destroy),
          TEST_CASE(random_faults_keep_the_books_exact), TEST_CASE(a_mapping_that_cannot_be_undone),
          TEST_CASE(pending_frees_at_a_failing_destroy), TEST_CASE(an_event_that_cannot_be_recorded_is_kept))
