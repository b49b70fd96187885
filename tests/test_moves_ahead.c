/*
 * test_moves_ahead.c -- an idle chunk moved within its own stream while work that may use it is still
 * queued (aliases.c): mapped at its new place with no wait, its old mapping kept until the stream has
 * passed the chunk's free, then unmapped without a wait; before its memory goes back to the device the
 * old mapping goes, after a wait if the stream is still at work. On real memory (the host backend) the
 * two mappings show the same bytes until then. Another stream's chunk still waits; during a graph
 * capture an old mapping in the way is waited for through a mark recorded before the capture.
 */
#include "test.h"

#include <stdbool.h>

#define MIB (1ull << 20)

static int64_t calls_of(gm_allocator *allocator, int kind)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[kind];
}

static int64_t reserved(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.reserved_bytes[GM_POOL_ALL].current;
}

/* The layout of every case: on `stream`, a small block kept live (the small pool's page stays), an
 * 8 MiB block freed while `queued` work that may use it is queued, and an 8 MiB block after it kept
 * live. A 16 MiB request on `taker` then needs 8 MiB more than the heap's free memory: it moves the
 * idle chunk, and makes the rest new. */
typedef struct layout {
    void *pin;
    void *kept;
    void *bigger;
    uintptr_t idle_address;
} layout;

static layout move_idle_chunk(gm_allocator *allocator, gm_stream stream, gm_stream taker, bool queued)
{
    layout made = {NULL, NULL, NULL, 0};
    void *idle = NULL;
    CHECK_OK(gm_malloc(allocator, 512, stream, &made.pin));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, stream, &idle));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, stream, &made.kept));
    if (queued)
        CHECK_OK(gm_sim_stream_enqueue(allocator, stream, 1));
    made.idle_address = (uintptr_t)idle;
    CHECK_OK(gm_free(allocator, idle));
    CHECK_OK(gm_malloc(allocator, 16 * MIB, taker, &made.bigger));
    return made;
}

static void free_layout(gm_allocator *allocator, const layout *made)
{
    CHECK_OK(gm_free(allocator, made->bigger));
    CHECK_OK(gm_free(allocator, made->kept));
    CHECK_OK(gm_free(allocator, made->pin));
}

/* No wait for the stream; the chunk is mapped anew, its old place stays mapped (no unmap yet) and no
 * memory is made for it. Once the stream has finished that work, the next growth unmaps the old place
 * without a wait. */
static void a_move_within_the_stream_does_not_wait(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    int64_t reserved_before = 18 * (int64_t)MIB; /* two 8 MiB chunks and the small pool's page */
    int64_t waits = calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE), unmaps = calls_of(allocator, GM_CALL_UNMAP);
    layout made = move_idle_chunk(allocator, 0, 0, true);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE) - waits, 0);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_UNMAP) - unmaps, 0);
    CHECK_EQ_INT(reserved(allocator), reserved_before + 8 * (int64_t)MIB); /* 8 moved, 8 made */
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_sim_stream_complete(allocator, 0));
    void *more = NULL;
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &more)); /* a growth: the old place goes */
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_UNMAP) - unmaps, 1);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE) - waits, 0);
    CHECK_OK(gm_free(allocator, more));
    free_layout(allocator, &made);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved(allocator), 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* The chunk goes back to the device (an empty_cache) while the stream still runs the work that may use
 * its old place: the old mapping is unmapped first, after one wait, and the device's memory is all free
 * again. */
static void an_old_mapping_goes_before_its_memory(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    layout made = move_idle_chunk(allocator, 0, 0, true);
    CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1)); /* still at work when the memory goes back */
    free_layout(allocator, &made);
    int64_t waits = calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK(calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE) - waits >= 1);
    CHECK_EQ_INT(reserved(allocator), 0);
    gm_device_info info;
    CHECK_OK(gm_get_device_info(allocator, &info));
    CHECK_EQ_INT((int64_t)info.free_bytes, (int64_t)info.total_bytes); /* no mapping holds memory */
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* The allocator goes while an old mapping is kept: nothing is left mapped or made (the sim refuses to
 * free addresses with pages still mapped, and ASan sees a leak of the list). */
static void an_allocator_going_drops_its_old_mappings(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    layout made = move_idle_chunk(allocator, 0, 0, true);
    free_layout(allocator, &made);
    size_t live = 1;
    gm_destroy(allocator, &live);
    CHECK_EQ_INT((int64_t)live, 0);
}

/* A chunk of another stream still at work is not moved by choice (new memory instead, no wait): the
 * old rule, untouched by moves ahead. */
static void another_streams_busy_chunk_stays(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    int64_t waits = calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE), maps = calls_of(allocator, GM_CALL_MAP);
    layout made = move_idle_chunk(allocator, 0, 1, true);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE) - waits, 0);
    CHECK_EQ_INT(reserved(allocator), 34 * (int64_t)MIB); /* 16 MiB made for stream 1 */
    CHECK(calls_of(allocator, GM_CALL_MAP) - maps >= 4);
    free_layout(allocator, &made);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* While the stream is being captured into a CUDA graph, a growth that maps over an old mapping waits
 * for it through the mark recorded before the capture began: no event is recorded on the capturing
 * stream (it would join the graph). */
static void an_old_mapping_in_the_way_during_a_capture(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    layout made = move_idle_chunk(allocator, 0, 0, true);
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 1));
    int64_t records = calls_of(allocator, GM_CALL_EVENT_RECORD), waits = calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE);
    int64_t unmaps = calls_of(allocator, GM_CALL_UNMAP);
    void *over = NULL;
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &over)); /* the old place: the smallest window needing 4 pages */
    CHECK_EQ_INT((int64_t)(uintptr_t)over, (int64_t)made.idle_address);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_RECORD) - records, 0);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_SYNCHRONIZE) - waits, 1);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_UNMAP) - unmaps, 1);
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 0));
    CHECK_OK(gm_free(allocator, over));
    free_layout(allocator, &made);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* Real memory: until the old mapping goes, the old addresses and the new ones are the same bytes. (The
 * host's streams have no queued work, but no mark after the free has been asked yet: the move goes
 * ahead.) */
static void both_mappings_show_the_same_bytes(void)
{
    /* chunk_room_share:0: the idle chunk as move_idle_chunk makes it, not pages (a 256 MiB device) */
    gm_allocator *allocator = make_allocator("backend:host,engine:pages,capacity:256MiB,chunk_room_share:0");
    layout made = move_idle_chunk(allocator, 0, 0, false);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_UNMAP), 0); /* the old place is still mapped */
    unsigned char *old_place = (unsigned char *)made.idle_address, *new_place = NULL;
    for (unsigned char *at = made.bigger; at < (unsigned char *)made.bigger + 16 * MIB && !new_place; at += 4096) {
        at[0] = 0x5a; /* which page of the new block is the moved chunk's first */
        if (old_place[0] == 0x5a)
            new_place = at;
        at[0] = 0;
    }
    REQUIRE(new_place != NULL);
    for (uint64_t i = 0; i < 8 * MIB; i += 4096)
        new_place[i] = (unsigned char)(i / 4096 + 1);
    for (uint64_t i = 0; i < 8 * MIB; i += 4096)
        CHECK_EQ_INT(old_place[i], (unsigned char)(i / 4096 + 1));
    free_layout(allocator, &made);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(reserved(allocator), 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(a_move_within_the_stream_does_not_wait), TEST_CASE(an_old_mapping_goes_before_its_memory),
          TEST_CASE(an_allocator_going_drops_its_old_mappings), TEST_CASE(another_streams_busy_chunk_stays),
          TEST_CASE(an_old_mapping_in_the_way_during_a_capture),
          TEST_CASE(both_mappings_show_the_same_bytes))
