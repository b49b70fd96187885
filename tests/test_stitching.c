/*
 * test_stitching.c -- stitch:true. Three 64 MiB chunks A, B, C of one 192 MiB tensor; then live blocks
 * hold A's first 10 MiB, all of B and C's last 42 MiB, so A's free end (54 MiB) and C's free start
 * (22 MiB) lie apart. A 70 MiB request fits nowhere mapped: with the option it lies across second
 * mappings of A and C (their free end and start back to back), with no new memory; the host backend
 * maps one memfd twice, so the bytes written through the request are A's and C's own. While it lives
 * no fit takes A's free end; freed, the stitch is undone and A's free end serves a fit where it lies.
 * gm_share hands another process the block's bytes through the second mappings' memory.
 * Without the option, and for a request that lifts live memory above its peak, memory grows as before.
 * gm_validate checks every step; a snapshot counts each byte of memory once. A second mapping that the
 * driver leaves behind (its access and then its unmap refused) is unmapped later, not forgotten.
 */
#include "host_memory_held.h"
#include "pattern.h"
#include "test.h"

#include <stdbool.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define HOST "backend:host,capacity:1GiB,page_size:2MiB,max_chunk_size:64MiB,chunk_room_share:0"
#define SIM "backend:sim,capacity:1GiB,max_chunk_size:64MiB,chunk_room_share:0,stitch:true"

typedef struct layout {
    gm_allocator *allocator;
    unsigned char *base; /* chunk A's first byte; B and C follow */
    void *head, *middle, *tail;
} layout;

static int64_t reserved(gm_allocator *allocator, bool peak)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return peak ? stats.reserved_bytes[GM_POOL_ALL].peak : stats.reserved_bytes[GM_POOL_ALL].current;
}

/* The layout on `stream`. `real`: the host backend, whose memory the test may write (the sim's addresses
 * are not memory). */
static layout lay_out_on(const char *config, bool real, gm_stream stream)
{
    layout l = {0};
    REQUIRE(gm_create(config, &l.allocator) == GM_OK);
    void *whole = NULL, *end_free = NULL, *start_free = NULL;
    CHECK_OK(gm_malloc(l.allocator, 192 * MIB, stream, &whole));
    CHECK_OK(gm_free(l.allocator, whole));
    l.base = whole;
    CHECK_OK(gm_malloc(l.allocator, 10 * MIB, stream, &l.head));
    CHECK_OK(gm_malloc(l.allocator, 54 * MIB, stream, &end_free));
    CHECK_OK(gm_malloc(l.allocator, 64 * MIB, stream, &l.middle));
    CHECK_OK(gm_malloc(l.allocator, 22 * MIB, stream, &start_free));
    CHECK_OK(gm_malloc(l.allocator, 42 * MIB, stream, &l.tail));
    CHECK(l.head == (void *)l.base && end_free == (void *)(l.base + 10 * MIB));
    CHECK(l.middle == (void *)(l.base + 64 * MIB) && start_free == (void *)(l.base + 128 * MIB));
    CHECK(l.tail == (void *)(l.base + 150 * MIB));
    CHECK_OK(gm_free(l.allocator, end_free));
    CHECK_OK(gm_free(l.allocator, start_free));
    if (real) {
        pattern_stamp(l.head, 10 * MIB, 1);
        pattern_stamp(l.middle, 64 * MIB, 2);
        pattern_stamp(l.tail, 42 * MIB, 3);
    }
    CHECK_EQ_INT(reserved(l.allocator, false), 192 * MIB);
    return l;
}

static layout lay_out(const char *config, bool real)
{
    return lay_out_on(config, real, 0);
}

static void check_and_free(layout *l)
{
    CHECK(pattern_intact(l->head, 10 * MIB, 1));
    CHECK(pattern_intact(l->middle, 64 * MIB, 2));
    CHECK(pattern_intact(l->tail, 42 * MIB, 3));
    CHECK_OK(gm_free(l->allocator, l->head));
    CHECK_OK(gm_free(l->allocator, l->middle));
    CHECK_OK(gm_free(l->allocator, l->tail));
    CHECK_OK(gm_validate(l->allocator));
    CHECK_OK(gm_empty_cache(l->allocator));
    CHECK_EQ_INT(reserved(l->allocator, false), 0);
    gm_destroy(l->allocator, NULL);
}

/* Each byte of memory once: the regions' mapped bytes add up to reserved memory. */
static void check_snapshot(gm_allocator *allocator)
{
    gm_snapshot *snapshot = NULL;
    CHECK_OK(gm_snapshot_take(allocator, &snapshot));
    uint64_t mapped = 0;
    for (size_t r = 0; r < snapshot->region_count; r++)
        mapped += snapshot->regions[r].mapped_bytes;
    CHECK_EQ_INT(mapped, reserved(allocator, false));
    gm_snapshot_free(snapshot);
}

static void a_request_lies_across_the_free_end_and_start(void)
{
    layout l = lay_out(HOST ",stitch:true", true);
    unsigned char *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, (void **)&request));
    CHECK_OK(gm_validate(l.allocator));
    CHECK_EQ_INT(reserved(l.allocator, true), 192 * MIB); /* no new memory */
    CHECK(request < l.base || request >= l.base + 192 * MIB);
    check_snapshot(l.allocator);
    gm_stats stats;
    CHECK_OK(gm_get_stats(l.allocator, &stats));
    CHECK_EQ_INT(stats.num_stitches, 1);
    CHECK_EQ_INT(stats.stitch_lent_bytes, (54 + 22) * MIB); /* A's free end, C's whole free start */
    /* Its first 54 MiB are A's free end, the next 16 MiB C's free start: the same memory. */
    pattern_stamp(request, 70 * MIB, 4);
    CHECK(memcmp(request, l.base + 10 * MIB, 54 * MIB) == 0);
    CHECK(memcmp(request + 54 * MIB, l.base + 128 * MIB, 16 * MIB) == 0);
    /* While it lives, A's free end is no fit's: a request of its size goes elsewhere. */
    void *other = NULL;
    CHECK_OK(gm_malloc(l.allocator, 54 * MIB, 0, &other));
    CHECK((unsigned char *)other + 54 * MIB <= l.base + 10 * MIB || (unsigned char *)other >= l.base + 64 * MIB);
    pattern_stamp(other, 54 * MIB, 5);
    CHECK(pattern_intact(request, 70 * MIB, 4));
    CHECK_OK(gm_free(l.allocator, other));
    CHECK_OK(gm_free(l.allocator, request));
    CHECK_OK(gm_validate(l.allocator));
    check_snapshot(l.allocator);
    /* Undone: A's free end serves a fit where it lies (one of the two free blocks of 54 MiB: the other
     * is the memory made for `other`), C's free start too. */
    void *end_again[2] = {NULL, NULL}, *start_again = NULL;
    CHECK_OK(gm_malloc(l.allocator, 54 * MIB, 0, &end_again[0]));
    CHECK_OK(gm_malloc(l.allocator, 54 * MIB, 0, &end_again[1]));
    CHECK(end_again[0] == (void *)(l.base + 10 * MIB) || end_again[1] == (void *)(l.base + 10 * MIB));
    CHECK_OK(gm_malloc(l.allocator, 22 * MIB, 0, &start_again));
    CHECK(start_again == (void *)(l.base + 128 * MIB));
    CHECK_EQ_INT(reserved(l.allocator, true), 246 * MIB); /* 192 + the 54 MiB made for `other` */
    CHECK_OK(gm_free(l.allocator, end_again[0]));
    CHECK_OK(gm_free(l.allocator, end_again[1]));
    CHECK_OK(gm_free(l.allocator, start_again));
    check_and_free(&l);
}

/* gm_share of a stitched block: its pieces are the two second mappings' memory, which another process
 * maps and reads as the block's bytes (the host backend shares each chunk's memfd). */
static void a_stitched_block_is_shared_like_any_other(void)
{
    layout l = lay_out(HOST ",stitch:true", true);
    gm_allocator *taker = NULL;
    REQUIRE(gm_create("backend:host,capacity:1GiB", &taker) == GM_OK);
    unsigned char *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, (void **)&request));
    CHECK_EQ_INT(reserved(l.allocator, true), 192 * MIB); /* stitched */
    pattern_stamp(request, 70 * MIB, 6);
    uint64_t offset = 0;
    gm_shared_piece pieces[8];
    size_t count = 0;
    CHECK_OK(gm_share(l.allocator, request, &offset, pieces, 8, &count));
    CHECK_EQ_INT(count, 2); /* the two second mappings, back to back */
    void *mapped = NULL;
    CHECK_OK(gm_open_shared(taker, getpid(), pieces, count, &mapped));
    unsigned char *there = (unsigned char *)mapped + offset;
    CHECK(pattern_intact(there, 70 * MIB, 6));
    pattern_stamp(there, 70 * MIB, 7);
    CHECK(pattern_intact(request, 70 * MIB, 7));
    CHECK_OK(gm_close_shared(taker, mapped));
    CHECK_OK(gm_free(l.allocator, request));
    CHECK_OK(gm_validate(l.allocator));
    gm_destroy(taker, NULL);
    check_and_free(&l);
}

static void without_the_option_memory_grows(void)
{
    layout l = lay_out(HOST ",stitch:false", true);
    void *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, &request));
    CHECK_EQ_INT(reserved(l.allocator, true), 262 * MIB);
    gm_stats stats;
    CHECK_OK(gm_get_stats(l.allocator, &stats));
    CHECK_EQ_INT(stats.num_stitches, 0);
    CHECK_EQ_INT(stats.stitch_lent_bytes, 0);
    CHECK_OK(gm_free(l.allocator, request));
    check_and_free(&l);
}

/* Live memory climbing above its peak needs new memory: no stitch then. */
static void no_stitch_above_the_live_peak(void)
{
    layout l = lay_out(HOST ",stitch:true", true);
    void *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 80 * MIB, 0, &request)); /* 116 + 80 MiB live: above the 192 MiB peak */
    CHECK_EQ_INT(reserved(l.allocator, true), 272 * MIB);
    CHECK_OK(gm_free(l.allocator, request));
    check_and_free(&l);
}

/* The same on the simulated device, many times over: each stitch made and undone leaves the books
 * exact and reserved memory at its peak. */
static void stitches_come_and_go(void)
{
    layout l = lay_out(SIM, false);
    for (int round = 0; round < 20; round++) {
        void *request = NULL;
        CHECK_OK(gm_malloc(l.allocator, (uint64_t)(60 + round % 10) * MIB, 0, &request));
        CHECK_OK(gm_validate(l.allocator));
        CHECK_OK(gm_free(l.allocator, request));
        CHECK_OK(gm_validate(l.allocator));
    }
    CHECK_EQ_INT(reserved(l.allocator, true), 192 * MIB);
    CHECK_OK(gm_free(l.allocator, l.head));
    CHECK_OK(gm_free(l.allocator, l.middle));
    CHECK_OK(gm_free(l.allocator, l.tail));
    CHECK_OK(gm_validate(l.allocator));
    gm_destroy(l.allocator, NULL);
}

/* A stitched block freed while its stream is being captured into a CUDA graph, with work still queued:
 * its second mappings cannot be unmapped now (no wait during a capture), so they are kept as old
 * mappings, unmapped once the capture has ended; they were lost once, mapped on the device with their
 * chunks given back, and the device held 128 MiB that no book counted. */
static void a_stitch_undone_during_a_capture(void)
{
    layout l = lay_out_on(SIM, false, 7);
    void *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 7, &request));
    gm_stats stats;
    CHECK_OK(gm_get_stats(l.allocator, &stats));
    CHECK_EQ_INT(stats.num_stitches, 1);
    CHECK_OK(gm_sim_stream_enqueue(l.allocator, 7, 10));
    CHECK_OK(gm_sim_stream_set_capturing(l.allocator, 7, 1));
    CHECK_OK(gm_free(l.allocator, request));
    CHECK_OK(gm_validate(l.allocator));
    CHECK_OK(gm_sim_stream_set_capturing(l.allocator, 7, 0));
    CHECK_OK(gm_free(l.allocator, l.head));
    CHECK_OK(gm_free(l.allocator, l.middle));
    CHECK_OK(gm_free(l.allocator, l.tail));
    CHECK_OK(gm_empty_cache(l.allocator));
    CHECK_OK(gm_validate(l.allocator)); /* the device holds what reserved_bytes says */
    CHECK_EQ_INT(reserved(l.allocator, false), 0);
    gm_destroy(l.allocator, NULL);
}

/* The allocator goes while a stitched block lives: its second mappings go with it (ASan sees a leak of
 * their entries; the host backend's descriptors and mappings all close). */
static void an_allocator_going_with_a_stitch_in_place(void)
{
    int held_before = host_memory_held();
    layout l = lay_out(HOST ",stitch:true", true);
    void *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, &request));
    CHECK(host_memory_held() > held_before);
    size_t live = 0;
    gm_destroy(l.allocator, &live);
    CHECK_EQ_INT(live, 4); /* head, middle, tail and the request */
    CHECK_EQ_INT(host_memory_held(), held_before);
}

/* An idle chunk larger than the middle's hole, but smaller than the request, becomes the whole middle:
 * four chunks of 64 MiB, A (10 MiB live, its free end 54 MiB), D (idle), B (live) and C (its free start
 * 22 MiB, 42 MiB live). A 130 MiB request would need a 54 MiB middle, in which D does not fit: the middle
 * is D's 64 MiB instead, D moves there, and no new memory is made. Without the option the request grows
 * at the top with D moved there and 66 MiB made. */
static void an_idle_chunk_larger_than_the_middle_becomes_it(void)
{
    for (int stitch = 0; stitch < 2; stitch++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(stitch ? "backend:sim,capacity:1GiB,max_chunk_size:64MiB,chunk_room_share:0,stitch:true"
                                 : "backend:sim,capacity:1GiB,max_chunk_size:64MiB,chunk_room_share:0,stitch:false",
                          &allocator) == GM_OK);
        void *whole = NULL, *parts[6] = {NULL};
        const uint64_t sizes[6] = {10 * MIB, 54 * MIB, 64 * MIB, 64 * MIB, 22 * MIB, 42 * MIB};
        CHECK_OK(gm_malloc(allocator, 256 * MIB, 0, &whole));
        CHECK_OK(gm_free(allocator, whole));
        for (int i = 0; i < 6; i++)
            CHECK_OK(gm_malloc(allocator, sizes[i], 0, &parts[i]));
        CHECK(parts[5] == (void *)((unsigned char *)whole + 214 * MIB));
        const int freed[3] = {1, 2, 4}, kept[3] = {0, 3, 5}; /* A's free end, D, C's free start */
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, parts[freed[i]]));
        void *request = NULL;
        CHECK_OK(gm_malloc(allocator, 130 * MIB, 0, &request));
        CHECK_OK(gm_validate(allocator));
        CHECK_EQ_INT(reserved(allocator, true), stitch ? 256 * MIB : 256 * MIB + 66 * MIB);
        CHECK_OK(gm_free(allocator, request));
        CHECK_OK(gm_validate(allocator));
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, parts[kept[i]]));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_EQ_INT(reserved(allocator, false), 0);
        gm_destroy(allocator, NULL);
    }
}

/* The driver refuses the second mapping's access, then the unmap that undoes it: the stitch is not made,
 * the request takes new memory, and the mapping left behind is kept as an old mapping, unmapped at the
 * latest when its chunk's memory goes back: in the end every map has its unmap. */
static void a_second_mapping_left_behind_is_unmapped_later(void)
{
    layout l = lay_out(SIM, false);
    gm_stats before, after;
    REQUIRE(gm_get_stats(l.allocator, &before) == GM_OK);
    CHECK_OK(gm_inject_device_failures(l.allocator, GM_CALL_SET_ACCESS, 0, 1));
    CHECK_OK(gm_inject_device_failures(l.allocator, GM_CALL_UNMAP, 0, 1));
    void *request = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, &request));
    CHECK_OK(gm_validate(l.allocator));
    CHECK_EQ_INT(reserved(l.allocator, true), 262 * MIB); /* not stitched: new memory */
    CHECK_OK(gm_free(l.allocator, request));
    CHECK_OK(gm_free(l.allocator, l.head));
    CHECK_OK(gm_free(l.allocator, l.middle));
    CHECK_OK(gm_free(l.allocator, l.tail));
    CHECK_OK(gm_validate(l.allocator));
    CHECK_OK(gm_empty_cache(l.allocator));
    CHECK_EQ_INT(reserved(l.allocator, false), 0);
    REQUIRE(gm_get_stats(l.allocator, &after) == GM_OK);
    int64_t maps = after.device_calls[GM_CALL_MAP] - before.device_calls[GM_CALL_MAP];
    int64_t unmaps = after.device_calls[GM_CALL_UNMAP] - before.device_calls[GM_CALL_UNMAP];
    CHECK_EQ_INT(unmaps, maps + 3); /* the layout's 3 chunks were mapped before; refused calls are not counted */
    gm_destroy(l.allocator, NULL);
}

/* The layout's live blocks freed and the cache emptied: nothing reserved, every mapping unmapped. */
static void free_all_and_unmapped(layout *l)
{
    CHECK_OK(gm_free(l->allocator, l->head));
    CHECK_OK(gm_free(l->allocator, l->middle));
    CHECK_OK(gm_free(l->allocator, l->tail));
    CHECK_OK(gm_empty_cache(l->allocator));
    CHECK_EQ_INT(reserved(l->allocator, false), 0);
    gm_stats stats;
    REQUIRE(gm_get_stats(l->allocator, &stats) == GM_OK);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_UNMAP], stats.device_calls[GM_CALL_MAP]); /* every mapping gone */
    gm_destroy(l->allocator, NULL);
}

/* While the stream still works on a stitched request (the sim's device behind its host), the request
 * is freed and asked for again: the stitch is laid out where the last one was, whatever the stream has
 * done, and the last stitch's second mappings, still mapped there until the stream passes them, serve
 * again: no map, no set-access, no wait. */
static void a_stitch_made_again_reuses_the_waiting_second_mappings(void)
{
    layout l = lay_out(SIM, false);
    void *first = NULL, *again = NULL;
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, &first));
    CHECK_OK(gm_sim_stream_enqueue(l.allocator, 0, 1)); /* a kernel using it, still queued */
    CHECK_OK(gm_free(l.allocator, first));
    CHECK_OK(gm_validate(l.allocator));
    gm_stats before, after;
    REQUIRE(gm_get_stats(l.allocator, &before) == GM_OK);
    CHECK_OK(gm_malloc(l.allocator, 70 * MIB, 0, &again));
    CHECK_OK(gm_validate(l.allocator));
    REQUIRE(gm_get_stats(l.allocator, &after) == GM_OK);
    CHECK(again == first);
    CHECK_EQ_INT(after.device_calls[GM_CALL_MAP] - before.device_calls[GM_CALL_MAP], 0);
    CHECK_EQ_INT(after.device_calls[GM_CALL_SET_ACCESS] - before.device_calls[GM_CALL_SET_ACCESS], 0);
    CHECK_EQ_INT(after.device_calls[GM_CALL_EVENT_SYNCHRONIZE] - before.device_calls[GM_CALL_EVENT_SYNCHRONIZE], 0);
    CHECK_EQ_INT(reserved(l.allocator, true), 192 * MIB);
    CHECK_OK(gm_free(l.allocator, again));
    CHECK_OK(gm_sim_stream_complete(l.allocator, 0));
    free_all_and_unmapped(&l);
}

/* A request 64 KiB larger than A's free end and C's free start together needs a one-page middle. Freed
 * and asked for again after a small-pool growth (each growth unmaps the old mappings that the stream has
 * passed), it lies where it did: around the middle that the last stitch left, between the addresses of
 * its second mappings, which linger there: no map, no set-access, no page made or moved, no wait. A
 * stream's 10 MiB, made and given back first, lifts the reserved peak so that the small pool's page is
 * new memory, not the middle moved away. */
static void a_stitch_made_again_lies_around_the_middle_it_left(void)
{
    layout l = lay_out(SIM, false);
    const uint64_t size = 76 * MIB + 64 * 1024;
    void *lift = NULL, *first = NULL, *small = NULL, *again = NULL;
    CHECK_OK(gm_malloc(l.allocator, 10 * MIB, 1, &lift));
    CHECK_OK(gm_free(l.allocator, lift));
    CHECK_OK(gm_empty_cache(l.allocator));
    CHECK_OK(gm_malloc(l.allocator, size, 0, &first));
    CHECK_EQ_INT(reserved(l.allocator, false), 194 * MIB); /* stitched: the middle's page is new */
    CHECK_OK(gm_free(l.allocator, first));
    CHECK_OK(gm_malloc(l.allocator, 4096, 0, &small));
    CHECK_EQ_INT(reserved(l.allocator, false), 196 * MIB);
    CHECK_OK(gm_validate(l.allocator));
    gm_stats before, after;
    REQUIRE(gm_get_stats(l.allocator, &before) == GM_OK);
    CHECK_OK(gm_malloc(l.allocator, size, 0, &again));
    CHECK_OK(gm_validate(l.allocator));
    REQUIRE(gm_get_stats(l.allocator, &after) == GM_OK);
    CHECK(again == first);
    CHECK_EQ_INT(after.num_stitches - before.num_stitches, 1);
    for (int call = 0; call < GM_CALL_KIND_COUNT; call++)
        if (call != GM_CALL_EVENT_QUERY && call != GM_CALL_EVENT_RECORD)
            CHECK_EQ_INT(after.device_calls[call] - before.device_calls[call], 0);
    CHECK_EQ_INT(reserved(l.allocator, false), 196 * MIB);
    CHECK_EQ_INT(reserved(l.allocator, true), 202 * MIB);
    CHECK_OK(gm_free(l.allocator, again));
    CHECK_OK(gm_free(l.allocator, small));
    free_all_and_unmapped(&l);
}

/* Chunks of 8 MiB (four pages) A, B, C, D of one 32 MiB block; live blocks hold all of A but its last
 * 1.5 MiB, all of B, all of C but its first 1.5 MiB, and D but 3.5 MiB in its middle (every piece above
 * 1 MiB, in the large pool). A request of `size` MiB (4 or 5) fits nowhere mapped and keeps live memory
 * under its 32 MiB peak; grown at the top it needs its size in pages. Stitched across A's free end and
 * C's free start, it needs new pages only for the rest. The reserved peak after it. */
static int64_t small_stitch(uint64_t size)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB,max_chunk_size:8MiB,chunk_room_share:0,device_credit_ns:0,"
                      "stitch:true", &allocator) == GM_OK);
    const uint64_t held = 6 * MIB + MIB / 2, end = MIB + MIB / 2, edge = 2 * MIB + MIB / 4;
    void *whole = NULL, *parts[8] = {NULL}, *request = NULL;
    const uint64_t sizes[8] = {held, end, 8 * MIB, end, held, edge, 3 * MIB + MIB / 2, edge};
    CHECK_OK(gm_malloc(allocator, 32 * MIB, 0, &whole));
    CHECK_OK(gm_free(allocator, whole));
    for (int i = 0; i < 8; i++)
        CHECK_OK(gm_malloc(allocator, sizes[i], 0, &parts[i]));
    CHECK(parts[7] == (void *)((unsigned char *)whole + 32 * MIB - edge));
    const int freed[3] = {1, 3, 6}, kept[5] = {0, 2, 4, 5, 7};
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(allocator, parts[freed[i]]));
    CHECK_OK(gm_malloc(allocator, size * MIB, 0, &request));
    CHECK_OK(gm_validate(allocator));
    int64_t peak = reserved(allocator, true);
    CHECK_OK(gm_free(allocator, request));
    for (int i = 0; i < 5; i++)
        CHECK_OK(gm_free(allocator, parts[kept[i]]));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    return peak;
}

/* A stitch must spare at least two pages. A 4 MiB request across the two 1.5 MiB ends needs a one-page
 * middle instead of two new pages: one page spared, so it grows (32 + 4 MiB). A 5 MiB request needs the
 * same one-page middle instead of three: two spared, stitched (32 + 2 MiB). */
static void a_stitch_spares_at_least_two_pages(void)
{
    CHECK_EQ_INT(small_stitch(4), 36 * MIB);
    CHECK_EQ_INT(small_stitch(5), 34 * MIB);
}

RUN_TESTS(TEST_CASE(a_request_lies_across_the_free_end_and_start),
          TEST_CASE(a_stitch_spares_at_least_two_pages),
          TEST_CASE(a_stitch_made_again_reuses_the_waiting_second_mappings),
          TEST_CASE(a_stitch_made_again_lies_around_the_middle_it_left),
          TEST_CASE(a_stitched_block_is_shared_like_any_other),
          TEST_CASE(without_the_option_memory_grows),
          TEST_CASE(no_stitch_above_the_live_peak),
          TEST_CASE(stitches_come_and_go),
          TEST_CASE(an_idle_chunk_larger_than_the_middle_becomes_it),
          TEST_CASE(a_second_mapping_left_behind_is_unmapped_later), TEST_CASE(a_stitch_undone_during_a_capture),
          TEST_CASE(an_allocator_going_with_a_stitch_in_place))
