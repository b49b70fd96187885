/*
 * replay.c -- drive an allocator with a loaded trace and measure it.
 *
 * The timed loop does nothing but call gm_malloc / gm_free and keep the live-byte count, so its
 * CPU time per operation is the allocator's (device calls included, whose modelled cost on "sim"
 * is reported separately as stats.device_call_ns). An allocation that fails with out of memory is
 * counted, its first report kept, and its later free skipped: a trace that does not fit is a
 * result, not a crash. Hooks (trace.h) let a caller look at the allocator after any operation or at
 * the end: a report samples its memory curve and takes a snapshot at the peak that way. The trace's
 * stream ids are names (gm_named_stream): the same numbers on sim and host, real streams on a GPU.
 */
#include "tools/trace.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t thread_cpu_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

gm_status gm_replay(gm_allocator *allocator, const gm_trace *trace, gm_replay_result *result_out)
{
    return gm_replay_with_hook(allocator, trace, result_out, NULL, NULL);
}

gm_status gm_replay_with_hook(gm_allocator *allocator, const gm_trace *trace, gm_replay_result *result_out,
                              gm_status (*at_end)(gm_allocator *allocator, void *context), void *context)
{
    gm_replay_hooks hooks = {.at_end = at_end, .context = context};
    return gm_replay_with_hooks(allocator, trace, result_out, &hooks);
}

/* One stream per stream id of the trace (an array the caller frees). The ids are names, not
 * handles: on a GPU each becomes a real stream. */
static gm_status open_streams(gm_allocator *allocator, const gm_trace *trace, gm_stream **streams_out)
{
    gm_stream *streams = gm_system_malloc((trace->stream_count ? trace->stream_count : 1) * sizeof *streams);
    if (!streams)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the replay");
    for (size_t i = 0; i < trace->stream_count; i++) {
        gm_status status = gm_named_stream(allocator, (uint64_t)trace->streams[i], &streams[i]);
        if (status != GM_OK) {
            free(streams);
            return status;
        }
    }
    *streams_out = streams;
    return GM_OK;
}

/* The result of a replay that ran to its end (result_out->stats already read). */
static void fill_result(const gm_trace *trace, size_t failed, uint64_t peak_live, int64_t elapsed_ns,
                        gm_replay_result *result_out)
{
    result_out->operations = trace->count;
    result_out->allocations = trace->allocation_count;
    result_out->frees = trace->count - trace->allocation_count;
    result_out->failed_allocations = failed;
    result_out->peak_live_bytes = peak_live;
    result_out->peak_reserved_bytes = (uint64_t)result_out->stats.reserved_bytes[GM_POOL_ALL].peak;
    result_out->ratio = peak_live ? (double)result_out->peak_reserved_bytes / (double)peak_live : 0.0;
    result_out->ns_per_operation = trace->count ? (double)elapsed_ns / (double)trace->count : 0.0;
}

gm_status gm_replay_with_hooks(gm_allocator *allocator, const gm_trace *trace, gm_replay_result *result_out,
                               const gm_replay_hooks *hooks)
{
    if (!allocator || !trace || !result_out || !hooks)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_replay: an argument is NULL");
    memset(result_out, 0, sizeof *result_out);
    void **pointers = gm_system_calloc(trace->slot_count ? trace->slot_count : 1, sizeof *pointers);
    gm_stream *streams = NULL;
    gm_status opened = pointers ? open_streams(allocator, trace, &streams)
                                : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the replay");
    if (opened != GM_OK) {
        free(pointers);
        return opened;
    }
    gm_status failure = GM_OK;
    uint64_t live = 0, peak_live = 0;
    size_t failed = 0;
    int64_t started = thread_cpu_ns();
    for (size_t i = 0; i < trace->count; i++) {
        const gm_trace_operation *operation = &trace->operations[i];
        if (operation->kind == GM_TRACE_ALLOCATE) {
            gm_status status = gm_malloc(allocator, operation->size, streams[operation->stream_index],
                                         &pointers[operation->slot]);
            if (status == GM_OK) {
                live += operation->size;
                peak_live = live > peak_live ? live : peak_live;
            } else if (status == GM_ERROR_OUT_OF_MEMORY) {
                if (failed++ == 0)
                    strncpy(result_out->first_failure, gm_last_error(), sizeof result_out->first_failure - 1);
            } else {
                failure = status;
                break;
            }
        } else if (pointers[operation->slot] || operation->size == 0) {
            gm_status status = gm_free(allocator, pointers[operation->slot]);
            if (status != GM_OK) {
                failure = status;
                break;
            }
            live -= operation->size;
            pointers[operation->slot] = NULL;
        }
        if (hooks->after_operation && (failure = hooks->after_operation(allocator, i, live, hooks->context)) != GM_OK)
            break;
    }
    int64_t elapsed = thread_cpu_ns() - started;
    gm_get_stats(allocator, &result_out->stats);
    if (failure == GM_OK && hooks->at_end)
        failure = hooks->at_end(allocator, hooks->context);
    for (size_t slot = 0; slot < trace->slot_count; slot++)
        if (pointers[slot])
            gm_free(allocator, pointers[slot]);
    free(pointers);
    free(streams);
    if (failure != GM_OK)
        return failure;
    fill_result(trace, failed, peak_live, elapsed, result_out);
    return GM_OK;
}
