/*
 * test_peer_access.c -- gm_enable_peer_access: another device may reach the allocator's memory.
 *
 * On two GPUs, PyTorch enables peer access before it copies a tensor from one to the other or lets a
 * kernel of one read the other's memory; memory mapped with cuMemMap is reachable from a device only
 * where cuMemSetAccess named it. So enabling a peer must grant it every mapping made so far (one
 * set-access call per chunk, for the peer alone) and every later mapping (the peer named in the same
 * call as the device: no second call). The sim counts the calls; the host backend shows that no byte
 * is lost on the way; a refused grant leaves the peer unrecorded, so that a later try grants again.
 */
#include "test.h"

#include "pattern.h"

#define MIB (1ull << 20)
#define BLOCKS 4

static const uint64_t block_sizes[BLOCKS] = {MIB / 2, 64 * MIB, 300 * MIB, 3 * MIB};

static int64_t calls_of(gm_allocator *allocator, gm_device_call kind)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats.device_calls[kind];
}

/* Mappings in place now: every map not undone by an unmap. */
static int64_t mappings_of(gm_allocator *allocator)
{
    return calls_of(allocator, GM_CALL_MAP) - calls_of(allocator, GM_CALL_UNMAP);
}

static void allocate_blocks(gm_allocator *allocator, void **blocks)
{
    for (int i = 0; i < BLOCKS; i++)
        REQUIRE(gm_malloc(allocator, block_sizes[i], 0, &blocks[i]) == GM_OK);
}

static void free_blocks(gm_allocator *allocator, void **blocks)
{
    for (int i = 0; i < BLOCKS; i++)
        CHECK_OK(gm_free(allocator, blocks[i]));
}

static void every_mapping_is_granted_once(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim", &allocator) == GM_OK);
    void *blocks[BLOCKS];
    allocate_blocks(allocator, blocks);
    int64_t mapped = mappings_of(allocator), before = calls_of(allocator, GM_CALL_SET_ACCESS);
    CHECK(mapped >= BLOCKS); /* the 300 MiB block alone spans several chunks */
    CHECK_OK(gm_enable_peer_access(allocator, 1));
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_SET_ACCESS) - before, mapped);

    before = calls_of(allocator, GM_CALL_SET_ACCESS);
    CHECK_OK(gm_enable_peer_access(allocator, 1)); /* enabled already */
    CHECK_OK(gm_enable_peer_access(allocator, 0)); /* the allocator's own device */
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_SET_ACCESS), before);

    /* A later growth names the peer in the same call as the device: one set-access per new mapping. */
    int64_t maps = calls_of(allocator, GM_CALL_MAP);
    void *later = NULL;
    CHECK_OK(gm_malloc(allocator, 700 * MIB, 0, &later));
    CHECK(calls_of(allocator, GM_CALL_MAP) > maps);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_SET_ACCESS) - before, calls_of(allocator, GM_CALL_MAP) - maps);
    CHECK_OK(gm_free(allocator, later));
    free_blocks(allocator, blocks);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void bad_peers_are_refused(void)
{
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_enable_peer_access(NULL, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("allocator is NULL");
    REQUIRE(gm_create("backend:sim", &allocator) == GM_OK);
    CHECK_STATUS(gm_enable_peer_access(allocator, -1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("device -1 does not exist");
    for (int peer = 1; peer <= 16; peer++)
        CHECK_OK(gm_enable_peer_access(allocator, peer));
    CHECK_STATUS(gm_enable_peer_access(allocator, 17), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("at most 16 devices");
    CHECK_OK(gm_enable_peer_access(allocator, 16)); /* still one of them */
    gm_destroy(allocator, NULL);
}

/* The driver refuses the grant: the peer stays out, the memory stays whole, and a second try grants
 * every mapping again. On the host backend, so that the blocks' bytes are checked too. */
static void a_refused_grant_records_nothing(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:host,capacity:2GiB", &allocator) == GM_OK);
    void *blocks[BLOCKS];
    allocate_blocks(allocator, blocks);
    for (int i = 0; i < BLOCKS; i++)
        pattern_stamp(blocks[i], block_sizes[i], (uint64_t)i + 1);
    int64_t mapped = mappings_of(allocator);
    CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_SET_ACCESS, 1, 1)); /* the second grant fails */
    CHECK_STATUS(gm_enable_peer_access(allocator, 1), GM_ERROR_DEVICE);
    int64_t before = calls_of(allocator, GM_CALL_SET_ACCESS);
    CHECK_OK(gm_enable_peer_access(allocator, 1));
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_SET_ACCESS) - before, mapped);
    for (int i = 0; i < BLOCKS; i++)
        CHECK(pattern_intact(blocks[i], block_sizes[i], (uint64_t)i + 1));
    free_blocks(allocator, blocks);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* Plain segments are reached through the driver's peer access, which the caller enables: no call here. */
static void segments_need_no_grant(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,engine:segments", &allocator) == GM_OK);
    void *blocks[BLOCKS];
    allocate_blocks(allocator, blocks);
    int64_t before = calls_of(allocator, GM_CALL_SET_ACCESS);
    CHECK_OK(gm_enable_peer_access(allocator, 1));
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_SET_ACCESS), before);
    free_blocks(allocator, blocks);
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(every_mapping_is_granted_once), TEST_CASE(bad_peers_are_refused),
          TEST_CASE(a_refused_grant_records_nothing), TEST_CASE(segments_need_no_grant))
