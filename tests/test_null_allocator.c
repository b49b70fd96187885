/*
 * test_null_allocator.c -- every public call that takes an allocator, given none (NULL) but otherwise
 * well-formed arguments, and given an allocator but NULL for one pointer the header does not say may be
 * NULL: a clear error naming that argument, never a crash, and nothing written through the caller's
 * other pointers or changed in the allocator.
 *
 * test_api.c passes NULL for every argument at once, which a check of any one of them refuses; a call
 * that checked its output pointer but not the allocator (or the other way round) would pass there and
 * crash here. The lists follow include/gpumem.h: a new call that takes an allocator belongs in them.
 */
#include "test.h"

#include <stdint.h>

#define SENTINEL 0x5a5a5a5a5a5a5a5aull

/* The call's status is an argument error whose message names `argument` as the NULL one. */
#define CHECK_NAMES(call, argument)                                                                           \
    do {                                                                                                      \
        CHECK_STATUS((call), GM_ERROR_INVALID_ARGUMENT);                                                      \
        CHECK_MESSAGE(argument " is NULL");                                                                   \
    } while (0)

/* The same for a call given no allocator. */
#define CHECK_REFUSED(call) CHECK_NAMES(call, "allocator")

static int any_stream(gm_stream stream, void *context)
{
    (void)stream;
    (void)context;
    return 1;
}

static uint64_t no_tag(void *context)
{
    (void)context;
    return 0;
}

static void ignore_event(const gm_event *event, void *context)
{
    (void)event;
    (void)context;
}

static void ignore_pressure(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                            void *context)
{
    (void)allocator;
    (void)level;
    (void)readings;
    (void)context;
}

/* Allocation, freeing and questions about pointers. */
static void memory_calls(void)
{
    char somewhere[64] = {0};
    void *pointer = (void *)(uintptr_t)SENTINEL;
    CHECK_REFUSED(gm_malloc(NULL, 4096, 0, &pointer));
    CHECK(pointer == (void *)(uintptr_t)SENTINEL);
    CHECK_REFUSED(gm_malloc_on_borrowed_stream(NULL, 4096, 7, &pointer));
    CHECK(pointer == (void *)(uintptr_t)SENTINEL);
    CHECK_REFUSED(gm_free(NULL, somewhere));
    CHECK_REFUSED(gm_record_stream(NULL, somewhere, 1));
    CHECK_REFUSED(gm_empty_cache(NULL));
    uint64_t bytes = SENTINEL, other = SENTINEL;
    CHECK_REFUSED(gm_defragment(NULL, 0, &bytes));
    CHECK_REFUSED(gm_enable_peer_access(NULL, 1));
    size_t size = SENTINEL;
    CHECK_REFUSED(gm_allocation_size(NULL, somewhere, &size));
    CHECK(gm_owns(NULL, somewhere) == 0);
    CHECK_REFUSED(gm_set_memory_limit(NULL, 1 << 30));
    CHECK_REFUSED(gm_get_memory_limit(NULL, &bytes));
    CHECK_REFUSED(gm_cache_info(NULL, &bytes, &other));
    CHECK_REFUSED(gm_largest_allocation(NULL, &bytes));
    CHECK(bytes == SENTINEL && other == SENTINEL && size == SENTINEL);
    int held = 7;
    CHECK_REFUSED(gm_holds_stream(NULL, 1, &held));
    CHECK(held == 7);
}

/* Sharing with other processes, private pools. */
static void sharing_and_pool_calls(void)
{
    char somewhere[64] = {0};
    uint64_t offset = SENTINEL;
    gm_shared_piece pieces[2] = {{0}};
    size_t count = SENTINEL;
    CHECK_REFUSED(gm_share(NULL, somewhere, &offset, pieces, 2, &count));
    void *pointer = (void *)(uintptr_t)SENTINEL;
    CHECK_REFUSED(gm_open_shared(NULL, 1, pieces, 1, &pointer));
    CHECK_REFUSED(gm_close_shared(NULL, somewhere));
    CHECK(offset == SENTINEL && count == SENTINEL && pointer == (void *)(uintptr_t)SENTINEL);
    gm_pool_id pool = {1, 2};
    CHECK_REFUSED(gm_begin_allocate_to_pool(NULL, pool, any_stream, NULL));
    CHECK_REFUSED(gm_end_allocate_to_pool(NULL, pool));
    CHECK_REFUSED(gm_retain_pool(NULL, pool));
    CHECK_REFUSED(gm_release_pool(NULL, pool));
    CHECK_REFUSED(gm_set_pool_use_on_oom(NULL, pool, 1));
    gm_pool_info info;
    CHECK_REFUSED(gm_get_pool_info(NULL, pool, &info));
    gm_pool_allocation allocations[2];
    CHECK_REFUSED(gm_get_pool_allocations(NULL, pool, allocations, 2, &count));
    CHECK_REFUSED(gm_pool_allocate_at(NULL, pool, 1 << 21, 4096, 4096));
    CHECK(count == SENTINEL);
}

/* Statistics, reports, snapshots and history. */
static void reading_calls(void)
{
    gm_stats stats;
    CHECK_REFUSED(gm_get_stats(NULL, &stats));
    CHECK_REFUSED(gm_reset_peak_stats(NULL));
    CHECK_REFUSED(gm_reset_accumulated_stats(NULL));
    char buffer[128];
    size_t needed = SENTINEL;
    CHECK_REFUSED(gm_summary(NULL, buffer, sizeof buffer, &needed));
    CHECK(needed == SENTINEL);
    CHECK_REFUSED(gm_validate(NULL));
    CHECK_REFUSED(gm_publish_status(NULL, buffer, sizeof buffer));
    gm_device_info info;
    CHECK_REFUSED(gm_get_device_info(NULL, &info));
    gm_snapshot *snapshot = (gm_snapshot *)(uintptr_t)SENTINEL;
    CHECK_REFUSED(gm_snapshot_take(NULL, &snapshot));
    CHECK(snapshot == (gm_snapshot *)(uintptr_t)SENTINEL);
    gm_event events[4];
    size_t count = SENTINEL;
    uint64_t dropped = SENTINEL;
    CHECK_REFUSED(gm_history_read(NULL, events, 4, &count, &dropped));
    CHECK(count == SENTINEL && dropped == SENTINEL);
    CHECK_REFUSED(gm_set_history(NULL, 16));
    CHECK_REFUSED(gm_resize_history(NULL, 16));
    size_t capacity = SENTINEL;
    CHECK_REFUSED(gm_history_capacity(NULL, &capacity));
    CHECK(capacity == SENTINEL);
    CHECK_REFUSED(gm_set_history_tagger(NULL, no_tag, NULL));
    CHECK_REFUSED(gm_set_event_observer(NULL, ignore_event, NULL));
    char *json = (char *)(uintptr_t)SENTINEL;
    CHECK_REFUSED(gm_history_json(NULL, &json));
    CHECK(json == (char *)(uintptr_t)SENTINEL);
}

/* Pinned host memory, pressure, streams and the sim's controls. */
static void host_pressure_and_stream_calls(void)
{
    char somewhere[64] = {0};
    void *pointer = (void *)(uintptr_t)SENTINEL;
    CHECK_REFUSED(gm_host_malloc(NULL, 4096, &pointer));
    CHECK(pointer == (void *)(uintptr_t)SENTINEL);
    CHECK_REFUSED(gm_host_free(NULL, somewhere));
    gm_stream streams[1] = {1};
    CHECK_REFUSED(gm_host_free_with_streams(NULL, somewhere, streams, 1));
    CHECK_REFUSED(gm_host_record_stream(NULL, somewhere, 1));
    CHECK_REFUSED(gm_host_empty_cache(NULL));
    gm_host_stats host_stats;
    CHECK_REFUSED(gm_host_get_stats(NULL, &host_stats));
    gm_pressure_policy policy = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_RESERVED};
    CHECK_REFUSED(gm_set_pressure_policy(NULL, &policy));
    CHECK_REFUSED(gm_get_pressure_policy(NULL, &policy));
    gm_pressure_readings readings;
    CHECK_REFUSED(gm_get_pressure(NULL, &readings));
    CHECK_REFUSED(gm_check_pressure(NULL, &readings));
    CHECK_REFUSED(gm_on_pressure(NULL, ignore_pressure, NULL));
    CHECK_REFUSED(gm_remove_pressure_callback(NULL, ignore_pressure, NULL));
    CHECK_REFUSED(gm_inject_device_failures(NULL, GM_CALL_PHYSICAL_CREATE, 0, 1));
    gm_stream stream = (gm_stream)SENTINEL;
    CHECK_REFUSED(gm_named_stream(NULL, 3, &stream));
    CHECK(stream == (gm_stream)SENTINEL);
    CHECK_REFUSED(gm_sim_stream_enqueue(NULL, 1, 10));
    CHECK_REFUSED(gm_sim_stream_complete(NULL, 1));
    CHECK_REFUSED(gm_sim_stream_finish_until(NULL, 1, 0));
    uint64_t units = SENTINEL;
    CHECK_REFUSED(gm_sim_work_waited_for(NULL, &units));
    CHECK(units == SENTINEL);
    CHECK_REFUSED(gm_sim_stream_set_capturing(NULL, 1, 1));
    CHECK_REFUSED(gm_sim_set_used_elsewhere(NULL, 1 << 20));
}

/* One pointer NULL at a time, on an allocator with a live block and cached memory, which no refused call
 * may change (gm_validate and the statistics before and after). */
static void each_required_pointer(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB,history:16", &allocator));
    void *live = NULL, *cached = NULL;
    CHECK_OK(gm_malloc(allocator, 4 << 20, 0, &live));
    CHECK_OK(gm_malloc(allocator, 8 << 20, 0, &cached));
    CHECK_OK(gm_free(allocator, cached));
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    uint64_t bytes = 0;
    size_t count = 0;
    CHECK_NAMES(gm_malloc(allocator, 4096, 0, NULL), "pointer_out");
    CHECK_NAMES(gm_malloc_on_borrowed_stream(allocator, 4096, 7, NULL), "pointer_out");
    CHECK_NAMES(gm_allocation_size(allocator, live, NULL), "size_out");
    CHECK_NAMES(gm_get_memory_limit(allocator, NULL), "bytes_out");
    CHECK_NAMES(gm_cache_info(allocator, NULL, &bytes), "free_bytes_out");
    CHECK_NAMES(gm_cache_info(allocator, &bytes, NULL), "largest_block_out");
    CHECK_NAMES(gm_largest_allocation(allocator, NULL), "bytes_out");
    CHECK_NAMES(gm_get_stats(allocator, NULL), "stats_out");
    CHECK_NAMES(gm_get_device_info(allocator, NULL), "info_out");
    CHECK_NAMES(gm_snapshot_take(allocator, NULL), "snapshot_out");
    CHECK_NAMES(gm_history_read(allocator, NULL, 0, NULL, NULL), "count_out");
    CHECK_NAMES(gm_history_json(allocator, NULL), "json_out");
    CHECK_NAMES(gm_history_capacity(allocator, NULL), "capacity_out");
    CHECK_NAMES(gm_get_pressure_policy(allocator, NULL), "policy_out");
    CHECK_NAMES(gm_get_pressure(allocator, NULL), "readings_out");
    CHECK_NAMES(gm_named_stream(allocator, 3, NULL), "stream_out");
    CHECK_NAMES(gm_sim_work_waited_for(allocator, NULL), "units_out");
    CHECK_STATUS(gm_holds_stream(allocator, 0, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_host_malloc(allocator, 4096, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_host_get_stats(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_on_pressure(allocator, NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_publish_status(allocator, NULL, 64), GM_ERROR_INVALID_ARGUMENT);
    gm_pool_id pool = {1, 2};
    CHECK_STATUS(gm_get_pool_info(allocator, pool, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_get_pool_allocations(allocator, pool, NULL, 2, &count), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_get_pool_allocations(allocator, pool, NULL, 0, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_host_free_with_streams(allocator, live, NULL, 1), GM_ERROR_INVALID_ARGUMENT);
    char table[64];
    CHECK_NAMES(gm_summary_of_stats(NULL, "sim", 0, table, sizeof table, NULL), "stats");
    CHECK_NAMES(gm_summary_of_stats(&before, NULL, 0, table, sizeof table, NULL), "backend");
    CHECK_NAMES(gm_snapshot_json(NULL, NULL), "snapshot");
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK_EQ_INT(after.allocated_bytes[GM_POOL_ALL].current, before.allocated_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, before.reserved_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(after.allocation[GM_POOL_ALL].allocated, before.allocation[GM_POOL_ALL].allocated);
    CHECK_OK(gm_free(allocator, live));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(memory_calls), TEST_CASE(sharing_and_pool_calls), TEST_CASE(reading_calls),
          TEST_CASE(host_pressure_and_stream_calls), TEST_CASE(each_required_pointer))
