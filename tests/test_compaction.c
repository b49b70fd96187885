/*
 * test_compaction.c -- compact_min (the pages engine on the sim): a growth that would lift reserved
 * memory above its peak (by more than a two-hundredth of it) first splits chunks that live blocks pin
 * around their live pages and gives their whole free pages back; the live blocks stay where they are. Off the simulated device, where
 * data would have to be copied, the key is refused.
 */
#include "test.h"

#define MIB (1ull << 20)

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
    CHECK_EQ_INT(peak_after_a_pinned_chunk("capacity:4GiB,page_size:2MiB", 0), 166 * MIB);
    CHECK_EQ_INT(peak_after_a_pinned_chunk("capacity:4GiB,page_size:2MiB,compact_min:2MiB", 0), 104 * MIB);
    /* A chunk with fewer free bytes than compact_min stays whole. */
    CHECK_EQ_INT(peak_after_a_pinned_chunk("capacity:4GiB,page_size:2MiB,compact_min:64MiB", 0), 166 * MIB);
}

static void a_rise_of_the_peak_within_its_two_hundredth_is_let_through(void)
{
    /* 100 MiB above a peak of 24 GiB: within a two-hundredth, the peak rises. Above 16 GiB it is more
     * than a two-hundredth: compacted. */
    const char *config = "capacity:64GiB,page_size:2MiB,compact_min:2MiB";
    CHECK_EQ_INT(peak_after_a_pinned_chunk(config, 24ull << 30), 166 * MIB);
    CHECK_EQ_INT(peak_after_a_pinned_chunk(config, 16ull << 30), 104 * MIB);
}

static void compaction_is_refused_off_the_simulated_device(void)
{
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("backend:host,capacity:1GiB,compact_min:2MiB", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("compact_min");
    CHECK_STATUS(gm_create("engine:segments,compact_min:2MiB", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("backend:sim");
    CHECK(allocator == NULL);
}

RUN_TESTS(TEST_CASE(a_growth_gives_back_the_free_pages_of_a_pinned_chunk),
          TEST_CASE(a_rise_of_the_peak_within_its_two_hundredth_is_let_through),
          TEST_CASE(compaction_is_refused_off_the_simulated_device))
