/*
 * size_index.c -- a TLSF-style segregated index of free blocks, O(1) to insert, remove and find.
 *
 * Sizes (multiples of 512) are counted in 512-byte units u. Units below 32 each get a list of their
 * own (first level 0). Above, the first level is the position of u's highest bit and the second
 * level the next five bits, so one list holds sizes within 1/32 of each other. A 64-bit bitmap says
 * which first levels have blocks and a 32-bit bitmap per first level which of its lists do, so the
 * next non-empty list is found with two bit scans.
 *
 * find() is a good fit that is nearly a best fit: it scans the request's own list (bounded) for the
 * smallest block that fits, taking an exact size at once (training loops repeat sizes exactly),
 * and otherwise takes the smallest of the first few blocks of the next non-empty list, every one of
 * which fits.
 */
#include "core/size_index.h"

#include "core/block.h"

#include <stdbool.h>

#define SCAN_LIMIT 16

typedef struct list_position {
    unsigned first;
    unsigned second;
} list_position;

static inline list_position position_of(uint64_t size)
{
    uint64_t units = size >> 9;
    if (units < GM_INDEX_SECOND_COUNT)
        return (list_position){0, (unsigned)units};
    unsigned high_bit = 63u - (unsigned)__builtin_clzll(units);
    unsigned first = high_bit - GM_INDEX_SECOND_BITS + 1;
    if (first >= GM_INDEX_FIRST_COUNT)
        return (list_position){GM_INDEX_FIRST_COUNT - 1, GM_INDEX_SECOND_COUNT - 1};
    unsigned second = (unsigned)(units >> (high_bit - GM_INDEX_SECOND_BITS)) & (GM_INDEX_SECOND_COUNT - 1);
    return (list_position){first, second};
}

void gm_size_index_insert(gm_size_index *index, gm_block *block)
{
    list_position at = position_of(block->size);
    gm_list_push_front(&index->lists[at.first][at.second], &block->link);
    index->first_bitmap |= 1ull << at.first;
    index->second_bitmaps[at.first] |= 1u << at.second;
    index->block_count++;
    index->bytes += block->size;
}

void gm_size_index_remove(gm_size_index *index, gm_block *block)
{
    list_position at = position_of(block->size);
    gm_list *list = &index->lists[at.first][at.second];
    gm_list_remove(list, &block->link);
    if (!list->first) {
        index->second_bitmaps[at.first] &= ~(1u << at.second);
        if (!index->second_bitmaps[at.first])
            index->first_bitmap &= ~(1ull << at.first);
    }
    index->block_count--;
    index->bytes -= block->size;
}

/* The smallest block of at least `size` among the first SCAN_LIMIT of a list; an exact fit ends the scan. */
static inline gm_block *best_in_list(const gm_list *list, uint64_t size)
{
    gm_block *best = NULL;
    int scanned = 0;
    for (gm_block *block = gm_block_of(list->first); block && scanned < SCAN_LIMIT;
         block = gm_block_of(block->link.next), scanned++) {
        if (block->size < size || (best && block->size >= best->size))
            continue;
        best = block;
        if (block->size == size)
            break;
    }
    return best;
}

/* The first non-empty list after position `at` (its position in *next_out), or false. */
static bool next_nonempty_list(const gm_size_index *index, list_position at, list_position *next_out)
{
    uint32_t later_seconds = at.second + 1 < GM_INDEX_SECOND_COUNT
                                 ? index->second_bitmaps[at.first] & ~((2u << at.second) - 1)
                                 : 0;
    unsigned first = at.first;
    if (!later_seconds) {
        uint64_t later_firsts = at.first + 1 < 64 ? index->first_bitmap & ~((2ull << at.first) - 1) : 0;
        if (!later_firsts)
            return false;
        first = (unsigned)__builtin_ctzll(later_firsts);
        later_seconds = index->second_bitmaps[first];
    }
    *next_out = (list_position){first, (unsigned)__builtin_ctz(later_seconds)};
    return true;
}

gm_block *gm_size_index_find(const gm_size_index *index, uint64_t size)
{
    list_position at = position_of(size);
    gm_block *fit = best_in_list(&index->lists[at.first][at.second], size);
    if (fit)
        return fit;
    /* Every block of a later list is larger than `size`. */
    list_position next;
    return next_nonempty_list(index, at, &next) ? best_in_list(&index->lists[next.first][next.second], size) : NULL;
}

gm_block *gm_size_index_begin(gm_index_cursor *cursor, const gm_size_index *index)
{
    return gm_size_index_begin_at(cursor, index, 0);
}

gm_block *gm_size_index_begin_at(gm_index_cursor *cursor, const gm_size_index *index, uint64_t size)
{
    list_position at = position_of(size);
    cursor->index = index;
    cursor->block = NULL;
    if (!index->lists[at.first][at.second].first && !next_nonempty_list(index, at, &at))
        return NULL;
    cursor->first = at.first;
    cursor->second = at.second;
    return cursor->block = gm_block_of(index->lists[at.first][at.second].first);
}

gm_block *gm_size_index_advance(gm_index_cursor *cursor)
{
    if (cursor->block && cursor->block->link.next)
        return cursor->block = gm_block_of(cursor->block->link.next);
    list_position next;
    if (!next_nonempty_list(cursor->index, (list_position){cursor->first, cursor->second}, &next))
        return cursor->block = NULL;
    cursor->first = next.first;
    cursor->second = next.second;
    return cursor->block = gm_block_of(cursor->index->lists[next.first][next.second].first);
}

gm_block *gm_size_index_largest(const gm_size_index *index)
{
    if (!index->first_bitmap)
        return NULL;
    unsigned first = 63u - (unsigned)__builtin_clzll(index->first_bitmap);
    unsigned second = 31u - (unsigned)__builtin_clz(index->second_bitmaps[first]);
    gm_block *largest = NULL;
    for (gm_block *block = gm_block_of(index->lists[first][second].first); block; block = gm_block_of(block->link.next))
        if (!largest || block->size > largest->size)
            largest = block;
    return largest;
}
