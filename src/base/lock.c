/*
 * lock.c -- the contended paths of lock.h's mutex (the three-state futex mutex).
 *
 * A waiter marks the word 2 ("held, with waiters") by exchanging it in: if the exchange finds it 0
 * the lock was released meanwhile and the waiter now holds it (marked 2, so that its own release
 * wakes a possible other waiter: a spurious wake at worst). Otherwise it sleeps while the word is
 * still 2; FUTEX_WAIT returns at once if the word changed before the sleep, so no wake is lost.
 */
#include "base/lock.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static void futex(_Atomic uint32_t *word, int operation, uint32_t value)
{
    syscall(SYS_futex, (uint32_t *)word, operation | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

void gm_lock_wait(gm_lock *lock)
{
    gm_before_blocking();
    while (atomic_exchange_explicit(&lock->state, 2, memory_order_acquire) != 0)
        futex(&lock->state, FUTEX_WAIT, 2);
}

void gm_lock_wake(gm_lock *lock)
{
    futex(&lock->state, FUTEX_WAKE, 1);
}
