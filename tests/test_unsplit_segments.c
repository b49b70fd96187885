/*
 * test_unsplit_segments.c -- the segments engine with split_blocks:false (PyTorch's
 * MemPool(no_split=True)): each request takes a whole free block or a new segment, so no two live
 * allocations share a segment; a freed segment serves the next request that fits in it whole, its
 * statistics count the whole block, and with splitting on the same requests share one segment.
 */
#include "test.h"

#define MIB (1ull << 20)

static gm_stats stats_of(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats;
}

static void no_two_allocations_share_a_segment(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB,engine:segments,split_blocks:false", &allocator));
    void *first = NULL, *second = NULL, *again = NULL, *tiny = NULL, *tinier = NULL;
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &first));
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &second));
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.segment[GM_POOL_LARGE].current, 2);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_LARGE].current, 40 * MIB); /* two whole 20 MiB segments */
    CHECK_EQ_INT(stats.requested_bytes[GM_POOL_LARGE].current, 6 * MIB);
    CHECK_OK(gm_free(allocator, first));
    CHECK_OK(gm_malloc(allocator, 5 * MIB, 0, &again)); /* the freed segment, whole */
    CHECK(again == first);
    CHECK_EQ_INT(stats_of(allocator).segment[GM_POOL_LARGE].current, 2);
    CHECK_OK(gm_malloc(allocator, 1000, 0, &tiny));
    CHECK_OK(gm_malloc(allocator, 1000, 0, &tinier));
    stats = stats_of(allocator);
    CHECK_EQ_INT(stats.segment[GM_POOL_SMALL].current, 2); /* small requests too */
    CHECK_EQ_INT(stats.inactive_split[GM_POOL_ALL].current, 0);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, again));
    CHECK_OK(gm_free(allocator, second));
    CHECK_OK(gm_free(allocator, tiny));
    CHECK_OK(gm_free(allocator, tinier));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 0);
    gm_destroy(allocator, NULL);
}

static void splitting_lets_requests_share_a_segment(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB,engine:segments", &allocator));
    void *first = NULL, *second = NULL;
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &first));
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &second));
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.segment[GM_POOL_LARGE].current, 1);
    CHECK_EQ_INT(stats.allocated_bytes[GM_POOL_LARGE].current, 6 * MIB);
    CHECK_OK(gm_free(allocator, first));
    CHECK_OK(gm_free(allocator, second));
    gm_destroy(allocator, NULL);
}

static void bad_values_are_refused(void)
{
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("engine:segments,split_blocks:maybe", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("split_blocks");
    CHECK(allocator == NULL);
    CHECK_STATUS(gm_create("split_blocks:false", &allocator), GM_ERROR_BAD_CONFIG); /* the pages engine */
    CHECK_MESSAGE("add engine:segments");
    CHECK(allocator == NULL);
}

RUN_TESTS(TEST_CASE(no_two_allocations_share_a_segment), TEST_CASE(splitting_lets_requests_share_a_segment),
          TEST_CASE(bad_values_are_refused))
