/*
 * test_blocking_hook.c -- gm_set_blocking_hook: the hook a caller holding a lock of its own (gpumem.cupy's
 * compiled path, holding Python's GIL) sets for its next call, called right before that call first
 * waits inside gpumem and at most once.
 *   - a malloc served from the cache and its free wait for nothing: no call;
 *   - a malloc that needs the device: one call, however many device calls follow;
 *   - a mutex another thread holds: the hook runs before the wait (gm_mutex_lock), and not when the
 *     mutex is free;
 *   - cleared with gm_set_blocking_hook(NULL, NULL), nothing is called;
 *   - a pressure dispatch (the caller's callbacks) calls it first;
 *   - pinned host memory: a cache miss calls it, a hit does not.
 */
#include "test.h"

#include "base/blocking.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

static int hook_calls;

static void count_hook(void *context)
{
    CHECK(context == &hook_calls);
    hook_calls++;
}

static void arm(void)
{
    gm_set_blocking_hook(count_hook, &hook_calls);
}

static void disarm(void)
{
    gm_set_blocking_hook(NULL, NULL);
}

static void a_cached_block_waits_for_nothing(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    void *pointer = NULL;
    hook_calls = 0;
    arm();
    CHECK_OK(gm_malloc(allocator, 5 << 20, 0, &pointer)); /* new memory: device calls */
    disarm();
    CHECK_EQ_INT(hook_calls, 1);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK(stats.device_calls[GM_CALL_MAP] >= 1);
    for (int round = 0; round < 3; round++) {
        arm();
        CHECK_OK(gm_free(allocator, pointer));
        CHECK_OK(gm_malloc(allocator, 5 << 20, 0, &pointer)); /* the cached block */
        disarm();
    }
    CHECK_EQ_INT(hook_calls, 1);
    arm();
    disarm();
    CHECK_OK(gm_free(allocator, pointer));
    CHECK_OK(gm_empty_cache(allocator)); /* device calls, with the hook cleared */
    CHECK_EQ_INT(hook_calls, 1);
    gm_destroy(allocator, NULL);
}

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static atomic_int waiter_hooked;

static void note_waiting(void *context)
{
    (void)context;
    atomic_store(&waiter_hooked, 1);
}

static void *lock_with_hook(void *unused)
{
    (void)unused;
    gm_set_blocking_hook(note_waiting, NULL);
    gm_mutex_lock(&held);
    pthread_mutex_unlock(&held);
    gm_set_blocking_hook(NULL, NULL);
    return NULL;
}

static void a_held_mutex_calls_the_hook_before_the_wait(void)
{
    hook_calls = 0;
    arm();
    gm_mutex_lock(&held); /* free: no wait, no call */
    disarm();
    CHECK_EQ_INT(hook_calls, 0);
    atomic_store(&waiter_hooked, 0);
    pthread_t waiter;
    CHECK(pthread_create(&waiter, NULL, lock_with_hook, NULL) == 0);
    /* The waiter's hook runs while this thread holds the mutex (given up to 10 s). */
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        usleep(100);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (!atomic_load(&waiter_hooked) && now.tv_sec - start.tv_sec < 10);
    CHECK(atomic_load(&waiter_hooked));
    pthread_mutex_unlock(&held);
    CHECK(pthread_join(waiter, NULL) == 0);
}

static int armed;

static void on_pressure(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                        void *context)
{
    (void)allocator;
    (void)level;
    (void)readings;
    if (armed)
        CHECK_EQ_INT(hook_calls, 1); /* the caller let its lock go before its callbacks run */
    (*(int *)context)++;
}

/* A cached block that lifts allocated memory above the high watermark: no device call, but the level
 * changes and the callbacks run, after the hook. */
static void a_pressure_dispatch_calls_it_first(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    gm_pressure_policy policy = {.high = 0.5, .low = 0.25, .signals = GM_PRESSURE_SIGNAL_ALLOCATED};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    int callbacks = 0;
    CHECK_OK(gm_on_pressure(allocator, on_pressure, &callbacks));
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, 600 << 20, 0, &pointer)); /* high: callbacks */
    CHECK_OK(gm_free(allocator, pointer));                  /* normal again: callbacks */
    int before = callbacks;
    CHECK(before >= 2);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    int64_t maps = stats.device_calls[GM_CALL_MAP];
    hook_calls = 0;
    armed = 1;
    arm();
    CHECK_OK(gm_malloc(allocator, 600 << 20, 0, &pointer)); /* the cached block: high again */
    disarm();
    armed = 0;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.device_calls[GM_CALL_MAP], maps);
    CHECK(callbacks > before);
    CHECK_EQ_INT(hook_calls, 1);
    CHECK_OK(gm_free(allocator, pointer));
    CHECK_OK(gm_remove_pressure_callback(allocator, on_pressure, &callbacks));
    gm_destroy(allocator, NULL);
}

static void pinned_memory_calls_it_on_a_miss_only(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    void *pointer = NULL;
    hook_calls = 0;
    arm();
    CHECK_OK(gm_host_malloc(allocator, 4096, &pointer)); /* a miss: the backend's host memory */
    disarm();
    CHECK_EQ_INT(hook_calls, 1);
    arm();
    CHECK_OK(gm_host_free(allocator, pointer));
    CHECK_OK(gm_host_malloc(allocator, 4096, &pointer)); /* a hit */
    disarm();
    CHECK_EQ_INT(hook_calls, 1);
    CHECK_OK(gm_host_free(allocator, pointer));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(a_cached_block_waits_for_nothing), TEST_CASE(a_held_mutex_calls_the_hook_before_the_wait),
          TEST_CASE(a_pressure_dispatch_calls_it_first), TEST_CASE(pinned_memory_calls_it_on_a_miss_only))
