/*
 * test_array.c -- gm_array_room_for_one (base/array.h): the same array while there is room, doubling
 * from a first capacity when full, items kept across growth, and a refusal that changes nothing when
 * the size would overflow.
 */
#include "test.h"

#include "base/array.h"

static void grows_by_doubling_and_keeps_the_items(void)
{
    int *items = NULL;
    size_t count = 0, capacity = 0;
    size_t capacities_seen[8] = {0}, growths = 0;
    for (int value = 0; value < 100; value++) {
        size_t before = capacity;
        int *room = gm_array_room_for_one(items, count, &capacity, sizeof *items, 4);
        REQUIRE(room != NULL);
        if (capacity != before) {
            CHECK(count == before); /* it grows only when full */
            if (growths < 8)
                capacities_seen[growths] = capacity;
            growths++;
        } else {
            CHECK(room == items); /* while there is room, the array stays */
        }
        items = room;
        items[count++] = value;
    }
    CHECK_EQ_INT(growths, 6); /* 4, 8, 16, 32, 64, 128 */
    CHECK_EQ_INT(capacities_seen[0], 4);
    CHECK_EQ_INT(capacities_seen[1], 8);
    CHECK_EQ_INT(capacities_seen[5], 128);
    CHECK_EQ_INT(capacity, 128);
    for (int value = 0; value < 100; value++)
        CHECK_EQ_INT(items[value], value);
    free(items);
}

static void an_overflowing_size_is_refused_and_changes_nothing(void)
{
    char first[4] = {1, 2, 3, 4};
    char *items = malloc(sizeof first);
    REQUIRE(items != NULL);
    memcpy(items, first, sizeof first);
    size_t capacity = SIZE_MAX / 2 + 1; /* doubling it overflows */
    CHECK(gm_array_room_for_one(items, capacity, &capacity, 1, 4) == NULL);
    CHECK(capacity == SIZE_MAX / 2 + 1);
    capacity = 4; /* doubled, 8 items of SIZE_MAX / 4 bytes overflow */
    CHECK(gm_array_room_for_one(items, 4, &capacity, SIZE_MAX / 4, 4) == NULL);
    CHECK_EQ_INT(capacity, 4);
    CHECK(memcmp(items, first, sizeof first) == 0); /* the array is still valid and unchanged */
    size_t none = 0;
    CHECK(gm_array_room_for_one(NULL, 0, &none, 8, 0) == NULL); /* no first capacity: no room */
    CHECK_EQ_INT(none, 0);
    free(items);
}

RUN_TESTS(TEST_CASE(grows_by_doubling_and_keeps_the_items), TEST_CASE(an_overflowing_size_is_refused_and_changes_nothing))
