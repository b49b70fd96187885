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
 *   set and removed; the library's own host allocations failing (gm_fail_system_allocations: one, a few,
 *   or every one from then on, until the input ends), which any call may meet with out of memory. The segments engine without cost_model also runs unsplit (split_blocks:false).
 *   The pages engine with tail_chunk also compacts pinned chunks (compact_min: 2 MiB on the sim, two pages
 *   on the host backend, whose stamps below check that the copies kept every block's bytes). The
 *   bit that sets the segments engine's release_before_growth gives the pages engine move_slack:0.01, and the
 *   one that turns its growth lane off chunks as large as max_chunk_size whatever the capacity
 *   (chunk_room_share:0), so that pinned chunks have free ends and starts to stitch (stitch is on by
 *   default: second mappings of pinned chunks).
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
#include "fuzz_api.h"

#include "base/system_memory.h"
#include "core/block.h"

const gm_stream streams[STREAMS] = {0, 1, 2, 1000};
const gm_pool_id pool_ids[POOLS] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {7, 3}};

fuzz_state *current;

void fail(const char *what)
{
    fprintf(stderr, "fuzz_api: during %s: %s (last error: %s)\n", current ? current->operation : "setup", what,
            gm_last_error());
    abort();
}

void expect(bool condition, const char *what)
{
    if (!condition)
        fail(what);
}

bool expect_done(const fuzz_state *state, gm_status status, const char *message)
{
    expect(status == GM_OK || (state->host_failing && status == GM_ERROR_OUT_OF_MEMORY), message);
    return status == GM_OK;
}

/* ---------------------------------------------------------------- stamps (real memory only) */

static uint8_t stamp_byte(uint64_t identity, size_t index)
{
    return (uint8_t)((identity * 0x9e3779b97f4a7c15ull) >> (8 * (index % 8))) ^ (uint8_t)index;
}

void stamp(const allocation *block)
{
    uint8_t *bytes = block->pointer;
    size_t count = block->size < STAMP_BYTES ? block->size : STAMP_BYTES;
    for (size_t i = 0; i < count; i++)
        bytes[i] = stamp_byte(block->identity, i);
    for (size_t i = 0; i < count; i++)
        bytes[block->size - 1 - i] = stamp_byte(block->identity, STAMP_BYTES + i);
}

void check_stamp(const allocation *block)
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

gm_stream choose_stream(input *in)
{
    return streams[next_byte(in) % STREAMS];
}

size_t choose_size(fuzz_state *state, input *in)
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

int live_host_slot(const fuzz_state *state, const void *pointer)
{
    for (int i = 0; i < HOST_SLOTS; i++)
        if (state->host[i].pointer && state->host[i].pointer == pointer)
            return i;
    return -1;
}

/* A pointer that is no live allocation: one freed earlier, one inside a live block, or made up. */
void *not_live_pointer(const void *const *stale, const allocation *slots, int slot_count, input *in)
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
    /* The last stream is borrowed: gpumem never names it after the call (gm_malloc_on_borrowed_stream). */
    gm_status status = stream == streams[STREAMS - 1] ? gm_malloc_on_borrowed_stream(state->allocator, size, stream, &pointer)
                                                      : gm_malloc(state->allocator, size, stream, &pointer);
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
    OP_FAIL_HOST_ALLOCATIONS,
    OP_STREAM_FINISH_UNTIL, /* a device behind its host: older work done, newer still queued */
    OP_COUNT
};

static const char *const operation_names[OP_COUNT] = {
    "malloc", "malloc", "free", "free of a pointer not live", "record_stream", "stream enqueue",
    "stream complete", "empty_cache", "set_memory_limit", "inject device failures", "pool begin", "pool end",
    "pool retain", "pool release", "pool info", "used elsewhere", "host malloc", "host free",
    "host free of a pointer not live", "host record_stream", "host empty_cache", "statistics",
    "snapshot, summary, history", "reset statistics", "defragment", "fail host allocations",
    "stream finish until"};

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
        expect_done(state, gm_sim_stream_enqueue(allocator, stream, 1 + next_byte(in)), "gm_sim_stream_enqueue failed");
        break;
    }
    case OP_STREAM_COMPLETE:
        expect_done(state, gm_sim_stream_complete(allocator, choose_stream(in)), "gm_sim_stream_complete failed");
        break;
    case OP_STREAM_FINISH_UNTIL: {
        gm_stream stream = choose_stream(in);
        expect_done(state, gm_sim_stream_finish_until(allocator, stream, next_byte(in) % 8),
                    "gm_sim_stream_finish_until failed");
        break;
    }
    case OP_EMPTY_CACHE:
        expect_done(state, gm_empty_cache(allocator), "gm_empty_cache failed");
        break;
    case OP_FAIL_HOST_ALLOCATIONS: {
        uint64_t after = next_byte(in) % 32;
        uint8_t how = next_byte(in);
        gm_fail_system_allocations(after, how == 255 ? UINT64_MAX : 1u + how % 3u);
        state->host_failing = true;
        break;
    }
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
        expect_done(state, gm_host_empty_cache(allocator), "gm_host_empty_cache failed");
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
             "compact_min:%llu%s%s",
             state->host_backend ? "host" : "sim", first & 2 ? "segments" : "pages",
             (unsigned long long)state->capacity, (unsigned long long)page_size,
             (unsigned long long)state->host_limit, (unsigned long long)memory_limits[(second >> 2) & 3],
             first & 64 ? "true" : "false", first & 128 ? "false" : "true", second & 16 ? "false" : "true",
             second & 32 ? "4MiB" : "128MiB", second & 64 ? "false" : "true", second & 128 ? 64 : 0,
             (first & 2) && (second & 16) ? "false" : "true",
             compact_min, !(first & 2) && (second & 64) ? ",move_slack:0.01" : "",
             !(first & 2) && (first & 128) ? ",chunk_room_share:0" : "");
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
    gm_fail_system_allocations(0, 0);
    /* Inputs of odd length take blocks' metadata a block at a time: each block made is then a host
     * allocation that may fail (the size does not change how the bytes are read). */
    gm_block_pool_set_chunk_blocks(size % 2 ? 1 : 0);
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
    gm_fail_system_allocations(0, 0); /* the checks below take host memory */
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
