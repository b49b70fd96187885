/*
 * pressure.c -- memory pressure: a policy's watermarks over a few signals, a level with hysteresis, a
 * ladder of actions when it rises, and the callbacks a program registers to react.
 *
 * The level. NORMAL until any watched signal reaches the high watermark; then HIGH until every one is
 * below the low watermark (hysteresis: a job hovering around one threshold would otherwise act at
 * every allocation). CRITICAL is not a state of the signals but a moment: an allocation that still
 * fails after the allocator's own retries calls the callbacks with CRITICAL and retries once more.
 *
 * The signals, and what each costs:
 *   - reserved and allocated bytes change with every call, so they are checked after every call that
 *     changes them: two comparisons with bounds precomputed in bytes (gm_pressure_crossed), no
 *     division, no system call. The bounds follow the level: while NORMAL the high watermark is
 *     watched, while HIGH the low one, so an evaluation runs only when a bound is crossed.
 *   - the driver's used memory (a device call; other processes count), and the host's MemAvailable,
 *     memory PSI and this process's memory cgroup (file reads; in a container the cgroup's limit, the
 *     lower of memory.max and memory.high, not the host's RAM, is where the job is throttled or killed)
 *     cost microseconds, too much for every call, so a thread samples them every interval_ms. A thread
 *     rather than a sample taken on some slow path: the hot path would need a clock reading to know
 *     when to sample, and a training loop in its steady state has no slow path at all (it makes no
 *     device call), yet the host may run out of memory meanwhile. The thread exists only while a
 *     policy with such a signal is set; it is stopped and joined on every policy change and by
 *     gm_destroy. It sleeps on a condition variable, so stopping it never waits an interval.
 *
 * The ladder on a rise (run with the allocator's lock held, inside the statistics' seqlock bracket):
 *   1. release idle cached memory until reserved memory is down to the low watermark's target (the
 *      engines' release_cached with a target: the pages engine unmaps idle chunks, the segments
 *      engine frees whole free segments). Cheap: no stream is waited for but those of the chunks moved;
 *   2. if a signal is still at or above high, release everything releasable: first wait for the
 *      streams of the frees pending on other streams (gm_record_stream), whose blocks then become
 *      free, then give back every cached piece. This synchronizes, so it comes second;
 *   3. after the lock is released, call the callbacks.
 * A rise caused only by host signals (host, psi, cgroup) skips 1 and 2 when the device is not host
 * memory: giving back GPU memory does not help the host, nor is it charged to the cgroup. Each step is
 * counted (num_pressure_*) and recorded in the history.
 *
 * Callbacks never run with a lock held: the level change is decided under the lock, and
 * gm_pressure_dispatch runs after it is released, so a callback may allocate, free or empty the cache
 * on the same allocator. A change that a callback's own calls cause is not dispatched recursively: the
 * thread's dispatch frame keeps the latest such change and delivers it after the current round.
 * Registrations carry an id; a dispatch copies the list, then calls each entry only if its id is still
 * registered, and a removal waits for dispatches on other threads to end, so once
 * gm_remove_pressure_callback returns its callback is not running anywhere (a dispatcher that is itself
 * waiting, in a removal or in a policy change that stops the sampling thread, is not waited for: the two
 * would wait for each other).
 */
#include "core/pressure.h"
#include "base/blocking.h"

#include "base/error.h"
#include "core/allocator.h"
#include "core/oom_report.h"
#include "monitor/host_memory.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_INTERVAL_MS 100
#define DEFAULT_PSI_HIGH 10.0
#define DISPATCH_ROUNDS 8 /* deferred changes delivered after one dispatch, at most */

static const uint32_t byte_signals = GM_PRESSURE_SIGNAL_RESERVED | GM_PRESSURE_SIGNAL_ALLOCATED;
static const uint32_t sampled_signals =
    GM_PRESSURE_SIGNAL_DEVICE | GM_PRESSURE_SIGNAL_HOST | GM_PRESSURE_SIGNAL_PSI | GM_PRESSURE_SIGNAL_CGROUP;
static const uint32_t host_signals = GM_PRESSURE_SIGNAL_HOST | GM_PRESSURE_SIGNAL_PSI | GM_PRESSURE_SIGNAL_CGROUP;

const char *gm_pressure_level_name(gm_pressure_level level)
{
    switch (level) {
    case GM_PRESSURE_NORMAL: return "normal";
    case GM_PRESSURE_HIGH: return "high";
    case GM_PRESSURE_CRITICAL: return "critical";
    }
    return "unknown";
}

/* ---------------------------------------------------------------- readings */

/* `fraction` of `total` bytes, to the nearest byte. */
static uint64_t watermark(double fraction, uint64_t total)
{
    return (uint64_t)(fraction * (double)total + 0.5);
}

static void clear_samples(gm_pressure_readings *sampled)
{
    sampled->device_used_bytes = sampled->device_total_bytes = 0;
    sampled->host_available_bytes = sampled->host_total_bytes = -1;
    sampled->host_psi_avg10 = -1;
    sampled->cgroup_current_bytes = sampled->cgroup_limit_bytes = -1;
}

/* The byte readings as of now, the sampled ones as last read (lock held). */
static gm_pressure_readings current_readings(gm_allocator *allocator)
{
    const gm_pressure *pressure = &allocator->pressure;
    gm_pressure_readings readings = pressure->sampled;
    readings.level = pressure->level;
    readings.signals_high = 0;
    readings.reserved_bytes = (uint64_t)gm_stat_total(allocator->arena.stats->reserved_bytes);
    readings.allocated_bytes = (uint64_t)gm_arena_allocated_bytes(&allocator->arena);
    readings.limit_bytes = allocator->arena.memory_limit;
    readings.high_bytes = pressure->policy_set ? pressure->high_bytes : 0;
    readings.low_bytes = pressure->policy_set ? pressure->low_bytes : 0;
    readings.request_bytes = 0;
    readings.released_bytes = 0;
    readings.changes = pressure->changes;
    return readings;
}

/* The watched signals at or above the high watermark (`high`), or at or above the low one. */
static uint32_t signals_at_or_above(const gm_pressure *pressure, const gm_pressure_readings *readings, bool high)
{
    if (!pressure->policy_set)
        return 0;
    const gm_pressure_policy *policy = &pressure->policy;
    double fraction = high ? policy->high : policy->low;
    uint64_t bytes = high ? pressure->high_bytes : pressure->low_bytes;
    uint32_t found = 0;
    if (readings->reserved_bytes >= bytes)
        found |= GM_PRESSURE_SIGNAL_RESERVED;
    if (readings->allocated_bytes >= bytes)
        found |= GM_PRESSURE_SIGNAL_ALLOCATED;
    if (readings->device_total_bytes &&
        readings->device_used_bytes >= watermark(fraction, readings->device_total_bytes))
        found |= GM_PRESSURE_SIGNAL_DEVICE;
    if (readings->host_total_bytes > 0 && readings->host_available_bytes >= 0 &&
        readings->host_available_bytes <= readings->host_total_bytes &&
        (uint64_t)(readings->host_total_bytes - readings->host_available_bytes) >=
            watermark(fraction, (uint64_t)readings->host_total_bytes))
        found |= GM_PRESSURE_SIGNAL_HOST;
    if (readings->host_psi_avg10 >= 0 && readings->host_psi_avg10 >= (high ? policy->psi_high : policy->psi_low))
        found |= GM_PRESSURE_SIGNAL_PSI;
    if (readings->cgroup_limit_bytes > 0 && readings->cgroup_current_bytes >= 0 &&
        (uint64_t)readings->cgroup_current_bytes >= watermark(fraction, (uint64_t)readings->cgroup_limit_bytes))
        found |= GM_PRESSURE_SIGNAL_CGROUP;
    return found & policy->signals;
}

/* The bounds the hot path compares with, for the level now. While HIGH and held there by a sampled
 * signal, the byte readings cannot end it: the sampling thread re-evaluates when it reads again. */
static void set_watch(gm_pressure *pressure, uint32_t holding_signals)
{
    uint32_t signals = pressure->policy_set ? pressure->policy.signals : 0;
    pressure->watching = (signals & byte_signals) != 0;
    bool normal = pressure->level == GM_PRESSURE_NORMAL;
    bool held_by_samples = (holding_signals & sampled_signals) != 0;
    pressure->reserved_above = normal && (signals & GM_PRESSURE_SIGNAL_RESERVED) ? pressure->high_bytes : UINT64_MAX;
    pressure->allocated_above = normal && (signals & GM_PRESSURE_SIGNAL_ALLOCATED) ? pressure->high_bytes : UINT64_MAX;
    if (normal || held_by_samples) {
        pressure->reserved_below = pressure->allocated_below = 0;
        return;
    }
    pressure->reserved_below = signals & GM_PRESSURE_SIGNAL_RESERVED ? pressure->low_bytes : UINT64_MAX;
    pressure->allocated_below = signals & GM_PRESSURE_SIGNAL_ALLOCATED ? pressure->low_bytes : UINT64_MAX;
}

/* ---------------------------------------------------------------- the ladder */

/* The signals that giving back cached device memory lowers: the host's too when the device is host
 * memory (the host backend). */
static uint32_t releasable_signals(const gm_allocator *allocator)
{
    uint32_t signals = byte_signals | GM_PRESSURE_SIGNAL_DEVICE;
    if (!strcmp(allocator->arena.backend->operations->name, "host"))
        signals |= host_signals;
    return signals;
}

/* Reserved bytes to release down to: the low watermark of the byte signals, and as much as takes the
 * device's used memory down to its low watermark. UINT64_MAX: nothing to aim at. */
static uint64_t release_target(const gm_pressure *pressure, const gm_pressure_readings *readings)
{
    uint32_t signals = pressure->policy.signals;
    uint64_t target = signals & byte_signals ? pressure->low_bytes : UINT64_MAX;
    if ((signals & GM_PRESSURE_SIGNAL_DEVICE) && readings->device_total_bytes) {
        uint64_t low = watermark(pressure->policy.low, readings->device_total_bytes);
        if (readings->device_used_bytes > low) {
            uint64_t excess = readings->device_used_bytes - low;
            uint64_t device_target = readings->reserved_bytes > excess ? readings->reserved_bytes - excess : 0;
            target = device_target < target ? device_target : target;
        }
    }
    if (target == UINT64_MAX && (signals & host_signals))
        target = pressure->low_bytes; /* the host backend under host pressure */
    return target;
}

/* One release step of the ladder: give cached memory back until reserved is at most `keep_bytes`. */
static void release_step(gm_allocator *allocator, gm_pressure_readings *readings, int step, uint64_t keep_bytes)
{
    gm_arena *arena = &allocator->arena;
    if (readings->reserved_bytes <= keep_bytes)
        return;
    arena->engine->release_cached(arena, keep_bytes);
    uint64_t after = (uint64_t)gm_stat_total(arena->stats->reserved_bytes);
    uint64_t released = readings->reserved_bytes - after;
    readings->reserved_bytes = after;
    if (!released)
        return;
    arena->stats->num_pressure_releases++;
    arena->stats->pressure_released_bytes += (int64_t)released;
    gm_history_record(arena->history, GM_EVENT_PRESSURE_RELEASE, (uint64_t)step, released, 0, GM_NO_POOL);
    readings->released_bytes += released;
    /* What the driver counts as used drops by as much, until the next sample says otherwise. */
    uint64_t *device_used = &allocator->pressure.sampled.device_used_bytes;
    *device_used -= released < *device_used ? released : *device_used;
    readings->device_used_bytes = *device_used;
}

static void run_ladder(gm_allocator *allocator, gm_pressure_readings *readings)
{
    gm_pressure *pressure = &allocator->pressure;
    uint32_t releasable = releasable_signals(allocator);
    if (!(readings->signals_high & releasable))
        return;
    uint64_t target = release_target(pressure, readings);
    if (target != UINT64_MAX)
        release_step(allocator, readings, 1, target);
    if (signals_at_or_above(pressure, readings, true) & releasable) {
        gm_wait_for_pending_frees_locked(allocator);
        release_step(allocator, readings, 2, 0);
    }
}

/* ---------------------------------------------------------------- evaluation */

bool gm_pressure_evaluate_locked(gm_allocator *allocator, gm_pressure_readings *event_out)
{
    gm_pressure *pressure = &allocator->pressure;
    gm_arena *arena = &allocator->arena;
    gm_pressure_readings readings = current_readings(allocator);
    readings.signals_high = signals_at_or_above(pressure, &readings, true);
    if (pressure->level == GM_PRESSURE_NORMAL) {
        if (!readings.signals_high) {
            set_watch(pressure, 0);
            return false;
        }
        pressure->level = GM_PRESSURE_HIGH;
        arena->stats->num_pressure_rises++;
        gm_history_record(arena->history, GM_EVENT_PRESSURE_HIGH, readings.signals_high, readings.reserved_bytes, 0,
                          GM_NO_POOL);
        run_ladder(allocator, &readings);
    } else {
        uint32_t holding = signals_at_or_above(pressure, &readings, false);
        if (holding) {
            set_watch(pressure, holding);
            return false;
        }
        pressure->level = GM_PRESSURE_NORMAL;
        gm_history_record(arena->history, GM_EVENT_PRESSURE_NORMAL, 0, readings.reserved_bytes, 0, GM_NO_POOL);
    }
    set_watch(pressure, 0);
    readings.level = pressure->level;
    readings.changes = ++pressure->changes;
    *event_out = readings;
    return true;
}

void gm_pressure_limit_changed_locked(gm_allocator *allocator)
{
    gm_pressure *pressure = &allocator->pressure;
    if (!pressure->policy_set)
        return;
    pressure->high_bytes = watermark(pressure->policy.high, allocator->arena.memory_limit);
    pressure->low_bytes = watermark(pressure->policy.low, allocator->arena.memory_limit);
    set_watch(pressure, 0);
}

/* ---------------------------------------------------------------- callbacks */

typedef struct dispatch_frame {
    gm_allocator *allocator;
    struct dispatch_frame *outer;
    bool deferred;                       /* a change arrived while the callbacks ran */
    gm_pressure_readings deferred_event; /* the latest such change */
} dispatch_frame;

static _Thread_local dispatch_frame *innermost_frame;

/* This thread's dispatch for `allocator`, if it is calling that allocator's callbacks now. */
static dispatch_frame *frame_of(const gm_allocator *allocator)
{
    for (dispatch_frame *frame = innermost_frame; frame; frame = frame->outer)
        if (frame->allocator == allocator)
            return frame;
    return NULL;
}

static ptrdiff_t find_registration(const gm_pressure *pressure, gm_pressure_callback function, void *context)
{
    for (size_t i = 0; i < pressure->callback_count; i++)
        if (pressure->callbacks[i].function == function && pressure->callbacks[i].context == context)
            return (ptrdiff_t)i;
    return -1;
}

static bool still_registered(gm_pressure *pressure, uint64_t id)
{
    gm_mutex_lock(&pressure->callbacks_lock);
    bool found = false;
    for (size_t i = 0; i < pressure->callback_count && !found; i++)
        found = pressure->callbacks[i].id == id;
    pthread_mutex_unlock(&pressure->callbacks_lock);
    return found;
}

static size_t callback_count(gm_pressure *pressure)
{
    gm_mutex_lock(&pressure->callbacks_lock);
    size_t count = pressure->callback_count;
    pthread_mutex_unlock(&pressure->callbacks_lock);
    return count;
}

/* One round: every callback registered, with `event`. */
static unsigned call_callbacks(gm_allocator *allocator, const gm_pressure_readings *event)
{
    gm_pressure *pressure = &allocator->pressure;
    gm_pressure_registration list[GM_PRESSURE_MAX_CALLBACKS];
    gm_mutex_lock(&pressure->callbacks_lock);
    size_t count = pressure->callback_count;
    memcpy(list, pressure->callbacks, count * sizeof list[0]);
    pressure->dispatches++;
    pthread_mutex_unlock(&pressure->callbacks_lock);
    unsigned called = 0;
    for (size_t i = 0; i < count; i++) {
        if (!still_registered(pressure, list[i].id))
            continue;
        list[i].function(allocator, event->level, event, list[i].context);
        called++;
    }
    gm_mutex_lock(&pressure->callbacks_lock);
    pressure->dispatches--;
    pthread_cond_broadcast(&pressure->callbacks_idle);
    pthread_mutex_unlock(&pressure->callbacks_lock);
    return called;
}

/* Count a round's calls in the statistics and the history. */
static void count_calls(gm_allocator *allocator, gm_pressure_level level, unsigned called)
{
    if (!called)
        return;
    gm_lock_for_change(allocator);
    allocator->arena.stats->num_pressure_callbacks += called;
    gm_history_record(allocator->arena.history, GM_EVENT_PRESSURE_CALLBACKS, (uint64_t)level, called, 0, GM_NO_POOL);
    gm_unlock_after_change(allocator);
}

unsigned gm_pressure_dispatch(gm_allocator *allocator, const gm_pressure_readings *event)
{
    dispatch_frame *running = frame_of(allocator);
    if (running) {
        running->deferred = true;
        running->deferred_event = *event;
        return 0;
    }
    if (!callback_count(&allocator->pressure))
        return 0;
    gm_before_blocking(); /* callbacks are the caller's code: they may wait for its lock */
    /* Callbacks call gpumem, which sets this thread's last error: the caller's (an OOM report) is kept. */
    char *saved_error = strdup(gm_last_error());
    gm_oom_cause saved_cause = gm_last_oom_cause();
    dispatch_frame frame = {.allocator = allocator, .outer = innermost_frame};
    innermost_frame = &frame;
    unsigned total = 0;
    gm_pressure_readings current = *event;
    for (int round = 0; round < DISPATCH_ROUNDS; round++) {
        unsigned called = call_callbacks(allocator, &current);
        count_calls(allocator, current.level, called);
        total += called;
        if (!frame.deferred)
            break;
        frame.deferred = false;
        current = frame.deferred_event;
    }
    innermost_frame = frame.outer;
    if (saved_error)
        gm_fail(GM_OK, "%s", saved_error);
    free(saved_error);
    gm_set_last_oom_cause(saved_cause);
    return total;
}

gm_status gm_on_pressure(gm_allocator *allocator, gm_pressure_callback callback, void *context)
{
    if (!allocator || !callback)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_on_pressure: %s is NULL", allocator ? "callback" : "allocator");
    gm_pressure *pressure = &allocator->pressure;
    gm_status status = GM_OK;
    gm_mutex_lock(&pressure->callbacks_lock);
    if (find_registration(pressure, callback, context) >= 0)
        status = gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_on_pressure: this callback is already registered with this "
                         "context");
    else if (pressure->callback_count == GM_PRESSURE_MAX_CALLBACKS)
        status = gm_fail(GM_ERROR_NOT_SUPPORTED, "gm_on_pressure: at most %d callbacks", GM_PRESSURE_MAX_CALLBACKS);
    else
        pressure->callbacks[pressure->callback_count++] =
            (gm_pressure_registration){.function = callback, .context = context, .id = ++pressure->next_id};
    pthread_mutex_unlock(&pressure->callbacks_lock);
    return status;
}

/* A thread inside a dispatch is about to wait for another thread (callbacks_lock held): removals on other
 * threads must not wait for its dispatch, or the two would wait for each other. */
static void begin_waiting_locked(gm_pressure *pressure)
{
    pressure->dispatches_waiting++;
    pthread_cond_broadcast(&pressure->callbacks_idle);
}

gm_status gm_remove_pressure_callback(gm_allocator *allocator, gm_pressure_callback callback, void *context)
{
    if (!allocator || !callback)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_remove_pressure_callback: %s is NULL",
                       allocator ? "callback" : "allocator");
    gm_pressure *pressure = &allocator->pressure;
    gm_mutex_lock(&pressure->callbacks_lock);
    ptrdiff_t index = find_registration(pressure, callback, context);
    if (index < 0) {
        pthread_mutex_unlock(&pressure->callbacks_lock);
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_remove_pressure_callback: this callback is not registered "
                       "with this context");
    }
    memmove(&pressure->callbacks[index], &pressure->callbacks[index + 1],
            (pressure->callback_count - (size_t)index - 1) * sizeof pressure->callbacks[0]);
    pressure->callback_count--;
    /* Wait for the dispatches of other threads; this thread's own (a callback removing one) and those
     * of threads that are themselves waiting (here, or for the sampling thread) are not waited for. */
    bool inside = frame_of(allocator) != NULL;
    if (inside)
        begin_waiting_locked(pressure);
    if (pressure->dispatches > pressure->dispatches_waiting)
        gm_before_blocking();
    while (pressure->dispatches > pressure->dispatches_waiting)
        pthread_cond_wait(&pressure->callbacks_idle, &pressure->callbacks_lock);
    if (inside)
        pressure->dispatches_waiting--;
    pthread_mutex_unlock(&pressure->callbacks_lock);
    return GM_OK;
}

/* ---------------------------------------------------------------- critical: an allocation would fail */

bool gm_pressure_begin_critical_locked(gm_allocator *allocator, uint64_t size, gm_stream stream,
                                       uint64_t released_bytes, gm_pressure_readings *event_out)
{
    gm_pressure *pressure = &allocator->pressure;
    if (frame_of(allocator) || !callback_count(pressure))
        return false;
    pressure->critical_calls++;
    allocator->arena.stats->num_pressure_criticals++;
    gm_pressure_readings readings = current_readings(allocator);
    readings.signals_high = signals_at_or_above(pressure, &readings, true);
    readings.level = GM_PRESSURE_CRITICAL;
    readings.request_bytes = size;
    readings.released_bytes = released_bytes;
    readings.changes = ++pressure->changes;
    gm_history_record(allocator->arena.history, GM_EVENT_PRESSURE_CRITICAL, readings.signals_high, size, stream,
                      GM_NO_POOL);
    *event_out = readings;
    return true;
}

void gm_pressure_end_critical_locked(gm_allocator *allocator)
{
    allocator->pressure.critical_calls--;
}

/* ---------------------------------------------------------------- sampling */

/* The host's memory and this process's memory cgroup, read without any lock (file reads), into the
 * sample's host and cgroup fields; only what a watched signal needs is read. A process without a
 * cgroup limit reads as such (limit -1), which no watermark reaches: nothing to report. */
static void sample_host(const gm_pressure_policy *policy, gm_pressure_readings *sample)
{
    clear_samples(sample);
    gm_host_memory host;
    if ((policy->signals & (GM_PRESSURE_SIGNAL_HOST | GM_PRESSURE_SIGNAL_PSI)) &&
        gm_host_memory_read(policy->host_root, &host) == GM_OK) {
        sample->host_available_bytes = host.available_bytes;
        sample->host_total_bytes = host.total_bytes;
        sample->host_psi_avg10 = host.pressure_some_avg10;
    }
    gm_cgroup_memory cgroup;
    if ((policy->signals & GM_PRESSURE_SIGNAL_CGROUP) &&
        gm_cgroup_memory_read(policy->host_root, (long)getpid(), &cgroup) == GM_OK) {
        sample->cgroup_current_bytes = cgroup.current_known ? cgroup.current_bytes : -1;
        sample->cgroup_limit_bytes = gm_cgroup_memory_limit(&cgroup);
    }
}

/* The driver's memory, lock held (the backend is not to be called concurrently). */
static void sample_device(gm_allocator *allocator, const gm_pressure_readings *host)
{
    gm_pressure_readings *sample = &allocator->pressure.sampled;
    sample->host_available_bytes = host->host_available_bytes;
    sample->host_total_bytes = host->host_total_bytes;
    sample->host_psi_avg10 = host->host_psi_avg10;
    sample->cgroup_current_bytes = host->cgroup_current_bytes;
    sample->cgroup_limit_bytes = host->cgroup_limit_bytes;
    uint64_t free_bytes = 0, total_bytes = 0;
    if (!(allocator->pressure.policy.signals & GM_PRESSURE_SIGNAL_DEVICE) ||
        gm_backend_memory_info(allocator->arena.backend, &free_bytes, &total_bytes) != GM_OK || free_bytes > total_bytes) {
        sample->device_used_bytes = sample->device_total_bytes = 0;
        return;
    }
    sample->device_used_bytes = total_bytes - free_bytes;
    sample->device_total_bytes = total_bytes;
}

/* Read the sampled signals and evaluate. True when the level changed: the caller is to dispatch *event_out
 * once it holds no lock. The policy must not change meanwhile (the caller holds policy_lock, or is the
 * sampling thread, which a policy change stops first). */
static bool sample_and_evaluate(gm_allocator *allocator, gm_pressure_readings *event_out)
{
    gm_pressure_readings host;
    sample_host(&allocator->pressure.policy, &host);
    gm_lock_for_change(allocator);
    if (allocator->pressure.policy_set)
        sample_device(allocator, &host);
    bool changed = gm_pressure_evaluate_locked(allocator, event_out);
    gm_unlock_after_change(allocator);
    return changed;
}

static struct timespec deadline_after(uint32_t milliseconds)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += milliseconds / 1000;
    deadline.tv_nsec += (long)(milliseconds % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    return deadline;
}

/* The allocator whose sampling thread this is (NULL on every other thread). */
static _Thread_local const gm_allocator *sampling_for;

static void *sampler_main(void *argument)
{
    gm_allocator *allocator = argument;
    gm_pressure *pressure = &allocator->pressure;
    sampling_for = allocator;
    gm_mutex_lock(&pressure->sampler_lock);
    while (!pressure->sampler_stop) {
        struct timespec deadline = deadline_after(pressure->policy.interval_ms);
        int waited = 0;
        while (!pressure->sampler_stop && waited != ETIMEDOUT)
            waited = pthread_cond_timedwait(&pressure->sampler_wake, &pressure->sampler_lock, &deadline);
        if (pressure->sampler_stop)
            break;
        pthread_mutex_unlock(&pressure->sampler_lock);
        gm_pressure_readings event;
        if (sample_and_evaluate(allocator, &event))
            gm_pressure_dispatch(allocator, &event);
        gm_mutex_lock(&pressure->sampler_lock);
    }
    pthread_mutex_unlock(&pressure->sampler_lock);
    return NULL;
}

/* The thread blocks every signal, so that the program's handlers run on the program's threads. */
static void start_sampler(gm_allocator *allocator)
{
    gm_pressure *pressure = &allocator->pressure;
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pressure->sampler_stop = false;
    pressure->sampler_running = pthread_create(&pressure->sampler, NULL, sampler_main, allocator) == 0;
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
}

static void stop_sampler(gm_allocator *allocator)
{
    gm_pressure *pressure = &allocator->pressure;
    if (!pressure->sampler_running)
        return;
    gm_mutex_lock(&pressure->sampler_lock);
    pressure->sampler_stop = true;
    pthread_cond_signal(&pressure->sampler_wake);
    pthread_mutex_unlock(&pressure->sampler_lock);
    gm_before_blocking();
    pthread_join(pressure->sampler, NULL);
    pressure->sampler_running = false;
}

static bool on_sampler_thread(const gm_allocator *allocator)
{
    return sampling_for == allocator;
}

/* ---------------------------------------------------------------- the policy */

static gm_status check_policy(const gm_pressure_policy *policy)
{
    if (!(policy->high > 0 && policy->high <= 1))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: high (%g) must be in (0, 1]", policy->high);
    if (!(policy->low > 0 && policy->low < policy->high))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: low (%g) must be in (0, high = %g)",
                       policy->low, policy->high);
    if (policy->signals & ~(byte_signals | sampled_signals))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: unknown signal bits 0x%x",
                       policy->signals & ~(byte_signals | sampled_signals));
    if (!(policy->psi_high >= 0 && policy->psi_high <= 100 && policy->psi_low >= 0) || /* NaN fails too */
        (policy->psi_low && policy->psi_low >= (policy->psi_high ? policy->psi_high : DEFAULT_PSI_HIGH)))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: psi_high must be in [0, 100] and psi_low "
                       "below it");
    if (policy->host_root && strlen(policy->host_root) >= GM_PRESSURE_ROOT_SIZE)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: host_root is too long");
    return GM_OK;
}

/* Take `policy` (NULL: none) with its defaults filled in (lock held). */
static void apply_policy(gm_allocator *allocator, const gm_pressure_policy *policy)
{
    gm_pressure *pressure = &allocator->pressure;
    pressure->policy_set = policy != NULL;
    clear_samples(&pressure->sampled);
    if (!policy) {
        memset(&pressure->policy, 0, sizeof pressure->policy);
        set_watch(pressure, 0);
        return;
    }
    gm_pressure_policy filled = *policy;
    filled.signals = filled.signals ? filled.signals : byte_signals;
    filled.interval_ms = filled.interval_ms ? filled.interval_ms : DEFAULT_INTERVAL_MS;
    filled.psi_high = filled.psi_high ? filled.psi_high : DEFAULT_PSI_HIGH;
    filled.psi_low = filled.psi_low ? filled.psi_low : filled.psi_high / 2;
    snprintf(pressure->root, sizeof pressure->root, "%s", policy->host_root ? policy->host_root : "/");
    filled.host_root = pressure->root;
    pressure->policy = filled;
    gm_pressure_limit_changed_locked(allocator);
}

gm_status gm_set_pressure_policy(gm_allocator *allocator, const gm_pressure_policy *policy)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: allocator is NULL");
    gm_status status = policy ? check_policy(policy) : GM_OK;
    if (status != GM_OK)
        return status;
    gm_pressure *pressure = &allocator->pressure;
    if (on_sampler_thread(allocator))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_set_pressure_policy: not from a callback on the sampling "
                       "thread (it would have to wait for itself)");
    /* From a callback, this thread may wait for others (policy_lock's holder, the sampling thread) that
     * wait in a removal for its dispatch: it counts as waiting meanwhile. */
    bool inside = frame_of(allocator) != NULL;
    if (inside) {
        gm_mutex_lock(&pressure->callbacks_lock);
        begin_waiting_locked(pressure);
        pthread_mutex_unlock(&pressure->callbacks_lock);
    }
    gm_mutex_lock(&pressure->policy_lock);
    stop_sampler(allocator);
    if (inside) {
        gm_mutex_lock(&pressure->callbacks_lock);
        pressure->dispatches_waiting--;
        pthread_mutex_unlock(&pressure->callbacks_lock);
    }
    gm_lock_for_change(allocator);
    apply_policy(allocator, policy);
    gm_unlock_after_change(allocator);
    gm_pressure_readings event;
    bool changed = sample_and_evaluate(allocator, &event); /* a rise is acted on now */
    if (policy && (pressure->policy.signals & sampled_signals))
        start_sampler(allocator);
    pthread_mutex_unlock(&pressure->policy_lock);
    if (changed)
        gm_pressure_dispatch(allocator, &event);
    return GM_OK;
}

gm_status gm_get_pressure_policy(gm_allocator *allocator, gm_pressure_policy *policy_out)
{
    if (!allocator || !policy_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_pressure_policy: %s is NULL", allocator ? "policy_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    *policy_out = allocator->pressure.policy;
    gm_lock_release(&allocator->lock);
    return GM_OK;
}

gm_status gm_get_pressure(gm_allocator *allocator, gm_pressure_readings *readings_out)
{
    if (!allocator || !readings_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_get_pressure: %s is NULL", allocator ? "readings_out" : "allocator");
    gm_lock_acquire(&allocator->lock);
    gm_pressure_readings readings = current_readings(allocator);
    readings.signals_high = signals_at_or_above(&allocator->pressure, &readings, true);
    if (allocator->pressure.critical_calls)
        readings.level = GM_PRESSURE_CRITICAL;
    gm_lock_release(&allocator->lock);
    *readings_out = readings;
    return GM_OK;
}

gm_status gm_check_pressure(gm_allocator *allocator, gm_pressure_readings *readings_out)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_check_pressure: allocator is NULL");
    gm_pressure *pressure = &allocator->pressure;
    bool sampler = on_sampler_thread(allocator); /* a callback there: the policy cannot change meanwhile */
    if (!sampler)
        gm_mutex_lock(&pressure->policy_lock);
    gm_pressure_readings event;
    bool changed = sample_and_evaluate(allocator, &event);
    if (!sampler)
        pthread_mutex_unlock(&pressure->policy_lock);
    if (changed)
        gm_pressure_dispatch(allocator, &event);
    return readings_out ? gm_get_pressure(allocator, readings_out) : GM_OK;
}

/* ---------------------------------------------------------------- life */

void gm_pressure_init(gm_pressure *pressure)
{
    memset(pressure, 0, sizeof *pressure);
    clear_samples(&pressure->sampled);
    pressure->reserved_above = pressure->allocated_above = UINT64_MAX;
    pthread_mutex_init(&pressure->callbacks_lock, NULL);
    pthread_cond_init(&pressure->callbacks_idle, NULL);
    pthread_mutex_init(&pressure->policy_lock, NULL);
    pthread_mutex_init(&pressure->sampler_lock, NULL);
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&pressure->sampler_wake, &attributes);
    pthread_condattr_destroy(&attributes);
}

void gm_pressure_stop(gm_allocator *allocator)
{
    gm_mutex_lock(&allocator->pressure.policy_lock);
    stop_sampler(allocator);
    pthread_mutex_unlock(&allocator->pressure.policy_lock);
}

void gm_pressure_destroy(gm_pressure *pressure)
{
    pthread_mutex_destroy(&pressure->callbacks_lock);
    pthread_cond_destroy(&pressure->callbacks_idle);
    pthread_mutex_destroy(&pressure->policy_lock);
    pthread_mutex_destroy(&pressure->sampler_lock);
    pthread_cond_destroy(&pressure->sampler_wake);
}
