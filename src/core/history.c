/*
 * history.c -- the history ring (history.h): a fixed array written round and round.
 */
#include "core/history.h"
#include "base/system_memory.h"

#include <stdlib.h>
#include <time.h>

gm_history *gm_history_create(size_t capacity)
{
    gm_history *history = gm_system_calloc(1, sizeof *history);
    if (!history)
        return NULL;
    history->events = capacity ? gm_system_calloc(capacity, sizeof *history->events) : NULL;
    if (capacity && !history->events) {
        free(history);
        return NULL;
    }
    history->capacity = capacity;
    return history;
}

void gm_history_destroy(gm_history *history)
{
    if (!history)
        return;
    free(history->events);
    free(history);
}

static uint64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

void gm_history_add(gm_history *history, gm_event_kind kind, uint64_t address, uint64_t size, gm_stream stream,
                    gm_pool_id pool)
{
    gm_event event = {.time_ns = monotonic_ns(), .address = address, .size = size, .stream = stream,
                      .tag = history->tagger ? history->tagger(history->tagger_context) : 0, .kind = kind,
                      .pool = pool};
    if (history->capacity)
        history->events[history->recorded++ % history->capacity] = event;
    if (history->observer)
        history->observer(&event, history->observer_context);
}

/* How many events the ring holds. */
static uint64_t gm_history_held(const gm_history *history)
{
    uint64_t since = history->recorded - history->forgotten;
    return since < history->capacity ? since : history->capacity;
}

void gm_history_keep_newest(gm_history *fresh, const gm_history *old)
{
    if (!fresh->capacity || !old->capacity)
        return;
    uint64_t held = gm_history_held(old);
    uint64_t kept = held < fresh->capacity ? held : fresh->capacity;
    for (uint64_t i = old->recorded - kept; i < old->recorded; i++)
        fresh->events[i % fresh->capacity] = old->events[i % old->capacity];
    fresh->recorded = old->recorded;
    fresh->forgotten = old->recorded - kept;
}

void gm_history_copy(const gm_history *history, gm_event *events, size_t capacity, size_t *count_out,
                     uint64_t *dropped_out)
{
    uint64_t held = gm_history_held(history);
    uint64_t first = history->recorded - held;
    size_t count = !events || held < capacity ? (size_t)held : capacity;
    *dropped_out = first;
    *count_out = count;
    if (!events)
        return;
    for (size_t i = 0; i < count; i++)
        events[i] = history->events[(first + i) % history->capacity];
}
