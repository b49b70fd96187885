/*
 * oom_report.h -- the out-of-memory report: what was asked, its one primary cause, what the device
 * and gpumem hold, what was already tried, and the remedies for that cause, in order.
 */
#ifndef GM_OOM_REPORT_H
#define GM_OOM_REPORT_H

#include "core/arena.h"

typedef struct gm_oom_attempts {
    bool waited_for_streams;   /* pending cross-stream frees were waited for */
    bool retried;              /* the cache was released and the request retried */
    uint64_t released_bytes;   /* bytes the releases gave back */
    bool called_callbacks;     /* the pressure callbacks were called (critical) and the request retried */
    unsigned callbacks_called; /* how many calls that made */
    const char *host_root;     /* where /proc is read (the pressure policy's; NULL: this machine's) */
} gm_oom_attempts;

/* What the classification looks at, in bytes. */
typedef struct gm_oom_facts {
    uint64_t size;             /* the request, rounded */
    uint64_t page_size;        /* the device's mapping granularity (0: none): memory is made in whole pages */
    uint64_t device_total;     /* the driver's total and free memory */
    uint64_t device_free;
    uint64_t memory_limit;     /* equal to device_total when no limit is set */
    uint64_t reserved;         /* gpumem's, after the retries' releases */
    uint64_t live;             /* allocated, plus freed but still in use on streams */
    uint64_t outside;          /* the driver's used memory that is not gpumem's */
    bool host_failed;          /* a host allocation failed for lack of memory */
    bool address_space_failed; /* a reservation of virtual addresses failed */
    int64_t host_available;    /* MemAvailable, MemTotal; -1 when unread */
    int64_t host_total;
} gm_oom_facts;

/* The one primary cause, in this order: a host allocation failed (host); live memory and the request
 * exceed the device (capacity), or the memory limit below it (memory limit); they exceed what memory
 * used outside gpumem leaves (other processes); MemAvailable is below min(256 MiB, 1% of MemTotal)
 * (host); otherwise the memory is there in total but not in one piece (fragmentation). */
gm_oom_cause gm_classify_oom(const gm_oom_facts *facts);

/* Write the report as this thread's gm_last_error() and set gm_last_oom_cause(). Called with the
 * allocator's lock held; clears the backend's host_memory_failed. Returns the device's free bytes that
 * the report read (0 when unread), which the "oom" event carries as PyTorch's trace entry does. */
uint64_t gm_write_oom_report(gm_arena *arena, gm_heap *heap, uint64_t size, const gm_oom_attempts *attempts);

/* The report of a request larger than `largest_request`, the most any request may be: refused before any
 * engine sees it (nothing is released or retried), cause capacity, with its real size. Returns the
 * device's free bytes, as gm_write_oom_report. */
uint64_t gm_write_impossible_request_report(gm_arena *arena, gm_stream stream, uint64_t size, uint64_t largest_request);

/* Set this thread's gm_last_oom_cause() (a dispatch of callbacks puts back its caller's). */
void gm_set_last_oom_cause(gm_oom_cause cause);

#endif
