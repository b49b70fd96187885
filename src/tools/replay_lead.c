/*
 * replay_lead.c -- the simulated device of a replay runs a fixed number of operations behind its host
 * (replay_lead.h says why).
 *
 * A ring holds the streams of the last `lead` operations, and a count per stream of its entries in
 * the ring: the units of that stream that should still be queued. When an operation leaves the ring,
 * its stream keeps at most that count queued (gm_sim_stream_finish_until), which finishes exactly the
 * unit it queued -- or nothing, when a wait for the stream has already finished it. So after a wait the
 * stream's queue starts empty and the lead builds up again, operation by operation.
 */
#include "tools/replay_lead.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>

struct gm_replay_lead {
    const gm_trace *trace;
    gm_stream *streams;       /* the trace's streams, by stream index (gm_named_stream) */
    uint64_t *queued;         /* by stream index: the stream's operations in the ring */
    uint16_t *ring;           /* stream indexes of the last operations, oldest at `oldest` */
    size_t lead;
    size_t oldest;
    size_t filled;
    gm_allocator *allocator;
};

gm_status gm_replay_lead_create(gm_allocator *allocator, const gm_trace *trace, size_t lead, gm_replay_lead **lead_out)
{
    *lead_out = NULL;
    if (!allocator || !trace || lead == 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_replay_lead_create: no allocator, no trace or a lead of 0");
    uint64_t waited = 0;
    if (gm_sim_work_waited_for(allocator, &waited) != GM_OK)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "a lead of the host over the device needs a simulated device "
                       "(--backend sim or host); a GPU runs behind its host by itself");
    gm_replay_lead *made = gm_system_calloc(1, sizeof *made);
    size_t stream_count = trace->stream_count ? trace->stream_count : 1;
    if (made) {
        made->streams = gm_system_calloc(stream_count, sizeof *made->streams);
        made->queued = gm_system_calloc(stream_count, sizeof *made->queued);
        made->ring = gm_system_calloc(lead, sizeof *made->ring);
    }
    if (!made || !made->streams || !made->queued || !made->ring) {
        gm_replay_lead_free(made);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for a lead of %zu operations", lead);
    }
    made->trace = trace;
    made->lead = lead;
    made->allocator = allocator;
    for (size_t i = 0; i < trace->stream_count; i++) {
        gm_status status = gm_named_stream(allocator, (uint64_t)trace->streams[i], &made->streams[i]);
        if (status != GM_OK) {
            gm_replay_lead_free(made);
            return status;
        }
    }
    *lead_out = made;
    return GM_OK;
}

gm_status gm_replay_lead_after_operation(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context)
{
    (void)live_bytes;
    gm_replay_lead *lead = context;
    uint16_t stream_index = lead->trace->operations[index].stream_index;
    gm_status status = gm_sim_stream_enqueue(allocator, lead->streams[stream_index], 1);
    if (status != GM_OK)
        return status;
    lead->queued[stream_index]++;
    if (lead->filled < lead->lead) {
        lead->ring[(lead->oldest + lead->filled++) % lead->lead] = stream_index;
        return GM_OK;
    }
    /* The oldest operation's unit finishes now, and this operation takes its place in the ring. */
    uint16_t finished = lead->ring[lead->oldest];
    lead->queued[finished]--;
    lead->ring[lead->oldest] = stream_index;
    lead->oldest = (lead->oldest + 1) % lead->lead;
    return gm_sim_stream_finish_until(allocator, lead->streams[finished], lead->queued[finished]);
}

gm_status gm_replay_lead_catch_up(gm_replay_lead *lead)
{
    for (size_t i = 0; i < lead->trace->stream_count; i++) {
        gm_status status = gm_sim_stream_complete(lead->allocator, lead->streams[i]);
        if (status != GM_OK)
            return status;
        lead->queued[i] = 0;
    }
    lead->oldest = lead->filled = 0;
    return GM_OK;
}

void gm_replay_lead_free(gm_replay_lead *lead)
{
    if (!lead)
        return;
    free(lead->streams);
    free(lead->queued);
    free(lead->ring);
    free(lead);
}
