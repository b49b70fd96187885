/*
 * failure_workload.h -- the workload that tests of failure paths run (test_device_failures.c,
 * test_host_failures.c): growth, moves of idle memory between streams, a memory limit, cross-stream
 * frees with events, empty_cache, new address ranges; every result noted (only OK, out of memory or a
 * device error are clean) and the books checked (gm_validate) after every step.
 */
#ifndef GPUMEM_TESTS_FAILURE_WORKLOAD_H
#define GPUMEM_TESTS_FAILURE_WORKLOAD_H

#include "test.h"

#define MIB (1ull << 20)
enum { SLOTS = 24 };

typedef struct run {
    gm_allocator *allocator;
    void *slots[SLOTS];
    int unclean; /* a result other than OK, out of memory or device error */
    int invalid; /* gm_validate failed */
} run;

static inline void note(run *r, gm_status status, const char *what)
{
    if (status != GM_OK && status != GM_ERROR_OUT_OF_MEMORY && status != GM_ERROR_DEVICE) {
        fprintf(stderr, "[%s] %s: %s (%s)\n", test_current, what, gm_strerror(status), gm_last_error());
        r->unclean++;
    }
    gm_status valid = gm_validate(r->allocator);
    if (valid != GM_OK) {
        if (!r->invalid)
            fprintf(stderr, "[%s] after %s: %s\n", test_current, what, gm_last_error());
        r->invalid++;
    }
}

static inline void release_slot(run *r, int slot)
{
    if (r->slots[slot]) {
        gm_status status = gm_free(r->allocator, r->slots[slot]);
        note(r, status, "free");
        if (status == GM_OK)
            r->slots[slot] = NULL;
    }
}

static inline void take_slot(run *r, int slot, uint64_t size, gm_stream stream)
{
    release_slot(r, slot);
    if (!r->slots[slot])
        note(r, gm_malloc(r->allocator, size, stream, &r->slots[slot]), "malloc");
}

static inline void workload(run *r)
{
    uint64_t state = 7;
    for (int step = 0; step < 160; step++) {
        int slot = (int)(test_random(&state) % SLOTS);
        uint64_t size = (test_random(&state) % 3 == 0) ? 512 * (1 + test_random(&state) % 64)
                                                        : MIB * (1 + test_random(&state) % 24) + 4096;
        gm_stream stream = 1 + test_random(&state) % 3;
        take_slot(r, slot, size, stream);
        if (step % 11 == 0 && r->slots[slot]) {
            note(r, gm_sim_stream_enqueue(r->allocator, 9, 1), "enqueue");
            note(r, gm_record_stream(r->allocator, r->slots[slot], 9), "record_stream");
        }
        if (step % 17 == 0)
            note(r, gm_sim_stream_complete(r->allocator, 9), "complete");
        if (step % 29 == 0)
            note(r, gm_empty_cache(r->allocator), "empty_cache");
        if (step == 80)
            note(r, gm_set_memory_limit(r->allocator, 160 * MIB), "memory limit");
    }
    note(r, gm_set_memory_limit(r->allocator, 0), "memory limit off");
    for (int slot = 0; slot < SLOTS; slot++)
        release_slot(r, slot);
    note(r, gm_sim_stream_complete(r->allocator, 9), "complete");
    note(r, gm_empty_cache(r->allocator), "empty_cache");
}

static inline int64_t reserved(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats.reserved_bytes[GM_POOL_ALL].current;
}

/* After the run with failures: the workload again with nothing failing, then nothing unclean, the books
 * exact, nothing left reserved and nothing live at gm_destroy. `failure` says what failed, for the
 * report. */
static inline void run_again_and_destroy(run *r, const char *config, const char *failure)
{
    memset(r->slots, 0, sizeof r->slots); /* the workload ends by freeing what it could */
    workload(r);
    if (r->unclean || r->invalid || reserved(r->allocator) != 0)
        fprintf(stderr, "[%s] %s: %s: %d unclean, %d invalid, %" PRId64 " bytes left reserved\n", test_current,
                config, failure, r->unclean, r->invalid, reserved(r->allocator));
    CHECK_EQ_INT(r->unclean, 0);
    CHECK_EQ_INT(r->invalid, 0);
    CHECK_EQ_INT(reserved(r->allocator), 0);
    size_t live = 1;
    gm_destroy(r->allocator, &live);
    CHECK_EQ_INT(live, 0);
}

#endif
