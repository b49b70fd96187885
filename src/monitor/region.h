/*
 * region.h -- the layout of a published-statistics region, shared by its writer and its readers.
 *
 * An allocator created with publish:true keeps a copy of its statistics in a small file,
 * <directory>/gpumem.<uid>.<pid>.<device> (directory: GPUMEM_SHM_DIR, default /dev/shm), which other
 * processes of the same user map read-only (`gpumem stats PID`). The file is a header saying what
 * wrote it and how the rest is laid out, a seqlock sequence number, a gm_stats, the cache's shape and
 * the pinned host memory cache's numbers. docs/formats.md
 * ("Published statistics") describes the bytes; this header is their single definition.
 */
#ifndef GM_REGION_H
#define GM_REGION_H

#include "gpumem.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_REGION_MAGIC "GMSTATS\0" /* 8 bytes, the last one NUL */
/* 6: the stitch counters; 5: the copy call kind; 4: the pinned host cache part; 3: GM_COUNTERS gained
 * the pressure counters */
#define GM_REGION_LAYOUT_VERSION 6u
#define GM_REGION_NAME_PREFIX "gpumem."
#define GM_REGION_DEFAULT_DIRECTORY "/dev/shm"

#define GM_REGION_COUNT_ONE_(...) +1
enum {
    GM_REGION_POOL_STATISTIC_COUNT = 0 GM_POOL_STATISTICS(GM_REGION_COUNT_ONE_),
    GM_REGION_COUNTER_COUNT = 0 GM_COUNTERS(GM_REGION_COUNT_ONE_)
};
#undef GM_REGION_COUNT_ONE_

/* What wrote the region; never changes after creation. */
typedef struct gm_region_header {
    char magic[8];                 /* GM_REGION_MAGIC */
    uint32_t layout_version;       /* GM_REGION_LAYOUT_VERSION */
    uint32_t header_size;          /* sizeof(gm_region_header) */
    uint64_t total_size;           /* sizeof(gm_region): the file's size */
    int64_t pid;                   /* the writing process */
    int32_t device;                /* the allocator's device index */
    uint32_t stats_size;           /* sizeof(gm_stats) */
    uint32_t pool_statistic_count; /* entries of GM_POOL_STATISTICS */
    uint32_t counter_count;        /* entries of GM_COUNTERS */
    uint32_t call_kind_count;      /* GM_CALL_KIND_COUNT */
    int32_t parent_pid;            /* the writing process's parent when the region was made (0: unknown) */
    char backend[16];              /* "sim", "host", "cuda", NUL-terminated */
    char engine[16];               /* "pages", "segments", NUL-terminated */
    uint64_t page_size;            /* the backend's mapping granularity */
    uint64_t device_total_bytes;   /* the device's memory */
    int64_t start_time_ns;         /* CLOCK_REALTIME when the region was created */
} gm_region_header;

/* The cache's shape, which needs a walk of the size indexes: refreshed with the device-call counts
 * (after a call that made a device call, and at least every 256 calls), not after every call. */
typedef struct gm_region_cache {
    uint64_t free_bytes;               /* bytes free in reserved memory */
    uint64_t largest_free_block_bytes; /* the largest of them in one piece */
} gm_region_cache;

/* The pinned host memory cache (core/host_cache.c: gm_host_malloc, gm_host_free, gm_host_empty_cache),
 * current after every one of those calls. Its own fields rather than a copy of the public gm_host_stats,
 * so that the public struct may grow without changing the file: a field added here is a new layout
 * version. Page-locked memory cannot be swapped and counts against RLIMIT_MEMLOCK, so what a process
 * holds in this cache (reserved_bytes) is host memory the rest of the machine cannot have. */
typedef struct gm_region_pinned_host {
    uint64_t allocated_bytes;      /* bytes in blocks handed out now (their power-of-two sizes) */
    uint64_t allocated_bytes_peak; /* the most ever handed out at once */
    uint64_t reserved_bytes;       /* page-locked bytes held from the backend: handed out, idle or pending */
    uint64_t reserved_bytes_peak;  /* the most ever held at once */
    uint64_t allocations;          /* blocks handed out now */
    uint64_t requested_bytes;      /* bytes the live blocks asked for (unrounded) */
    uint64_t cache_hits;           /* gm_host_malloc served from the cache */
    uint64_t cache_misses;         /* gm_host_malloc that needed a new backend allocation */
    uint64_t host_frees;           /* blocks given back to the backend (gm_host_empty_cache, host_limit) */
    uint64_t pending_blocks;       /* freed blocks not reusable yet (streams not asked yet, or events not done) */
    uint64_t limit_bytes;          /* host_limit; 0: none */
} gm_region_pinned_host;

/* The whole file. `sequence` is the seqlock: odd while the writer is changing `stats`, `cache` or
 * `pinned_host`. */
typedef struct gm_region {
    gm_region_header header;
    _Atomic uint64_t sequence;
    uint64_t padding;
    gm_stats stats;
    gm_region_cache cache;
    gm_region_pinned_host pinned_host;
} gm_region;

/* The directory regions live in: GPUMEM_SHM_DIR, else /dev/shm. */
const char *gm_region_directory(void);

/* <directory>/gpumem.<uid>.<pid>.<device> into `buffer`; false if it does not fit. */
bool gm_region_path(char *buffer, size_t size, long pid, int device);

#endif
