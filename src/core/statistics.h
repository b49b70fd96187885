/*
 * statistics.h -- PyTorch's statistics, kept on the hot path at the cost of a few additions.
 *
 * The list of statistics is in gpumem.h (GM_POOL_STATISTICS, GM_COUNTERS); everything here iterates
 * it. Only the pools' readings are updated per call, and the all-pools peak: the all-pools current,
 * allocated and freed readings are sums, filled in when the statistics are read
 * (gm_stats_complete).
 *
 * The five statistics that every allocation and free changes (allocations, allocated, requested,
 * active, active bytes) are kept apart, one cache line each (gm_hot_stats): in the public gm_stats
 * layout one such change touches two lines (the pool's reading, and the all-pools peak beside the
 * other pool's current), and in an interpreter's loop, which leaves little of gpumem cached between
 * calls, every line is a trip to a slower cache. A line holds both pools' current, peak and
 * allocated readings with the all-pools current and peak; freed is what was allocated less what is
 * still there (gm_hot_stats_write fills them into a gm_stats when the statistics are read). With
 * publish:true they stay in the region's gm_stats instead, where other processes read them
 * (gm_arena_count, arena.h).
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

/* One statistic of gm_hot_stats: [0] is the small pool, [1] the large one. */
typedef struct gm_hot_stat {
    int64_t all_current;
    int64_t all_peak;
    int64_t current[2];
    int64_t peak[2];
    int64_t allocated[2]; /* increases since the accumulated readings were reset */
} gm_hot_stat;

typedef struct gm_hot_stats {
    _Alignas(64) gm_hot_stat allocation;
    _Alignas(64) gm_hot_stat allocated_bytes;
    _Alignas(64) gm_hot_stat requested_bytes;
    _Alignas(64) gm_hot_stat active;
    _Alignas(64) gm_hot_stat active_bytes;
    /* Each pool's current reading when the accumulated readings were last reset: freed = start +
     * allocated - current. Read only when the statistics are. */
    _Alignas(64) int64_t start[5][2];
} gm_hot_stats;

/* Add `amount` (may be negative) to a hot statistic of `pool` (GM_POOL_SMALL or GM_POOL_LARGE). */
static inline void gm_hot_stat_change(gm_hot_stat *stat, int pool, int64_t amount)
{
    int side = pool - GM_POOL_SMALL;
    stat->current[side] += amount;
    stat->all_current += amount;
    if (amount <= 0)
        return;
    stat->allocated[side] += amount;
    if (stat->current[side] > stat->peak[side])
        stat->peak[side] = stat->current[side];
    if (stat->all_current > stat->all_peak)
        stat->all_peak = stat->all_current;
}

/* The hot statistics' readings, every pool's, into their arrays of `stats`. */
void gm_hot_stats_write(const gm_hot_stats *hot, gm_stats *stats);
/* Every hot peak back to its current value. */
void gm_hot_stats_reset_peaks(gm_hot_stats *hot);
/* Every hot accumulated reading back to zero. */
void gm_hot_stats_reset_accumulated(gm_hot_stats *hot);

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
