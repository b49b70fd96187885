/*
 * statistics.c -- the statistics as a list: their names, and the operations on every one of them.
 *
 * Everything here iterates GM_POOL_STATISTICS and GM_COUNTERS (gpumem.h), so a statistic added
 * there is named, completed, reset, compared by gm_validate and shown by bindings without a change
 * here.
 */
#include "core/statistics.h"

#include <string.h>

const char *gm_stat_name(size_t index)
{
#define NAME(field, label, unit, origin) #field,
    static const char *const names[] = {GM_POOL_STATISTICS(NAME)};
#undef NAME
    return index < sizeof names / sizeof names[0] ? names[index] : NULL;
}

const char *gm_counter_name(size_t index)
{
#define NAME(field, label, origin) #field,
    static const char *const names[] = {GM_COUNTERS(NAME)};
#undef NAME
    return index < sizeof names / sizeof names[0] ? names[index] : NULL;
}

gm_stat *gm_stats_array(gm_stats *stats, size_t index)
{
#define ARRAY(field, label, unit, origin) stats->field,
    gm_stat *arrays[] = {GM_POOL_STATISTICS(ARRAY)};
#undef ARRAY
    return index < sizeof arrays / sizeof arrays[0] ? arrays[index] : NULL;
}

int64_t *gm_stats_counter(gm_stats *stats, size_t index)
{
#define COUNTER(field, label, origin) &stats->field,
    int64_t *counters[] = {GM_COUNTERS(COUNTER)};
#undef COUNTER
    return index < sizeof counters / sizeof counters[0] ? counters[index] : NULL;
}

void gm_stats_complete(gm_stats *stats)
{
    gm_stat *array;
    for (size_t i = 0; (array = gm_stats_array(stats, i)); i++) {
        array[GM_POOL_ALL].current = gm_stat_total(array);
        array[GM_POOL_ALL].allocated = array[GM_POOL_SMALL].allocated + array[GM_POOL_LARGE].allocated;
        array[GM_POOL_ALL].freed = array[GM_POOL_SMALL].freed + array[GM_POOL_LARGE].freed;
    }
}

void gm_stats_reset_peaks(gm_stats *stats)
{
    gm_stat *array;
    for (size_t i = 0; (array = gm_stats_array(stats, i)); i++) {
        array[GM_POOL_SMALL].peak = array[GM_POOL_SMALL].current;
        array[GM_POOL_LARGE].peak = array[GM_POOL_LARGE].current;
        array[GM_POOL_ALL].peak = gm_stat_total(array);
    }
}

void gm_stats_reset_accumulated(gm_stats *stats)
{
    gm_stat *array;
    for (size_t i = 0; (array = gm_stats_array(stats, i)); i++)
        for (int pool = 0; pool < GM_POOL_COUNT; pool++)
            array[pool].allocated = array[pool].freed = 0;
    int64_t *counter;
    for (size_t i = 0; (counter = gm_stats_counter(stats, i)); i++)
        *counter = 0;
}

/* The hot statistics with their gm_stats arrays, in one order. */
#define GM_HOT_STATISTICS(X) X(allocation) X(allocated_bytes) X(requested_bytes) X(active) X(active_bytes)

static void write_one(const gm_hot_stat *hot, const int64_t start[2], gm_stat array[GM_POOL_COUNT])
{
    int64_t freed_total = 0, allocated_total = 0;
    for (int side = 0; side < 2; side++) {
        gm_stat *stat = &array[GM_POOL_SMALL + side];
        stat->current = hot->current[side];
        stat->peak = hot->peak[side];
        stat->allocated = hot->allocated[side];
        stat->freed = start[side] + hot->allocated[side] - hot->current[side];
        allocated_total += stat->allocated;
        freed_total += stat->freed;
    }
    array[GM_POOL_ALL].current = hot->all_current;
    array[GM_POOL_ALL].peak = hot->all_peak;
    array[GM_POOL_ALL].allocated = allocated_total;
    array[GM_POOL_ALL].freed = freed_total;
}

void gm_hot_stats_write(const gm_hot_stats *hot, gm_stats *stats)
{
    size_t i = 0;
#define WRITE(field) write_one(&hot->field, hot->start[i], stats->field), i++;
    GM_HOT_STATISTICS(WRITE)
#undef WRITE
}

static void reset_peaks_of(gm_hot_stat *stat)
{
    stat->peak[0] = stat->current[0];
    stat->peak[1] = stat->current[1];
    stat->all_peak = stat->all_current;
}

void gm_hot_stats_reset_peaks(gm_hot_stats *hot)
{
#define RESET(field) reset_peaks_of(&hot->field);
    GM_HOT_STATISTICS(RESET)
#undef RESET
}

static void reset_accumulated_of(gm_hot_stat *stat, int64_t start[2])
{
    for (int side = 0; side < 2; side++) {
        stat->allocated[side] = 0;
        start[side] = stat->current[side];
    }
}

void gm_hot_stats_reset_accumulated(gm_hot_stats *hot)
{
    size_t i = 0;
#define RESET(field) reset_accumulated_of(&hot->field, hot->start[i]), i++;
    GM_HOT_STATISTICS(RESET)
#undef RESET
}
