/*
 * published.h -- reading the statistics other processes publish (see published.c, docs/formats.md).
 */
#ifndef GM_PUBLISHED_H
#define GM_PUBLISHED_H

#include "gpumem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The pinned host memory cache's numbers in a region (region.h's gm_region_pinned_host): page-locked
 * host memory the process holds through gm_host_malloc. */
typedef struct gm_published_pinned_host {
    uint64_t allocated_bytes;      /* in blocks handed out now (power-of-two sizes) */
    uint64_t allocated_bytes_peak;
    uint64_t reserved_bytes;       /* held from the backend: handed out, idle or waiting for streams */
    uint64_t reserved_bytes_peak;
    uint64_t allocations;          /* blocks handed out now */
    uint64_t requested_bytes;      /* what the live blocks asked for */
    uint64_t cache_hits;
    uint64_t cache_misses;
    uint64_t host_frees;           /* blocks given back to the backend */
    uint64_t pending_blocks;       /* freed blocks not reusable yet (streams not asked yet, or events not done) */
    uint64_t limit_bytes;          /* host_limit; 0: none */
} gm_published_pinned_host;

/* One consistent snapshot of a region. */
typedef struct gm_published {
    long pid;
    long parent_pid; /* the writer's parent when it made the region; 0: unknown */
    int device;
    char backend[16];
    char engine[16];
    uint64_t page_size;
    uint64_t device_total_bytes;
    int64_t start_time_ns;
    gm_stats stats; /* complete: the all-pools readings summed as gm_get_stats gives them */
    uint64_t cached_free_bytes;        /* free in reserved memory, as gm_cache_info says (sampled) */
    uint64_t largest_free_block_bytes; /* the largest free piece of it (sampled) */
    gm_published_pinned_host pinned_host; /* exact after every gm_host_malloc, gm_host_free, gm_host_empty_cache */
    bool torn; /* the writer died inside an update: that one call's changes may be counted in part */
} gm_published;

/* Open the region at `path`, check it (a regular file, not a symbolic link, of this user, of the
 * region's size, magic and layout version, its writer alive) and read it under its seqlock.
 * GM_ERROR_IO: missing, a symbolic link, another user's, or its process is gone (stale);
 * GM_ERROR_CORRUPT: wrong size, magic or header; GM_ERROR_NOT_SUPPORTED: another layout version;
 * GM_ERROR_IO too when its writer, alive, stays inside one update for 200 ms (stopped in a debugger),
 * or updates for 2 s without a pause long enough for a copy.
 * gm_last_error() names the reason. */
gm_status gm_published_read(const char *path, gm_published *published_out);

/* A region kept mapped, to read it again and again, and once more after its writer has exited: the
 * mapping keeps the last numbers even after the file is removed (`gpumem run` reads its command's
 * final statistics so). Opening checks the file as gm_published_read does, except that its writer
 * may be gone (one killed inside an update leaves its numbers `torn`); reading needs no system call
 * unless the writer is inside an update. */
typedef struct gm_published_watch gm_published_watch;
gm_status gm_published_watch_open(const char *path, gm_published_watch **watch_out);
gm_status gm_published_watch_read(const gm_published_watch *watch, gm_published *published_out);
void gm_published_watch_close(gm_published_watch *watch);

/* The path of process `pid`'s region for `device`, or (device < 0) of its lowest-numbered device.
 * GM_ERROR_IO when it has none. */
gm_status gm_published_find(long pid, int device, char *path_out, size_t path_size);

/* Call `visit` with the path, pid and device of every region of this user in the directory, in no
 * particular order; stop early when it returns false. GM_ERROR_IO if the directory is unreadable. */
gm_status gm_published_list(bool (*visit)(const char *path, long pid, int device, void *context), void *context);

/* Whether process `pid` exists (kill(pid, 0) does not fail with ESRCH). */
bool gm_published_process_alive(long pid);

/* Remove the regions of this user whose processes are gone; the number removed. */
size_t gm_published_remove_stale(void);

#endif
