/*
 * lock.h -- the allocator's mutex: one word, taken with one atomic instruction when free.
 *
 * Every public call takes the allocator's lock, so on the common path (a cached block) the lock is a
 * good part of the call, and in an interpreter's loop, where the cache holds little of gpumem between
 * calls, every cache line it touches counts. pthread's mutex is 40 bytes, its trylock checks the
 * mutex's kind and records the owner's thread id (another line, in the thread's descriptor). This
 * one is the word itself, placed in the allocator's first cache line with the fields every call
 * reads: 0 free, 1 held, 2 held with threads waiting. A thread that finds it held calls the caller's
 * blocking hook (blocking.h) once, then sleeps on the word (Linux futex) until the holder's release
 * wakes one waiter. The acquiring exchange and the releasing one order memory as a mutex does, which
 * is also what ThreadSanitizer checks.
 */
#ifndef GM_LOCK_H
#define GM_LOCK_H

#include "base/blocking.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct gm_lock {
    _Atomic uint32_t state;
} gm_lock;

/* The contended paths (lock.c): wait until the lock is had, wake one waiter. */
void gm_lock_wait(gm_lock *lock);
void gm_lock_wake(gm_lock *lock);

/* The lock if it is free (true), else false at once. */
static inline bool gm_lock_try_acquire(gm_lock *lock)
{
    uint32_t expected = 0;
    return atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void gm_lock_acquire(gm_lock *lock)
{
    if (!gm_lock_try_acquire(lock))
        gm_lock_wait(lock);
}

static inline void gm_lock_release(gm_lock *lock)
{
    if (atomic_exchange_explicit(&lock->state, 0, memory_order_release) == 2)
        gm_lock_wake(lock);
}

#endif
