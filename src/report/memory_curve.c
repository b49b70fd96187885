/*
 * memory_curve.c -- min/max downsampling of memory over time (memory_curve.h). Bucket i holds samples
 * [i * samples_per_bucket, (i + 1) * samples_per_bucket); when a sample would open bucket max_buckets,
 * neighbouring buckets are merged pairwise (lows and highs combined, the later one's last reading
 * kept) and each bucket covers twice as many samples from then on. The number of samples need not be
 * known in advance, and the result has between max_buckets / 2 and max_buckets buckets.
 */
#include "report/memory_curve.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>
#include <string.h>

gm_status gm_memory_curve_init(gm_memory_curve *curve, size_t max_buckets)
{
    memset(curve, 0, sizeof *curve);
    max_buckets = max_buckets < 2 ? 2 : max_buckets + (max_buckets & 1);
    curve->buckets = gm_system_calloc(max_buckets, sizeof *curve->buckets);
    if (!curve->buckets)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the memory curve");
    curve->max_buckets = max_buckets;
    curve->samples_per_bucket = 1;
    return GM_OK;
}

static uint64_t lower(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t higher(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* Merge bucket pairs (0,1), (2,3), ...: the buckets are all full, so every pair is whole. */
static void halve(gm_memory_curve *curve)
{
    for (size_t i = 0; i < curve->bucket_count / 2; i++) {
        const gm_curve_bucket *left = &curve->buckets[2 * i], *right = &curve->buckets[2 * i + 1];
        gm_curve_bucket merged = {
            .first_x = left->first_x,
            .last_x = right->last_x,
            .allocated_low = lower(left->allocated_low, right->allocated_low),
            .allocated_high = higher(left->allocated_high, right->allocated_high),
            .allocated_last = right->allocated_last,
            .reserved_low = lower(left->reserved_low, right->reserved_low),
            .reserved_high = higher(left->reserved_high, right->reserved_high),
            .reserved_last = right->reserved_last,
        };
        curve->buckets[i] = merged;
    }
    curve->bucket_count /= 2;
    curve->samples_per_bucket *= 2;
}

void gm_memory_curve_add(gm_memory_curve *curve, uint64_t x, uint64_t allocated, uint64_t reserved)
{
    uint64_t index = curve->sample_count / curve->samples_per_bucket;
    if (index >= curve->max_buckets) {
        halve(curve);
        index = curve->sample_count / curve->samples_per_bucket;
    }
    if (curve->sample_count == 0 || allocated > curve->peak_allocated) {
        curve->peak_allocated = allocated;
        curve->peak_allocated_x = x;
    }
    if (curve->sample_count == 0 || reserved > curve->peak_reserved) {
        curve->peak_reserved = reserved;
        curve->peak_reserved_x = x;
    }
    curve->sample_count++;
    gm_curve_bucket *bucket = &curve->buckets[index];
    if (index == curve->bucket_count) { /* the bucket's first sample */
        curve->bucket_count++;
        *bucket = (gm_curve_bucket){x, x, allocated, allocated, allocated, reserved, reserved, reserved};
        return;
    }
    bucket->last_x = x;
    bucket->allocated_low = lower(bucket->allocated_low, allocated);
    bucket->allocated_high = higher(bucket->allocated_high, allocated);
    bucket->allocated_last = allocated;
    bucket->reserved_low = lower(bucket->reserved_low, reserved);
    bucket->reserved_high = higher(bucket->reserved_high, reserved);
    bucket->reserved_last = reserved;
}

void gm_memory_curve_free(gm_memory_curve *curve)
{
    free(curve->buckets);
    memset(curve, 0, sizeof *curve);
}

/* a + b, held within [-INT64_MAX, INT64_MAX] (a malformed history may hold any sizes). */
static int64_t add_clamped(int64_t a, int64_t b)
{
    int64_t sum;
    if (__builtin_add_overflow(a, b, &sum))
        return b > 0 ? INT64_MAX : -INT64_MAX;
    return sum < -INT64_MAX ? -INT64_MAX : sum;
}

static uint64_t level(int64_t value)
{
    return value < 0 ? 0 : (uint64_t)value;
}

/* The change an event makes to the allocated and reserved levels. */
static void event_change(const gm_event *event, int64_t *allocated, int64_t *reserved)
{
    *allocated = *reserved = 0;
    int64_t size = event->size > INT64_MAX ? INT64_MAX : (int64_t)event->size;
    switch (event->kind) {
    case GM_EVENT_ALLOC:
        *allocated = size;
        break;
    case GM_EVENT_FREE_REQUESTED:
        *allocated = -size;
        break;
    case GM_EVENT_SEGMENT_MAP:
        *reserved = size;
        break;
    case GM_EVENT_SEGMENT_UNMAP:
        *reserved = -size;
        break;
    default:
        break;
    }
}

gm_status gm_memory_curve_from_events(gm_memory_curve *curve, size_t max_buckets, const gm_event *events,
                                      size_t count, uint64_t *allocated_baseline_out,
                                      uint64_t *reserved_baseline_out)
{
    gm_status status = gm_memory_curve_init(curve, max_buckets);
    if (status != GM_OK)
        return status;
    /* First the lowest each level reaches relative to its start: the baseline lifts that to zero. Reserved
     * memory also holds all allocated memory at every moment, so its baseline is lifted until it does:
     * by the most that allocated memory ever rises above reserved memory, relative to their starts. */
    int64_t allocated = 0, reserved = 0, lowest_allocated = 0, lowest_reserved = 0, most_unreserved = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t allocated_change, reserved_change;
        event_change(&events[i], &allocated_change, &reserved_change);
        allocated = add_clamped(allocated, allocated_change);
        reserved = add_clamped(reserved, reserved_change);
        lowest_allocated = allocated < lowest_allocated ? allocated : lowest_allocated;
        lowest_reserved = reserved < lowest_reserved ? reserved : lowest_reserved;
        int64_t unreserved = add_clamped(allocated, -reserved); /* add_clamped keeps reserved > INT64_MIN */
        most_unreserved = unreserved > most_unreserved ? unreserved : most_unreserved;
    }
    allocated = -lowest_allocated;
    int64_t holding_allocated = add_clamped(allocated, most_unreserved);
    reserved = -lowest_reserved > holding_allocated ? -lowest_reserved : holding_allocated;
    *allocated_baseline_out = (uint64_t)allocated;
    *reserved_baseline_out = (uint64_t)reserved;
    if (count && (allocated || reserved)) /* the levels before the first event (older ones were dropped) */
        gm_memory_curve_add(curve, 0, level(allocated), level(reserved));
    for (size_t i = 0; i < count; i++) {
        int64_t allocated_change, reserved_change;
        event_change(&events[i], &allocated_change, &reserved_change);
        allocated = add_clamped(allocated, allocated_change);
        reserved = add_clamped(reserved, reserved_change);
        gm_memory_curve_add(curve, i, level(allocated), level(reserved));
    }
    return GM_OK;
}
