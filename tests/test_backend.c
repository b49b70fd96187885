/*
 * test_backend.c -- the backends under the allocator: the device model refuses what a driver
 * refuses (over capacity, double frees, overlapping or partial mappings, access to unmapped
 * memory), simulated streams and events behave, the H200 cost model prices calls as measured, and
 * the host backend's physical memory really keeps its data when it is mapped somewhere else.
 */
#include "test.h"

#include "backend/backend.h"
#include "backend/device_model.h"

#define MiB (1ull << 20)

/* A backend of `name` with `capacity` bytes (0: its default), 2 MiB pages, the cost model on. */
static gm_backend *open_backend(const char *name, uint64_t capacity)
{
    gm_backend_config config = {.name = name, .capacity = capacity, .page_size = 2 * MiB, .cost_model = true};
    gm_backend *backend = NULL;
    CHECK_OK(gm_backend_open(&config, &backend));
    REQUIRE(backend);
    return backend;
}

static void segments_respect_capacity_and_are_freed_once(void)
{
    const char *names[] = {"sim", "host"};
    for (int c = 0; c < 2; c++) {
        gm_backend *backend = open_backend(names[c], 64 * MiB);
        uintptr_t a = 0, b = 0;
        CHECK_OK(gm_backend_segment_allocate(backend, 40 * MiB, &a));
        CHECK_STATUS(gm_backend_segment_allocate(backend, 40 * MiB, &b), GM_ERROR_OUT_OF_MEMORY);
        CHECK_MESSAGE("device out of memory");
        uint64_t free_bytes = 0, total = 0;
        CHECK_OK(gm_backend_memory_info(backend, &free_bytes, &total));
        CHECK_EQ_INT(total - free_bytes, 40 * MiB);
        CHECK_STATUS(gm_backend_segment_free(backend, a, 20 * MiB), GM_ERROR_DEVICE);
        CHECK_OK(gm_backend_segment_free(backend, a, 40 * MiB));
        CHECK_STATUS(gm_backend_segment_free(backend, a, 40 * MiB), GM_ERROR_DEVICE);
        CHECK_MESSAGE("not a segment");
        CHECK_EQ_INT(backend->calls[GM_CALL_SEGMENT_ALLOCATE], 2);
        CHECK_EQ_INT(backend->calls[GM_CALL_SEGMENT_FREE], 3);
        gm_backend_close(backend);
    }
}

static void mapping_rules_are_enforced(void)
{
    gm_backend *backend = open_backend("sim", 64 * MiB);
    uintptr_t range = 0;
    uint64_t handle = 0, other = 0;
    CHECK_STATUS(gm_backend_address_reserve(backend, 3 * MiB, &range), GM_ERROR_DEVICE); /* not page-aligned */
    CHECK_OK(gm_backend_address_reserve(backend, 16 * MiB, &range));
    CHECK_STATUS(gm_backend_physical_create(backend, 3 * MiB, &handle), GM_ERROR_DEVICE);
    CHECK_STATUS(gm_backend_physical_create(backend, 128 * MiB, &handle), GM_ERROR_OUT_OF_MEMORY);
    CHECK_OK(gm_backend_physical_create(backend, 4 * MiB, &handle));
    CHECK_OK(gm_backend_physical_create(backend, 4 * MiB, &other));
    CHECK_STATUS(gm_backend_map(backend, range, 2 * MiB, handle), GM_ERROR_DEVICE); /* a handle maps whole */
    CHECK_STATUS(gm_backend_map(backend, range + 14 * MiB, 4 * MiB, handle), GM_ERROR_DEVICE); /* past the range */
    CHECK_STATUS(gm_backend_map(backend, range + MiB, 4 * MiB, handle), GM_ERROR_DEVICE);  /* unaligned */
    CHECK_OK(gm_backend_map(backend, range, 4 * MiB, handle));
    CHECK_STATUS(gm_backend_map(backend, range + 2 * MiB, 4 * MiB, other), GM_ERROR_DEVICE);
    CHECK_MESSAGE("overlaps");
    CHECK_STATUS(gm_backend_set_access(backend, range, 8 * MiB), GM_ERROR_DEVICE); /* half unmapped */
    CHECK_OK(gm_backend_map(backend, range + 4 * MiB, 4 * MiB, other));
    CHECK_OK(gm_backend_set_access(backend, range, 8 * MiB)); /* one call over two mappings */
    CHECK_STATUS(gm_backend_unmap(backend, range, 8 * MiB), GM_ERROR_DEVICE); /* not one mapping */
    CHECK_STATUS(gm_backend_address_free(backend, range, 16 * MiB), GM_ERROR_DEVICE); /* still mapped */
    /* Released while mapped: the memory lives until the mapping goes. */
    CHECK_OK(gm_backend_physical_release(backend, handle, 4 * MiB));
    CHECK_STATUS(gm_backend_physical_release(backend, handle, 4 * MiB), GM_ERROR_DEVICE);
    uint64_t free_bytes = 0, total = 0;
    CHECK_OK(gm_backend_memory_info(backend, &free_bytes, &total));
    CHECK_EQ_INT(total - free_bytes, 8 * MiB);
    CHECK_OK(gm_backend_unmap(backend, range, 4 * MiB));
    CHECK_OK(gm_backend_memory_info(backend, &free_bytes, &total));
    CHECK_EQ_INT(total - free_bytes, 4 * MiB);
    CHECK_STATUS(gm_backend_unmap(backend, range, 4 * MiB), GM_ERROR_DEVICE);
    CHECK_OK(gm_backend_unmap(backend, range + 4 * MiB, 4 * MiB));
    CHECK_OK(gm_backend_physical_release(backend, other, 4 * MiB));
    CHECK_OK(gm_backend_address_free(backend, range, 16 * MiB));
    CHECK_STATUS(gm_backend_address_free(backend, range, 16 * MiB), GM_ERROR_DEVICE);
    CHECK_OK(gm_backend_memory_info(backend, &free_bytes, &total));
    CHECK_EQ_INT(free_bytes, total);
    gm_backend_close(backend);
}

static void simulated_events_follow_stream_work(void)
{
    gm_backend *backend = open_backend("sim", 0);
    uint64_t event = 0;
    bool done = false;
    CHECK_OK(gm_backend_event_create(backend, &event));
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(done); /* never recorded */
    CHECK_OK(backend->operations->stream_enqueue(backend, 4, 2));
    CHECK_OK(gm_backend_event_record(backend, event, 4));
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(!done);
    CHECK_OK(backend->operations->stream_enqueue(backend, 4, 1)); /* after the event: irrelevant */
    CHECK_OK(gm_backend_event_synchronize(backend, event));
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(done);
    CHECK_OK(gm_backend_event_destroy(backend, event));
    CHECK_STATUS(gm_backend_event_query(backend, event, &done), GM_ERROR_DEVICE);
    CHECK_STATUS(gm_backend_event_record(backend, 999, 0), GM_ERROR_DEVICE);
    CHECK_STATUS(gm_backend_event_destroy(backend, event), GM_ERROR_DEVICE);
    gm_backend_close(backend);
}

static void cost_model_matches_the_h200_table(void)
{
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_SEGMENT_ALLOCATE, 2 * MiB), 45000);
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_SEGMENT_ALLOCATE, 512 * 1024), 45000); /* below: flat */
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_SEGMENT_FREE, 256 * MiB), 167000);
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_PHYSICAL_CREATE, 1024 * MiB), 98000);
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_MAP, 20 * MiB), 1000);
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_SET_ACCESS, 11 * MiB), 27000);
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_UNMAP, 640 * MiB), 32500);                /* halfway 27..38 */
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_PHYSICAL_RELEASE, 11 * MiB), 20500);      /* halfway 13..28 */
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_SEGMENT_FREE, 1792 * MiB), 533000 + 366000); /* extrapolated */
    CHECK_EQ_INT(gm_device_call_cost_ns(GM_CALL_EVENT_RECORD, 0), 0);
    gm_backend *backend = open_backend("sim", 1024 * MiB);
    uintptr_t address = 0;
    CHECK_OK(gm_backend_segment_allocate(backend, 20 * MiB, &address));
    CHECK_OK(gm_backend_segment_free(backend, address, 20 * MiB));
    CHECK_EQ_INT(backend->call_ns, 46000 + 52000);
    gm_backend_close(backend);
}

static void host_physical_memory_keeps_its_data_when_remapped(void)
{
    gm_backend *backend = open_backend("host", 64 * MiB);
    uintptr_t range = 0;
    uint64_t handle = 0;
    CHECK_OK(gm_backend_address_reserve(backend, 16 * MiB, &range));
    CHECK((range & (2 * MiB - 1)) == 0);
    CHECK_OK(gm_backend_physical_create(backend, 2 * MiB, &handle));
    CHECK_OK(gm_backend_map(backend, range, 2 * MiB, handle));
    CHECK_OK(gm_backend_set_access(backend, range, 2 * MiB));
    memset((void *)range, 0x5a, 2 * MiB);
    CHECK_OK(gm_backend_unmap(backend, range, 2 * MiB));
    CHECK_OK(gm_backend_map(backend, range + 10 * MiB, 2 * MiB, handle));
    CHECK_OK(gm_backend_set_access(backend, range + 10 * MiB, 2 * MiB));
    const unsigned char *moved = (const unsigned char *)(range + 10 * MiB);
    CHECK(moved[0] == 0x5a && moved[2 * MiB - 1] == 0x5a);
    CHECK_OK(gm_backend_unmap(backend, range + 10 * MiB, 2 * MiB));
    CHECK_OK(gm_backend_physical_release(backend, handle, 2 * MiB));
    CHECK_OK(gm_backend_address_free(backend, range, 16 * MiB));
    gm_backend_close(backend);
}

static void unknown_backend_is_a_configuration_error(void)
{
    const char *names[] = {"tpu", "", NULL};
    for (int i = 0; i < 3; i++) {
        gm_backend_config config = {.name = names[i], .page_size = 2 * MiB};
        gm_backend *backend = NULL;
        CHECK_STATUS(gm_backend_open(&config, &backend), GM_ERROR_BAD_CONFIG);
        CHECK_MESSAGE("unknown backend");
        CHECK(backend == NULL);
    }
}

static void cuda_backend_reports_why_it_cannot_open(void)
{
    gm_backend_config config = {.name = "cuda"};
    gm_backend *backend = NULL;
    gm_status status = gm_backend_open(&config, &backend);
    if (status == GM_OK) { /* a GPU machine */
        CHECK(backend->total_bytes > 0 && backend->page_size > 0);
        gm_backend_close(backend);
        return;
    }
    CHECK_EQ_INT(status, GM_ERROR_NO_DEVICE);
    CHECK_MESSAGE("cuda backend:");
    CHECK(backend == NULL);
}

/* The model remembers a stream only while it matters: work not yet completed, a capture, or an event
 * waiting on it. An event found done stays done, even when its stream is named again for new work. */
static void idle_simulated_streams_are_forgotten(void)
{
    gm_backend *backend = open_backend("sim", 64 * MiB);
    const gm_backend_operations *operations = backend->operations;
    uint64_t event = 0;
    bool done = false;
    CHECK_OK(gm_backend_event_create(backend, &event));
    CHECK_OK(operations->stream_enqueue(backend, 7, 2));
    CHECK_OK(gm_backend_event_record(backend, event, 7));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 1);
    CHECK_OK(operations->stream_complete(backend, 7, 1));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 1); /* work left, and the event waits for it */
    CHECK_OK(operations->stream_complete(backend, 7, 0));
    /* Its work all run, the stream is forgotten though nobody asked about the event (an allocator that
     * knows a later event of the stream is done need not ask), and the event says it is done. */
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 0);
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(done);
    CHECK_OK(gm_backend_event_record(backend, event, 9)); /* on a stream with nothing queued: done at once */
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 0);
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(done);
    uint64_t later = 0; /* a wait for the later of two events runs the earlier one's work too */
    CHECK_OK(gm_backend_event_create(backend, &later));
    CHECK_OK(operations->stream_enqueue(backend, 11, 2));
    CHECK_OK(gm_backend_event_record(backend, event, 11));
    CHECK_OK(operations->stream_enqueue(backend, 11, 3));
    CHECK_OK(gm_backend_event_record(backend, later, 11));
    CHECK_OK(gm_backend_event_synchronize(backend, later));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 0);
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(done);
    CHECK_OK(gm_backend_event_destroy(backend, later));
    CHECK_OK(operations->stream_enqueue(backend, 7, 5)); /* stream 7 again, with new work */
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(done);
    CHECK_OK(gm_backend_event_record(backend, event, 7)); /* waits for the new work */
    CHECK_OK(gm_backend_event_query(backend, event, &done));
    CHECK(!done);
    CHECK_OK(gm_backend_event_synchronize(backend, event));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 0); /* waiting finished its work */
    CHECK_OK(operations->stream_set_capturing(backend, UINTPTR_MAX, true)); /* the largest name too */
    CHECK(gm_backend_stream_is_capturing(backend, UINTPTR_MAX));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 1);
    CHECK_OK(operations->stream_set_capturing(backend, UINTPTR_MAX, false));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 0);
    CHECK_OK(gm_backend_event_destroy(backend, event));
    CHECK_EQ_INT(gm_model_footprint_of(backend).events, 0);
    gm_backend_close(backend);
}

/* A device-wide wait (compaction's copy) runs every stream's work: the events recorded on them are done
 * and the streams are forgotten, as after a wait for each. */
static void a_device_wide_wait_settles_every_stream(void)
{
    gm_backend *backend = open_backend("sim", 64 * MiB);
    const gm_backend_operations *operations = backend->operations;
    uintptr_t range = 0;
    uint64_t source = 0, target = 0, events[3] = {0};
    CHECK_OK(gm_backend_address_reserve(backend, 4 * MiB, &range));
    CHECK_OK(gm_backend_physical_create(backend, 2 * MiB, &source));
    CHECK_OK(gm_backend_map(backend, range, 2 * MiB, source));
    CHECK_OK(gm_backend_set_access(backend, range, 2 * MiB));
    CHECK_OK(gm_backend_physical_create(backend, 2 * MiB, &target));
    for (int i = 0; i < 3; i++) { /* two events on stream 5, one on stream 6, work queued after each */
        CHECK_OK(gm_backend_event_create(backend, &events[i]));
        CHECK_OK(operations->stream_enqueue(backend, i < 2 ? 5 : 6, 3));
        CHECK_OK(gm_backend_event_record(backend, events[i], i < 2 ? 5 : 6));
        CHECK_OK(operations->stream_enqueue(backend, i < 2 ? 5 : 6, 1));
    }
    CHECK_OK(operations->stream_enqueue(backend, 8, 2)); /* a stream with work and no event */
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 3);
    CHECK_OK(gm_backend_copy_into(backend, target, 2 * MiB, range));
    CHECK_EQ_INT(gm_model_footprint_of(backend).streams, 0);
    for (int i = 0; i < 3; i++) {
        bool done = false;
        CHECK_OK(gm_backend_event_query(backend, events[i], &done));
        CHECK(done);
        CHECK_OK(gm_backend_event_destroy(backend, events[i]));
    }
    CHECK_OK(gm_backend_unmap(backend, range, 2 * MiB));
    CHECK_OK(gm_backend_physical_release(backend, source, 2 * MiB));
    CHECK_OK(gm_backend_physical_release(backend, target, 2 * MiB));
    CHECK_OK(gm_backend_address_free(backend, range, 4 * MiB));
    gm_backend_close(backend);
}

/* Address ranges given back are merged with their free neighbours, whatever the order they come in. */
static void returned_sim_addresses_are_merged(void)
{
    gm_backend *backend = open_backend("sim", 64 * MiB);
    uintptr_t ranges[6];
    for (int i = 0; i < 6; i++)
        CHECK_OK(gm_backend_address_reserve(backend, 4 * MiB, &ranges[i]));
    static const int order[] = {1, 3, 2, 5, 0};
    static const size_t kept_after[] = {1, 2, 1, 2, 2};
    for (int i = 0; i < 5; i++) {
        CHECK_OK(gm_backend_address_free(backend, ranges[order[i]], 4 * MiB));
        CHECK_EQ_INT(gm_sim_returned_range_count(backend), kept_after[i]);
    }
    CHECK_OK(gm_backend_address_free(backend, ranges[4], 4 * MiB));
    CHECK_EQ_INT(gm_sim_returned_range_count(backend), 1); /* all six, one range */
    gm_backend_close(backend);
}

RUN_TESTS(TEST_CASE(idle_simulated_streams_are_forgotten), TEST_CASE(a_device_wide_wait_settles_every_stream),
          TEST_CASE(returned_sim_addresses_are_merged),
          TEST_CASE(segments_respect_capacity_and_are_freed_once), TEST_CASE(mapping_rules_are_enforced),
          TEST_CASE(simulated_events_follow_stream_work), TEST_CASE(cost_model_matches_the_h200_table),
          TEST_CASE(host_physical_memory_keeps_its_data_when_remapped),
          TEST_CASE(unknown_backend_is_a_configuration_error), TEST_CASE(cuda_backend_reports_why_it_cannot_open))
