/*
 * test_size_index.c -- the two-level size index (TLSF): fits, and cursors that visit every
 * free block, from the smallest or from a given size up (as the pages engine searches for the free
 * block around a chunk). Randomized against a plain list, with a fixed seed.
 */
#include "test.h"

#include "core/block.h"
#include "core/size_index.h"

#define BLOCKS 400

static gm_block blocks[BLOCKS];

static uint64_t random_size(uint64_t *state)
{
    /* 512 bytes to 4 GiB, spread over the orders of magnitude, multiples of 512 */
    unsigned shift = (unsigned)(test_random(state) % 24);
    return ((test_random(state) % (1ull << shift)) + 1) * 512;
}

static void fill(gm_size_index *index, uint64_t seed)
{
    memset(index, 0, sizeof *index);
    uint64_t state = seed;
    for (int i = 0; i < BLOCKS; i++) {
        memset(&blocks[i], 0, sizeof blocks[i]);
        blocks[i].size = random_size(&state);
        gm_size_index_insert(index, &blocks[i]);
    }
}

static void finds_a_fit_whenever_a_larger_class_holds_one(void)
{
    gm_size_index index;
    fill(&index, 42);
    uint64_t largest = 0;
    for (int i = 0; i < BLOCKS; i++)
        largest = blocks[i].size > largest ? blocks[i].size : largest;
    uint64_t state = 7;
    for (int round = 0; round < 2000; round++) {
        uint64_t size = random_size(&state);
        gm_block *found = gm_size_index_find(&index, size);
        if (found)
            CHECK(found->size >= size);
        else /* only a fit in the request's own list, beyond the scan limit, may be missed */
            CHECK(largest < 2 * size);
    }
}

static void cursors_visit_every_block_once(void)
{
    gm_size_index index;
    fill(&index, 99);
    static int seen[BLOCKS];
    uint64_t state = 5;
    for (int round = 0; round < 200; round++) {
        uint64_t from = round == 0 ? 0 : random_size(&state);
        memset(seen, 0, sizeof seen);
        gm_index_cursor cursor;
        gm_block *block = round == 0 ? gm_size_index_begin(&cursor, &index)
                                     : gm_size_index_begin_at(&cursor, &index, from);
        for (; block; block = gm_size_index_advance(&cursor))
            seen[block - blocks]++;
        for (int i = 0; i < BLOCKS; i++) {
            CHECK(seen[i] <= 1);
            if (blocks[i].size >= from)
                CHECK_EQ_INT(seen[i], 1); /* every block of at least `from` bytes is visited */
            else if (seen[i])
                CHECK(blocks[i].size * 2 > from); /* a smaller one only from the first list */
        }
    }
    gm_index_cursor cursor;
    CHECK(gm_size_index_begin_at(&cursor, &index, 1ull << 60) == NULL); /* every block is at most 4 GiB */
    for (int i = 0; i < BLOCKS; i++)
        gm_size_index_remove(&index, &blocks[i]);
    CHECK_EQ_INT(index.block_count, 0);
    CHECK(gm_size_index_begin(&cursor, &index) == NULL);
    CHECK(gm_size_index_begin_at(&cursor, &index, 4096) == NULL);
}

RUN_TESTS(TEST_CASE(finds_a_fit_whenever_a_larger_class_holds_one), TEST_CASE(cursors_visit_every_block_once))
