/*
 * fuzz_api.c -- libFuzzer harness for sequences of API calls on one allocator.
 *
 * The first two bytes choose the allocator: backend (sim, or host with a small capacity: real memory),
 * engine (pages or segments), capacity, page size, host_limit, the initial memory limit and a few
 * engine switches. Every following byte starts an operation, whose arguments come from the bytes
 * after it (zeros past the end):
 *   malloc of a size of some class (0, tiny, pool and segment boundaries, page multiples, large, and
 *   huge: the capacity, 2^60, SIZE_MAX) on one of four streams into one of 32 slots; free of a live
 *   slot, of a pointer freed earlier, of garbage (inside a live block, a made-up address); record_stream;
 *   simulated stream work enqueued and completed; empty_cache; set_memory_limit; injected device
 *   failures (gm_inject_device_failures); private pools begun (optionally capturing the stream, as a
 *   CUDA graph does), ended, retained, released, looked at and marked to lend their free memory on out of
 *   memory (gm_set_pool_use_on_oom); memory used elsewhere; the pinned host
 *   cache (gm_host_malloc, free of live, freed and garbage pointers, with streams, record_stream, empty_cache);
 *   statistics, snapshots, the summary table, the history set, resized and read, and an event observer
 *   set and removed. The segments engine without cost_model also runs unsplit (split_blocks:false).
 *   The pages engine with tail_chunk also compacts pinned chunks (compact_min: 2 MiB on the sim, two pages
 *   on the host backend, whose stamps below check that the copies kept every block's bytes). The
 *   bit that sets the segments engine's release_before_growth gives the pages engine move_slack:0.01.
 * gm_destroy ends the input, with whatever is still live. FUZZ_API_VERBOSE=1 prints the configuration
 * and each operation with its argument bytes, to read a finding.
 *
 * What must hold, else abort() (a finding):
 *   - gm_validate after every operation;
 *   - every call returns a status that its documentation allows in that situation (a pointer that is
 *     not live: GM_ERROR_INVALID_POINTER and nothing changed; a pool's calls as its users and routes,
 *     modelled here, say);
 *   - an allocation is non-NULL, owned, at least as large as asked, and overlaps no other live one;
 *     on the host backend its first and last bytes, stamped at allocation, are intact at its free,
 *     and so are those of pinned host blocks (real memory on both backends);
 *   - the statistics count exactly the live allocations and their requested bytes, device and host;
 *   - gm_destroy reports exactly the allocations still live;
 *   - the event observer sees only known events, an alloc only for a live-to-be block.
 */
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

static const gm_stream streams[STREAMS] = {0, 1, 2, 1000};
static const gm_pool_id pool_ids[POOLS] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {7, 3}};

/* The input, read a byte at a time; zeros once it is used up. */
typedef struct input {
    const uint8_t *data;
    size_t size;
    size_t position;
} input;

static uint8_t next_byte(input *in)
{
    return in->position < in->size ? in->data[in->position++] : 0;
}

static uint64_t next_bytes(input *in, int count)
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
} fuzz_state;

static fuzz_state *current;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_api: during %s: %s (last error: %s)\n", current ? current->operation : "setup", what,
            gm_last_error());
    abort();
}

static void expect(bool condition, const char *what)
{
    if (!condition)
        fail(what);
}

/* A pool's stream filter: the context is the pool's stream mask. */
static int take_masked_streams(gm_stream stream, void *context)
{
    uint8_t mask = *(const uint8_t *)context;
    for (int i = 0; i < STREAMS; i++)
        if (streams[i] == stream)
            return (mask >> i) & 1;
    return 0;
}

/* ---------------------------------------------------------------- stamps (real memory only) */

static uint8_t stamp_byte(uint64_t identity, size_t index)
{
    return (uint8_t)((identity * 0x9e3779b97f4a7c15ull) >> (8 * (index % 8))) ^ (uint8_t)index;
}

static void stamp(const allocation *block)
{
    uint8_t *bytes = block->pointer;
    size_t count = block->size < STAMP_BYTES ? block->size : STAMP_BYTES;
    for (size_t i = 0; i < count; i++)
        bytes[i] = stamp_byte(block->identity, i);
    for (size_t i = 0; i < count; i++)
        bytes[block->size - 1 - i] = stamp_byte(block->identity, STAMP_BYTES + i);
}

static void check_stamp(const allocation *block)
{
    if (block->unreachable)
        return;
    const uint8_t *bytes = block->pointer;
    size_t count = block->size < STAMP_BYTES ? block->size : STAMP_BYTES;
    /* With fewer than 2 * STAMP_BYTES bytes the two stamps overlap: the end's, written last, wins. */
    for (size_t i = 0; i < count; i++)
        expect(bytes[block->size - 1 - i] == stamp_byte(block->identity, STAMP_BYTES + i),
               "the end of a block was overwritten (two live blocks share memory)");
    for (size_t i = 0; i < count && i + count < block->size; i++)
        expect(bytes[i] == stamp_byte(block->identity, i),
               "the start of a block was overwritten (two live blocks share memory)");
}

/* A device error that says a failed compaction left live blocks' memory unmapped (it cannot say which):
 * no live device block's stamps are read from then on. */
static void note_lost_memory(fuzz_state *state, gm_status status)
{
    if (status != GM_ERROR_DEVICE || !strstr(gm_last_error(), "the device cannot reach their memory"))
        return;
    for (int i = 0; i < DEVICE_SLOTS; i++)
        state->device[i].unreachable = state->device[i].pointer != NULL;
}

/* ---------------------------------------------------------------- choices from the input */

static gm_stream choose_stream(input *in)
{
    return streams[next_byte(in) % STREAMS];
}

static size_t choose_size(fuzz_state *state, input *in)
{
    static const size_t boundaries[] = {MIB, MIB + 1, MIB - 1, 2 * MIB, 10 * MIB, 10 * MIB + 1, 20 * MIB, 20 * MIB + 1};
    uint8_t kind = next_byte(in);
    switch (kind % 8) {
    case 0:
        return 0;
    case 1:
        return 1 + next_bytes(in, 2) % 4096;
    case 2:
        return 512 * (1 + (size_t)next_byte(in));
    case 3:
        return 1 + next_bytes(in, 3) % (4 * MIB);
    case 4: /* around page multiples */
        return ((1 + (size_t)next_byte(in) % 64) << 20) + (size_t)(next_byte(in) % 3) - 1;
    case 5:
        return 1 + next_bytes(in, 4) % (512 * MIB);
    case 6: {
        size_t huge[] = {state->capacity, state->capacity + 1, (size_t)1 << 60, ((size_t)1 << 60) + 1,
                         (size_t)1 << 63, SIZE_MAX - 511, SIZE_MAX};
        return huge[next_byte(in) % (sizeof huge / sizeof huge[0])];
    }
    default:
        return boundaries[next_byte(in) % (sizeof boundaries / sizeof boundaries[0])];
    }
}

/* The live device slot whose pointer is `pointer`, or -1. */
static int live_device_slot(const fuzz_state *state, const void *pointer)
{
    for (int i = 0; i < DEVICE_SLOTS; i++)
        if (state->device[i].pointer && state->device[i].pointer == pointer)
            return i;
    return -1;
}

static int live_host_slot(const fuzz_state *state, const void *pointer)
{
    for (int i = 0; i < HOST_SLOTS; i++)
        if (state->host[i].pointer && state->host[i].pointer == pointer)
            return i;
    return -1;
}

/* A pointer that is no live allocation: one freed earlier, one inside a live block, or made up. */
static void *not_live_pointer(const void *const *stale, const allocation *slots, int slot_count, input *in)
{
    uint8_t kind = next_byte(in);
    switch (kind % 4) {
    case 0:
        return (void *)stale[next_byte(in) % STALE_POINTERS];
    case 1: {
        const allocation *block = &slots[next_byte(in) % slot_count];
        return block->pointer ? (char *)block->pointer + 1 + next_byte(in) % 1024 : NULL;
    }
    case 2:
        return (void *)(uintptr_t)next_bytes(in, 8);
    default:
        return (void *)(uintptr_t)(1 + next_byte(in));
    }
}

/* ---------------------------------------------------------------- device memory */

static void free_device_slot(fuzz_state *state, int slot)
{
    allocation *block = &state->device[slot];
    if (!block->pointer) {
        expect(gm_free(state->allocator, NULL) == GM_OK, "gm_free(NULL) failed");
        return;
    }
    if (state->host_backend)
        check_stamp(block);
    gm_status status = gm_free(state->allocator, block->pointer);
    if (status == GM_OK) {
        expect(!gm_owns(state->allocator, block->pointer), "a freed pointer is still owned");
        state->stale_device[state->stale_device_next++ % STALE_POINTERS] = block->pointer;
        block->pointer = NULL;
    } else {
        /* During a capture a free used on other streams may fail for want of host memory: nothing changes. */
        expect(status == GM_ERROR_OUT_OF_MEMORY, "gm_free of a live block failed");
        expect(gm_owns(state->allocator, block->pointer), "a failed gm_free changed the block");
    }
}

static void allocate(fuzz_state *state, input *in)
{
    int slot = next_byte(in) % DEVICE_SLOTS;
    size_t size = choose_size(state, in);
    gm_stream stream = choose_stream(in);
    free_device_slot(state, slot);
    if (state->device[slot].pointer)
        return; /* its free was refused */
    void *pointer = (void *)1;
    gm_status status = gm_malloc(state->allocator, size, stream, &pointer);
    note_lost_memory(state, status);
    if (status != GM_OK) {
        expect(status == GM_ERROR_OUT_OF_MEMORY || status == GM_ERROR_DEVICE, "gm_malloc: unexpected status");
        return;
    }
    if (size == 0) {
        expect(pointer == NULL, "gm_malloc of 0 bytes gave a pointer");
        return;
    }
    expect(pointer != NULL, "gm_malloc succeeded with NULL");
    expect(gm_owns(state->allocator, pointer), "a new allocation is not owned");
    size_t usable = 0;
    expect(gm_allocation_size(state->allocator, pointer, &usable) == GM_OK && usable >= size,
           "gm_allocation_size is below the size asked for");
    uintptr_t start = (uintptr_t)pointer;
    expect(start + size > start, "an allocation wraps around the address space");
    for (int i = 0; i < DEVICE_SLOTS; i++) {
        const allocation *other = &state->device[i];
        uintptr_t other_start = (uintptr_t)other->pointer;
        if (other->pointer && start < other_start + other->size && other_start < start + size)
            fail("a new allocation overlaps a live one");
    }
    state->device[slot] = (allocation){pointer, size, ++state->identities, false};
    if (state->host_backend)
        stamp(&state->device[slot]);
}

static void free_not_live(fuzz_state *state, input *in)
{
    void *pointer = not_live_pointer((const void *const *)state->stale_device, state->device, DEVICE_SLOTS, in);
    if (!pointer || live_device_slot(state, pointer) >= 0)
        return; /* NULL, or its address was handed out again */
    expect(gm_free(state->allocator, pointer) == GM_ERROR_INVALID_POINTER,
           "gm_free of a pointer that is not live did not say so");
}

static void record_stream(fuzz_state *state, input *in)
{
    const allocation *block = &state->device[next_byte(in) % DEVICE_SLOTS];
    gm_stream stream = choose_stream(in);
    if (block->pointer) {
        gm_status status = gm_record_stream(state->allocator, block->pointer, stream);
        expect(status == GM_OK || status == GM_ERROR_OUT_OF_MEMORY, "gm_record_stream of a live block failed");
        return;
    }
    void *pointer = state->stale_device[next_byte(in) % STALE_POINTERS];
    if (pointer && live_device_slot(state, pointer) < 0)
        expect(gm_record_stream(state->allocator, pointer, stream) == GM_ERROR_INVALID_POINTER,
               "gm_record_stream of a freed pointer did not say so");
}

/* ---------------------------------------------------------------- private pools */

static void begin_pool(fuzz_state *state, input *in)
{
    int pool = next_byte(in) % POOLS;
    uint8_t how = next_byte(in);
    if (state->pool_routes[pool] == MAX_ROUTES)
        return;
    uint8_t mask = (how >> 2) % (1 << STREAMS);
    bool filtered = how & 1;
    state->stream_masks[pool] = mask;
    gm_status status = gm_begin_allocate_to_pool(state->allocator, pool_ids[pool], filtered ? take_masked_streams : NULL,
                                                 &state->stream_masks[pool]);
    if (pool == 0) {
        expect(status == GM_ERROR_INVALID_ARGUMENT, "pool (0, 0) was accepted");
        return;
    }
    expect(status == GM_OK, "gm_begin_allocate_to_pool failed");
    /* Capture a stream the pool takes, as a CUDA graph's capture does: its events can then never be
     * waited for. */
    int captured = -1;
    if (how & 2) {
        for (int i = 0; i < STREAMS && captured < 0; i++)
            if (!filtered || (mask >> i & 1))
                captured = filtered ? i : (how >> 2) % STREAMS;
    }
    if (captured >= 0) {
        expect(gm_sim_stream_set_capturing(state->allocator, streams[captured], 1) == GM_OK,
               "gm_sim_stream_set_capturing failed");
        state->capturing[captured]++;
    }
    state->route_capture[pool][state->pool_routes[pool]] = captured;
    state->pool_users[pool]++;
    state->pool_routes[pool]++;
}

static void end_pool(fuzz_state *state, input *in)
{
    int pool = next_byte(in) % POOLS;
    if (pool == 0 || state->pool_routes[pool] == 0) {
        expect(gm_end_allocate_to_pool(state->allocator, pool_ids[pool]) == GM_ERROR_INVALID_ARGUMENT,
               "gm_end_allocate_to_pool without a begin succeeded");
        return;
    }
    /* The pool's first route ends (gm_end_allocate_to_pool ends the earliest begun), and its capture
     * first, as PyTorch ends a graph's capture before it stops allocating to the graph's pool. */
    int captured = state->route_capture[pool][0];
    if (captured >= 0 && --state->capturing[captured] == 0)
        expect(gm_sim_stream_set_capturing(state->allocator, streams[captured], 0) == GM_OK,
               "gm_sim_stream_set_capturing failed");
    expect(gm_end_allocate_to_pool(state->allocator, pool_ids[pool]) == GM_OK, "gm_end_allocate_to_pool failed");
    for (uint32_t i = 0; i + 1 < state->pool_routes[pool]; i++)
        state->route_capture[pool][i] = state->route_capture[pool][i + 1];
    state->pool_routes[pool]--;
}

static void retain_or_release_pool(fuzz_state *state, input *in, bool retain)
{
    int pool = next_byte(in) % POOLS;
    gm_status status = retain ? gm_retain_pool(state->allocator, pool_ids[pool])
                              : gm_release_pool(state->allocator, pool_ids[pool]);
    if (pool == 0 || (!retain && state->pool_users[pool] == 0)) {
        expect(status == GM_ERROR_INVALID_ARGUMENT, "a pool call that names no pool (or no user) succeeded");
        return;
    }
    expect(status == GM_OK, retain ? "gm_retain_pool failed" : "gm_release_pool failed");
    state->pool_users[pool] += retain ? 1 : (uint32_t)-1;
}

static void look_at_pool(fuzz_state *state, input *in)
{
    int pool = next_byte(in) % POOLS;
    gm_pool_info info;
    gm_status status = gm_get_pool_info(state->allocator, pool_ids[pool], &info);
    if (status == GM_OK)
        expect(pool != 0 && info.users == state->pool_users[pool], "a pool's users differ from its retains");
    else
        expect(status == GM_ERROR_INVALID_ARGUMENT && (pool == 0 || state->pool_users[pool] == 0),
               "gm_get_pool_info failed on a pool with users");
    uint8_t lend = next_byte(in);
    if (lend & 2) {
        status = gm_set_pool_use_on_oom(state->allocator, pool_ids[pool], lend & 1);
        expect(status == GM_OK || (status == GM_ERROR_INVALID_ARGUMENT && (pool == 0 || state->pool_users[pool] == 0)),
               "gm_set_pool_use_on_oom failed on a pool with users");
    }
}

/* ---------------------------------------------------------------- pinned host memory */

static void free_host_slot(fuzz_state *state, int slot)
{
    allocation *block = &state->host[slot];
    if (!block->pointer) {
        expect(gm_host_free(state->allocator, NULL) == GM_OK, "gm_host_free(NULL) failed");
        return;
    }
    check_stamp(block);
    gm_stream streams[] = {(gm_stream)slot, (gm_stream)slot}; /* odd slots: a stream given twice, in the free */
    gm_status status = slot % 2 ? gm_host_free_with_streams(state->allocator, block->pointer, streams, 2)
                                : gm_host_free(state->allocator, block->pointer);
    if (status == GM_OK) {
        state->stale_host[state->stale_host_next++ % STALE_POINTERS] = block->pointer;
        block->pointer = NULL;
    } else {
        /* No host memory to record the streams: the block stays live. */
        expect(status == GM_ERROR_OUT_OF_MEMORY, "gm_host_free of a live block failed");
    }
}

static void host_allocate(fuzz_state *state, input *in)
{
    int slot = next_byte(in) % HOST_SLOTS;
    size_t size = choose_size(state, in);
    /* Without a host_limit a huge request reaches the host's malloc, which the sanitizers and libFuzzer
     * report rather than fail: only a limited cache gets those. */
    if (!state->host_limit && size > 64 * MIB && size <= ((size_t)1 << 62))
        size = size % (64 * MIB);
    free_host_slot(state, slot);
    if (state->host[slot].pointer)
        return;
    void *pointer = (void *)1;
    gm_status status = gm_host_malloc(state->allocator, size, &pointer);
    if (status != GM_OK) {
        expect(status == GM_ERROR_OUT_OF_MEMORY || (status == GM_ERROR_INVALID_ARGUMENT && size > ((size_t)1 << 62)),
               "gm_host_malloc: unexpected status");
        return;
    }
    if (size == 0) {
        expect(pointer == NULL, "gm_host_malloc of 0 bytes gave a pointer");
        return;
    }
    expect(pointer != NULL, "gm_host_malloc succeeded with NULL");
    uintptr_t start = (uintptr_t)pointer;
    for (int i = 0; i < HOST_SLOTS; i++) {
        const allocation *other = &state->host[i];
        uintptr_t other_start = (uintptr_t)other->pointer;
        if (other->pointer && start < other_start + other->size && other_start < start + size)
            fail("a new pinned host block overlaps a live one");
    }
    state->host[slot] = (allocation){pointer, size, ++state->identities, false};
    stamp(&state->host[slot]);
}

static void host_free_not_live(fuzz_state *state, input *in)
{
    void *pointer = not_live_pointer((const void *const *)state->stale_host, state->host, HOST_SLOTS, in);
    if (!pointer || live_host_slot(state, pointer) >= 0)
        return;
    expect(gm_host_free(state->allocator, pointer) == GM_ERROR_INVALID_POINTER,
           "gm_host_free of a pointer that is not live did not say so");
}

static void host_record_stream(fuzz_state *state, input *in)
{
    const allocation *block = &state->host[next_byte(in) % HOST_SLOTS];
    gm_stream stream = choose_stream(in);
    if (block->pointer) {
        gm_status status = gm_host_record_stream(state->allocator, block->pointer, stream);
        expect(status == GM_OK || status == GM_ERROR_OUT_OF_MEMORY, "gm_host_record_stream of a live block failed");
        return;
    }
    void *pointer = state->stale_host[next_byte(in) % STALE_POINTERS];
    if (pointer && live_host_slot(state, pointer) < 0)
        expect(gm_host_record_stream(state->allocator, pointer, stream) == GM_ERROR_INVALID_POINTER,
               "gm_host_record_stream of a freed pointer did not say so");
}

/* ---------------------------------------------------------------- looking at the allocator */

static uint64_t observed_events;

/* The event observer: under the allocator's lock, so it only checks and counts. */
static void observe(const gm_event *event, void *context)
{
    (void)context;
    expect((unsigned)event->kind < GM_EVENT_KIND_COUNT, "the observer saw an unknown event");
    expect(event->kind != GM_EVENT_ALLOC || event->address != 0, "the observer saw an alloc at address 0");
    observed_events++;
}

static void check_statistics(fuzz_state *state)
{
    gm_stats stats;
    expect(gm_get_stats(state->allocator, &stats) == GM_OK, "gm_get_stats failed");
    int64_t live = 0, requested = 0;
    for (int i = 0; i < DEVICE_SLOTS; i++) {
        live += state->device[i].pointer != NULL;
        requested += state->device[i].pointer ? (int64_t)state->device[i].size : 0;
    }
    expect(stats.allocation[GM_POOL_ALL].current == live, "the allocation count differs from the live blocks");
    expect(stats.requested_bytes[GM_POOL_ALL].current == requested,
           "the requested bytes differ from the live blocks' sizes");
    gm_host_stats host;
    expect(gm_host_get_stats(state->allocator, &host) == GM_OK, "gm_host_get_stats failed");
    live = requested = 0;
    for (int i = 0; i < HOST_SLOTS; i++) {
        live += state->host[i].pointer != NULL;
        requested += state->host[i].pointer ? (int64_t)state->host[i].size : 0;
    }
    expect(host.allocations.current == live, "the pinned host allocation count differs from the live blocks");
    expect(host.requested_bytes == requested, "the pinned host requested bytes differ from the live blocks' sizes");
    uint64_t free_bytes = 0, largest = 0;
    expect(gm_cache_info(state->allocator, &free_bytes, &largest) == GM_OK && largest <= free_bytes,
           "gm_cache_info failed or its largest block exceeds the free bytes");
    uint64_t can_have = 0;
    expect(gm_largest_allocation(state->allocator, &can_have) == GM_OK && can_have >= largest,
           "gm_largest_allocation failed or is below the largest cached block");
}

static void look_around(fuzz_state *state, input *in)
{
    uint8_t what = next_byte(in);
    switch (what % 4) {
    case 0: {
        gm_snapshot *snapshot = NULL;
        expect(gm_snapshot_take(state->allocator, &snapshot) == GM_OK, "gm_snapshot_take failed");
        char *json = NULL;
        expect(gm_snapshot_json(snapshot, &json) == GM_OK && json, "gm_snapshot_json failed");
        gm_json_free(json);
        gm_snapshot_free(snapshot);
        break;
    }
    case 1: {
        size_t capacity = next_byte(in) * 64u, needed = 0;
        char *buffer = malloc(capacity + 1);
        expect(buffer != NULL, "no memory for the summary");
        gm_status status = gm_summary(state->allocator, buffer, capacity, &needed);
        expect(status == GM_OK ? needed <= capacity : status == GM_ERROR_BUFFER_TOO_SMALL && needed > capacity,
               "gm_summary's status disagrees with the size it needs");
        free(buffer);
        break;
    }
    case 2: {
        size_t capacity = next_byte(in) % 64;
        uint8_t how = next_byte(in);
        if (how & 4)
            expect(gm_set_event_observer(state->allocator, how & 8 ? observe : NULL, NULL) == GM_OK,
                   "gm_set_event_observer failed");
        expect((how & 1 ? gm_resize_history(state->allocator, capacity) : gm_set_history(state->allocator, capacity)) ==
                   GM_OK,
               "gm_set_history or gm_resize_history failed");
        break;
    }
    default: {
        gm_event events[64];
        size_t count = 0;
        gm_status status = gm_history_read(state->allocator, events, 64, &count, NULL);
        expect(status == GM_OK ? count <= 64 : status == GM_ERROR_NOT_SUPPORTED, "gm_history_read failed");
        if (next_byte(in) & 1) {
            char *json = NULL;
            status = gm_history_json(state->allocator, &json);
            expect(status == GM_OK || status == GM_ERROR_NOT_SUPPORTED, "gm_history_json failed");
            gm_json_free(json);
        }
        break;
    }
    }
}

/* ---------------------------------------------------------------- the run */

enum operation_kind {
    OP_MALLOC,
    OP_MALLOC_AGAIN, /* weighs allocation and freeing */
    OP_FREE,
    OP_FREE_NOT_LIVE,
    OP_RECORD_STREAM,
    OP_STREAM_ENQUEUE,
    OP_STREAM_COMPLETE,
    OP_EMPTY_CACHE,
    OP_SET_MEMORY_LIMIT,
    OP_INJECT_FAILURES,
    OP_POOL_BEGIN,
    OP_POOL_END,
    OP_POOL_RETAIN,
    OP_POOL_RELEASE,
    OP_POOL_INFO,
    OP_USED_ELSEWHERE,
    OP_HOST_MALLOC,
    OP_HOST_FREE,
    OP_HOST_FREE_NOT_LIVE,
    OP_HOST_RECORD_STREAM,
    OP_HOST_EMPTY_CACHE,
    OP_STATISTICS,
    OP_LOOK_AROUND,
    OP_RESET_STATISTICS,
    OP_DEFRAGMENT,
    OP_COUNT
};

static const char *const operation_names[OP_COUNT] = {
    "malloc", "malloc", "free", "free of a pointer not live", "record_stream", "stream enqueue",
    "stream complete", "empty_cache", "set_memory_limit", "inject device failures", "pool begin", "pool end",
    "pool retain", "pool release", "pool info", "used elsewhere", "host malloc", "host free",
    "host free of a pointer not live", "host record_stream", "host empty_cache", "statistics",
    "snapshot, summary, history", "reset statistics", "defragment"};

static void run_operation(fuzz_state *state, input *in, enum operation_kind kind)
{
    gm_allocator *allocator = state->allocator;
    switch (kind) {
    case OP_MALLOC:
    case OP_MALLOC_AGAIN:
        allocate(state, in);
        break;
    case OP_FREE:
        free_device_slot(state, next_byte(in) % DEVICE_SLOTS);
        break;
    case OP_FREE_NOT_LIVE:
        free_not_live(state, in);
        break;
    case OP_RECORD_STREAM:
        record_stream(state, in);
        break;
    case OP_STREAM_ENQUEUE: {
        gm_stream stream = choose_stream(in);
        expect(gm_sim_stream_enqueue(allocator, stream, 1 + next_byte(in)) == GM_OK, "gm_sim_stream_enqueue failed");
        break;
    }
    case OP_STREAM_COMPLETE:
        expect(gm_sim_stream_complete(allocator, choose_stream(in)) == GM_OK, "gm_sim_stream_complete failed");
        break;
    case OP_EMPTY_CACHE:
        expect(gm_empty_cache(allocator) == GM_OK, "gm_empty_cache failed");
        break;
    case OP_DEFRAGMENT: { /* refused only under segments or while a stream is captured; a device call may fail */
        bool captured = false;
        for (size_t i = 0; i < STREAMS; i++)
            captured |= state->capturing[i] > 0;
        gm_status status = gm_defragment(allocator, next_byte(in) % 4 * state->capacity / 64, NULL);
        note_lost_memory(state, status);
        expect(state->segments ? status == GM_ERROR_NOT_SUPPORTED
                               : status == GM_OK || status == GM_ERROR_DEVICE || (captured && status == GM_ERROR_NOT_SUPPORTED),
               "gm_defragment gave an unexpected status");
        break;
    }
    case OP_SET_MEMORY_LIMIT: {
        const uint64_t limits[] = {0, 1, state->capacity / 4, state->capacity / 2, state->capacity - 1,
                                   state->capacity, 2 * state->capacity};
        uint8_t choice = next_byte(in) % (sizeof limits / sizeof limits[0] + 1);
        uint64_t limit = choice < sizeof limits / sizeof limits[0] ? limits[choice] : next_bytes(in, 8);
        expect(gm_set_memory_limit(allocator, limit) == GM_OK, "gm_set_memory_limit failed");
        uint64_t now = 0;
        expect(gm_get_memory_limit(allocator, &now) == GM_OK && now <= state->capacity && now > 0 &&
                   (limit == 0 || limit >= state->capacity || now == limit),
               "gm_get_memory_limit does not give the limit set");
        break;
    }
    case OP_INJECT_FAILURES: {
        uint8_t call = next_byte(in) % (GM_CALL_KIND_COUNT + 1);
        uint64_t after = next_byte(in) % 8;
        uint8_t how = next_byte(in);
        uint64_t failures = how == 255 ? UINT64_MAX : how % 4; /* rarely: failing until cancelled */
        gm_status status = gm_inject_device_failures(allocator, (gm_device_call)call, after, failures);
        expect(call < GM_CALL_KIND_COUNT ? status == GM_OK : status == GM_ERROR_INVALID_ARGUMENT,
               "gm_inject_device_failures gave an unexpected status");
        break;
    }
    case OP_POOL_BEGIN:
        begin_pool(state, in);
        break;
    case OP_POOL_END:
        end_pool(state, in);
        break;
    case OP_POOL_RETAIN:
        retain_or_release_pool(state, in, true);
        break;
    case OP_POOL_RELEASE:
        retain_or_release_pool(state, in, false);
        break;
    case OP_POOL_INFO:
        look_at_pool(state, in);
        break;
    case OP_USED_ELSEWHERE: {
        const uint64_t amounts[] = {0, MIB, state->capacity / 2, state->capacity};
        uint8_t choice = next_byte(in) % (sizeof amounts / sizeof amounts[0] + 1);
        uint64_t amount = choice < sizeof amounts / sizeof amounts[0] ? amounts[choice] : next_bytes(in, 8);
        gm_status status = gm_sim_set_used_elsewhere(allocator, amount);
        expect(status == GM_OK || status == GM_ERROR_OUT_OF_MEMORY, "gm_sim_set_used_elsewhere failed");
        break;
    }
    case OP_HOST_MALLOC:
        host_allocate(state, in);
        break;
    case OP_HOST_FREE:
        free_host_slot(state, next_byte(in) % HOST_SLOTS);
        break;
    case OP_HOST_FREE_NOT_LIVE:
        host_free_not_live(state, in);
        break;
    case OP_HOST_RECORD_STREAM:
        host_record_stream(state, in);
        break;
    case OP_HOST_EMPTY_CACHE:
        expect(gm_host_empty_cache(allocator) == GM_OK, "gm_host_empty_cache failed");
        break;
    case OP_STATISTICS:
        check_statistics(state);
        break;
    case OP_LOOK_AROUND:
        look_around(state, in);
        break;
    case OP_RESET_STATISTICS:
        expect((next_byte(in) & 1 ? gm_reset_peak_stats(allocator) : gm_reset_accumulated_stats(allocator)) == GM_OK,
               "resetting statistics failed");
        break;
    case OP_COUNT:
        break;
    }
}

/* The allocator the first two bytes describe. */
static void create_allocator(fuzz_state *state, input *in)
{
    static const uint64_t sim_capacities[] = {64 * MIB, GIB, 16 * GIB, 143771 * MIB};
    static const uint64_t host_capacities[] = {16 * MIB, 64 * MIB, 256 * MIB, 32 * MIB};
    static const uint64_t page_sizes[] = {2 * MIB, 64 << 10, 4 << 10, 1 * MIB};
    static const uint64_t host_limits[] = {0, 4096, MIB, 64 * MIB};
    uint8_t first = next_byte(in), second = next_byte(in);
    state->host_backend = first & 1;
    state->capacity = (state->host_backend ? host_capacities : sim_capacities)[(first >> 2) & 3];
    uint64_t page_size = page_sizes[second & 3];
    if (state->capacity / page_size > 65536) /* keeps the pages engine's tables small */
        page_size = 2 * MIB;
    state->host_limit = host_limits[(first >> 4) & 3];
    uint64_t memory_limits[] = {0, state->capacity / 2, state->capacity / 8, 3 * MIB};
    /* Compaction on the small host devices from two pages of free memory, so that it happens at all. */
    unsigned long long compact_min = (first & 2) || !(first & 64) ? 0 : state->host_backend ? 2 * page_size : 2 * MIB;
    char config[512];
    snprintf(config, sizeof config,
             "backend:%s,engine:%s,capacity:%llu,page_size:%llu,host_limit:%llu,memory_limit:%llu,tail_chunk:%s,"
             "growth_lane:%s,cost_model:%s,max_chunk_size:%s,release_before_growth:%s,history:%d,split_blocks:%s,"
             "compact_min:%llu%s",
             state->host_backend ? "host" : "sim", first & 2 ? "segments" : "pages",
             (unsigned long long)state->capacity, (unsigned long long)page_size,
             (unsigned long long)state->host_limit, (unsigned long long)memory_limits[(second >> 2) & 3],
             first & 64 ? "true" : "false", first & 128 ? "false" : "true", second & 16 ? "false" : "true",
             second & 32 ? "4MiB" : "128MiB", second & 64 ? "false" : "true", second & 128 ? 64 : 0,
             (first & 2) && (second & 16) ? "false" : "true",
             compact_min, !(first & 2) && (second & 64) ? ",move_slack:0.01" : "");
    if (getenv("FUZZ_API_VERBOSE") && atoi(getenv("FUZZ_API_VERBOSE")) > 0)
        fprintf(stderr, "fuzz_api: gm_create(\"%s\")\n", config);
    state->segments = first & 2;
    if (gm_create(config, &state->allocator) != GM_OK) {
        fprintf(stderr, "fuzz_api: gm_create(\"%s\") failed\n", config);
        fail("gm_create failed");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int verbose = -1; /* FUZZ_API_VERBOSE=1: each operation and its argument bytes on stderr */
    if (verbose < 0)
        verbose = getenv("FUZZ_API_VERBOSE") && atoi(getenv("FUZZ_API_VERBOSE")) > 0;
    static fuzz_state state;
    memset(&state, 0, sizeof state);
    current = &state;
    input in = {data, size, 0};
    create_allocator(&state, &in);
    while (in.position < in.size) {
        enum operation_kind kind = (enum operation_kind)(next_byte(&in) % OP_COUNT);
        state.operation = operation_names[kind];
        size_t start = in.position;
        run_operation(&state, &in, kind);
        if (verbose) {
            fprintf(stderr, "fuzz_api: %-32s bytes", state.operation);
            for (size_t i = start; i < in.position; i++)
                fprintf(stderr, " %02x", in.data[i]);
            fprintf(stderr, "\n");
        }
        if (gm_validate(state.allocator) != GM_OK)
            fail("gm_validate failed");
    }
    state.operation = "the final statistics";
    check_statistics(&state);
    int64_t live = 0;
    for (int i = 0; i < DEVICE_SLOTS; i++)
        live += state.device[i].pointer != NULL;
    state.operation = "gm_destroy";
    size_t live_at_destroy = 0;
    gm_destroy(state.allocator, &live_at_destroy);
    expect((int64_t)live_at_destroy == live, "gm_destroy counted other live allocations than there were");
    current = NULL;
    return 0;
}
