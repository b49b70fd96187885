/*
 * memory_curve.h -- memory over time, kept small enough to draw: samples of allocated and reserved
 * bytes go in one at a time (after each operation of a replay, or each event of a history) and at most
 * `max_buckets` buckets come out, each with the lowest, highest and last readings of the samples it
 * covers, so that a peak narrower than a bucket still shows. The peaks themselves, and the first sample
 * that reached each, are kept exactly.
 */
#ifndef GM_MEMORY_CURVE_H
#define GM_MEMORY_CURVE_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gm_curve_bucket {
    uint64_t first_x; /* the x (operation or event index) of its first sample */
    uint64_t last_x;
    uint64_t allocated_low, allocated_high, allocated_last;
    uint64_t reserved_low, reserved_high, reserved_last;
} gm_curve_bucket;

typedef struct gm_memory_curve {
    gm_curve_bucket *buckets;
    size_t bucket_count;
    size_t max_buckets;          /* even; when all are full, neighbours merge pairwise */
    uint64_t samples_per_bucket; /* a power of two */
    uint64_t sample_count;
    uint64_t peak_allocated;
    uint64_t peak_allocated_x;   /* the first sample at the peak */
    uint64_t peak_reserved;
    uint64_t peak_reserved_x;
} gm_memory_curve;

/* An empty curve of at most max_buckets buckets (rounded up to an even number, at least 2). */
gm_status gm_memory_curve_init(gm_memory_curve *curve, size_t max_buckets);
void gm_memory_curve_add(gm_memory_curve *curve, uint64_t x, uint64_t allocated, uint64_t reserved);
void gm_memory_curve_free(gm_memory_curve *curve);

/* The curve of a history, x being the event's index: allocated is the bytes asked for by `alloc`
 * events less those of `free_requested` ones (torch's allocated memory, unrounded); reserved is the
 * sizes of `segment_map` events less those of `segment_unmap` ones. Each level starts from the lowest
 * baseline that keeps it from going below zero, and reserved memory from the one that keeps it at least
 * the allocated: 0 for a whole history; for one whose ring dropped older events, a lower bound of what
 * was held before its first event (the baselines come out), which is then the curve's first sample. */
gm_status gm_memory_curve_from_events(gm_memory_curve *curve, size_t max_buckets, const gm_event *events,
                                      size_t count, uint64_t *allocated_baseline_out,
                                      uint64_t *reserved_baseline_out);

#endif
