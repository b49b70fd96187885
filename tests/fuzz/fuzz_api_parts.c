/*
 * fuzz_api_parts.c -- fuzz_api's operations on private pools, on pinned host memory, and those that
 * look at the allocator (statistics, snapshots, the summary, the history, an event observer); the
 * harness and what must hold are in fuzz_api.c.
 */
#include "fuzz_api.h"

/* A pool's stream filter: the context is the pool's stream mask. */
static int take_masked_streams(gm_stream stream, void *context)
{
    uint8_t mask = *(const uint8_t *)context;
    for (int i = 0; i < STREAMS; i++)
        if (streams[i] == stream)
            return (mask >> i) & 1;
    return 0;
}

/* ---------------------------------------------------------------- private pools */

void begin_pool(fuzz_state *state, input *in)
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
    if (!expect_done(state, status, "gm_begin_allocate_to_pool failed"))
        return;
    /* Capture a stream the pool takes, as a CUDA graph's capture does: its events can then never be
     * waited for. */
    int captured = -1;
    if (how & 2) {
        for (int i = 0; i < STREAMS && captured < 0; i++)
            if (!filtered || (mask >> i & 1))
                captured = filtered ? i : (how >> 2) % STREAMS;
    }
    if (captured >= 0 && expect_done(state, gm_sim_stream_set_capturing(state->allocator, streams[captured], 1),
                                     "gm_sim_stream_set_capturing failed"))
        state->capturing[captured]++;
    else
        captured = -1;
    state->route_capture[pool][state->pool_routes[pool]] = captured;
    state->pool_users[pool]++;
    state->pool_routes[pool]++;
}

void end_pool(fuzz_state *state, input *in)
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

void retain_or_release_pool(fuzz_state *state, input *in, bool retain)
{
    int pool = next_byte(in) % POOLS;
    gm_status status = retain ? gm_retain_pool(state->allocator, pool_ids[pool])
                              : gm_release_pool(state->allocator, pool_ids[pool]);
    if (pool == 0 || (!retain && state->pool_users[pool] == 0)) {
        expect(status == GM_ERROR_INVALID_ARGUMENT, "a pool call that names no pool (or no user) succeeded");
        return;
    }
    if (expect_done(state, status, retain ? "gm_retain_pool failed" : "gm_release_pool failed"))
        state->pool_users[pool] += retain ? 1 : (uint32_t)-1;
}

void look_at_pool(fuzz_state *state, input *in)
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

void free_host_slot(fuzz_state *state, int slot)
{
    allocation *block = &state->host[slot];
    if (!block->pointer) {
        expect(gm_host_free(state->allocator, NULL) == GM_OK, "gm_host_free(NULL) failed");
        return;
    }
    check_stamp(block);
    gm_stream streams[] = {(gm_stream)slot, (gm_stream)slot}; /* odd slots: a stream given twice, in the free */
    gm_host_stats before, after;
    expect(gm_host_get_stats(state->allocator, &before) == GM_OK, "gm_host_get_stats failed");
    gm_status status = slot % 2 ? gm_host_free_with_streams(state->allocator, block->pointer, streams, 2)
                                : gm_host_free(state->allocator, block->pointer);
    if (status == GM_OK) {
        state->stale_host[state->stale_host_next++ % STALE_POINTERS] = block->pointer;
        block->pointer = NULL;
    } else {
        /* No host memory to record the streams, or (with device failures injected) an event for a busy
         * stream that could not be made or recorded: the block stays live (gpumem.h), freed again later. */
        expect(status == GM_ERROR_OUT_OF_MEMORY || status == GM_ERROR_DEVICE, "gm_host_free of a live block failed");
        expect(gm_host_get_stats(state->allocator, &after) == GM_OK, "gm_host_get_stats failed");
        expect(after.allocations.current == before.allocations.current &&
                   after.allocated_bytes.current == before.allocated_bytes.current,
               "a block whose free failed is no longer counted live");
    }
}

void host_allocate(fuzz_state *state, input *in)
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

void host_free_not_live(fuzz_state *state, input *in)
{
    void *pointer = not_live_pointer((const void *const *)state->stale_host, state->host, HOST_SLOTS, in);
    if (!pointer || live_host_slot(state, pointer) >= 0)
        return;
    expect(gm_host_free(state->allocator, pointer) == GM_ERROR_INVALID_POINTER,
           "gm_host_free of a pointer that is not live did not say so");
}

void host_record_stream(fuzz_state *state, input *in)
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

void check_statistics(fuzz_state *state)
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
    if (expect_done(state, gm_cache_info(state->allocator, &free_bytes, &largest), "gm_cache_info failed"))
        expect(largest <= free_bytes, "gm_cache_info's largest block exceeds the free bytes");
    uint64_t can_have = 0;
    if (expect_done(state, gm_largest_allocation(state->allocator, &can_have), "gm_largest_allocation failed"))
        expect(can_have >= largest, "gm_largest_allocation is below the largest cached block");
}

void look_around(fuzz_state *state, input *in)
{
    uint8_t what = next_byte(in);
    switch (what % 4) {
    case 0: {
        gm_snapshot *snapshot = NULL;
        if (!expect_done(state, gm_snapshot_take(state->allocator, &snapshot), "gm_snapshot_take failed"))
            break;
        char *json = NULL;
        if (expect_done(state, gm_snapshot_json(snapshot, &json), "gm_snapshot_json failed"))
            expect(json != NULL, "gm_snapshot_json gave no text");
        gm_json_free(json);
        gm_snapshot_free(snapshot);
        break;
    }
    case 1: {
        size_t capacity = next_byte(in) * 64u, needed = 0;
        char *buffer = malloc(capacity + 1);
        expect(buffer != NULL, "no memory for the summary");
        gm_status status = gm_summary(state->allocator, buffer, capacity, &needed);
        expect(status == GM_OK ? needed <= capacity
                               : (status == GM_ERROR_BUFFER_TOO_SMALL && needed > capacity) ||
                                     (state->host_failing && status == GM_ERROR_OUT_OF_MEMORY),
               "gm_summary's status disagrees with the size it needs");
        free(buffer);
        break;
    }
    case 2: {
        size_t capacity = next_byte(in) % 64;
        uint8_t how = next_byte(in);
        if (how & 4)
            expect_done(state, gm_set_event_observer(state->allocator, how & 8 ? observe : NULL, NULL),
                        "gm_set_event_observer failed");
        expect_done(state, how & 1 ? gm_resize_history(state->allocator, capacity) : gm_set_history(state->allocator, capacity),
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
            if (status != GM_ERROR_NOT_SUPPORTED)
                expect_done(state, status, "gm_history_json failed");
            gm_json_free(json);
        }
        break;
    }
    }
}

