/*
 * pressure_test.h -- what test_pressure.c and test_pressure_signals.c share: allocators on the sim
 * backend, their readings, and a callback that records its calls (level, readings, thread).
 */
#ifndef GM_PRESSURE_TEST_H
#define GM_PRESSURE_TEST_H

#include "core/allocator.h"

#include "test.h"

#include <pthread.h>

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* The segments engine without release_before_growth: a request of 10 MiB or more gets a segment of its
 * own size, so reserved bytes move by exactly the sizes asked for. */
static const char *const segments = "engine:segments,capacity:1GiB,release_before_growth:false,history:256";

static inline gm_allocator *make(const char *config)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator != NULL);
    return allocator;
}

static inline void *take(gm_allocator *allocator, uint64_t size, gm_stream stream)
{
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, size, stream, &pointer));
    return pointer;
}

static inline gm_pressure_level level_of(gm_allocator *allocator)
{
    gm_pressure_readings readings;
    CHECK_OK(gm_get_pressure(allocator, &readings));
    return readings.level;
}

static inline gm_stats stats_of(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats;
}

static inline gm_status set_policy(gm_allocator *allocator, double high, double low, uint32_t signals, const char *root)
{
    gm_pressure_policy policy = {.high = high, .low = low, .signals = signals, .host_root = root};
    return gm_set_pressure_policy(allocator, &policy);
}

/* ---------------------------------------------------------------- a callback that records its calls */

typedef struct recorder {
    pthread_mutex_t lock;
    int calls;
    gm_pressure_level levels[64];
    gm_pressure_readings readings[64];
    pthread_t threads[64];
    int depth, deepest; /* callbacks running on the stack now, and at most */
} recorder;

static inline void recorder_init(recorder *record)
{
    memset(record, 0, sizeof *record);
    pthread_mutex_init(&record->lock, NULL);
}

static inline int calls_of(recorder *record)
{
    pthread_mutex_lock(&record->lock);
    int calls = record->calls;
    pthread_mutex_unlock(&record->lock);
    return calls;
}

static inline void record_call(recorder *record, gm_pressure_level level, const gm_pressure_readings *readings)
{
    pthread_mutex_lock(&record->lock);
    if (record->calls < 64) {
        record->levels[record->calls] = level;
        record->readings[record->calls] = *readings;
        record->threads[record->calls] = pthread_self();
    }
    record->calls++;
    pthread_mutex_unlock(&record->lock);
}

static inline void record(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                   void *context)
{
    (void)allocator;
    record_call(context, level, readings);
}

/* The events of the history, newest last. */
static inline size_t read_history(gm_allocator *allocator, gm_event *events, size_t capacity)
{
    size_t count = 0;
    CHECK_OK(gm_history_read(allocator, events, capacity, &count, NULL));
    return count;
}

/* The index of the first event of `kind` at or after `from`, or -1. */
static inline long find_event(const gm_event *events, size_t count, size_t from, gm_event_kind kind)
{
    for (size_t i = from; i < count; i++)
        if (events[i].kind == kind)
            return (long)i;
    return -1;
}

#endif
