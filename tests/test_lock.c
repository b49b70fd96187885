/*
 * test_lock.c -- the allocator's mutex (base/lock.h): a try on a held lock fails and changes nothing,
 * a waiter marks the word and sleeps until the release wakes it, and threads that increment a plain
 * counter under the lock lose no increment (ThreadSanitizer checks the ordering in its build).
 */
#include "test.h"

#include "base/lock.h"

#include <pthread.h>
#include <time.h>

static void a_try_takes_a_free_lock_and_fails_on_a_held_one(void)
{
    gm_lock lock = {0};
    CHECK(gm_lock_try_acquire(&lock));
    CHECK_EQ_INT(atomic_load(&lock.state), 1);
    CHECK(!gm_lock_try_acquire(&lock));
    CHECK_EQ_INT(atomic_load(&lock.state), 1); /* the failed try changed nothing */
    gm_lock_release(&lock);
    CHECK_EQ_INT(atomic_load(&lock.state), 0);
    CHECK(gm_lock_try_acquire(&lock));
    gm_lock_release(&lock);
}

typedef struct waiter_state {
    gm_lock *lock;
    atomic_int got_it;
} waiter_state;

static void *wait_for_the_lock(void *context)
{
    waiter_state *state = context;
    gm_lock_acquire(state->lock);
    atomic_store(&state->got_it, 1);
    gm_lock_release(state->lock);
    return NULL;
}

static void sleep_ms(long milliseconds)
{
    struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000L};
    nanosleep(&pause, NULL);
}

static void a_waiter_sleeps_until_the_release_wakes_it(void)
{
    gm_lock lock = {0};
    waiter_state state = {.lock = &lock};
    gm_lock_acquire(&lock);
    pthread_t thread;
    REQUIRE(pthread_create(&thread, NULL, wait_for_the_lock, &state) == 0);
    for (int i = 0; i < 500 && atomic_load(&lock.state) != 2; i++)
        sleep_ms(2);
    CHECK_EQ_INT(atomic_load(&lock.state), 2); /* the waiter said it waits */
    CHECK_EQ_INT(atomic_load(&state.got_it), 0);
    gm_lock_release(&lock);
    REQUIRE(pthread_join(thread, NULL) == 0);
    CHECK_EQ_INT(atomic_load(&state.got_it), 1);
    CHECK_EQ_INT(atomic_load(&lock.state), 0);
}

#define THREADS 4
#define INCREMENTS 100000

typedef struct counter_state {
    gm_lock lock;
    long counter; /* plain: only the lock orders its increments */
} counter_state;

static void *increment(void *context)
{
    counter_state *state = context;
    for (int i = 0; i < INCREMENTS; i++) {
        gm_lock_acquire(&state->lock);
        state->counter++;
        gm_lock_release(&state->lock);
    }
    return NULL;
}

static void threads_lose_no_increment(void)
{
    counter_state state = {.counter = 0};
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&threads[i], NULL, increment, &state) == 0);
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_join(threads[i], NULL) == 0);
    CHECK_EQ_INT(state.counter, (long)THREADS * INCREMENTS);
    CHECK_EQ_INT(atomic_load(&state.lock.state), 0);
}

RUN_TESTS(TEST_CASE(a_try_takes_a_free_lock_and_fails_on_a_held_one),
          TEST_CASE(a_waiter_sleeps_until_the_release_wakes_it), TEST_CASE(threads_lose_no_increment))
