/*
 * data_workload.h -- randomized operations on an allocator whose memory the test can read and write
 * (the host backend, or the cuda backend over tests/fake_cuda.c): every live allocation carries a
 * data pattern (pattern.h) that is checked when it is freed and, all of them, every 10000 operations;
 * any overlap of live allocations, or live memory that the engine unmapped or remapped under them,
 * shows as a broken pattern (or a fault). A fixed seed makes each run the same.
 */
#ifndef GM_TEST_DATA_WORKLOAD_H
#define GM_TEST_DATA_WORKLOAD_H

#include "test.h"

#include "pattern.h"

#include <stdbool.h>

#define DATA_WORKLOAD_MAX_LIVE 2048

typedef struct data_workload {
    const char *config;
    int operations;
    uint64_t seed;
    /* Frees recorded on a side stream: on the device model (sim, host) its work is queued and later
     * completed (gm_sim_stream_*); elsewhere it is the named stream 5, whose work the device runs. */
    bool model_streams;
    /* Allocations may fail with a device error (a driver told to fail now and then): counted, not a
     * failure of the test. */
    bool device_errors_expected;
    /* Called every 10000 operations and at the end, with the allocator (may be NULL). */
    void (*check)(gm_allocator *allocator);
} data_workload;

typedef struct data_workload_result {
    int out_of_memory, device_errors;
} data_workload_result;

typedef struct data_live_allocation {
    char *pointer;
    size_t size;
    uint64_t identity;
} data_live_allocation;

static data_live_allocation data_live[DATA_WORKLOAD_MAX_LIVE];

static size_t data_random_size(uint64_t *seed)
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

static int data_verify_all(size_t count)
{
    int broken = 0;
    for (size_t i = 0; i < count; i++)
        broken += !pattern_intact(data_live[i].pointer, data_live[i].size, data_live[i].identity);
    return broken;
}

/* One allocation of a random size on stream 0 or 1, stamped; false when none was made. */
static bool data_allocate(gm_allocator *allocator, const data_workload *workload, uint64_t *seed, size_t count,
                          uint64_t identity, data_workload_result *result)
{
    size_t size = data_random_size(seed);
    void *pointer = NULL;
    gm_stream stream = (gm_stream)(test_random(seed) % 2);
    gm_status status = gm_malloc(allocator, size, stream, &pointer);
    if (status == GM_ERROR_OUT_OF_MEMORY || (status == GM_ERROR_DEVICE && workload->device_errors_expected)) {
        result->out_of_memory += status == GM_ERROR_OUT_OF_MEMORY;
        result->device_errors += status == GM_ERROR_DEVICE;
        return false;
    }
    CHECK_OK(status);
    if (status != GM_OK)
        return false;
    data_live[count] = (data_live_allocation){pointer, size, identity};
    pattern_stamp(pointer, size, identity);
    return true;
}

/* The allocation at `victim` checked and freed, now and then after a record on the side stream. */
static int data_free(gm_allocator *allocator, const data_workload *workload, uint64_t *seed, size_t victim,
                     gm_stream side_stream, int step)
{
    int broken = 0;
    if (!pattern_intact(data_live[victim].pointer, data_live[victim].size, data_live[victim].identity)) {
        fprintf(stderr, "[%s] step %d: allocation %p of %zu bytes was overwritten\n", workload->config, step,
                (void *)data_live[victim].pointer, data_live[victim].size);
        broken++;
    }
    if (test_random(seed) % 8 == 0) {
        CHECK_OK(gm_record_stream(allocator, data_live[victim].pointer, side_stream));
        if (workload->model_streams)
            CHECK_OK(gm_sim_stream_enqueue(allocator, side_stream, 1));
    }
    CHECK_OK(gm_free(allocator, data_live[victim].pointer));
    if (workload->model_streams && test_random(seed) % 16 == 0)
        CHECK_OK(gm_sim_stream_complete(allocator, side_stream));
    return broken;
}

static data_workload_result data_workload_run(const data_workload *workload)
{
    data_workload_result result = {0};
    gm_allocator *allocator = make_allocator(workload->config);
    gm_stream side_stream = 5;
    if (!workload->model_streams)
        CHECK_OK(gm_named_stream(allocator, 5, &side_stream));
    uint64_t seed = workload->seed, identity = 0;
    size_t count = 0;
    int broken = 0;
    for (int step = 0; step < workload->operations && !broken; step++) {
        uint64_t action = test_random(&seed) % 100;
        if (action < 52 && count < DATA_WORKLOAD_MAX_LIVE) {
            if (data_allocate(allocator, workload, &seed, count, identity + 1, &result)) {
                identity++;
                count++;
            }
        } else if (action < 99 && count) {
            size_t victim = test_random(&seed) % count;
            broken += data_free(allocator, workload, &seed, victim, side_stream, step);
            data_live[victim] = data_live[--count];
        } else {
            CHECK_OK(gm_empty_cache(allocator));
        }
        if (step % 10000 == 0) {
            broken += data_verify_all(count);
            CHECK_OK(gm_validate(allocator));
            if (workload->check)
                workload->check(allocator);
        }
    }
    CHECK_EQ_INT(broken, 0);
    CHECK(result.out_of_memory > 0);
    CHECK_EQ_INT(data_verify_all(count), 0);
    CHECK_OK(gm_validate(allocator));
    for (size_t i = 0; i < count; i++)
        CHECK_OK(gm_free(allocator, data_live[i].pointer));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].allocated, (int64_t)identity);
    if (workload->check)
        workload->check(allocator);
    gm_destroy(allocator, NULL);
    return result;
}

#endif
