/*
 * hash_map.c -- see hash_map.h. Keys are mixed with a 64-bit multiplicative hash (Fibonacci
 * hashing), which spreads aligned addresses (whose low bits are all zero) over the table. A keyed map
 * first passes key + secret through a full 64-bit mixer (every output bit depends on every input bit),
 * whose collisions cannot be chosen without the secret.
 */
#include "base/hash_map.h"
#include "base/system_memory.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>

static inline uint64_t mix_fully(uint64_t value)
{
    value ^= value >> 33;
    value *= 0xff51afd7ed558ccdull;
    value ^= value >> 33;
    value *= 0xc4ceb9fe1a85ec53ull;
    return value ^ (value >> 33);
}

static inline size_t slot_for(const gm_hash_map *map, uint64_t key)
{
    if (__builtin_expect(map->secret != 0, 0))
        key = mix_fully(key + map->secret);
    uint64_t mixed = (key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(mixed >> 20) & (map->capacity - 1);
}

/* This process's secret: from the kernel's random source, else from the clock and an address (which
 * address-space randomization varies); never 0. */
static uint64_t process_secret(void)
{
    static _Atomic uint64_t secret;
    uint64_t value = atomic_load_explicit(&secret, memory_order_relaxed);
    if (value)
        return value;
    if (getrandom(&value, sizeof value, GRND_NONBLOCK) != (ssize_t)sizeof value) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        value = mix_fully((uint64_t)now.tv_nsec ^ (uint64_t)now.tv_sec << 32 ^ (uint64_t)(uintptr_t)&secret);
    }
    value |= 1;
    atomic_store_explicit(&secret, value, memory_order_relaxed); /* a race stores one of two good values */
    return value;
}

bool gm_hash_map_init_keyed(gm_hash_map *map, size_t initial_capacity)
{
    bool made = gm_hash_map_init(map, initial_capacity);
    map->secret = process_secret();
    return made;
}

size_t gm_hash_map_probes(const gm_hash_map *map, uint64_t key)
{
    if (map->capacity == 0)
        return 0;
    size_t slot = slot_for(map, key), probes = 1;
    while (map->entries[slot].key != 0 && map->entries[slot].key != key) {
        slot = (slot + 1) & (map->capacity - 1);
        probes++;
    }
    return probes;
}

bool gm_hash_map_init(gm_hash_map *map, size_t initial_capacity)
{
    size_t capacity = 16;
    while (capacity < initial_capacity * 2)
        capacity *= 2;
    map->entries = gm_system_calloc(capacity, sizeof(gm_hash_entry));
    map->capacity = map->entries ? capacity : 0;
    map->count = 0;
    map->secret = 0;
    return map->entries != NULL;
}

void gm_hash_map_free(gm_hash_map *map)
{
    free(map->entries);
    map->entries = NULL;
    map->capacity = 0;
    map->count = 0;
}

static void insert_fresh(gm_hash_map *map, uint64_t key, uint64_t value)
{
    size_t slot = slot_for(map, key);
    while (map->entries[slot].key != 0)
        slot = (slot + 1) & (map->capacity - 1);
    map->entries[slot].key = key;
    map->entries[slot].value = value;
    map->count++;
}

/* The cold path of put: kept out of line so that put stays small. */
__attribute__((noinline)) static bool grow_to(gm_hash_map *map, size_t capacity)
{
    gm_hash_entry *old = map->entries;
    size_t old_capacity = map->capacity;
    gm_hash_entry *fresh = gm_system_calloc(capacity, sizeof(gm_hash_entry));
    if (!fresh)
        return false;
    map->entries = fresh;
    map->capacity = capacity;
    map->count = 0;
    for (size_t i = 0; i < old_capacity; i++)
        if (old[i].key != 0)
            insert_fresh(map, old[i].key, old[i].value);
    free(old);
    return true;
}

bool gm_hash_map_put(gm_hash_map *map, uint64_t key, uint64_t value)
{
    if ((map->count + 1) * 2 > map->capacity && !grow_to(map, map->capacity ? map->capacity * 2 : 16))
        return false;
    size_t slot = slot_for(map, key);
    while (map->entries[slot].key != 0) {
        if (map->entries[slot].key == key) {
            map->entries[slot].value = value;
            return true;
        }
        slot = (slot + 1) & (map->capacity - 1);
    }
    map->entries[slot].key = key;
    map->entries[slot].value = value;
    map->count++;
    return true;
}

bool gm_hash_map_get(const gm_hash_map *map, uint64_t key, uint64_t *value_out)
{
    if (map->capacity == 0 || key == 0)
        return false;
    size_t slot = slot_for(map, key);
    while (map->entries[slot].key != 0) {
        if (map->entries[slot].key == key) {
            *value_out = map->entries[slot].value;
            return true;
        }
        slot = (slot + 1) & (map->capacity - 1);
    }
    return false;
}

bool gm_hash_map_remove(gm_hash_map *map, uint64_t key, uint64_t *value_out)
{
    if (map->capacity == 0 || key == 0)
        return false;
    size_t mask = map->capacity - 1;
    size_t slot = slot_for(map, key);
    while (map->entries[slot].key != key) {
        if (map->entries[slot].key == 0)
            return false;
        slot = (slot + 1) & mask;
    }
    if (value_out)
        *value_out = map->entries[slot].value;
    /* Backward-shift deletion: move later entries of the probe run into the hole when their home
     * slot does not lie cyclically between the hole and their current slot. */
    size_t hole = slot;
    size_t probe = (slot + 1) & mask;
    while (map->entries[probe].key != 0) {
        size_t home = slot_for(map, map->entries[probe].key);
        bool home_between = hole <= probe ? (home > hole && home <= probe) : (home > hole || home <= probe);
        if (!home_between) {
            map->entries[hole] = map->entries[probe];
            hole = probe;
        }
        probe = (probe + 1) & mask;
    }
    map->entries[hole].key = 0;
    map->entries[hole].value = 0;
    map->count--;
    return true;
}
