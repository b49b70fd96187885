/*
 * publish.h -- the writer of a published-statistics region (see publish.c and docs/formats.md).
 *
 * In terms of gm_stats and plain values only, so that the front end can publish without the
 * monitor knowing anything of the allocator. Calls on one publisher must be serialized by the
 * caller (the allocator's mutex); readers in other processes need no lock.
 */
#ifndef GM_PUBLISH_H
#define GM_PUBLISH_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gm_publisher gm_publisher;

/* What the region's header says about its writer. */
typedef struct gm_publish_identity {
    int device;
    const char *backend;
    const char *engine;
    uint64_t page_size;
    uint64_t device_total_bytes;
} gm_publish_identity;

/* Create the region of this process and device, holding `stats`. On failure nothing is created,
 * *publisher_out is NULL and gm_last_error() says why. */
gm_status gm_publisher_open(const gm_publish_identity *identity, const gm_stats *stats,
                            gm_publisher **publisher_out);

/* Publish what a malloc or free without a device call changes: every pool statistic's readings of
 * `pool` (GM_POOL_SMALL or GM_POOL_LARGE), the all-pools peaks and the counters. No system call, no
 * lock. */
void gm_publisher_write_pool(gm_publisher *publisher, const gm_stats *stats, int pool);

/* Publish the whole of `stats` (device calls included). */
void gm_publisher_write_all(gm_publisher *publisher, const gm_stats *stats);

/* The region's path. */
const char *gm_publisher_path(const gm_publisher *publisher);

/* Unmap and remove the region. NULL does nothing. */
void gm_publisher_close(gm_publisher *publisher);

#endif
