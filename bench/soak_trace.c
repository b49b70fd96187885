/*
 * soak_trace.c -- the soak's --trace workload: every thread replays a trace's allocations and frees,
 * again and again.
 *
 * The plain soak's random sizes and side operations never make the moments some of the engine's rules
 * are for: a step that repeats a request no free block fits while pinned chunks' free ends and starts
 * would hold it (stitching, and the second mappings that linger after a stitch is undone), tensors
 * replaced by slightly larger copies (the growth lane), layouts that settle over passes. Its frequent
 * empty_cache calls, memory limits, new streams and pending cross-stream frees rule the layout instead
 * (docs/benchmarks.md, Soak). A real program's trace makes those moments, so under --trace each thread
 * walks the trace and does nothing else: an allocation is made on the thread's own stream (the trace's
 * stream 0) or on a shared stream (its others), a free frees the block that the same slot holds (one in
 * sixteen after a use on another stream, with work queued there), and after the trace's last operation
 * the thread frees what the trace left live, lets the device finish its streams' work (a program's step
 * that synchronizes) and starts again. Allocations that fail (out of memory, device faults) leave their
 * slot empty, and its free is skipped. The checks at the barriers are the plain soak's.
 */
#include "soak.h"

static gm_stream stream_of(const soak_worker *self, unsigned stream_index)
{
    return stream_index ? (gm_stream)(1 + stream_index % SOAK_SHARED_STREAMS) : self->own_stream;
}

/* Free the block of `slot`, if one lives there. */
static void free_slot(soak_worker *self, uint32_t slot, bool cross_stream)
{
    size_t position = self->slot_positions[slot];
    self->slot_positions[slot] = 0;
    if (position)
        soak_release(self, position - 1, cross_stream);
}

/* An allocation of the trace's: its block (the last of the thread's live ones) fills `slot`, which the trace
 * (src/tools/trace.c) reuses only once it is freed. */
static void fill_slot(soak_worker *self, uint32_t slot, size_t requested, gm_stream stream)
{
    if (soak_allocate(self, requested, stream) == 0)
        return;
    self->live[self->live_count - 1].slot = slot;
    self->slot_positions[slot] = self->live_count;
}

/* The end of a pass: what the trace left live goes, and every stream the thread may have queued work on
 * (its own, the default and the shared ones) finishes it. */
static void end_pass(soak_worker *self)
{
    soak_run *run = self->run;
    for (uint32_t slot = 0; slot < run->trace.slot_count; slot++)
        free_slot(self, slot, false);
    soak_check_status(run, gm_sim_stream_complete(run->allocator, self->own_stream), GM_OK, "gm_sim_stream_complete");
    for (gm_stream stream = 0; stream <= SOAK_SHARED_STREAMS; stream++)
        soak_check_status(run, gm_sim_stream_complete(run->allocator, stream), GM_OK, "gm_sim_stream_complete");
    self->trace_position = 0;
}

void soak_trace_operation(soak_worker *self)
{
    const gm_trace *trace = &self->run->trace;
    if (self->trace_position == trace->count) {
        end_pass(self);
        return;
    }
    const gm_trace_operation *operation = &trace->operations[self->trace_position++];
    if (operation->kind == GM_TRACE_FREE)
        free_slot(self, operation->slot, soak_random(&self->random) % 16 == 0);
    else if (operation->size)
        fill_slot(self, operation->slot, operation->size, stream_of(self, operation->stream_index));
}
