/*
 * test_api.c -- every public call, on both engines, and every error path: NULL arguments, pointers
 * the allocator never returned, interior pointers, double frees, requests too large for the
 * device, a buffer too small for the summary. A failing call must return its code, say why in
 * gm_last_error(), and change nothing.
 */
#include "test.h"

#include <stdint.h>
#include <time.h>

static const char *const engines[] = {"engine:pages,capacity:1GiB", "engine:segments,capacity:1GiB"};

static void create_and_destroy(void)
{
    CHECK_STATUS(gm_create(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("engine:nonsense", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK(allocator == NULL);
    CHECK_STATUS(gm_create("backend:tpu", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_OK(gm_create(NULL, &allocator));
    gm_destroy(allocator, NULL);
    gm_destroy(NULL, NULL); /* accepted */
    size_t live = 99;
    gm_destroy(NULL, &live);
    CHECK_EQ_INT(live, 0);
    CHECK_STATUS(gm_create_from_environment(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
}

static void cuda_backend_without_gpu_is_a_clear_error(void)
{
    gm_allocator *allocator = NULL;
    gm_status status = gm_create("backend:cuda", &allocator);
    if (status == GM_OK) { /* a machine with a GPU: the backend must then describe it */
        gm_device_info info;
        CHECK_OK(gm_get_device_info(allocator, &info));
        CHECK(!strcmp(info.backend, "cuda"));
        CHECK(info.total_bytes > 0);
        gm_destroy(allocator, NULL);
        return;
    }
    CHECK_EQ_INT(status, GM_ERROR_NO_DEVICE);
    CHECK_MESSAGE("cuda backend");
    CHECK(allocator == NULL);
}

static void malloc_and_free_basics(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        void *pointer = (void *)1;
        CHECK_OK(gm_malloc(allocator, 0, 0, &pointer));
        CHECK(pointer == NULL);
        CHECK_STATUS(gm_malloc(NULL, 16, 0, &pointer), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_malloc(allocator, 16, 0, NULL), GM_ERROR_INVALID_ARGUMENT);
        void *small = NULL, *large = NULL;
        CHECK_OK(gm_malloc(allocator, 1, 0, &small));
        CHECK_OK(gm_malloc(allocator, 5u << 20, 0, &large));
        CHECK(small && large && small != large);
        CHECK((uintptr_t)small % 512 == 0 && (uintptr_t)large % 512 == 0);
        size_t size = 0;
        CHECK_OK(gm_allocation_size(allocator, small, &size));
        CHECK_EQ_INT(size, 512);
        CHECK_OK(gm_allocation_size(allocator, large, &size));
        CHECK_EQ_INT(size, 5u << 20);
        CHECK_STATUS(gm_allocation_size(allocator, NULL, &size), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_allocation_size(allocator, (char *)small + 512, &size), GM_ERROR_INVALID_POINTER);
        /* gm_owns: a yes/no that leaves the last error alone */
        CHECK_STATUS(gm_free(allocator, (char *)large + 512), GM_ERROR_INVALID_POINTER);
        const char *before = gm_last_error();
        char remembered[64];
        snprintf(remembered, sizeof remembered, "%s", before);
        CHECK(gm_owns(allocator, small) == 1 && gm_owns(allocator, large) == 1);
        CHECK(gm_owns(allocator, (char *)small + 512) == 0 && gm_owns(allocator, NULL) == 0);
        CHECK(gm_owns(NULL, small) == 0);
        CHECK(strncmp(gm_last_error(), remembered, strlen(remembered)) == 0);

        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.allocation[GM_POOL_SMALL].current, 1);
        CHECK_EQ_INT(stats.allocation[GM_POOL_LARGE].current, 1);
        CHECK_EQ_INT(stats.requested_bytes[GM_POOL_ALL].current, 1 + (5 << 20));
        CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, 512 + (5 << 20));

        CHECK_OK(gm_free(allocator, small));
        CHECK_OK(gm_free(allocator, NULL));
        CHECK_STATUS(gm_free(NULL, large), GM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(gm_free(allocator, large));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void invalid_pointers_change_nothing(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        void *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 4096, 0, &pointer));
        gm_stats before, after;
        CHECK_OK(gm_get_stats(allocator, &before));
        int on_stack = 0;
        CHECK_STATUS(gm_free(allocator, &on_stack), GM_ERROR_INVALID_POINTER);
        CHECK_MESSAGE("not a live allocation");
        CHECK_STATUS(gm_free(allocator, (char *)pointer + 512), GM_ERROR_INVALID_POINTER);
        CHECK_STATUS(gm_record_stream(allocator, &on_stack, 1), GM_ERROR_INVALID_POINTER);
        CHECK_OK(gm_get_stats(allocator, &after));
        CHECK(!memcmp(&before, &after, sizeof before));
        CHECK_OK(gm_free(allocator, pointer));
        /* A double free is refused and changes nothing. */
        CHECK_OK(gm_get_stats(allocator, &before));
        CHECK_STATUS(gm_free(allocator, pointer), GM_ERROR_INVALID_POINTER);
        CHECK_MESSAGE("already freed");
        CHECK_OK(gm_get_stats(allocator, &after));
        CHECK(!memcmp(&before, &after, sizeof before));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void out_of_memory_explains_and_recovers(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        void *pointer = NULL;
        CHECK_STATUS(gm_malloc(allocator, 2ull << 30, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
        CHECK(pointer == NULL);
        CHECK_MESSAGE("Tried to allocate 2.00 GiB");
        CHECK_MESSAGE("Cause: capacity. The request alone (2.00 GiB) is larger than the whole device (1.00 GiB)");
        CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_CAPACITY);
        CHECK_STATUS(gm_malloc(allocator, SIZE_MAX, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
        /* Fill the device, fail, free one block, succeed again. */
        void *blocks[64];
        size_t count = 0;
        while (count < 64 && gm_malloc(allocator, 100u << 20, 0, &blocks[count]) == GM_OK)
            count++;
        CHECK(count >= 9 && count < 11);
        CHECK_MESSAGE("Cause: capacity. Live allocations hold");
        CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_CAPACITY);
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.num_ooms, 3);
        CHECK(stats.num_alloc_retries >= 2); /* not for SIZE_MAX: it fits no device, so it is not retried */
        CHECK_OK(gm_free(allocator, blocks[--count]));
        CHECK_OK(gm_malloc(allocator, 100u << 20, 0, &blocks[count++]));
        for (size_t i = 0; i < count; i++)
            CHECK_OK(gm_free(allocator, blocks[i]));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void fragmentation_is_diagnosed(void)
{
    /* Segments: alternate blocks of a filled device freed leave plenty free, none of it in one piece. */
    gm_allocator *allocator = make_allocator("engine:segments,capacity:200MiB,release_before_growth:false");
    void *blocks[100];
    size_t count = 0;
    while (count < 100 && gm_malloc(allocator, 4u << 20, 0, &blocks[count]) == GM_OK)
        count++;
    CHECK_EQ_INT(count, 50);
    for (size_t i = 0; i < count; i += 2)
        CHECK_OK(gm_free(allocator, blocks[i]));
    void *big = NULL;
    CHECK_STATUS(gm_malloc(allocator, 30u << 20, 0, &big), GM_ERROR_OUT_OF_MEMORY);
    CHECK_MESSAGE("Cause: fragmentation");
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_FRAGMENTATION);
    gm_destroy(allocator, NULL);
    /* The pages engine gathers the same free pages into one range and succeeds. */
    allocator = make_allocator("engine:pages,capacity:200MiB");
    count = 0;
    while (count < 100 && gm_malloc(allocator, 4u << 20, 0, &blocks[count]) == GM_OK)
        count++;
    CHECK_EQ_INT(count, 50);
    for (size_t i = 0; i < count; i += 2)
        CHECK_OK(gm_free(allocator, blocks[i]));
    CHECK_OK(gm_malloc(allocator, 30u << 20, 0, &big));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    /* With one chunk per growth, a small block left where a big one was pins the big chunk: the pages
     * engine says so and names the option that helps; with 128 MiB chunks the same requests succeed, and
     * so they do with one chunk per growth when stitching lays the request across the two free pieces.
     * (chunk_room_share:0: on a device this small the room share alone makes every chunk a page.) */
    static const char *const pinned[] = {"engine:pages,capacity:1GiB,max_chunk_size:0,chunk_room_share:0,stitch:false",
                                         "engine:pages,capacity:1GiB,chunk_room_share:0,stitch:false",
                                         "engine:pages,capacity:1GiB,max_chunk_size:0,chunk_room_share:0,stitch:true"};
    for (size_t c = 0; c < 3; c++) {
        allocator = make_allocator(pinned[c]);
        void *first = NULL, *second = NULL, *head = NULL, *middle = NULL, *tail = NULL;
        CHECK_OK(gm_malloc(allocator, 800u << 20, 0, &first));
        CHECK_OK(gm_malloc(allocator, 100u << 20, 0, &second));
        CHECK_OK(gm_free(allocator, first)); /* 800 MiB free, then small blocks scattered in it */
        CHECK_OK(gm_malloc(allocator, 4u << 20, 0, &head));
        CHECK_OK(gm_malloc(allocator, 396u << 20, 0, &middle));
        CHECK_OK(gm_malloc(allocator, 4u << 20, 0, &tail));
        CHECK_OK(gm_free(allocator, middle)); /* free: 396 + 392 MiB, neither piece fits 500 MiB */
        gm_status status = gm_malloc(allocator, 500u << 20, 0, &big);
        if (c == 0) {
            CHECK_STATUS(status, GM_ERROR_OUT_OF_MEMORY);
            CHECK_MESSAGE("Cause: fragmentation");
            CHECK_MESSAGE("max_chunk_size");
            CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_FRAGMENTATION);
        } else {
            CHECK_OK(status);
        }
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void memory_limit_is_diagnosed(void)
{
    gm_allocator *allocator = make_allocator("capacity:1GiB,memory_limit:64MiB");
    void *pointer = NULL;
    CHECK_STATUS(gm_malloc(allocator, 100u << 20, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
    CHECK_MESSAGE("memory limit");
    CHECK_OK(gm_malloc(allocator, 60u << 20, 0, &pointer));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK(stats.reserved_bytes[GM_POOL_ALL].current <= 64 << 20);
    gm_destroy(allocator, NULL);
}

static void empty_cache_returns_memory(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        void *a = NULL, *b = NULL, *c = NULL;
        CHECK_OK(gm_malloc(allocator, 30u << 20, 0, &a));
        CHECK_OK(gm_malloc(allocator, 1000, 0, &b));
        CHECK_OK(gm_malloc(allocator, 30u << 20, 7, &c));
        CHECK_OK(gm_free(allocator, a));
        CHECK_OK(gm_free(allocator, b));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK(stats.reserved_bytes[GM_POOL_ALL].current >= 60 << 20);
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 30 << 20); /* what c still holds */
        CHECK(stats.num_device_free >= 2);
        gm_device_info info;
        CHECK_OK(gm_get_device_info(allocator, &info));
        CHECK_EQ_INT(info.total_bytes - info.free_bytes, 30 << 20);
        CHECK_OK(gm_free(allocator, c));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_get_device_info(allocator, &info));
        CHECK_EQ_INT(info.free_bytes, info.total_bytes);
        CHECK_STATUS(gm_empty_cache(NULL), GM_ERROR_INVALID_ARGUMENT);
        gm_destroy(allocator, NULL);
    }
}

static void peaks_and_accumulated_stats_reset(void)
{
    gm_allocator *allocator = make_allocator("capacity:1GiB");
    void *a = NULL;
    CHECK_OK(gm_malloc(allocator, 8u << 20, 0, &a));
    CHECK_OK(gm_free(allocator, a));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].peak, 8 << 20);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].allocated, 8 << 20);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].freed, 8 << 20);
    CHECK_OK(gm_reset_peak_stats(allocator));
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].peak, 0);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].peak, stats.reserved_bytes[GM_POOL_ALL].current);
    CHECK_OK(gm_reset_accumulated_stats(allocator));
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].allocated, 0);
    CHECK_EQ_INT(stats.num_device_alloc, 0);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], 0);
    CHECK_STATUS(gm_get_stats(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_reset_peak_stats(NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_reset_accumulated_stats(NULL), GM_ERROR_INVALID_ARGUMENT);
    gm_destroy(allocator, NULL);
}

/* Blocks alive across a reset of the accumulated readings: what they free afterwards is counted as
 * freed in their pool, and the readings of the statistics every call changes stay consistent
 * (current = allocated - freed + what was current at the reset). */
static void accumulated_readings_after_a_reset_with_live_blocks(void)
{
    gm_allocator *allocator = make_allocator("capacity:1GiB");
    void *large = NULL, *small = NULL, *later = NULL;
    CHECK_OK(gm_malloc(allocator, 8u << 20, 0, &large));
    CHECK_OK(gm_malloc(allocator, 4096, 0, &small));
    CHECK_OK(gm_reset_accumulated_stats(allocator));
    CHECK_OK(gm_free(allocator, large));
    CHECK_OK(gm_malloc(allocator, 2u << 20, 0, &later));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_LARGE].allocated, 2 << 20);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_LARGE].freed, 8 << 20);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_LARGE].current, 2 << 20);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_LARGE].peak, 8 << 20);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_SMALL].allocated, 0);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_SMALL].freed, 0);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_SMALL].current, 4096);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].current, (2 << 20) + 4096);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].peak, (8 << 20) + 4096);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].freed, 8 << 20);
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].allocated, 1);
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].freed, 1);
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].current, 2);
    CHECK_EQ_INT(stats.active_bytes[GM_POOL_LARGE].freed, 8 << 20);
    CHECK_EQ_INT(stats.requested_bytes[GM_POOL_LARGE].freed, 8 << 20);
    CHECK_EQ_INT(stats.active[GM_POOL_SMALL].current, 1);
    CHECK_OK(gm_free(allocator, small));
    CHECK_OK(gm_reset_peak_stats(allocator));
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_SMALL].freed, 4096);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_SMALL].peak, 0);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_ALL].peak, 2 << 20);
    CHECK_EQ_INT(stats.active[GM_POOL_ALL].peak, 1);
    CHECK_OK(gm_free(allocator, later));
    gm_destroy(allocator, NULL);
}

static void device_calls_are_counted_and_priced(void)
{
    /* 64 GiB: room for 20 MiB in one chunk (a thousandth of a smaller device's room would be less) */
    gm_allocator *allocator = make_allocator("engine:pages,capacity:64GiB");
    void *a = NULL;
    CHECK_OK(gm_malloc(allocator, 20u << 20, 0, &a));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], 1);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_MAP], 1);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_SET_ACCESS], 1);
    CHECK_EQ_INT(stats.num_page_maps, 10);
    /* cuMemCreate 12 us + cuMemMap 1.0 us + cuMemSetAccess 27 us at 20 MiB on the H200 */
    CHECK_EQ_INT(stats.device_call_ns, 12000 + 1000 + 27000);
    CHECK(!strcmp(gm_device_call_name(GM_CALL_UNMAP), "unmap"));
    CHECK(!strcmp(gm_device_call_name((gm_device_call)99), "unknown"));
    gm_destroy(allocator, NULL);
    /* Without the model the calls are timed: their time lies within the call's own, and is not the
     * model's prices (a fixed bound on it fails on a loaded or instrumented machine). */
    allocator = make_allocator("engine:pages,capacity:1GiB,cost_model:false");
    struct timespec before, after;
    clock_gettime(CLOCK_MONOTONIC, &before);
    CHECK_OK(gm_malloc(allocator, 20u << 20, 0, &a));
    clock_gettime(CLOCK_MONOTONIC, &after);
    CHECK_OK(gm_get_stats(allocator, &stats));
    uint64_t call_ns = (uint64_t)(after.tv_sec - before.tv_sec) * 1000000000u + (uint64_t)after.tv_nsec -
                       (uint64_t)before.tv_nsec;
    CHECK(stats.device_call_ns >= 0 && (uint64_t)stats.device_call_ns <= call_ns);
    const int64_t *by_kind = stats.device_call_ns_by_kind;
    CHECK(by_kind[GM_CALL_PHYSICAL_CREATE] + by_kind[GM_CALL_MAP] + by_kind[GM_CALL_SET_ACCESS] +
              by_kind[GM_CALL_ADDRESS_RESERVE] == stats.device_call_ns);
    CHECK(!(by_kind[GM_CALL_PHYSICAL_CREATE] == 12000 && by_kind[GM_CALL_MAP] == 1000 &&
            by_kind[GM_CALL_SET_ACCESS] == 27000));
    gm_destroy(allocator, NULL);
}

static void summary_has_pytorch_layout(void)
{
    gm_allocator *allocator = make_allocator("capacity:1GiB");
    void *a = NULL;
    CHECK_OK(gm_malloc(allocator, 3u << 20, 0, &a));
    size_t needed = 0;
    CHECK_STATUS(gm_summary(allocator, NULL, 0, &needed), GM_ERROR_BUFFER_TOO_SMALL);
    CHECK(needed > 1000);
    char small[16];
    CHECK_STATUS(gm_summary(allocator, small, sizeof small, &needed), GM_ERROR_BUFFER_TOO_SMALL);
    CHECK(strlen(small) < sizeof small);
    char *table = malloc(needed);
    CHECK_OK(gm_summary(allocator, table, needed, NULL));
    CHECK(strlen(table) + 1 == needed);
    static const char *const rows[] = {"| Allocated memory      |", "| Active memory         |",
                                       "| Requested memory      |", "| GPU reserved memory   |",
                                       "| Non-releasable memory |", "| Allocations           |",
                                       "| Active allocs         |", "| GPU reserved segments |",
                                       "| Non-releasable allocs |", "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
                                       "      from large pool", "      from small pool", "OOMs: 0",
                                       "gpumem memory summary, sim device ID 0",
                                       "| Allocated memory      |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strstr(table, rows[i])) {
            fprintf(stderr, "summary lacks '%s':\n%s", rows[i], table);
            test_failures++;
        }
    /* every line is 77 characters wide, as PyTorch's */
    for (char *line = table; *line;) {
        char *end = strchr(line, '\n');
        CHECK(end && end - line == 77);
        line = end ? end + 1 : line + strlen(line);
    }
    free(table);
    CHECK_STATUS(gm_summary(NULL, NULL, 0, NULL), GM_ERROR_INVALID_ARGUMENT);
    gm_destroy(allocator, NULL);
}

static void status_names_and_messages(void)
{
    for (int status = GM_OK; status <= GM_ERROR_BUFFER_TOO_SMALL; status++)
        CHECK(strcmp(gm_strerror((gm_status)status), "unknown status") != 0);
    CHECK(!strcmp(gm_strerror((gm_status)1234), "unknown status"));
    CHECK(gm_last_error() != NULL);
    CHECK_STATUS(gm_validate(NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_get_device_info(NULL, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_record_stream(NULL, NULL, 0), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_stream_enqueue(NULL, 0, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_stream_complete(NULL, 0), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_stream_finish_until(NULL, 0, 0), GM_ERROR_INVALID_ARGUMENT);
    uint64_t units = 0;
    CHECK_STATUS(gm_sim_work_waited_for(NULL, &units), GM_ERROR_INVALID_ARGUMENT);
}

/* A request larger than any device (a size made from a negative number, or an overflow) is refused at
 * once, without releasing the cache for nothing, and the report gives its real size: every size above
 * the engines' bound of 2^60 bytes was reported as that bound, "1024.00 PiB". */
static void impossible_requests_report_their_real_size(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        void *cached = NULL, *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 10u << 20, 0, &cached));
        CHECK_OK(gm_free(allocator, cached));
        gm_stats before, after;
        CHECK_OK(gm_get_stats(allocator, &before));
        CHECK_STATUS(gm_malloc(allocator, 1ull << 63, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
        CHECK(pointer == NULL);
        CHECK_MESSAGE("Tried to allocate 8.00 EiB (9223372036854775808 bytes) on stream 0 of sim device 0.");
        CHECK_MESSAGE("Cause: capacity. No device has 8.00 EiB: gpumem serves at most 1.00 EiB in one request "
                      "(this device has 1.00 GiB).");
        CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_CAPACITY);
        CHECK_STATUS(gm_malloc(allocator, SIZE_MAX, 3, &pointer), GM_ERROR_OUT_OF_MEMORY);
        CHECK_MESSAGE("Tried to allocate 16.00 EiB (18446744073709551615 bytes) on stream 3");
        CHECK_MESSAGE("a negative number");
        CHECK_OK(gm_get_stats(allocator, &after));
        CHECK_EQ_INT(after.num_ooms, before.num_ooms + 2);
        CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, before.reserved_bytes[GM_POOL_ALL].current);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* What a device cannot be is refused when the allocator is made, with the reason: sim and host have one
 * device, 0 (device:5 was accepted); more pages than the pages engine keeps a table for (a 7.6 GB table
 * was allocated for backend:host,capacity:999999900MiB); a page larger than the device. */
static void impossible_devices_are_refused(void)
{
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("device:5", &allocator), GM_ERROR_NO_DEVICE);
    CHECK_MESSAGE("sim backend: device 5 does not exist (the sim backend has one device, 0)");
    CHECK_STATUS(gm_create("backend:host,device:1", &allocator), GM_ERROR_NO_DEVICE);
    CHECK_MESSAGE("host backend: device 1 does not exist");
    CHECK_STATUS(gm_create("page_size:4KiB", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("sim backend: a capacity of 140.40 GiB in pages of 4.00 KiB is 36805376 pages, more than the "
                  "4194304 supported");
    CHECK_STATUS(gm_create("capacity:512MiB,page_size:1GiB", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("page_size (1.00 GiB) is larger than the capacity (512.00 MiB)");
    CHECK_STATUS(gm_create("backend:host,capacity:999999900MiB", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("more than the 1TiB supported");
    CHECK(allocator == NULL);
    /* The bounds themselves work. */
    static const char *const largest[] = {"capacity:1TiB", "capacity:1TiB,engine:segments",
                                          "capacity:16GiB,page_size:4KiB"};
    for (size_t i = 0; i < sizeof largest / sizeof largest[0]; i++) {
        allocator = make_allocator(largest[i]);
        void *pointer = NULL;
        CHECK_OK(gm_malloc(allocator, 3ull << 30, 0, &pointer));
        CHECK_OK(gm_malloc(allocator, 1000, 1, &pointer));
        gm_destroy(allocator, NULL);
    }
}

static void destroy_reports_live_allocations(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        void *a = NULL, *b = NULL;
        CHECK_OK(gm_malloc(allocator, 100, 0, &a));
        CHECK_OK(gm_malloc(allocator, 50u << 20, 3, &b));
        CHECK_OK(gm_record_stream(allocator, b, 9));
        size_t live = 0;
        gm_destroy(allocator, &live);
        CHECK_EQ_INT(live, 2);
    }
}

static void device_info_describes_the_backend(void)
{
    gm_allocator *allocator = make_allocator("backend:sim,capacity:3GiB,page_size:64KiB,engine:segments");
    gm_device_info info;
    CHECK_OK(gm_get_device_info(allocator, &info));
    CHECK(!strcmp(info.backend, "sim"));
    CHECK(!strcmp(info.engine, "segments"));
    CHECK_EQ_INT(info.total_bytes, 3ull << 30);
    CHECK_EQ_INT(info.free_bytes, 3ull << 30);
    CHECK_EQ_INT(info.granularity, 64 << 10);
    CHECK_EQ_INT(info.virtual_memory, 1);
    gm_destroy(allocator, NULL);
}

static void memory_limit_changes_at_run_time(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        uint64_t limit = 0;
        CHECK_OK(gm_get_memory_limit(allocator, &limit));
        CHECK_EQ_INT(limit, 1ull << 30);
        void *a = NULL, *b = NULL;
        CHECK_OK(gm_malloc(allocator, 300u << 20, 0, &a));
        CHECK_OK(gm_free(allocator, a));
        CHECK_OK(gm_set_memory_limit(allocator, 200u << 20)); /* cached memory beyond it is given back */
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK(stats.reserved_bytes[GM_POOL_ALL].current <= 200 << 20);
        CHECK_STATUS(gm_malloc(allocator, 300u << 20, 0, &b), GM_ERROR_OUT_OF_MEMORY);
        CHECK_MESSAGE("memory limit");
        CHECK_OK(gm_malloc(allocator, 150u << 20, 0, &b));
        uint64_t free_bytes = 0, largest = 0;
        CHECK_OK(gm_free(allocator, b));
        CHECK_OK(gm_cache_info(allocator, &free_bytes, &largest));
        CHECK(free_bytes >= 150u << 20 && largest >= 150u << 20 && largest <= free_bytes);
        /* A limit lowered under live memory: what is reserved beyond it goes back as it becomes free. */
        CHECK_OK(gm_malloc(allocator, 180u << 20, 0, &a));
        CHECK_OK(gm_set_memory_limit(allocator, 50u << 20));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK(stats.reserved_bytes[GM_POOL_ALL].current >= 180 << 20);
        CHECK_OK(gm_free(allocator, a));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK(stats.reserved_bytes[GM_POOL_ALL].current <= 50 << 20);
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK(largest <= 50u << 20);
        CHECK_STATUS(gm_malloc(allocator, 100u << 20, 0, &a), GM_ERROR_OUT_OF_MEMORY);
        CHECK_OK(gm_set_memory_limit(allocator, 0)); /* back to the whole device */
        CHECK_OK(gm_get_memory_limit(allocator, &limit));
        CHECK_EQ_INT(limit, 1ull << 30);
        CHECK_OK(gm_malloc(allocator, 100u << 20, 0, &a));
        CHECK_OK(gm_free(allocator, a));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK(stats.reserved_bytes[GM_POOL_ALL].current >= 100 << 20); /* cached again, no limit left */
        CHECK_STATUS(gm_set_memory_limit(NULL, 0), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_get_memory_limit(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_cache_info(allocator, NULL, &largest), GM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* What cuDNN sizes its workspaces by (through torch's cacheInfo): the largest single allocation that can
 * be had now, counting memory not yet reserved, not only the largest cached block (an empty cache
 * would leave cuDNN only its plans without a workspace). Each answer is checked by allocating it. */
static void largest_allocation_counts_what_can_still_be_reserved(void)
{
    for (size_t e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]); /* 1 GiB sim device */
        uint64_t largest = 0, free_bytes = 0, cached_largest = 0;
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK_EQ_INT(largest, 1ull << 30); /* nothing cached: the whole device */
        void *held = NULL, *probe = NULL;
        CHECK_OK(gm_malloc(allocator, 600u << 20, 0, &held));
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK(largest >= 400u << 20 && largest <= 424u << 20); /* the device's rest, less rounding */
        CHECK_OK(gm_malloc(allocator, largest, 0, &probe));
        CHECK_OK(gm_free(allocator, probe));
        CHECK_OK(gm_free(allocator, held));
        CHECK_OK(gm_cache_info(allocator, &free_bytes, &cached_largest));
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK(largest >= cached_largest && largest >= 600u << 20);
        CHECK_OK(gm_malloc(allocator, largest, 0, &probe));
        CHECK_OK(gm_free(allocator, probe));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_set_memory_limit(allocator, 257u << 20)); /* the limit bounds what can be reserved, */
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK_EQ_INT(largest, 256u << 20); /* in whole 2 MiB pages */
        CHECK_STATUS(gm_malloc(allocator, largest + (1u << 20), 0, &probe), GM_ERROR_OUT_OF_MEMORY);
        CHECK_OK(gm_set_memory_limit(allocator, 512u << 20)); /* idle cached memory counts as room too */
        CHECK_OK(gm_malloc(allocator, 400u << 20, 0, &probe));
        CHECK_OK(gm_free(allocator, probe));
        CHECK_OK(gm_cache_info(allocator, &free_bytes, &cached_largest));
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK(cached_largest >= 400u << 20 && cached_largest < 512u << 20);
        CHECK_EQ_INT(largest, 512u << 20);
        CHECK_OK(gm_malloc(allocator, largest, 0, &probe));
        CHECK_OK(gm_free(allocator, probe));
        CHECK_OK(gm_malloc(allocator, largest, 0, &probe));
        CHECK_OK(gm_free(allocator, probe));
        CHECK_OK(gm_set_memory_limit(allocator, 0));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_sim_set_used_elsewhere(allocator, 900u << 20)); /* and so does the device's free memory */
        CHECK_OK(gm_largest_allocation(allocator, &largest));
        CHECK_EQ_INT(largest, 124u << 20);
        CHECK_STATUS(gm_malloc(allocator, largest + (4u << 20), 0, &probe), GM_ERROR_OUT_OF_MEMORY);
        CHECK_OK(gm_malloc(allocator, largest, 0, &probe));
        CHECK_OK(gm_free(allocator, probe));
        CHECK_OK(gm_sim_set_used_elsewhere(allocator, 0));
        CHECK_STATUS(gm_largest_allocation(NULL, &largest), GM_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(gm_largest_allocation(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

/* A big tensor's memory comes in chunks of at most max_chunk_size (128 MiB): when small tensors take
 * the start of a freed big block, only the chunk under them stays pinned and the rest moves to where
 * the next big request goes. With one chunk per growth (max_chunk_size:0) the whole block stays.
 * (chunk_room_share:0: on an 8 GiB device the room share would make the chunks smaller still.) */
static void small_tensors_pin_one_chunk_not_a_whole_block(void)
{
    static const char *const configs[] = {"engine:pages,capacity:8GiB,chunk_room_share:0",
                                          "engine:pages,capacity:8GiB,max_chunk_size:0,chunk_room_share:0"};
    for (size_t c = 0; c < 2; c++) {
        gm_allocator *allocator = make_allocator(configs[c]);
        void *big = NULL, *neighbour = NULL, *small = NULL, *next = NULL;
        CHECK_OK(gm_malloc(allocator, 1ull << 30, 0, &big));
        CHECK_OK(gm_malloc(allocator, 1ull << 30, 0, &neighbour));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], c == 0 ? 16 : 2);
        CHECK_OK(gm_free(allocator, big));
        CHECK_OK(gm_malloc(allocator, 4u << 20, 0, &small)); /* lands where `big` was */
        CHECK(small == big);
        CHECK_OK(gm_malloc(allocator, 3ull << 29, 0, &next)); /* 1.5 GiB: fits nowhere mapped */
        CHECK_OK(gm_get_stats(allocator, &stats));
        int64_t live = (1ll << 30) + (4 << 20) + (3ll << 29);
        int64_t excess = stats.reserved_bytes[GM_POOL_ALL].peak - live;
        if (c == 0)
            CHECK(excess <= 128ll << 20); /* the chunk under `small` */
        else
            CHECK(excess >= 1000ll << 20); /* all of `big`'s memory */
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void named_streams_are_their_names_on_sim(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim", &allocator) == GM_OK);
    gm_stream stream = 0;
    CHECK_OK(gm_named_stream(allocator, 123456, &stream));
    CHECK_EQ_INT(stream, 123456);
    CHECK_OK(gm_named_stream(allocator, 0, &stream));
    CHECK_EQ_INT(stream, 0);
    CHECK_STATUS(gm_named_stream(allocator, 1, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_named_stream(NULL, 1, &stream), GM_ERROR_INVALID_ARGUMENT);
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(named_streams_are_their_names_on_sim), TEST_CASE(largest_allocation_counts_what_can_still_be_reserved),
          TEST_CASE(small_tensors_pin_one_chunk_not_a_whole_block), TEST_CASE(memory_limit_changes_at_run_time), TEST_CASE(create_and_destroy), TEST_CASE(cuda_backend_without_gpu_is_a_clear_error),
          TEST_CASE(malloc_and_free_basics), TEST_CASE(invalid_pointers_change_nothing),
          TEST_CASE(out_of_memory_explains_and_recovers), TEST_CASE(fragmentation_is_diagnosed),
          TEST_CASE(memory_limit_is_diagnosed), TEST_CASE(empty_cache_returns_memory),
          TEST_CASE(peaks_and_accumulated_stats_reset),
          TEST_CASE(accumulated_readings_after_a_reset_with_live_blocks), TEST_CASE(device_calls_are_counted_and_priced),
          TEST_CASE(summary_has_pytorch_layout), TEST_CASE(status_names_and_messages),
          TEST_CASE(destroy_reports_live_allocations), TEST_CASE(device_info_describes_the_backend),
          TEST_CASE(impossible_requests_report_their_real_size), TEST_CASE(impossible_devices_are_refused))
