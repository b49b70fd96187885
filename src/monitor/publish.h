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

#include <stdatomic.h>
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

/* The writer's side of the region's seqlock. */
typedef struct gm_seqlock_writer {
    _Atomic uint64_t *sequence; /* in the region */
    uint64_t value;             /* its value: we are its only writer */
} gm_seqlock_writer;

/* Create the region of this process and device, holding a copy of `stats` and of the pinned host
 * cache's `pinned_host`. On failure nothing is created, *publisher_out is NULL and gm_last_error()
 * says why. */
gm_status gm_publisher_open(const gm_publish_identity *identity, const gm_stats *stats,
                            const gm_host_stats *pinned_host, gm_publisher **publisher_out);

/* The region's gm_stats: the writer keeps its statistics there, changing them only between
 * gm_publish_begin and gm_publish_end. */
gm_stats *gm_publisher_stats(gm_publisher *publisher);

/* Publish the cache's free bytes and largest free block (between gm_publish_begin and _end). */
void gm_publisher_set_cache(gm_publisher *publisher, uint64_t free_bytes, uint64_t largest_free_block_bytes);

/* Publish the pinned host cache's statistics (between gm_publish_begin and _end): a copy of eleven
 * numbers, no system call. */
void gm_publisher_set_pinned_host(gm_publisher *publisher, const gm_host_stats *pinned_host);

/* The region's seqlock. */
gm_seqlock_writer *gm_publisher_seqlock(gm_publisher *publisher);

/* Before changing the region's statistics: the sequence goes odd (readers will retry). */
static inline void gm_publish_begin(gm_seqlock_writer *writer)
{
    atomic_store_explicit(writer->sequence, ++writer->value, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

/* After: the sequence goes even again, ordered after every change. */
static inline void gm_publish_end(gm_seqlock_writer *writer)
{
    atomic_store_explicit(writer->sequence, ++writer->value, memory_order_release);
}

/* The region's path. */
const char *gm_publisher_path(const gm_publisher *publisher);

/* Unmap and remove the region (the caller has stopped using gm_publisher_stats). NULL does nothing. */
void gm_publisher_close(gm_publisher *publisher);

#endif
