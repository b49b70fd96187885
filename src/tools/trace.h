/*
 * trace.h -- allocation traces: loading and replaying them.
 *
 * Format (plain text or gzip, one event a line, '#' lines are comments):
 *     a,<id>,<bytes>,<stream>    allocate <bytes> on <stream>
 *     f,<id>,<bytes>,<stream>    free the allocation named <id>
 * Loading checks every line and maps ids to dense slots, so replay does no lookups of its own.
 */
#ifndef GM_TRACE_H
#define GM_TRACE_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

enum { GM_TRACE_ALLOCATE = 0, GM_TRACE_FREE = 1 };

typedef struct gm_trace_operation {
    uint64_t size;
    uint32_t slot;         /* dense index of the allocation, reused once it is freed */
    uint16_t stream_index; /* index into gm_trace.streams */
    uint8_t kind;          /* GM_TRACE_ALLOCATE or GM_TRACE_FREE */
} gm_trace_operation;

typedef struct gm_trace {
    gm_trace_operation *operations;
    size_t count;
    size_t allocation_count;
    size_t slot_count;        /* most allocations live at once */
    gm_stream *streams;
    size_t stream_count;
    uint64_t peak_live_bytes; /* the trace's true peak of requested live bytes */
} gm_trace;

/* Load a trace. A malformed line (binary data, a line over 512 bytes included) gives GM_ERROR_PARSE with
 * "FILE:LINE: reason" in gm_last_error(); an unreadable file, or a truncated or corrupt gzip file, gives
 * GM_ERROR_IO. */
gm_status gm_trace_load(const char *path, gm_trace *trace_out);
/* The same from a source already open (text_source.h), from where it stands; the source stays open. */
struct gm_text_source;
gm_status gm_trace_load_source(struct gm_text_source *source, gm_trace *trace_out);
void gm_trace_free(gm_trace *trace);

/* The allocations and frees of a history's events (oldest first; gm_history_read, or a history file) as
 * a trace: each "alloc" an allocation, named by its address, each "free_requested" its free (the
 * completion of a free is the allocator's own wait for streams), each "oom" an allocation of what was
 * asked for, freed at once (whether it fits under another configuration is the question). A block freed in the events but
 * allocated before them (dropped from the ring, or older than the history) is allocated at the start;
 * *early_out counts those. Streams: the default stream is 0, the others 1, 2, ... in order. A history that
 * allocates an address still live is malformed: GM_ERROR_PARSE, "NAME:EVENT: reason"; no allocation at
 * all, GM_ERROR_PARSE too. */
gm_status gm_trace_from_events(const char *name, const gm_event *events, size_t count, gm_trace *trace_out,
                               size_t *early_out);

typedef struct gm_replay_result {
    size_t operations;
    size_t allocations;
    size_t frees;
    size_t failed_allocations;  /* out of memory */
    uint64_t peak_live_bytes;   /* measured over the allocations that succeeded */
    uint64_t peak_reserved_bytes;
    double ratio;               /* peak reserved / peak live */
    double ns_per_operation;    /* CPU time of the replay loop per operation */
    gm_stats stats;             /* at the end of the replay, before the remaining frees */
    char first_failure[8192];   /* the report of the first failed allocation, whole (gm_last_error holds as much) */
} gm_replay_result;

/* Replay every operation through the allocator, then free what is still live. */
gm_status gm_replay(gm_allocator *allocator, const gm_trace *trace, gm_replay_result *result_out);
/* The same, calling `at_end` (when not NULL) after the last operation, before the final frees -- to
 * take a snapshot of the state the trace ends in. Its failure is the replay's. */
gm_status gm_replay_with_hook(gm_allocator *allocator, const gm_trace *trace, gm_replay_result *result_out,
                              gm_status (*at_end)(gm_allocator *allocator, void *context), void *context);

/* What a replay calls besides the allocator; either function may be NULL. `after_operation` runs after
 * each operation (a failed allocation included) with its index in the trace and the bytes then live
 * (requested sizes, as peak_live_bytes counts them) -- to sample a memory curve or to stop and look at
 * one moment; its time counts in ns_per_operation. `at_end` runs after the last operation, before the
 * final frees. A hook's failure stops the replay and is its result. */
typedef struct gm_replay_hooks {
    gm_status (*after_operation)(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context);
    gm_status (*at_end)(gm_allocator *allocator, void *context);
    void *context;
} gm_replay_hooks;

gm_status gm_replay_with_hooks(gm_allocator *allocator, const gm_trace *trace, gm_replay_result *result_out,
                               const gm_replay_hooks *hooks);

#endif
