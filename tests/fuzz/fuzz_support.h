/*
 * fuzz_support.h -- what the trace harnesses (fuzz_trace, fuzz_history) share: the input as a file that
 * the readers open by path, and what they check of every trace they load or make (tools/trace.h): its
 * consistency -- each operation's stream and slot in range, an allocation only into a
 * free slot, a free only of a live slot with that slot's size, the counts and peak_live_bytes (the true
 * peak, computed without overflow) as the operations say, no stream twice in the stream table. A
 * violation calls `fail` (which aborts: a finding).
 */
#ifndef GM_FUZZ_SUPPORT_H
#define GM_FUZZ_SUPPORT_H

#include "tools/trace.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A memory file (memfd) holding `size` bytes, made once and rewritten at each call, and its path
 * (/proc/self/fd/N): the readers read only paths, and read it as a user's file. */
const char *fuzz_memory_file(const uint8_t *data, size_t size, void (*fail)(const char *what, const char *detail));

void fuzz_check_trace(const gm_trace *trace, void (*fail)(const char *what, const char *detail));

/* A small trace (few streams, up to 20000 operations) replayed on the simulated device, either engine:
 * the replay succeeds (out of memory is a result), its counts are the trace's, the allocator validates
 * afterwards and nothing is left live; a larger one is not replayed. */
void fuzz_replay_trace(const gm_trace *trace, bool segments_engine, void (*fail)(const char *what, const char *detail));

#endif
