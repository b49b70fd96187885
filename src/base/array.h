/*
 * array.h -- room for one more item in an array that grows by doubling.
 *
 * Many lists here (the sim's returned address ranges, the engine's idle chunks, spare events, a host
 * block's streams, the items a reader builds from a file) are plain arrays with a count and a
 * capacity, grown when full. The growth is the same everywhere: double the capacity (a first
 * capacity when empty), realloc, keep the old array if that fails. It lives here once, with the
 * overflow check that each copy would otherwise have to repeat.
 */
#ifndef GM_ARRAY_H
#define GM_ARRAY_H

#include <stddef.h>

/* `items` (an array of *capacity items of item_size bytes, `count` of them in use) with room for one
 * more: `items` itself while count < *capacity, else the array reallocated to twice *capacity
 * (first_capacity when *capacity is 0), with *capacity updated. NULL when host memory cannot be had or
 * the size would overflow: then `items` and *capacity are unchanged and still valid. */
void *gm_array_room_for_one(void *items, size_t count, size_t *capacity, size_t item_size, size_t first_capacity);

#endif
