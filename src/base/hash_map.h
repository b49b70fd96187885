/*
 * hash_map.h -- an open-addressing hash map from 64-bit keys to 64-bit values.
 *
 * Linear probing, power-of-two capacity, load factor at most 1/2, deletion by backward shift
 * (no tombstones), so a lookup touches one or two cache lines. Key 0 marks an empty slot, so
 * key 0 cannot be stored: callers store addresses or ids + 1. Growth is the only allocation and
 * happens when the map doubles.
 *
 * Keys that come from a file (a trace's ids, a history's addresses) could be chosen to share one home
 * slot, and each insert would then walk all the others: loading n of them would take n * n / 2 probes.
 * A map made with gm_hash_map_init_keyed mixes its keys with a secret of this process first, so that no
 * file can know which keys collide. The allocator's own maps, whose keys it makes itself, skip that.
 */
#ifndef GM_HASH_MAP_H
#define GM_HASH_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gm_hash_entry {
    uint64_t key;
    uint64_t value;
} gm_hash_entry;

typedef struct gm_hash_map {
    gm_hash_entry *entries;
    size_t capacity; /* a power of two */
    size_t count;
    uint64_t secret; /* 0: keys placed as they are; else mixed with it first (gm_hash_map_init_keyed) */
} gm_hash_map;

bool gm_hash_map_init(gm_hash_map *map, size_t initial_capacity);
/* The same, for keys that come from outside the process (see above). */
bool gm_hash_map_init_keyed(gm_hash_map *map, size_t initial_capacity);
/* How many slots a lookup of `key` walks (1: found or missed in its home slot); for tests. */
size_t gm_hash_map_probes(const gm_hash_map *map, uint64_t key);
void gm_hash_map_free(gm_hash_map *map);
/* Insert or replace. False only if memory for growth could not be had. */
bool gm_hash_map_put(gm_hash_map *map, uint64_t key, uint64_t value);
/* The value for key into *value_out; false if absent. */
bool gm_hash_map_get(const gm_hash_map *map, uint64_t key, uint64_t *value_out);
/* Remove key, giving its value; false if absent. */
bool gm_hash_map_remove(gm_hash_map *map, uint64_t key, uint64_t *value_out);

/* Iterate: for (size_t i = 0; i < map->capacity; i++) if (map->entries[i].key) ... */

#endif
