/*
 * statistics.h -- PyTorch's statistics, kept on the hot path at the cost of a few additions.
 *
 * The list of statistics is in gpumem.h (GM_POOL_STATISTICS, GM_COUNTERS); everything here iterates
 * it. Only the pools' readings are updated per call, and the all-pools peak: the all-pools current,
 * allocated and freed readings are sums, filled in when the statistics are read
 * (gm_stats_complete).
 */
#ifndef GM_STATISTICS_H
#define GM_STATISTICS_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

/* Add `amount` (may be negative) to one reading of a statistic. */
static inline void gm_stat_add(gm_stat *stat, int64_t amount)
{
    stat->current += amount;
    if (amount > 0)
        stat->allocated += amount;
    else
        stat->freed -= amount;
    if (stat->current > stat->peak)
        stat->peak = stat->current;
}

/* The all-pools current reading of a statistic. */
static inline int64_t gm_stat_total(const gm_stat stat[GM_POOL_COUNT])
{
    return stat[GM_POOL_SMALL].current + stat[GM_POOL_LARGE].current;
}

/* Add `amount` to a statistic of `pool` (and keep the all-pools peak). */
static inline void gm_stat_change(gm_stat stat[GM_POOL_COUNT], int pool, int64_t amount)
{
    gm_stat_add(&stat[pool], amount);
    if (amount <= 0)
        return;
    int64_t total = gm_stat_total(stat);
    if (total > stat[GM_POOL_ALL].peak)
        stat[GM_POOL_ALL].peak = total;
}

/* The pool statistics of a gm_stats, in the order of GM_POOL_STATISTICS; NULL past the last. */
gm_stat *gm_stats_array(gm_stats *stats, size_t index);
/* The counters of a gm_stats, in the order of GM_COUNTERS; NULL past the last. */
int64_t *gm_stats_counter(gm_stats *stats, size_t index);
/* Fill in the all-pools current, allocated and freed readings of every statistic. */
void gm_stats_complete(gm_stats *stats);
/* Every peak back to its current value. */
void gm_stats_reset_peaks(gm_stats *stats);
/* Every accumulated reading and counter back to zero. */
void gm_stats_reset_accumulated(gm_stats *stats);

#endif
