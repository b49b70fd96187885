/*
 * test_hash_map.c -- base/hash_map.h: keys that share one home slot in a plain map (built by inverting
 * its mixing, as a crafted trace could) make every insert walk the others; the same keys in a keyed map
 * spread out, and both maps find, replace and remove every key.
 */
#include "test.h"

#include "base/hash_map.h"

#define KEYS 2000

/* The inverse of an odd number modulo 2^64 (Newton's iteration doubles the correct bits each step). */
static uint64_t inverse_of(uint64_t odd)
{
    uint64_t inverse = odd;
    for (int step = 0; step < 6; step++)
        inverse *= 2 - odd * inverse;
    return inverse;
}

/* Keys whose multiplicative hash differs only in bits 50 and up: one home slot in any plain map of up
 * to 2^30 slots. Each undoes the map's steps: the product, then key ^ (key >> 29). */
static void colliding_keys(uint64_t *keys)
{
    uint64_t inverse = inverse_of(0x9E3779B97F4A7C15ull);
    for (uint64_t i = 0; i < KEYS; i++) {
        uint64_t folded = ((i + 1) << 50) * inverse;
        keys[i] = folded ^ (folded >> 29) ^ (folded >> 58);
    }
}

static double mean_probes(const gm_hash_map *map, const uint64_t *keys)
{
    double total = 0;
    for (size_t i = 0; i < KEYS; i++)
        total += (double)gm_hash_map_probes(map, keys[i]);
    return total / KEYS;
}

/* Every key is found with its value, replaced, and removed; then none is left. */
static void check_contents(gm_hash_map *map, const uint64_t *keys)
{
    uint64_t value = 0;
    for (size_t i = 0; i < KEYS; i++)
        CHECK(gm_hash_map_get(map, keys[i], &value) && value == i);
    CHECK(gm_hash_map_put(map, keys[7], 70) && gm_hash_map_get(map, keys[7], &value) && value == 70);
    CHECK_EQ_INT(map->count, KEYS);
    for (size_t i = 0; i < KEYS; i++)
        CHECK(gm_hash_map_remove(map, keys[i], NULL));
    CHECK_EQ_INT(map->count, 0);
    CHECK(!gm_hash_map_get(map, keys[0], &value));
}

static void crafted_keys_collide_in_a_plain_map_and_spread_in_a_keyed_one(void)
{
    static uint64_t keys[KEYS];
    colliding_keys(keys);
    gm_hash_map plain, keyed;
    REQUIRE(gm_hash_map_init(&plain, 16) && gm_hash_map_init_keyed(&keyed, 16));
    CHECK(plain.secret == 0 && keyed.secret != 0);
    for (size_t i = 0; i < KEYS; i++)
        REQUIRE(gm_hash_map_put(&plain, keys[i], i) && gm_hash_map_put(&keyed, keys[i], i));
    CHECK(mean_probes(&plain, keys) > KEYS / 4.0); /* the construction works: one run of all keys */
    CHECK(mean_probes(&keyed, keys) < 3.0);        /* about 1.5 at a load of at most one half */
    check_contents(&plain, keys);
    check_contents(&keyed, keys);
    gm_hash_map another;
    REQUIRE(gm_hash_map_init_keyed(&another, 16));
    CHECK(another.secret == keyed.secret); /* one secret per process */
    gm_hash_map_free(&plain);
    gm_hash_map_free(&keyed);
    gm_hash_map_free(&another);
}

static void an_empty_map_reports_no_probes(void)
{
    gm_hash_map map = {0};
    CHECK_EQ_INT(gm_hash_map_probes(&map, 5), 0);
    CHECK(gm_hash_map_put(&map, 5, 1)); /* a zeroed map grows on its first insert */
    CHECK_EQ_INT(gm_hash_map_probes(&map, 5), 1);
    gm_hash_map_free(&map);
}

RUN_TESTS(TEST_CASE(crafted_keys_collide_in_a_plain_map_and_spread_in_a_keyed_one),
          TEST_CASE(an_empty_map_reports_no_probes))
