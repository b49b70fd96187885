/*
 * test_pressure.c -- memory pressure on the sim backend, with exact expectations: watermarks computed
 * from fractions (and following the memory limit), the level rising at exactly the high watermark and
 * falling only below the low one, the ladder's order and the bytes each step releases, callbacks
 * called outside the lock (they allocate, free, read statistics, empty the cache) and never re-entered,
 * a critical callback that frees memory so that a failing allocation succeeds, registration and
 * removal (also concurrent with dispatches), the arguments checked, and the counters and history
 * events that record all of it. The sampled signals are in test_pressure_signals.c.
 */
#include "pressure_test.h"

#include <unistd.h>

/* ---------------------------------------------------------------- watermarks and levels */

static void watermarks_are_fractions_of_the_limit(void)
{
    gm_allocator *allocator = make(segments);
    gm_pressure_readings readings;
    CHECK_OK(gm_get_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(readings.high_bytes, 0); /* no policy */
    CHECK_EQ_INT(readings.limit_bytes, GiB);
    CHECK(!allocator->pressure.watching);
    gm_pressure_policy policy;
    CHECK_OK(gm_get_pressure_policy(allocator, &policy));
    CHECK(policy.high == 0);

    CHECK_OK(set_policy(allocator, 0.9, 0.8, 0, NULL));
    CHECK_OK(gm_get_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.high_bytes, 966367642); /* 0.9 GiB to the nearest byte */
    CHECK_EQ_INT(readings.low_bytes, 858993459);
    CHECK(allocator->pressure.watching);
    CHECK_OK(gm_get_pressure_policy(allocator, &policy)); /* with its defaults filled in */
    CHECK_EQ_INT(policy.signals, GM_PRESSURE_SIGNAL_RESERVED | GM_PRESSURE_SIGNAL_ALLOCATED);
    CHECK_EQ_INT(policy.interval_ms, 100);
    CHECK(policy.psi_high == 10 && policy.psi_low == 5);
    CHECK(!strcmp(policy.host_root, "/"));

    /* The watermarks follow the memory limit; a limit under the reserved bytes raises the level at once. */
    void *block = take(allocator, 500 * MiB, 0);
    CHECK_OK(gm_set_memory_limit(allocator, 600 * MiB));
    CHECK_OK(gm_get_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.limit_bytes, 600 * MiB);
    CHECK_EQ_INT(readings.high_bytes, 566231040); /* 540 MiB */
    CHECK_EQ_INT(readings.low_bytes, 503316480);  /* 480 MiB */
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL); /* 500 MiB */
    CHECK_OK(gm_set_memory_limit(allocator, 550 * MiB)); /* high 495 MiB: 500 MiB is above it */
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    CHECK_EQ_INT(stats_of(allocator).num_pressure_rises, 1);
    CHECK_OK(gm_free(allocator, block));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL);

    CHECK_OK(gm_set_pressure_policy(allocator, NULL)); /* off again */
    CHECK(!allocator->pressure.watching);
    CHECK_OK(gm_get_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.high_bytes, 0);
    gm_destroy(allocator, NULL);
}

static void level_rises_at_high_and_falls_only_below_low(void)
{
    gm_allocator *allocator = make(segments);
    recorder calls;
    recorder_init(&calls);
    CHECK_OK(gm_on_pressure(allocator, record, &calls));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, GM_PRESSURE_SIGNAL_ALLOCATED, NULL)); /* 512 MiB, 256 MiB */
    void *a = take(allocator, 200 * MiB, 0), *b = take(allocator, 56 * MiB, 0), *c = take(allocator, 254 * MiB, 0);
    void *d = take(allocator, 2 * MiB - 512, 0);
    CHECK_EQ_INT(stats_of(allocator).allocated_bytes[GM_POOL_ALL].current, 512 * MiB - 512);
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL); /* one allocation unit below high */
    CHECK_EQ_INT(calls_of(&calls), 0);
    void *e = take(allocator, 512, 0); /* exactly 512 MiB */
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls_of(&calls), 1);
    CHECK_EQ_INT(calls.levels[0], GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls.readings[0].allocated_bytes, 512 * MiB);
    CHECK_EQ_INT(calls.readings[0].signals_high, GM_PRESSURE_SIGNAL_ALLOCATED);
    CHECK_EQ_INT(calls.readings[0].changes, 1);
    CHECK(pthread_equal(calls.threads[0], pthread_self())); /* on the thread whose call changed it */
    CHECK_OK(gm_free(allocator, e)); /* 512 MiB - 512: below high, above low */
    CHECK_OK(gm_free(allocator, c)); /* 258 MiB - 512 */
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    CHECK_OK(gm_free(allocator, d)); /* exactly 256 MiB: not below low */
    CHECK_EQ_INT(stats_of(allocator).allocated_bytes[GM_POOL_ALL].current, 256 * MiB);
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls_of(&calls), 1);
    CHECK_OK(gm_free(allocator, b)); /* 200 MiB */
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(calls_of(&calls), 2);
    CHECK_EQ_INT(calls.levels[1], GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(calls.readings[1].allocated_bytes, 200 * MiB);
    CHECK_EQ_INT(calls.readings[1].changes, 2);
    /* Up again: a second rise. */
    void *f = take(allocator, 312 * MiB, 0);
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    /* The first rise found nothing cached (every segment had a live block); this one finds the freed
     * segments, newest first: E's small one (2 MiB), D's (20), C's (254), B's (56): 844 - 332 = 512 MiB. */
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_pressure_rises, 2);
    CHECK_EQ_INT(stats.num_pressure_callbacks, 3);
    CHECK_EQ_INT(stats.num_pressure_releases, 1);
    CHECK_EQ_INT(stats.pressure_released_bytes, 332 * MiB);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 512 * MiB);
    CHECK_OK(gm_free(allocator, f));
    CHECK_OK(gm_free(allocator, a));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- the ladder */

static void ladder_releases_down_to_the_low_watermark(void)
{
    gm_allocator *allocator = make(segments);
    void *cached[4];
    for (int i = 0; i < 4; i++)
        cached[i] = take(allocator, 100 * MiB, 0);
    for (int i = 0; i < 4; i++)
        CHECK_OK(gm_free(allocator, cached[i])); /* four free segments of 100 MiB: 400 MiB reserved */
    recorder calls;
    recorder_init(&calls);
    CHECK_OK(gm_on_pressure(allocator, record, &calls));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, GM_PRESSURE_SIGNAL_RESERVED, NULL));
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL);
    void *big = take(allocator, 150 * MiB, 0); /* a new segment: 550 MiB reserved */
    /* Step 1: the newest free segments go back until reserved is at most 256 MiB: 450, 350, 250. */
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 250 * MiB);
    CHECK_EQ_INT(stats.num_pressure_rises, 1);
    CHECK_EQ_INT(stats.num_pressure_releases, 1);
    CHECK_EQ_INT(stats.pressure_released_bytes, 300 * MiB);
    CHECK_EQ_INT(stats.num_pressure_callbacks, 1);
    CHECK_EQ_INT(stats.num_sync_all_streams, 0); /* step 2 was not needed */
    CHECK_EQ_INT(calls_of(&calls), 1);
    CHECK_EQ_INT(calls.levels[0], GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls.readings[0].signals_high, GM_PRESSURE_SIGNAL_RESERVED);
    CHECK_EQ_INT(calls.readings[0].reserved_bytes, 250 * MiB); /* after the ladder */
    CHECK_EQ_INT(calls.readings[0].released_bytes, 300 * MiB);
    CHECK_EQ_INT(calls.readings[0].allocated_bytes, 150 * MiB);
    /* The history: the rise, the three unmaps, the release, then the callbacks. */
    gm_event events[256];
    size_t count = read_history(allocator, events, 256);
    long rise = find_event(events, count, 0, GM_EVENT_PRESSURE_HIGH);
    REQUIRE(rise >= 0);
    CHECK_EQ_INT(events[rise].address, GM_PRESSURE_SIGNAL_RESERVED);
    CHECK_EQ_INT(events[rise].size, 550 * MiB);
    CHECK_EQ_INT(events[rise - 1].kind, GM_EVENT_ALLOC);
    for (long i = rise + 1; i <= rise + 3; i++) {
        CHECK_EQ_INT(events[i].kind, GM_EVENT_SEGMENT_UNMAP);
        CHECK_EQ_INT(events[i].size, 100 * MiB);
    }
    CHECK_EQ_INT(events[rise + 4].kind, GM_EVENT_PRESSURE_RELEASE);
    CHECK_EQ_INT(events[rise + 4].address, 1);
    CHECK_EQ_INT(events[rise + 4].size, 300 * MiB);
    CHECK_EQ_INT(events[rise + 5].kind, GM_EVENT_PRESSURE_CALLBACKS);
    CHECK_EQ_INT(events[rise + 5].address, GM_PRESSURE_HIGH);
    CHECK_EQ_INT(events[rise + 5].size, 1);
    /* Freeing the big block leaves 250 MiB reserved, below 256 MiB: normal, nothing released. */
    CHECK_OK(gm_free(allocator, big));
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL);
    count = read_history(allocator, events, 256);
    long fall = find_event(events, count, (size_t)rise, GM_EVENT_PRESSURE_NORMAL);
    REQUIRE(fall >= 0);
    CHECK_EQ_INT(events[fall].size, 250 * MiB);
    CHECK_EQ_INT(stats_of(allocator).num_pressure_releases, 1);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* The pages engine gives back idle chunks (physical memory lying wholly in free space), one by one, until
 * reserved memory is down to the target. */
static void ladder_on_the_pages_engine_unmaps_idle_chunks(void)
{
    /* chunk_room_share:0: on a device this small the room share would cut each growth into pages */
    gm_allocator *allocator = make("engine:pages,capacity:1GiB,chunk_room_share:0");
    void *live = take(allocator, 100 * MiB, 0), *freed[4];
    for (int i = 0; i < 4; i++)
        freed[i] = take(allocator, 100 * MiB, 0); /* a chunk of 100 MiB each */
    for (int i = 0; i < 4; i++)
        CHECK_OK(gm_free(allocator, freed[i]));
    gm_stats before = stats_of(allocator);
    CHECK_EQ_INT(before.reserved_bytes[GM_POOL_ALL].current, 500 * MiB);
    CHECK_OK(set_policy(allocator, 0.45, 0.25, GM_PRESSURE_SIGNAL_RESERVED, NULL)); /* 460.8 MiB, 256 MiB */
    /* 500 -> 400 -> 300 -> 200 MiB: three chunks, 150 pages; the fourth stays cached. */
    gm_stats after = stats_of(allocator);
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, 200 * MiB);
    CHECK_EQ_INT(after.pressure_released_bytes, 300 * MiB);
    CHECK_EQ_INT(after.num_pressure_releases, 1);
    CHECK_EQ_INT(after.num_page_unmaps - before.num_page_unmaps, 150);
    CHECK_EQ_INT(after.num_device_free - before.num_device_free, 3);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, live));
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL); /* 200 MiB, nothing live */
    gm_destroy(allocator, NULL);
}

static void ladder_waits_for_pending_frees_when_step_one_is_not_enough(void)
{
    gm_allocator *allocator = make(segments);
    void *pending[3];
    for (int i = 0; i < 3; i++) {
        pending[i] = take(allocator, 100 * MiB, 1);
        CHECK_OK(gm_record_stream(allocator, pending[i], 2));
    }
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* stream 2 still uses them */
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(allocator, pending[i]));
    CHECK_OK(gm_free(allocator, take(allocator, 100 * MiB, 1))); /* one free segment */
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 400 * MiB);
    CHECK_OK(set_policy(allocator, 0.5, 0.25, GM_PRESSURE_SIGNAL_RESERVED, NULL));
    void *big = take(allocator, 250 * MiB, 1); /* 650 MiB reserved */
    /* Step 1 frees the one free segment (550 MiB, still above 512 MiB); step 2 waits for stream 2,
     * and the three blocks it held go back too. */
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 250 * MiB);
    CHECK_EQ_INT(stats.num_pressure_releases, 2);
    CHECK_EQ_INT(stats.pressure_released_bytes, 400 * MiB);
    CHECK_EQ_INT(stats.num_sync_all_streams, 1);
    CHECK_EQ_INT(stats.active_bytes[GM_POOL_ALL].current, 250 * MiB); /* nothing pending any more */
    gm_event events[256];
    size_t count = read_history(allocator, events, 256);
    long first = find_event(events, count, 0, GM_EVENT_PRESSURE_RELEASE);
    REQUIRE(first >= 0);
    long second = find_event(events, count, (size_t)first + 1, GM_EVENT_PRESSURE_RELEASE);
    REQUIRE(second >= 0);
    CHECK_EQ_INT(events[first].address, 1);
    CHECK_EQ_INT(events[first].size, 100 * MiB);
    CHECK_EQ_INT(events[second].address, 2);
    CHECK_EQ_INT(events[second].size, 300 * MiB);
    /* Below the low watermark now, but the level falls with the next reading (the next call that
     * changes the bytes): the rise's callbacks hear HIGH with the readings after the ladder. */
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    CHECK_OK(gm_free(allocator, big));
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void policy_set_above_high_acts_at_once(void)
{
    gm_allocator *allocator = make(segments);
    void *block = take(allocator, 600 * MiB, 0);
    CHECK_OK(gm_free(allocator, take(allocator, 100 * MiB, 0)));
    recorder calls;
    recorder_init(&calls);
    CHECK_OK(gm_on_pressure(allocator, record, &calls));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, 0, NULL)); /* 700 MiB reserved */
    CHECK_EQ_INT(calls_of(&calls), 1); /* before gm_set_pressure_policy returned */
    CHECK_EQ_INT(calls.levels[0], GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls.readings[0].signals_high, GM_PRESSURE_SIGNAL_RESERVED | GM_PRESSURE_SIGNAL_ALLOCATED);
    CHECK_EQ_INT(calls.readings[0].released_bytes, 100 * MiB);
    /* Turning the policy off ends the pressure, and the callbacks hear it. */
    CHECK_OK(gm_set_pressure_policy(allocator, NULL));
    CHECK_EQ_INT(calls_of(&calls), 2);
    CHECK_EQ_INT(calls.levels[1], GM_PRESSURE_NORMAL);
    CHECK_OK(gm_free(allocator, block));
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- callbacks */

typedef struct inside_checks {
    int calls;
    bool lock_was_free;
    bool sequence_even;
    bool allocator_usable;
    gm_pressure_level level_seen;
} inside_checks;

/* A callback that uses the allocator it is called for. */
static void use_the_allocator(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                              void *context)
{
    (void)readings;
    inside_checks *checks = context;
    checks->calls++;
    checks->lock_was_free = gm_lock_try_acquire(&allocator->lock);
    if (checks->lock_was_free)
        gm_lock_release(&allocator->lock);
    checks->sequence_even = !allocator->published || allocator->published->value % 2 == 0;
    void *pointer = NULL;
    gm_stats stats;
    gm_pressure_readings now;
    checks->allocator_usable = gm_malloc(allocator, 10 * MiB, 0, &pointer) == GM_OK && pointer &&
                               gm_free(allocator, pointer) == GM_OK && gm_get_stats(allocator, &stats) == GM_OK &&
                               gm_get_pressure(allocator, &now) == GM_OK && gm_empty_cache(allocator) == GM_OK;
    checks->level_seen = level;
}

static void callbacks_run_outside_the_lock_and_may_use_the_allocator(void)
{
    char directory[] = "/tmp/gpumem_pressure_XXXXXX";
    REQUIRE(mkdtemp(directory));
    REQUIRE(setenv("GPUMEM_SHM_DIR", directory, 1) == 0);
    gm_allocator *allocator = make("engine:pages,capacity:1GiB,publish:true");
    char path[512];
    CHECK_OK(gm_publish_status(allocator, path, sizeof path));
    CHECK(allocator->published != NULL);
    inside_checks checks = {0};
    CHECK_OK(gm_on_pressure(allocator, use_the_allocator, &checks));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, GM_PRESSURE_SIGNAL_ALLOCATED, NULL));
    void *block = take(allocator, 600 * MiB, 0);
    CHECK_EQ_INT(checks.calls, 1);
    CHECK(checks.lock_was_free);
    CHECK(checks.sequence_even); /* not inside the published statistics' seqlock bracket */
    CHECK(checks.allocator_usable);
    CHECK_EQ_INT(checks.level_seen, GM_PRESSURE_HIGH);
    CHECK_OK(gm_free(allocator, block));
    CHECK_EQ_INT(checks.calls, 2); /* normal again */
    CHECK(checks.lock_was_free && checks.sequence_even && checks.allocator_usable);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    unsetenv("GPUMEM_SHM_DIR");
    rmdir(directory);
}

typedef struct ballast {
    void *pointer;
    int calls;
    gm_pressure_readings readings;
    gm_pressure_level level_inside;
    bool try_huge_first; /* allocate something impossible first (re-entrance) */
    gm_status huge_status;
    gm_oom_cause huge_cause;
} ballast;

static _Thread_local int callback_depth, deepest_callback;

/* On CRITICAL, free the memory the program keeps for such moments. */
static void free_ballast(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                         void *context)
{
    ballast *kept = context;
    callback_depth++;
    deepest_callback = callback_depth > deepest_callback ? callback_depth : deepest_callback;
    kept->calls++;
    kept->readings = *readings;
    kept->level_inside = level_of(allocator);
    if (level == GM_PRESSURE_CRITICAL) {
        if (kept->try_huge_first) {
            void *huge = NULL;
            kept->huge_status = gm_malloc(allocator, 5 * GiB, 0, &huge);
            kept->huge_cause = gm_last_oom_cause();
        }
        if (kept->pointer)
            CHECK_OK(gm_free(allocator, kept->pointer));
        kept->pointer = NULL;
    }
    callback_depth--;
}

static void critical_callback_frees_memory_and_the_allocation_succeeds(void)
{
    /* chunk_room_share:0: the ballast one chunk, not 450 pages whose maps would fill the history */
    static const char *const configs[] = {"engine:pages,capacity:1GiB,history:256,chunk_room_share:0", segments};
    for (size_t c = 0; c < 2; c++) {
        gm_allocator *allocator = make(configs[c]); /* no policy: a callback is enough */
        ballast kept = {.pointer = take(allocator, 900 * MiB, 0)};
        CHECK_OK(gm_on_pressure(allocator, free_ballast, &kept));
        void *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 300 * MiB, 7, &pointer));
        CHECK(pointer != NULL);
        CHECK_EQ_INT(kept.calls, 1);
        CHECK_EQ_INT(kept.readings.level, GM_PRESSURE_CRITICAL);
        CHECK_EQ_INT(kept.level_inside, GM_PRESSURE_CRITICAL);
        CHECK_EQ_INT(kept.readings.request_bytes, 300 * MiB);
        CHECK_EQ_INT(kept.readings.allocated_bytes, 900 * MiB);
        CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL); /* critical lasts as long as the callbacks */
        gm_stats stats = stats_of(allocator);
        CHECK_EQ_INT(stats.num_ooms, 0);
        CHECK_EQ_INT(stats.num_pressure_criticals, 1);
        CHECK_EQ_INT(stats.num_pressure_callbacks, 1);
        CHECK_EQ_INT(stats.num_pressure_rises, 0);
        CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 300 * MiB);
        gm_event events[256];
        size_t count = read_history(allocator, events, 256);
        long critical = find_event(events, count, 0, GM_EVENT_PRESSURE_CRITICAL);
        REQUIRE(critical >= 0);
        CHECK_EQ_INT(events[critical].size, 300 * MiB);
        CHECK_EQ_INT(events[critical].stream, 7);
        long freed = find_event(events, count, (size_t)critical, GM_EVENT_FREE_REQUESTED);
        long called = find_event(events, count, (size_t)critical, GM_EVENT_PRESSURE_CALLBACKS);
        long allocated = find_event(events, count, (size_t)critical, GM_EVENT_ALLOC);
        CHECK(critical < freed && freed < called && called < allocated); /* callback, then the retry */
        CHECK_EQ_INT(events[called].address, GM_PRESSURE_CRITICAL);
        CHECK_OK(gm_free(allocator, pointer));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void critical_callback_that_cannot_help_is_in_the_report(void)
{
    gm_allocator *allocator = make(segments);
    ballast nothing = {0};
    CHECK_OK(gm_on_pressure(allocator, free_ballast, &nothing));
    void *kept = take(allocator, 900 * MiB, 0), *pointer = NULL;
    CHECK_STATUS(gm_malloc(allocator, 300 * MiB, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(nothing.calls, 1);
    CHECK_MESSAGE("gpumem: out of memory. Tried to allocate 300.00 MiB");
    CHECK_MESSAGE("calling the pressure callbacks (level critical) and retrying");
    CHECK_MESSAGE("(1 pressure callback call)");
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_CAPACITY);
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_ooms, 1);
    CHECK_EQ_INT(stats.num_pressure_criticals, 1);
    CHECK_EQ_INT(stats.num_alloc_retries, 2); /* before the callbacks and after */
    CHECK_OK(gm_free(allocator, kept));
    gm_destroy(allocator, NULL);
}

static void critical_callbacks_are_not_reentered(void)
{
    gm_allocator *allocator = make(segments);
    ballast kept = {.pointer = take(allocator, 900 * MiB, 0), .try_huge_first = true};
    CHECK_OK(gm_on_pressure(allocator, free_ballast, &kept));
    deepest_callback = 0;
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, 300 * MiB, 0, &pointer));
    CHECK_EQ_INT(kept.calls, 1);       /* the callback's own failing allocation did not call it again */
    CHECK_EQ_INT(deepest_callback, 1);
    CHECK_EQ_INT(kept.huge_status, GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(kept.huge_cause, GM_OOM_CAUSE_CAPACITY);
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_pressure_criticals, 1);
    CHECK_EQ_INT(stats.num_ooms, 1); /* the callback's */
    CHECK_OK(gm_free(allocator, pointer));
    gm_destroy(allocator, NULL);
}

typedef struct releaser {
    recorder record;
    void *block;
} releaser;

/* On HIGH, free a block and empty the cache: pressure ends inside the callback. */
static void release_on_high(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                            void *context)
{
    releaser *self = context;
    callback_depth++;
    deepest_callback = callback_depth > deepest_callback ? callback_depth : deepest_callback;
    record_call(&self->record, level, readings);
    if (level == GM_PRESSURE_HIGH && self->block) {
        CHECK_OK(gm_free(allocator, self->block));
        self->block = NULL;
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL); /* changed, but told after this returns */
        CHECK_EQ_INT(self->record.calls, 1);
    }
    callback_depth--;
}

static void a_change_caused_inside_a_callback_follows_it(void)
{
    gm_allocator *allocator = make(segments);
    releaser self;
    recorder_init(&self.record);
    self.block = take(allocator, 400 * MiB, 0);
    CHECK_OK(gm_on_pressure(allocator, release_on_high, &self));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, GM_PRESSURE_SIGNAL_RESERVED, NULL));
    deepest_callback = 0;
    void *other = take(allocator, 200 * MiB, 0); /* 600 MiB: high; the callback brings it to 200 MiB */
    CHECK_EQ_INT(calls_of(&self.record), 2);
    CHECK_EQ_INT(self.record.levels[0], GM_PRESSURE_HIGH);
    CHECK_EQ_INT(self.record.levels[1], GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(self.record.readings[1].reserved_bytes, 200 * MiB);
    CHECK_EQ_INT(deepest_callback, 1);
    CHECK_EQ_INT(stats_of(allocator).num_pressure_callbacks, 2);
    CHECK_OK(gm_free(allocator, other));
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- registration */

static void remove_self(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                        void *context)
{
    record_call(context, level, readings);
    CHECK_OK(gm_remove_pressure_callback(allocator, remove_self, context));
}

static void registration_rules(void)
{
    gm_allocator *allocator = make(segments);
    recorder first, second, once;
    recorder_init(&first);
    recorder_init(&second);
    recorder_init(&once);
    CHECK_STATUS(gm_on_pressure(allocator, NULL, &first), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_on_pressure(NULL, record, &first), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_on_pressure(allocator, record, &first));
    CHECK_STATUS(gm_on_pressure(allocator, record, &first), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("already registered");
    CHECK_OK(gm_on_pressure(allocator, record, &second));
    CHECK_OK(gm_on_pressure(allocator, remove_self, &once));
    CHECK_OK(gm_remove_pressure_callback(allocator, record, &second));
    CHECK_STATUS(gm_remove_pressure_callback(allocator, record, &second), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not registered");
    CHECK_OK(set_policy(allocator, 0.5, 0.25, 0, NULL));
    void *block = take(allocator, 600 * MiB, 0);
    CHECK_OK(gm_free(allocator, block));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(calls_of(&first), 2); /* high, normal */
    CHECK_EQ_INT(calls_of(&second), 0);
    CHECK_EQ_INT(calls_of(&once), 1); /* removed itself in its first call */
    CHECK_STATUS(gm_remove_pressure_callback(allocator, remove_self, &once), GM_ERROR_INVALID_ARGUMENT);
    /* At most 16. */
    recorder many[16];
    size_t added = 1;
    for (size_t i = 0; i < 16 && added < 16; i++, added++)
        CHECK_OK(gm_on_pressure(allocator, record, &many[i]));
    CHECK_STATUS(gm_on_pressure(allocator, record, &many[15]), GM_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE("at most 16 callbacks");
    gm_destroy(allocator, NULL);
}

typedef struct churn {
    gm_allocator *allocator;
    _Atomic bool stop;
    _Atomic int registrations;
} churn;

static void count_call(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                       void *context)
{
    (void)allocator;
    (void)level;
    (void)readings;
    (*(int *)context)++; /* a use after its removal would touch freed memory: the sanitizers say so */
}

static void *register_and_remove(void *argument)
{
    churn *work = argument;
    while (!work->stop) {
        int *counter = calloc(1, sizeof *counter);
        REQUIRE(counter);
        CHECK_OK(gm_on_pressure(work->allocator, count_call, counter));
        CHECK_OK(gm_remove_pressure_callback(work->allocator, count_call, counter));
        free(counter);
        work->registrations++;
    }
    return NULL;
}

static void registration_concurrent_with_dispatches_is_safe(void)
{
    gm_allocator *allocator = make(segments);
    CHECK_OK(set_policy(allocator, 0.5, 0.25, GM_PRESSURE_SIGNAL_ALLOCATED, NULL));
    churn work = {.allocator = allocator};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        REQUIRE(pthread_create(&threads[i], NULL, register_and_remove, &work) == 0);
    int rises = 0; /* two level changes each, until the other threads have churned a while */
    for (; rises < 300 || (work.registrations < 200 && rises < 100000); rises++) {
        void *block = take(allocator, 600 * MiB, 0);
        CHECK_OK(gm_free(allocator, block));
    }
    work.stop = true;
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    CHECK(work.registrations >= 200);
    CHECK_EQ_INT(stats_of(allocator).num_pressure_rises, rises);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- arguments, names, statistics */

static void policies_are_checked(void)
{
    gm_allocator *allocator = make(segments);
    static const struct {
        gm_pressure_policy policy;
        const char *message;
    } cases[] = {
        {{.high = 0, .low = 0}, "high (0) must be in (0, 1]"},
        {{.high = 1.5, .low = 0.5}, "high (1.5) must be in (0, 1]"},
        {{.high = 0.5, .low = 0.5}, "low (0.5) must be in (0, high = 0.5)"},
        {{.high = 0.5, .low = 0}, "low (0) must be in (0, high = 0.5)"},
        {{.high = 0.5, .low = 0.25, .signals = 1u << 7}, "unknown signal bits 0x80"},
        {{.high = 0.5, .low = 0.25, .psi_high = 10, .psi_low = 20}, "psi_low below it"},
        {{.high = 0.5, .low = 0.25, .psi_high = 120}, "psi_high must be in [0, 100]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_STATUS(gm_set_pressure_policy(allocator, &cases[i].policy), GM_ERROR_INVALID_ARGUMENT);
        CHECK_MESSAGE(cases[i].message);
    }
    CHECK_STATUS(gm_set_pressure_policy(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_get_pressure(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_get_pressure_policy(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_check_pressure(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_check_pressure(allocator, NULL)); /* no policy: nothing to read */
    gm_pressure_policy policy;
    CHECK_OK(gm_get_pressure_policy(allocator, &policy));
    CHECK(policy.high == 0); /* every refused policy left none */
    gm_destroy(allocator, NULL);
}

static void names_statistics_and_history_show_pressure(void)
{
    CHECK(!strcmp(gm_pressure_level_name(GM_PRESSURE_NORMAL), "normal"));
    CHECK(!strcmp(gm_pressure_level_name(GM_PRESSURE_HIGH), "high"));
    CHECK(!strcmp(gm_pressure_level_name(GM_PRESSURE_CRITICAL), "critical"));
    CHECK(!strcmp(gm_pressure_level_name((gm_pressure_level)9), "unknown"));
    static const char *const events[] = {"pressure_high", "pressure_critical", "pressure_normal", "pressure_release",
                                         "pressure_callbacks"};
    for (int i = 0; i < 5; i++)
        CHECK(!strcmp(gm_event_name((gm_event_kind)(GM_EVENT_PRESSURE_HIGH + i)), events[i]));
    gm_allocator *allocator = make(segments);
    CHECK_OK(gm_free(allocator, take(allocator, 100 * MiB, 0)));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, 0, NULL));
    void *block = take(allocator, 500 * MiB, 0);
    char table[8192];
    CHECK_OK(gm_summary(allocator, table, sizeof table, NULL));
    char row[64];
    snprintf(row, sizeof row, "| %-21s | %7d ", "Pressure rises", 1);
    CHECK(strstr(table, row) != NULL);
    snprintf(row, sizeof row, "| %-21s | %7d ", "Pressure releases", 1);
    CHECK(strstr(table, row) != NULL);
    CHECK(strstr(table, "Pressure callbacks") != NULL && strstr(table, "Pressure criticals") != NULL);
    char *json = NULL;
    CHECK_OK(gm_history_json(allocator, &json));
    CHECK(json && strstr(json, "\"action\": \"pressure_high\", \"address\": 1, \"size\": 629145600") != NULL);
    CHECK(json && strstr(json, "\"action\": \"pressure_release\", \"address\": 1, \"size\": 104857600") != NULL);
    gm_json_free(json);
    CHECK_OK(gm_free(allocator, block));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(watermarks_are_fractions_of_the_limit), TEST_CASE(level_rises_at_high_and_falls_only_below_low),
          TEST_CASE(ladder_releases_down_to_the_low_watermark), TEST_CASE(ladder_on_the_pages_engine_unmaps_idle_chunks),
          TEST_CASE(ladder_waits_for_pending_frees_when_step_one_is_not_enough),
          TEST_CASE(policy_set_above_high_acts_at_once),
          TEST_CASE(callbacks_run_outside_the_lock_and_may_use_the_allocator),
          TEST_CASE(critical_callback_frees_memory_and_the_allocation_succeeds),
          TEST_CASE(critical_callback_that_cannot_help_is_in_the_report),
          TEST_CASE(critical_callbacks_are_not_reentered), TEST_CASE(a_change_caused_inside_a_callback_follows_it),
          TEST_CASE(registration_rules), TEST_CASE(registration_concurrent_with_dispatches_is_safe),
          TEST_CASE(policies_are_checked), TEST_CASE(names_statistics_and_history_show_pressure))
