/*
 * test_borrowed_streams.c -- a stream the program destroys while the allocator still caches memory
 * freed on it is never named again (gm_malloc_on_borrowed_stream).
 *
 * PyTorch's own allocator never calls the driver on a tensor's stream after the allocation, so a
 * program may destroy a stream of its own (torch.cuda.ExternalStream over another library's stream)
 * while tensors made on it live or their memory stays cached; a driver call that names a destroyed
 * stream may crash. The simulated device here remembers destroyed streams and counts every later call
 * that names one (gm_model_stream_destroy): with the stream borrowed the count stays 0 while its
 * tensors are freed after it is gone (more frees than a progress mark needs), while another stream's
 * growth takes its idle memory (after a wait for the whole device), and through empty_cache; the same
 * program on gm_malloc is caught naming it, so the count can fail. On the host backend every block
 * keeps its bytes. While another stream is being captured into a CUDA graph, a device-wide wait would
 * break the capture: the borrowed stream's memory then stays where it is and the growth makes new
 * memory, without a wait.
 */
#include "test.h"

#include "backend/device_model.h"
#include "core/allocator.h"
#include "core/arena.h"
#include "pattern.h"

#define MIB (1ull << 20)
#define BORROWED_STREAM 77
#define OTHER_STREAM 0
#define CAPTURED_STREAM 5
#define SMALL_BLOCKS 400
#define LARGE_BLOCKS 6
#define GROWTH_BLOCKS 10

typedef struct program {
    gm_allocator *allocator;
    bool host; /* blocks carry patterns */
    void *small[SMALL_BLOCKS];
    void *large[LARGE_BLOCKS];
    void *growth[GROWTH_BLOCKS];
} program;

static uint64_t calls_on_destroyed(gm_allocator *allocator)
{
    gm_arena *arena = gm_lock_arena(allocator);
    uint64_t calls = gm_model_footprint_of(arena->backend).calls_on_destroyed_streams;
    gm_unlock_arena(allocator);
    return calls;
}

static int64_t device_waits(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[GM_CALL_EVENT_SYNCHRONIZE];
}

static void destroy_stream(gm_allocator *allocator, gm_stream stream)
{
    gm_arena *arena = gm_lock_arena(allocator);
    gm_status status = gm_model_stream_destroy(arena->backend, stream);
    gm_unlock_arena(allocator);
    CHECK_OK(status);
}

static void *allocate(program *run, size_t size, gm_stream stream, bool borrowed, uint64_t identity)
{
    void *pointer = NULL;
    gm_status status = borrowed ? gm_malloc_on_borrowed_stream(run->allocator, size, stream, &pointer)
                                : gm_malloc(run->allocator, size, stream, &pointer);
    CHECK_OK(status);
    if (pointer && run->host)
        pattern_stamp(pointer, size, identity);
    return pointer;
}

static void release(program *run, void **pointer, size_t size, uint64_t identity)
{
    if (*pointer && run->host)
        CHECK(pattern_intact(*pointer, size, identity));
    CHECK_OK(gm_free(run->allocator, *pointer));
    *pointer = NULL;
}

static size_t small_size(size_t index) { return 64 * 1024 + (index % 16) * 60 * 1024; }

/* Blocks on the stream, work queued on it, half of them freed; then the stream is destroyed and the
 * rest freed after it. */
static void use_then_destroy(program *run, bool borrowed)
{
    for (size_t i = 0; i < SMALL_BLOCKS; i++)
        run->small[i] = allocate(run, small_size(i), BORROWED_STREAM, borrowed, i + 1);
    for (size_t i = 0; i < LARGE_BLOCKS; i++)
        run->large[i] = allocate(run, 96 * MIB + i * MIB, BORROWED_STREAM, borrowed, 1000 + i);
    CHECK_OK(gm_sim_stream_enqueue(run->allocator, BORROWED_STREAM, 50)); /* its kernels */
    for (size_t i = 0; i < SMALL_BLOCKS; i += 2)
        release(run, &run->small[i], small_size(i), i + 1);
    for (size_t i = 0; i < LARGE_BLOCKS; i++)
        release(run, &run->large[i], 96 * MIB + i * MIB, 1000 + i);
    destroy_stream(run->allocator, BORROWED_STREAM);
    for (size_t i = 1; i < SMALL_BLOCKS; i += 2) /* tensors that outlive their stream */
        release(run, &run->small[i], small_size(i), i + 1);
}

/* Another stream needs more than the device has left beside the destroyed stream's cache. */
static void grow_elsewhere(program *run)
{
    for (size_t i = 0; i < GROWTH_BLOCKS; i++)
        run->growth[i] = allocate(run, 64 * MIB, OTHER_STREAM, false, 5000 + i);
    for (size_t i = 0; i < GROWTH_BLOCKS; i++)
        release(run, &run->growth[i], 64 * MIB, 5000 + i);
}

static void destroyed_stream_is_never_named_on(const char *config, bool host)
{
    program run = {.allocator = make_allocator(config), .host = host};
    use_then_destroy(&run, true);
    CHECK_EQ_INT(calls_on_destroyed(run.allocator), 0);
    int64_t waits_before = device_waits(run.allocator);
    grow_elsewhere(&run);
    CHECK(device_waits(run.allocator) > waits_before); /* its memory moved after a wait for the device */
    CHECK_OK(gm_validate(run.allocator));
    CHECK_OK(gm_empty_cache(run.allocator));
    gm_stats stats;
    CHECK_OK(gm_get_stats(run.allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(calls_on_destroyed(run.allocator), 0);
    CHECK_OK(gm_validate(run.allocator));
    gm_destroy(run.allocator, NULL);
}

static void destroyed_stream_is_never_named(void)
{
    destroyed_stream_is_never_named_on("backend:sim,capacity:1GiB", false);
    destroyed_stream_is_never_named_on("backend:sim,capacity:1GiB,stitch:false,compact_min:2MiB", false);
    destroyed_stream_is_never_named_on("backend:host,capacity:1GiB", true);
}

/* The check above can fail: the same program through gm_malloc names the destroyed stream. */
static void an_owned_stream_is_named_after_its_end(void)
{
    program run = {.allocator = make_allocator("backend:sim,capacity:1GiB"), .host = false};
    use_then_destroy(&run, false);
    for (size_t i = 0; i < GROWTH_BLOCKS; i++) { /* the driver refuses some of these calls */
        void *pointer = NULL;
        if (gm_malloc(run.allocator, 64 * MIB, OTHER_STREAM, &pointer) == GM_OK)
            CHECK_OK(gm_free(run.allocator, pointer));
    }
    CHECK(calls_on_destroyed(run.allocator) > 0);
    gm_destroy(run.allocator, NULL);
}

/* During another stream's capture the borrowed stream's cache stays put: new memory, no wait. */
static void capture_elsewhere_leaves_it_in_place(void)
{
    program run = {.allocator = make_allocator("backend:sim,capacity:4GiB"), .host = false};
    void *captured = allocate(&run, MIB, CAPTURED_STREAM, false, 9000);
    use_then_destroy(&run, true);
    CHECK_OK(gm_sim_stream_set_capturing(run.allocator, CAPTURED_STREAM, 1));
    gm_stats before, after;
    CHECK_OK(gm_get_stats(run.allocator, &before));
    grow_elsewhere(&run);
    CHECK_OK(gm_get_stats(run.allocator, &after));
    CHECK_EQ_INT(after.device_calls[GM_CALL_EVENT_SYNCHRONIZE], before.device_calls[GM_CALL_EVENT_SYNCHRONIZE]);
    CHECK(after.reserved_bytes[GM_POOL_ALL].peak > before.reserved_bytes[GM_POOL_ALL].current); /* made anew */
    CHECK_OK(gm_sim_stream_set_capturing(run.allocator, CAPTURED_STREAM, 0));
    release(&run, &captured, MIB, 9000);
    CHECK_OK(gm_empty_cache(run.allocator));
    CHECK_OK(gm_get_stats(run.allocator, &after));
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(calls_on_destroyed(run.allocator), 0);
    CHECK_OK(gm_validate(run.allocator));
    gm_destroy(run.allocator, NULL);
}

RUN_TESTS(TEST_CASE(destroyed_stream_is_never_named), TEST_CASE(an_owned_stream_is_named_after_its_end),
          TEST_CASE(capture_elsewhere_leaves_it_in_place))
