/*
 * fuzz_api.h -- what fuzz_api.c and fuzz_api_parts.c share: the input, the state the harness models,
 * and its checks.
 */
#ifndef GPUMEM_FUZZ_API_H
#define GPUMEM_FUZZ_API_H

#include "gpumem.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define DEVICE_SLOTS 32
#define HOST_SLOTS 8
#define STALE_POINTERS 16
#define POOLS 5   /* pool index 0 is the id (0, 0), which names no pool */
#define STREAMS 4
#define STAMP_BYTES 16
#define MAX_ROUTES 8 /* begins of one pool not yet ended */

extern const gm_stream streams[STREAMS];
extern const gm_pool_id pool_ids[POOLS];

/* The input, read a byte at a time; zeros once it is used up. */
typedef struct input {
    const uint8_t *data;
    size_t size;
    size_t position;
} input;

static inline uint8_t next_byte(input *in)
{
    return in->position < in->size ? in->data[in->position++] : 0;
}

static inline uint64_t next_bytes(input *in, int count)
{
    uint64_t value = 0;
    for (int i = 0; i < count; i++)
        value = value << 8 | next_byte(in);
    return value;
}

typedef struct allocation {
    void *pointer; /* NULL: the slot is empty */
    size_t size;
    uint64_t identity;
    bool unreachable; /* a failed compaction said its memory cannot be reached: its stamps are not read */
} allocation;

typedef struct fuzz_state {
    gm_allocator *allocator;
    bool host_backend; /* device memory is real (and may be stamped) */
    bool segments;     /* engine:segments, which cannot defragment */
    uint64_t capacity;
    uint64_t host_limit;
    allocation device[DEVICE_SLOTS];
    allocation host[HOST_SLOTS];
    void *stale_device[STALE_POINTERS]; /* pointers freed earlier (or NULL) */
    void *stale_host[STALE_POINTERS];
    size_t stale_device_next, stale_host_next;
    uint64_t identities;
    uint32_t pool_users[POOLS];     /* begins and retains not yet released */
    uint32_t pool_routes[POOLS];    /* begins not yet ended */
    uint8_t stream_masks[POOLS];    /* which streams a begun pool's filter takes (bit i: streams[i]) */
    uint32_t capturing[STREAMS];    /* begins that capture the stream, not yet ended */
    int route_capture[POOLS][MAX_ROUTES]; /* per pool, each route's captured stream (or -1), in begin order */
    const char *operation;          /* the operation running, for reports */
    bool host_failing;              /* the library's host allocations were made to fail: calls that need
                                       host memory may say out of memory, and must then change nothing */
} fuzz_state;

extern fuzz_state *current;

/* abort() with what failed, in which operation, and the library's last error: a finding. */
void fail(const char *what);
void expect(bool condition, const char *what);
/* OK, or out of memory once the library's host allocations fail; whether it was OK. */
bool expect_done(const fuzz_state *state, gm_status status, const char *message);

/* fuzz_api.c */
void stamp(const allocation *block);
void check_stamp(const allocation *block);
gm_stream choose_stream(input *in);
size_t choose_size(fuzz_state *state, input *in);
int live_host_slot(const fuzz_state *state, const void *pointer);
void *not_live_pointer(const void *const *stale, const allocation *slots, int slot_count, input *in);

/* fuzz_api_parts.c: private pools, pinned host memory, looking at the allocator */
void begin_pool(fuzz_state *state, input *in);
void end_pool(fuzz_state *state, input *in);
void retain_or_release_pool(fuzz_state *state, input *in, bool retain);
void look_at_pool(fuzz_state *state, input *in);
void free_host_slot(fuzz_state *state, int slot);
void host_allocate(fuzz_state *state, input *in);
void host_free_not_live(fuzz_state *state, input *in);
void host_record_stream(fuzz_state *state, input *in);
void check_statistics(fuzz_state *state);
void look_around(fuzz_state *state, input *in);

#endif
