/*
 * failure_workload.h -- the workload that tests of failure paths run (test_device_failures.c,
 * test_host_failures.c): growth, moves of idle memory between streams, a memory limit, cross-stream
 * frees with events, empty_cache, new address ranges, a stitch (stitching.c) that lives through some of
 * them and a stream's growth lane (lane.c); every result noted (only OK, out of memory or a device error
 * are clean) and the books checked (gm_validate) after every step.
 */
#ifndef GPUMEM_TESTS_FAILURE_WORKLOAD_H
#define GPUMEM_TESTS_FAILURE_WORKLOAD_H

#include "test.h"

#define MIB (1ull << 20)
/* Chunks of 64 MiB whatever the capacity, as the stitch below needs (and rechunking, to have chunks that
 * a fit covers in part); with the room share a 4 GiB device makes chunks of 4 MiB. */
#define WHOLE_CHUNKS "max_chunk_size:64MiB,chunk_room_share:0"
enum { SLOTS = 24, STITCH_SLOTS = 5, CACHE_SLOTS = 6 };

typedef struct run {
    gm_allocator *allocator;
    void *slots[SLOTS + STITCH_SLOTS + CACHE_SLOTS]; /* the random steps' slots, the stitch's, the caches' */
    int unclean; /* a result other than OK, out of memory or device error */
    int invalid; /* gm_validate failed */
} run;

/* A positive count from the environment variable `name` (tests/CMakeLists.txt sets the sanitizers'
 * lighter strides), else `otherwise`. */
static inline long count_from_environment(const char *name, long otherwise)
{
    const char *text = getenv(name);
    long count = text ? strtol(text, NULL, 10) : otherwise;
    return count > 0 ? count : otherwise;
}

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

/* test_stitching.c's layout, on a stream of its own: a 192 MiB tensor freed (three 64 MiB chunks where
 * chunks may be that large), then blocks that leave the first chunk's last 54 MiB and the third's first
 * 22 MiB free, apart; a 70 MiB request that no mapped free block fits then lies across second mappings
 * of both (with stitch:true, the default, and chunks of 64 MiB; elsewhere it is a growth like any other). */
static inline void stitch(run *r)
{
    enum { STREAM = 4 };
    static const uint64_t sizes[] = {10 * MIB, 54 * MIB, 64 * MIB, 22 * MIB, 42 * MIB};
    take_slot(r, SLOTS, 192 * MIB, STREAM);
    release_slot(r, SLOTS);
    for (int part = 0; part < STITCH_SLOTS; part++)
        take_slot(r, SLOTS + part, sizes[part], STREAM);
    release_slot(r, SLOTS + 1);
    release_slot(r, SLOTS + 3);
    take_slot(r, SLOTS + 1, 70 * MIB, STREAM);
}

/* Key-value caches that generation grows at every step on a stream of their own: each replaced by a copy
 * 64 KiB larger (allocated, then the old one freed), until the stream's growth lane opens (lane.c) and its
 * ring runs; two slots a cache, taking turns. */
static inline void grow_caches(run *r)
{
    enum { STREAM = 5, FIRST = SLOTS + STITCH_SLOTS, CACHES = CACHE_SLOTS / 2 };
    for (int step = 0; step < 32; step++)
        for (int cache = 0; cache < CACHES; cache++) {
            take_slot(r, FIRST + 2 * cache + step % 2, 2 * MIB + (uint64_t)(step + 1) * (64 << 10), STREAM);
            release_slot(r, FIRST + 2 * cache + (step + 1) % 2);
        }
}

static inline void workload(run *r)
{
    uint64_t state = 7;
    stitch(r);
    grow_caches(r);
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
        if (step == 40) /* the stitch is undone once its range holds nothing live */
            for (int part = 0; part < STITCH_SLOTS; part++)
                release_slot(r, SLOTS + part);
        if (step == 80)
            note(r, gm_set_memory_limit(r->allocator, 160 * MIB), "memory limit");
    }
    note(r, gm_set_memory_limit(r->allocator, 0), "memory limit off");
    for (int slot = 0; slot < SLOTS + STITCH_SLOTS + CACHE_SLOTS; slot++)
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

/* The stitches a clean workload makes under `config` (a test of stitching's failure paths first checks
 * that it makes some). */
static inline uint64_t stitches_made(const char *config)
{
    run r = {0};
    REQUIRE(gm_create(config, &r.allocator) == GM_OK);
    workload(&r);
    gm_stats stats;
    REQUIRE(gm_get_stats(r.allocator, &stats) == GM_OK);
    run_again_and_destroy(&r, config, "nothing failing");
    return stats.num_stitches;
}

#endif
