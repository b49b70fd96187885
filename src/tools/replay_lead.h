/*
 * replay_lead.h -- a replay on a simulated device that runs behind its host, as a GPU does.
 *
 * A program launches kernels faster than the GPU runs them: the host is ahead of the device by some
 * amount of queued work. Memory freed moments before is then still in use by queued work, and an
 * allocator that unmaps it must wait for that work, stalling the host (docs/engine.md, "Limits known
 * today"). Trace replays on the sim normally run no stream work, so every free is long done and such
 * waits never show. With a lead of N, each operation of the trace queues one unit of work on its
 * stream, and the unit queued N operations earlier finishes: the simulated device runs N operations
 * behind the host. A wait for a stream finishes its queued work at once (the host stalls), and the
 * lead builds up again from there. gm_sim_work_waited_for counts the units such waits finished early.
 */
#ifndef GM_REPLAY_LEAD_H
#define GM_REPLAY_LEAD_H

#include "tools/trace.h"

typedef struct gm_replay_lead gm_replay_lead;

/* A lead of `lead` operations (at least 1) for replays of `trace` on `allocator`, whose backend must
 * simulate streams (sim, host): else GM_ERROR_NOT_SUPPORTED with the reason. */
gm_status gm_replay_lead_create(gm_allocator *allocator, const gm_trace *trace, size_t lead, gm_replay_lead **lead_out);
/* The replay hook (gm_replay_hooks.after_operation, with the lead as context): queue the operation's
 * unit of work and finish the one queued `lead` operations earlier. */
gm_status gm_replay_lead_after_operation(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context);
/* The device catches up: every unit still queued finishes (between passes, as a synchronize would). */
gm_status gm_replay_lead_catch_up(gm_replay_lead *lead);
void gm_replay_lead_free(gm_replay_lead *lead);

#endif
