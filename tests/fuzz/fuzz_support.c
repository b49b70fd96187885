/*
 * fuzz_support.c -- what the trace harnesses share (fuzz_support.h).
 */
#include "fuzz_support.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Replays are for small traces: each stream of the pages engine reserves its own address range. */
#define REPLAY_MAX_STREAMS 8
#define REPLAY_MAX_OPERATIONS 20000

const char *fuzz_memory_file(const uint8_t *data, size_t size, void (*fail)(const char *what, const char *detail))
{
    static int memory_file = -1;
    static char path[64];
    if (memory_file < 0) {
        memory_file = memfd_create("fuzz_input", 0);
        if (memory_file < 0)
            fail("memfd_create failed", NULL);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memory_file);
    }
    if (ftruncate(memory_file, 0) != 0)
        fail("ftruncate failed", NULL);
    size_t written = 0;
    while (written < size) {
        ssize_t result = pwrite(memory_file, data + written, size - written, (off_t)written);
        if (result <= 0)
            fail("pwrite failed", NULL);
        written += (size_t)result;
    }
    return path;
}

void fuzz_check_trace(const gm_trace *trace, void (*fail)(const char *what, const char *detail))
{
    if (trace->count == 0 || !trace->operations)
        fail("a loaded trace has no operations", NULL);
    bool *slot_live = calloc(trace->slot_count ? trace->slot_count : 1, sizeof *slot_live);
    uint64_t *slot_size = calloc(trace->slot_count ? trace->slot_count : 1, sizeof *slot_size);
    if (!slot_live || !slot_size)
        fail("no memory for the check", NULL);
    unsigned __int128 live = 0, peak = 0;
    size_t allocations = 0;
    for (size_t i = 0; i < trace->count; i++) {
        const gm_trace_operation *operation = &trace->operations[i];
        if (operation->stream_index >= trace->stream_count)
            fail("an operation's stream index is out of range", NULL);
        if (operation->slot >= trace->slot_count)
            fail("an operation's slot is out of range", NULL);
        if (operation->kind == GM_TRACE_ALLOCATE) {
            if (slot_live[operation->slot])
                fail("an allocation into a live slot", NULL);
            slot_live[operation->slot] = true;
            slot_size[operation->slot] = operation->size;
            live += operation->size;
            peak = live > peak ? live : peak;
            allocations++;
        } else if (operation->kind == GM_TRACE_FREE) {
            if (!slot_live[operation->slot])
                fail("a free of a slot that is not live", NULL);
            if (slot_size[operation->slot] != operation->size)
                fail("a free's size differs from its allocation's", NULL);
            slot_live[operation->slot] = false;
            live -= operation->size;
        } else {
            fail("an operation of unknown kind", NULL);
        }
    }
    free(slot_live);
    free(slot_size);
    if (allocations != trace->allocation_count)
        fail("allocation_count differs from the allocations", NULL);
    if (peak != trace->peak_live_bytes)
        fail("peak_live_bytes is not the peak of the live bytes", NULL);
    for (size_t i = 0; i < trace->stream_count; i++)
        for (size_t j = i + 1; j < trace->stream_count; j++)
            if (trace->streams[i] == trace->streams[j])
                fail("a stream appears twice in the stream table", NULL);
}

void fuzz_replay_trace(const gm_trace *trace, bool segments_engine, void (*fail)(const char *what, const char *detail))
{
    if (trace->stream_count > REPLAY_MAX_STREAMS || trace->count > REPLAY_MAX_OPERATIONS)
        return;
    gm_allocator *allocator = NULL;
    const char *config = segments_engine ? "backend:sim,capacity:1GiB,engine:segments" : "backend:sim,capacity:1GiB";
    if (gm_create(config, &allocator) != GM_OK)
        fail("gm_create failed", gm_last_error());
    gm_replay_result *result = calloc(1, sizeof *result);
    if (!result)
        fail("no memory for the replay result", NULL);
    gm_status status = gm_replay(allocator, trace, result);
    if (status != GM_OK)
        fail("the replay failed", gm_last_error());
    if (result->operations != trace->count || result->failed_allocations > result->allocations)
        fail("the replay's counts differ from the trace's", NULL);
    if (gm_validate(allocator) != GM_OK)
        fail("gm_validate failed after the replay", gm_last_error());
    size_t live = 0;
    gm_destroy(allocator, &live);
    if (live != 0)
        fail("allocations were left live after the replay", NULL);
    free(result);
}
