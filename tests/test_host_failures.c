/*
 * test_host_failures.c -- every allocation of the library's own host memory may fail, and a failure
 * never corrupts the allocator.
 *
 * As SQLite tests its malloc failures: the workload of failure_workload.h (and gm_create before it) runs
 * once to count the host allocations it makes, then once for each position with that allocation failing
 * (gm_fail_system_allocations), and for some positions with every allocation from there on failing;
 * blocks' metadata is taken a block at a time, so that each block made is such a position.
 * A creation that fails must say out of memory and leave nothing behind; otherwise each run must see
 * only clean results (OK, out of memory or a device error), keep its books exact (gm_validate after
 * every step), then run the workload again with memory back, give everything back (empty_cache leaves
 * nothing reserved) and be destroyed without a leak or a double free (ASan/UBSan in CI). A second part
 * does the same for private pools, pinned host memory, snapshots and the summary.
 */
#include "failure_workload.h"

#include "base/system_memory.h"
#include "core/block.h"

#include <stdlib.h>
#include <unistd.h>

/* gm_create and one workload with the host allocation at `position` failing (and the `failures` - 1
 * after it; none when position < 0), then a clean workload. The allocations the first part made. */
static uint64_t run_with_host_failures(const char *config, int64_t position, uint64_t failures)
{
    run r = {0};
    uint64_t before = gm_system_allocations_made();
    if (position >= 0)
        gm_fail_system_allocations((uint64_t)position, failures);
    gm_status created = gm_create(config, &r.allocator);
    if (created != GM_OK) {
        gm_fail_system_allocations(0, 0);
        if (created != GM_ERROR_OUT_OF_MEMORY)
            fprintf(stderr, "[%s] %s: gm_create with allocation %" PRId64 " failing: %s (%s)\n", test_current,
                    config, position, gm_strerror(created), gm_last_error());
        CHECK(position >= 0 && created == GM_ERROR_OUT_OF_MEMORY);
        CHECK(r.allocator == NULL);
        return 0;
    }
    workload(&r);
    uint64_t made = gm_system_allocations_made() - before;
    gm_fail_system_allocations(0, 0);
    char failure[96];
    snprintf(failure, sizeof failure, "allocation %" PRId64 " failing (%" PRIu64 " times)", position, failures);
    run_again_and_destroy(&r, config, failure);
    return made;
}

/* Every position, or every Nth under the sanitizers (GPUMEM_HOST_FAILURE_STRIDE, set by tests/CMakeLists.txt:
 * they run the workload ten times slower, and the plain build covers every position). */
static uint64_t position_stride(void)
{
    return (uint64_t)count_from_environment("GPUMEM_HOST_FAILURE_STRIDE", 1);
}

static void every_allocation_may_fail(const char *config)
{
    gm_block_pool_set_chunk_blocks(1); /* every block made is an allocation that may fail */
    uint64_t made = run_with_host_failures(config, -1, 0);
    CHECK(made > 0);
    for (uint64_t position = 0; position < made; position += position_stride())
        run_with_host_failures(config, (int64_t)position, 1);
    uint64_t step = made > 20 ? made / 20 : 1; /* memory gone for good from there on */
    for (uint64_t position = 0; position < made; position += step)
        run_with_host_failures(config, (int64_t)position, UINT64_MAX);
    gm_block_pool_set_chunk_blocks(0);
}

/* Note a call's status: OK, or out of memory while allocations fail. */
static bool done(run *r, gm_status status, const char *what)
{
    note(r, status, what);
    return status == GM_OK;
}

/* Private pools (a block taken back at an address too), pinned host memory, snapshots and the summary
 * with the allocation at `position` failing (and the `failures` - 1 after it): every call OK or out of
 * memory with nothing changed, the books exact; then, with memory back, everything given back. The
 * allocations made. */
static uint64_t pools_and_more_with_host_failures(const char *config, int64_t position, uint64_t failures)
{
    run r = {0};
    REQUIRE(gm_create(config, &r.allocator) == GM_OK);
    const gm_pool_id pool = {1, 0};
    uint64_t before = gm_system_allocations_made();
    if (position >= 0)
        gm_fail_system_allocations((uint64_t)position, failures);
    void *in_pool[3] = {0}, *outside = NULL, *host[3] = {0};
    bool begun = done(&r, gm_begin_allocate_to_pool(r.allocator, pool, NULL, NULL), "begin pool");
    for (int i = 0; i < 3; i++)
        done(&r, gm_malloc(r.allocator, (size_t)(i + 1) * 3 * MIB, 0, &in_pool[i]), "malloc in the pool");
    if (begun)
        REQUIRE(gm_end_allocate_to_pool(r.allocator, pool) == GM_OK); /* needs no memory */
    done(&r, gm_malloc(r.allocator, 5 * MIB, 1, &outside), "malloc outside");
    uintptr_t freed = 0;
    if (in_pool[1] && done(&r, gm_free(r.allocator, in_pool[1]), "free in the pool")) {
        freed = (uintptr_t)in_pool[1];
        in_pool[1] = NULL;
    }
    void *restored = NULL; /* a middle piece of the freed block taken back, as a graph checkpoint does */
    if (begun && freed && done(&r, gm_pool_allocate_at(r.allocator, pool, freed + MIB, 2 * MIB, 2 * MIB), "allocate at"))
        restored = (void *)(freed + MIB);
    CHECK(position >= 0 || restored); /* without failures the piece is taken back */
    for (int i = 0; i < 3; i++)
        done(&r, gm_host_malloc(r.allocator, (size_t)4096 << (4 * i), &host[i]), "host malloc");
    if (host[0] && done(&r, gm_host_free(r.allocator, host[0]), "host free"))
        host[0] = NULL;
    gm_snapshot *snapshot = NULL;
    if (done(&r, gm_snapshot_take(r.allocator, &snapshot), "snapshot")) {
        char *json = NULL;
        done(&r, gm_snapshot_json(snapshot, &json), "snapshot json");
        gm_json_free(json);
        gm_snapshot_free(snapshot);
    }
    char summary[16384];
    size_t needed = 0;
    done(&r, gm_summary(r.allocator, summary, sizeof summary, &needed), "summary");
    done(&r, gm_empty_cache(r.allocator), "empty_cache");
    done(&r, gm_host_empty_cache(r.allocator), "host empty_cache");
    uint64_t made = gm_system_allocations_made() - before;
    gm_fail_system_allocations(0, 0);
    for (int i = 0; i < 3; i++) {
        if (in_pool[i])
            CHECK_OK(gm_free(r.allocator, in_pool[i]));
        if (host[i])
            CHECK_OK(gm_host_free(r.allocator, host[i]));
    }
    if (outside)
        CHECK_OK(gm_free(r.allocator, outside));
    if (restored)
        CHECK_OK(gm_free(r.allocator, restored));
    if (begun)
        CHECK_OK(gm_release_pool(r.allocator, pool));
    CHECK_OK(gm_empty_cache(r.allocator));
    CHECK_OK(gm_host_empty_cache(r.allocator));
    CHECK_OK(gm_validate(r.allocator));
    CHECK_EQ_INT(reserved(r.allocator), 0);
    CHECK_EQ_INT(r.unclean, 0);
    CHECK_EQ_INT(r.invalid, 0);
    size_t live = 1;
    gm_destroy(r.allocator, &live);
    CHECK_EQ_INT(live, 0);
    return made;
}

static void pools_pinned_memory_and_snapshots(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB", "backend:sim,capacity:4GiB,engine:segments"};
    gm_block_pool_set_chunk_blocks(1);
    for (size_t c = 0; c < 2; c++) {
        uint64_t made = pools_and_more_with_host_failures(configs[c], -1, 0);
        CHECK(made > 10);
        for (uint64_t position = 0; position < made; position++) {
            pools_and_more_with_host_failures(configs[c], (int64_t)position, 1);
            pools_and_more_with_host_failures(configs[c], (int64_t)position, UINT64_MAX);
        }
    }
    gm_block_pool_set_chunk_blocks(0);
}

/* gm_create with each of its host allocations failing in turn, for configurations that make more at
 * creation (a published region, a history, the host backend): out of memory and nothing left behind
 * (no region file either); or, where the failure was the published region's, an allocator that does
 * not publish and says why (gm_publish_status), as include/gpumem.h promises. */
static void creation_fails_cleanly(void)
{
    static const char *const configs[] = {"backend:sim,capacity:4GiB,publish:true", "backend:sim,history:1000",
                                          "backend:host,capacity:256MiB", "backend:sim,engine:segments"};
    char directory[] = "/tmp/gpumem-host-failures-XXXXXX";
    REQUIRE(mkdtemp(directory) != NULL);
    REQUIRE(setenv("GPUMEM_SHM_DIR", directory, 1) == 0);
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        gm_allocator *allocator = NULL;
        uint64_t before = gm_system_allocations_made();
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        uint64_t made = gm_system_allocations_made() - before;
        gm_destroy(allocator, NULL);
        for (uint64_t position = 0; position < made; position++) {
            allocator = NULL;
            gm_fail_system_allocations(position, 1);
            gm_status status = gm_create(configs[c], &allocator);
            gm_fail_system_allocations(0, 0);
            if (status == GM_OK) { /* only publication may fail without the creation: it says so */
                char path[512];
                CHECK_STATUS(gm_publish_status(allocator, path, sizeof path), GM_ERROR_OUT_OF_MEMORY);
                gm_destroy(allocator, NULL);
            } else {
                CHECK_STATUS(status, GM_ERROR_OUT_OF_MEMORY);
                CHECK(allocator == NULL);
            }
            char command[128];
            snprintf(command, sizeof command, "test -z \"$(ls -A '%s')\"", directory);
            CHECK(system(command) == 0); /* no published region left behind */
        }
    }
    unsetenv("GPUMEM_SHM_DIR");
    rmdir(directory);
}

static void pages_engine(void)
{
    every_allocation_may_fail("backend:sim,capacity:4GiB");
}

static void pages_engine_with_compaction(void)
{
    every_allocation_may_fail("backend:sim,capacity:4GiB,compact_min:2MiB,max_chunk_size:32MiB");
}

static void pages_engine_rechunking(void)
{
    every_allocation_may_fail("backend:sim,capacity:4GiB," WHOLE_CHUNKS ",rechunk_min:4MiB");
}

static void pages_engine_stitching(void)
{
    static const char config[] = "backend:sim,capacity:4GiB," WHOLE_CHUNKS;
    CHECK(stitches_made(config) >= 1);
    every_allocation_may_fail(config);
}

static void segments_engine(void)
{
    every_allocation_may_fail("backend:sim,capacity:4GiB,engine:segments");
}

static void pages_engine_on_host(void)
{
    every_allocation_may_fail("backend:host,capacity:1GiB");
}

RUN_TESTS(TEST_CASE(pages_engine), TEST_CASE(pages_engine_with_compaction), TEST_CASE(pages_engine_rechunking),
          TEST_CASE(pages_engine_stitching),
          TEST_CASE(segments_engine), TEST_CASE(pages_engine_on_host), TEST_CASE(pools_pinned_memory_and_snapshots),
          TEST_CASE(creation_fails_cleanly))
