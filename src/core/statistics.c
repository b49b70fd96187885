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
