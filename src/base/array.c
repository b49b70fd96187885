/*
 * array.c -- see array.h.
 */
#include "base/array.h"
#include "base/system_memory.h"

#include <stdint.h>
#include <stdlib.h>

void *gm_array_room_for_one(void *items, size_t count, size_t *capacity, size_t item_size, size_t first_capacity)
{
    if (count < *capacity)
        return items;
    size_t grown_capacity = *capacity ? *capacity : first_capacity;
    if (*capacity) {
        if (grown_capacity > SIZE_MAX / 2)
            return NULL;
        grown_capacity *= 2;
    }
    if (grown_capacity == 0 || item_size == 0 || grown_capacity > SIZE_MAX / item_size)
        return NULL;
    void *grown = gm_system_realloc(items, grown_capacity * item_size);
    if (grown)
        *capacity = grown_capacity;
    return grown;
}
