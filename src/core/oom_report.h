/*
 * oom_report.h -- the out-of-memory report: what was asked, what the device and gpumem hold, what
 * was already tried, and a diagnosis a user can act on.
 */
#ifndef GM_OOM_REPORT_H
#define GM_OOM_REPORT_H

#include "core/arena.h"

typedef struct gm_oom_attempts {
    bool waited_for_streams; /* pending cross-stream frees were waited for */
    bool retried;            /* the cache was released and the request retried */
    uint64_t released_bytes; /* bytes the release gave back */
} gm_oom_attempts;

/* Write the report as this thread's gm_last_error(). Called with the allocator's lock held. */
void gm_write_oom_report(gm_arena *arena, gm_heap *heap, uint64_t size, const gm_oom_attempts *attempts);

#endif
