/*
 * blocking.h -- a caller's chance to let its own lock go before gpumem waits.
 *
 * An interpreter that calls gpumem while holding a global lock of its own (CPython's GIL, held by
 * gpumem.cupy's compiled allocation path) must not keep it while gpumem waits: for one of gpumem's
 * mutexes, which another thread may hold while it waits for that global lock (a Python callback), or
 * for the device, whose host callbacks may need it. Letting it go around every call costs more than
 * the call itself on the common path (a cached block: no wait, no device call), so the caller sets a
 * one-shot hook for its next call (gm_set_blocking_hook, gpumem.h) and gpumem calls it right before the
 * first wait of that call: a mutex another thread holds (gm_mutex_lock, and the allocator's own mutex,
 * lock.h), a condition wait, a thread join, any backend call, a pressure dispatch. Without a hook set
 * these cost one thread-local test.
 */
#ifndef GM_BLOCKING_H
#define GM_BLOCKING_H

#include <pthread.h>
#include <stddef.h>

typedef struct gm_blocking_hook_state {
    void (*hook)(void *context);
    void *context;
} gm_blocking_hook_state;

extern _Thread_local gm_blocking_hook_state gm_blocking_hook_pending;

/* Call this thread's pending hook, once. */
static inline void gm_before_blocking(void)
{
    if (__builtin_expect(gm_blocking_hook_pending.hook != NULL, 0)) {
        void (*hook)(void *context) = gm_blocking_hook_pending.hook;
        gm_blocking_hook_pending.hook = NULL;
        hook(gm_blocking_hook_pending.context);
    }
}

/* pthread_mutex_lock, with the hook called first when another thread holds the mutex. */
static inline void gm_mutex_lock(pthread_mutex_t *mutex)
{
    if (pthread_mutex_trylock(mutex) != 0) {
        gm_before_blocking();
        pthread_mutex_lock(mutex);
    }
}

#endif
