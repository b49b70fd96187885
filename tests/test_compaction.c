/*
 * test_compaction.c -- compact_min: a growth that would lift reserved memory above its peak (by more
 * than a two-hundredth of it) first splits chunks that live blocks pin around their live pages and
 * gives their whole free pages back; the live blocks stay where they are, with their data (the host
 * backend holds real bytes), and a failure at any step of a compaction loses nothing. No compaction
 * while a stream is being captured; engine:segments refuses the key. gm_defragment does the same split
 * on demand, for every pinned chunk at once. Every allocator here sets chunk_room_share:0: on devices
 * this small the room share would make every chunk a page, and there would be nothing to split.
 */
#include "pattern.h"
#include "test.h"

#define MIB (1ull << 20)
#define ONE_CHUNK_PER_GROWTH ",chunk_room_share:0"

static int64_t reserved_peak(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats.reserved_bytes[GM_POOL_ALL].peak;
}

/* After `held` bytes kept live: a 64 MiB chunk pinned by a 1 MiB block at its start, fenced by a live
 * block after it, then a 100 MiB request that fits nowhere mapped. The peak reserved memory beyond
 * `held`. */
static int64_t peak_after_a_pinned_chunk(const char *config, uint64_t held)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create(config, &allocator) == GM_OK);
    void *kept = NULL, *big = NULL, *fence = NULL, *pin = NULL, *large = NULL;
    if (held)
        CHECK_OK(gm_malloc(allocator, held, 0, &kept));
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &big)); /* one chunk of 64 MiB */
    CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, &fence));
    CHECK_OK(gm_free(allocator, big));
    CHECK_OK(gm_malloc(allocator, MIB + 1, 0, &pin)); /* at the start of the chunk: pins all of it */
    CHECK(pin == big);
    unsigned char *pin_bytes = pin;
    CHECK_OK(gm_malloc(allocator, 100 * MIB, 0, &large));
    CHECK((unsigned char *)large >= (unsigned char *)fence + 2 * MIB); /* past the fence: new memory */
    CHECK_OK(gm_validate(allocator));
    size_t size = 0;
    CHECK_OK(gm_allocation_size(allocator, pin_bytes, &size)); /* the pinning block is still there */
    CHECK_EQ_INT(size, MIB + 512);
    int64_t peak = reserved_peak(allocator) - (int64_t)held;
    if (kept)
        CHECK_OK(gm_free(allocator, kept));
    CHECK_OK(gm_free(allocator, pin));
    CHECK_OK(gm_free(allocator, fence));
    CHECK_OK(gm_free(allocator, large));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_empty_cache(allocator));
    gm_destroy(allocator, NULL);
    return peak;
}

static void a_growth_gives_back_the_free_pages_of_a_pinned_chunk(void)
{
    /* Without: the chunk (64), the fence (2) and the request (100). With: the pinning block's page, the
     * fence and the request. */
    CHECK_EQ_INT(peak_after_a_pinned_chunk("capacity:4GiB,page_size:2MiB" ONE_CHUNK_PER_GROWTH, 0), 166 * MIB);
    CHECK_EQ_INT(peak_after_a_pinned_chunk("capacity:4GiB,page_size:2MiB,compact_min:2MiB" ONE_CHUNK_PER_GROWTH, 0),
                 104 * MIB);
    /* A chunk with fewer free bytes than compact_min stays whole. */
    CHECK_EQ_INT(peak_after_a_pinned_chunk("capacity:4GiB,page_size:2MiB,compact_min:64MiB" ONE_CHUNK_PER_GROWTH, 0),
                 166 * MIB);
}

static void a_rise_of_the_peak_within_its_two_hundredth_is_let_through(void)
{
    /* 100 MiB above a peak of 24 GiB: within a two-hundredth, the peak rises. Above 16 GiB it is more
     * than a two-hundredth: compacted. */
    const char *config = "capacity:64GiB,page_size:2MiB,compact_min:2MiB" ONE_CHUNK_PER_GROWTH;
    CHECK_EQ_INT(peak_after_a_pinned_chunk(config, 24ull << 30), 166 * MIB);
    CHECK_EQ_INT(peak_after_a_pinned_chunk(config, 16ull << 30), 104 * MIB);
}

#define HOST_COMPACTING "backend:host,capacity:1GiB,page_size:2MiB,compact_min:2MiB" ONE_CHUNK_PER_GROWTH

/* Live blocks with free gaps between them in one 64 MiB chunk (fenced), each stamped, then a request
 * of 100 MiB, with one failure of `failing` (GM_CALL_KIND_COUNT: none) after `after` calls. Checks
 * that every block keeps its address and its bytes; returns the peak reserved memory and the copies
 * made (*copies_out). */
static const size_t sizes[3] = {3 * MIB, 5 * MIB + 4096, 7 * MIB};

/* A 64 MiB chunk fenced by a live 2 MiB block (*fence_out), with three live blocks in it (live), each
 * stamped with `stamp` + its index, and freed gaps of 20 and 24 MiB between them: 44 MiB of whole free
 * pages that the blocks pin. */
static void pin_a_chunk(gm_allocator *allocator, uint64_t stamp, void **fence_out, void *live[3])
{
    void *big = NULL, *gaps[2] = {0};
    const size_t gap_sizes[2] = {20 * MIB, 24 * MIB};
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &big));
    CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, fence_out));
    CHECK_OK(gm_free(allocator, big));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_malloc(allocator, sizes[i], 0, &live[i]));
        if (stamp) /* 0: fake addresses (the sim) */
            pattern_stamp(live[i], sizes[i], stamp + (uint64_t)i);
        if (i < 2)
            CHECK_OK(gm_malloc(allocator, gap_sizes[i], 0, &gaps[i]));
    }
    CHECK(live[0] == big && (char *)live[2] < (char *)big + 64 * MIB); /* all in the chunk */
    for (int i = 0; i < 2; i++)
        CHECK_OK(gm_free(allocator, gaps[i]));
}

static int64_t host_compaction_peak(const char *config, gm_device_call failing, uint64_t after, uint64_t failures,
                                    int64_t *copies_out)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create(config, &allocator) == GM_OK);
    void *fence = NULL, *large = NULL, *live[3] = {0};
    pin_a_chunk(allocator, 100, &fence, live);
    if (failing != GM_CALL_KIND_COUNT)
        CHECK_OK(gm_inject_device_failures(allocator, failing, after, failures));
    CHECK_OK(gm_malloc(allocator, 100 * MIB, 0, &large));
    memset(large, 0x5a, 100 * MIB);
    CHECK_OK(gm_validate(allocator));
    for (int i = 0; i < 3; i++) {
        CHECK(pattern_intact(live[i], sizes[i], 100 + (uint64_t)i));
        pattern_stamp(live[i], sizes[i], 200 + (uint64_t)i); /* still mapped, readable and writable */
        CHECK(pattern_intact(live[i], sizes[i], 200 + (uint64_t)i));
    }
    int64_t peak = reserved_peak(allocator);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    *copies_out = stats.device_calls[GM_CALL_COPY];
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(allocator, live[i]));
    CHECK_OK(gm_free(allocator, fence));
    CHECK_OK(gm_free(allocator, large));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    return peak;
}

static void a_compaction_on_real_memory_keeps_every_byte(void)
{
    int64_t copies = -1;
    CHECK_EQ_INT(host_compaction_peak("backend:host,capacity:1GiB,page_size:2MiB" ONE_CHUNK_PER_GROWTH, GM_CALL_KIND_COUNT,
                                      0, 0, &copies),
                 166 * MIB);
    CHECK_EQ_INT(copies, 0);
    /* The live blocks' pages (3 + 6 + 8 MiB, rounded to pages: three runs, three copies), the fence and
     * the request: 44 MiB of free pages given back. */
    CHECK_EQ_INT(host_compaction_peak(HOST_COMPACTING, GM_CALL_KIND_COUNT, 0, 0, &copies), 166 * MIB - 44 * MIB);
    CHECK_EQ_INT(copies, 3);
}

static void a_failed_compaction_puts_the_chunk_back(void)
{
    int64_t copies = -1;
    /* The second copy refused: the first given back, the chunk whole, the growth takes new memory. */
    CHECK_EQ_INT(host_compaction_peak(HOST_COMPACTING, GM_CALL_COPY, 1, 1, &copies), 166 * MIB);
    CHECK_EQ_INT(copies, 1);
    /* The chunk's unmap refused, after the three copies. */
    CHECK_EQ_INT(host_compaction_peak(HOST_COMPACTING, GM_CALL_UNMAP, 0, 1, &copies), 166 * MIB);
    CHECK_EQ_INT(copies, 3);
    /* The second copy's map refused: the first unmapped again, the chunk mapped back. */
    CHECK_EQ_INT(host_compaction_peak(HOST_COMPACTING, GM_CALL_MAP, 1, 1, &copies), 166 * MIB);
    CHECK_EQ_INT(copies, 3);
    /* The second copy's map refused and then the chunk's map back: the compaction finishes with the
     * copies instead (found by fuzz_api: the chunk was released with its blocks still live over it). */
    CHECK_EQ_INT(host_compaction_peak(HOST_COMPACTING, GM_CALL_MAP, 1, 2, &copies), 166 * MIB - 44 * MIB);
    CHECK_EQ_INT(copies, 3);
}

/* Every map refused once the chunk is unmapped: neither it nor its copies can be mapped again. The
 * request fails with a device error that says so; the chunk stays in the books (its live blocks can
 * still be freed, and then it moves or goes back to the device like any other chunk), nothing leaks,
 * nothing crashes. The live blocks' bytes are not read: nothing is mapped there. */
static void a_chunk_that_cannot_be_mapped_again_stays_in_the_books(void)
{
    static const char *const configs[] = {"backend:sim,capacity:1GiB,compact_min:2MiB" ONE_CHUNK_PER_GROWTH,
                                          HOST_COMPACTING};
    for (size_t c = 0; c < 2; c++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create(configs[c], &allocator) == GM_OK);
        void *fence = NULL, *large = NULL, *live[3] = {0};
        pin_a_chunk(allocator, c == 1 ? 100 : 0, &fence, live);
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_MAP, 1, UINT64_MAX));
        CHECK_STATUS(gm_malloc(allocator, 100 * MIB, 0, &large), GM_ERROR_DEVICE);
        CHECK(strstr(gm_last_error(), "the device cannot reach their memory") != NULL);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_MAP, 0, 0));
        /* Its free pages are not mapped: nothing is placed anywhere while it holds a live block. */
        CHECK_STATUS(gm_malloc(allocator, MIB, 0, &large), GM_ERROR_DEVICE);
        CHECK(strstr(gm_last_error(), "no allocation until those blocks are freed") != NULL);
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, live[i]));
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_malloc(allocator, 100 * MIB, 0, &large)); /* the lost chunk given back first */
        CHECK_OK(gm_malloc(allocator, 60 * MIB, 0, &live[0]));
        if (c == 1) { /* both mapped for real */
            memset(large, 0x5a, 100 * MIB);
            memset(live[0], 0xa5, 60 * MIB);
        }
        CHECK_OK(gm_free(allocator, live[0]));
        CHECK_OK(gm_free(allocator, fence));
        CHECK_OK(gm_free(allocator, large));
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_empty_cache(allocator));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
        gm_destroy(allocator, NULL);
    }
}

static void no_compaction_while_a_stream_is_captured(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("capacity:4GiB,page_size:2MiB,compact_min:2MiB" ONE_CHUNK_PER_GROWTH, &allocator) == GM_OK);
    void *other = NULL, *big = NULL, *fence = NULL, *pin = NULL, *large = NULL;
    CHECK_OK(gm_malloc(allocator, 512, 7, &other)); /* stream 7 has a heap */
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &big));
    CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, &fence));
    CHECK_OK(gm_free(allocator, big));
    CHECK_OK(gm_malloc(allocator, MIB + 1, 0, &pin)); /* pins the chunk */
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 7, 1));
    int64_t before = reserved_peak(allocator);
    CHECK_OK(gm_malloc(allocator, 100 * MIB, 0, &large));
    CHECK_EQ_INT(reserved_peak(allocator) - before, 100 * MIB); /* the pinned chunk stayed whole, */
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.device_calls[GM_CALL_COPY], 0); /* and no copy was tried (the wait would fail) */
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 7, 0));
    CHECK_OK(gm_free(allocator, large));
    CHECK_OK(gm_free(allocator, pin));
    CHECK_OK(gm_free(allocator, fence));
    CHECK_OK(gm_free(allocator, other));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void the_segments_engine_refuses_compaction(void)
{
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("engine:segments,compact_min:2MiB", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("compact_min");
    CHECK(allocator == NULL);
}

/* gm_defragment on real memory: three stamped blocks pin a 64 MiB chunk with 44 MiB of whole free pages
 * between and after them; one call gives those pages back at once, the blocks keep their addresses
 * and bytes, and a second call finds nothing more. */
static void defragment_gives_back_pinned_free_pages_on_demand(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:host,capacity:1GiB,page_size:2MiB" ONE_CHUNK_PER_GROWTH, &allocator) == GM_OK);
    void *fence = NULL, *live[3] = {0};
    pin_a_chunk(allocator, 300, &fence, live);
    CHECK_OK(gm_empty_cache(allocator)); /* gives back nothing: every chunk is pinned */
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 66 * MIB);
    uint64_t released = 1;
    CHECK_STATUS(gm_defragment(allocator, 64 * MIB, &released), GM_OK); /* no chunk has that much free */
    CHECK_EQ_INT(released, 0);
    CHECK_OK(gm_defragment(allocator, 0, &released));
    CHECK_EQ_INT(released, 44 * MIB);
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 22 * MIB);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_COPY], 3);
    CHECK_OK(gm_validate(allocator));
    for (int i = 0; i < 3; i++) {
        size_t size = 0;
        CHECK_OK(gm_allocation_size(allocator, live[i], &size)); /* same addresses, */
        CHECK(pattern_intact(live[i], sizes[i], 300 + (uint64_t)i)); /* same bytes */
    }
    CHECK_OK(gm_defragment(allocator, 0, &released));
    CHECK_EQ_INT(released, 0);
    CHECK_OK(gm_defragment(allocator, 0, NULL));
    void *again = NULL; /* the pages given back serve new requests */
    CHECK_OK(gm_malloc(allocator, 40 * MIB, 0, &again));
    memset(again, 0x33, 40 * MIB);
    for (int i = 0; i < 3; i++)
        CHECK(pattern_intact(live[i], sizes[i], 300 + (uint64_t)i));
    CHECK_OK(gm_free(allocator, again));
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(allocator, live[i]));
    CHECK_OK(gm_free(allocator, fence));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void defragment_refuses_what_it_cannot_do(void)
{
    CHECK_STATUS(gm_defragment(NULL, 0, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("allocator is NULL");
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("engine:segments", &allocator) == GM_OK);
    uint64_t released = 7;
    CHECK_STATUS(gm_defragment(allocator, 0, &released), GM_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE("segments engine cannot split");
    gm_destroy(allocator, NULL);
    /* While a stream is captured: refused, the pinned chunk whole. */
    REQUIRE(gm_create("capacity:4GiB,page_size:2MiB" ONE_CHUNK_PER_GROWTH, &allocator) == GM_OK);
    void *big = NULL, *fence = NULL, *pin = NULL;
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &big));
    CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, &fence));
    CHECK_OK(gm_free(allocator, big));
    CHECK_OK(gm_malloc(allocator, MIB + 1, 0, &pin));
    CHECK(pin == big); /* at the chunk's start: it pins all of it */
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 1));
    CHECK_STATUS(gm_defragment(allocator, 0, &released), GM_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE("captured into a CUDA graph");
    CHECK_EQ_INT(released, 0);
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 0));
    /* At a memory limit that reserved memory has reached, the copies' moment would pass it: refused. */
    CHECK_OK(gm_set_memory_limit(allocator, 66 * MIB));
    CHECK_OK(gm_defragment(allocator, 0, &released));
    CHECK_EQ_INT(released, 0);
    CHECK_EQ_INT(reserved_peak(allocator), 66 * MIB);
    CHECK_OK(gm_set_memory_limit(allocator, 68 * MIB)); /* room for the pinning page's copy */
    CHECK_OK(gm_defragment(allocator, 0, &released));
    CHECK_EQ_INT(released, 62 * MIB);
    CHECK_EQ_INT(reserved_peak(allocator), 68 * MIB);
    CHECK_OK(gm_free(allocator, pin));
    CHECK_OK(gm_free(allocator, fence));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(a_growth_gives_back_the_free_pages_of_a_pinned_chunk),
          TEST_CASE(a_rise_of_the_peak_within_its_two_hundredth_is_let_through),
          TEST_CASE(a_compaction_on_real_memory_keeps_every_byte),
          TEST_CASE(a_failed_compaction_puts_the_chunk_back),
          TEST_CASE(a_chunk_that_cannot_be_mapped_again_stays_in_the_books),
          TEST_CASE(no_compaction_while_a_stream_is_captured),
          TEST_CASE(the_segments_engine_refuses_compaction),
          TEST_CASE(defragment_gives_back_pinned_free_pages_on_demand),
          TEST_CASE(defragment_refuses_what_it_cannot_do))
