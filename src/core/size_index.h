/*
 * size_index.h -- free blocks by size (TLSF): O(1) insert, remove and good-fit find.
 *
 * Sizes are indexed in units of 512 bytes: first level = position of the highest bit, second level
 * = the next GM_INDEX_SECOND_BITS bits, so each list holds sizes within 1/32 of each other.
 */
#ifndef GM_SIZE_INDEX_H
#define GM_SIZE_INDEX_H

#include "base/list.h"

#include <stdint.h>

typedef struct gm_block gm_block;

#define GM_INDEX_SECOND_BITS 5
#define GM_INDEX_SECOND_COUNT (1 << GM_INDEX_SECOND_BITS)
#define GM_INDEX_FIRST_COUNT 48

typedef struct gm_size_index {
    uint64_t first_bitmap;
    uint32_t second_bitmaps[GM_INDEX_FIRST_COUNT];
    gm_list lists[GM_INDEX_FIRST_COUNT][GM_INDEX_SECOND_COUNT]; /* of blocks, through gm_block.link */
    uint64_t block_count;
    uint64_t bytes;
} gm_size_index;

void gm_size_index_insert(gm_size_index *index, gm_block *block);
void gm_size_index_remove(gm_size_index *index, gm_block *block);
/* A free block of at least `size` bytes, close to the smallest such (the exact-size list is searched
 * for the best fit, larger lists give their first block), or NULL. */
gm_block *gm_size_index_find(const gm_size_index *index, uint64_t size);
/* Every block of an index, list by list:
 *     gm_index_cursor cursor;
 *     for (gm_block *block = gm_size_index_begin(&cursor, index); block; block = gm_size_index_advance(&cursor))
 * The index must not change during the walk. */
typedef struct gm_index_cursor {
    const gm_size_index *index;
    unsigned first;
    unsigned second;
    gm_block *block;
} gm_index_cursor;
gm_block *gm_size_index_begin(gm_index_cursor *cursor, const gm_size_index *index);
/* The same from the list that holds blocks of `size` bytes: every block of at least `size` bytes is
 * visited (and some smaller ones of that first list). */
gm_block *gm_size_index_begin_at(gm_index_cursor *cursor, const gm_size_index *index, uint64_t size);
gm_block *gm_size_index_advance(gm_index_cursor *cursor);
/* The largest block in the index, or NULL (for reports). */
gm_block *gm_size_index_largest(const gm_size_index *index);

#endif
