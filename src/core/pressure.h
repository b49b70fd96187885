/*
 * pressure.h -- memory pressure (pressure.c): a policy's watermarks, the level with hysteresis, the
 * ladder of actions on a rise, and the callbacks, for the front end's files (allocator.c calls in at a
 * few points; the state lives in gm_allocator).
 *
 * Locks, outermost first: policy_lock (gm_set_pressure_policy, gm_check_pressure), the allocator's
 * lock, callbacks_lock (the list of callbacks), sampler_lock (the sampling thread's sleep). No callback
 * runs with any of them held.
 */
#ifndef GM_PRESSURE_H
#define GM_PRESSURE_H

#include "gpumem.h"

#include "core/arena.h"
#include "core/statistics.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define GM_PRESSURE_MAX_CALLBACKS 16
#define GM_PRESSURE_ROOT_SIZE 4096

typedef struct gm_pressure_registration {
    gm_pressure_callback function;
    void *context;
    uint64_t id; /* unique per registration: a dispatch calls only those still registered */
} gm_pressure_registration;

typedef struct gm_pressure {
    /* The byte signals' watch, read by every call that changes them (under the allocator's lock):
     * evaluate when a reading reaches an `above` bound, or when both are under their `below` bound. */
    bool watching; /* a policy with a byte signal is set */
    uint64_t reserved_above, allocated_above; /* UINT64_MAX: not watched */
    uint64_t reserved_below, allocated_below; /* 0: not watched */

    /* Under the allocator's lock. */
    bool policy_set;
    gm_pressure_policy policy;  /* with its defaults filled in; host_root points at `root` */
    char root[GM_PRESSURE_ROOT_SIZE];
    uint64_t high_bytes, low_bytes; /* the watermarks of the byte signals, of the memory limit */
    gm_pressure_level level;        /* NORMAL or HIGH; CRITICAL is shown while critical_calls > 0 */
    unsigned critical_calls;
    uint64_t changes;
    gm_pressure_readings sampled;   /* the device and host fields as last sampled */

    /* The callbacks. */
    pthread_mutex_t callbacks_lock;
    pthread_cond_t callbacks_idle; /* a dispatch ended, or a dispatcher began waiting in a removal */
    gm_pressure_registration callbacks[GM_PRESSURE_MAX_CALLBACKS];
    size_t callback_count;
    uint64_t next_id;
    unsigned dispatches;         /* dispatches calling callbacks now, on any thread */
    unsigned dispatches_waiting; /* of those, blocked in a removal or in stopping the sampling thread */

    /* The sampling thread. */
    pthread_mutex_t policy_lock;
    pthread_mutex_t sampler_lock;
    pthread_cond_t sampler_wake;
    pthread_t sampler;
    bool sampler_running;
    bool sampler_stop;
} gm_pressure;

/* At creation and destruction of an allocator. gm_pressure_stop runs without the allocator's lock: it
 * joins the sampling thread, which may be waiting for that lock. */
void gm_pressure_init(gm_pressure *pressure);
void gm_pressure_stop(gm_allocator *allocator);
void gm_pressure_destroy(gm_pressure *pressure);

/* Whether the byte readings crossed a watched bound: after every call that changes them, when
 * `watching`. Comparisons only. */
static inline bool gm_pressure_crossed(const gm_pressure *pressure, const gm_arena *arena)
{
    uint64_t reserved = (uint64_t)gm_stat_total(arena->stats->reserved_bytes);
    uint64_t allocated = (uint64_t)gm_arena_allocated_bytes(arena);
    return reserved >= pressure->reserved_above || allocated >= pressure->allocated_above ||
           (reserved < pressure->reserved_below && allocated < pressure->allocated_below);
}

/* With the allocator's lock held and its statistics open for change: evaluate the level from the
 * readings (a rise runs the release steps of the ladder). True when the level changed: *event_out is
 * then what gm_pressure_dispatch is to tell the callbacks, once the lock is released. */
bool gm_pressure_evaluate_locked(gm_allocator *allocator, gm_pressure_readings *event_out);

/* The memory limit changed (lock held): the watermarks in bytes follow it. */
void gm_pressure_limit_changed_locked(gm_allocator *allocator);

/* An allocation of `size` bytes on `stream` fails after the allocator's retries, which released
 * `released_bytes` (lock held). True when callbacks are to be called first (there are some and this
 * thread is not already inside one): *event_out is the CRITICAL event; gm_pressure_end_critical_locked
 * follows the dispatch. */
bool gm_pressure_begin_critical_locked(gm_allocator *allocator, uint64_t size, gm_stream stream,
                                       uint64_t released_bytes, gm_pressure_readings *event_out);
void gm_pressure_end_critical_locked(gm_allocator *allocator);

/* Without the allocator's lock: call the callbacks with `event`; how many calls were made. On a thread
 * already calling this allocator's callbacks the event is deferred to the end of that dispatch. */
unsigned gm_pressure_dispatch(gm_allocator *allocator, const gm_pressure_readings *event);

#endif
