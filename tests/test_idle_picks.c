/*
 * test_idle_picks.c -- which idle chunk a growth moves next (chunks.c, pages_pick_idle_chunk): the
 * smallest that covers what remains, else the largest that does not, within the room. The pick uses
 * binary searches over the sorted list (taken entries keep their sizes), and taking an entry trims the
 * list at both ends; the rule is the linear scan below, which the pick must match entry for entry on
 * random lists with many equal sizes, through whole sequences of picks and takes as a growth makes them.
 */
#include "test.h"

#include "core/pages/pages.h"

/* The rule, as a plain scan: the first entry that fits the room and covers `remaining`, else the last
 * that fits the room. */
static ptrdiff_t rule(const idle_chunk *idle, size_t count, uint64_t remaining, uint64_t room)
{
    ptrdiff_t largest_below = -1;
    for (size_t i = 0; i < count; i++) {
        if (!idle[i].chunk || idle[i].size > room)
            continue;
        if (idle[i].size >= remaining)
            return (ptrdiff_t)i;
        largest_below = (ptrdiff_t)i;
    }
    return largest_below;
}

enum { MAX_CHUNKS = 300 };

static int by_size(const void *left, const void *right)
{
    uint64_t a = ((const page_chunk *)left)->size, b = ((const page_chunk *)right)->size;
    return a < b ? -1 : a > b;
}

static void picks_follow_the_rule(void)
{
    static page_chunk chunks[MAX_CHUNKS];
    static idle_chunk idle[MAX_CHUNKS];
    static const uint64_t sizes[] = {1, 1, 1, 2, 2, 4, 8, 8, 64}; /* pages: mostly small, many equal */
    uint64_t seed = 12345;
    page_engine engine;
    memset(&engine, 0, sizeof engine);
    engine.idle = idle;
    size_t picks = 0, fallbacks = 0;
    for (int round = 0; round < 2000; round++) {
        size_t count = 1 + test_random(&seed) % MAX_CHUNKS;
        for (size_t i = 0; i < count; i++)
            chunks[i].size = sizes[test_random(&seed) % (sizeof sizes / sizeof sizes[0])];
        qsort(chunks, count, sizeof chunks[0], by_size);
        for (size_t i = 0; i < count; i++)
            idle[i] = (idle_chunk){&chunks[i], NULL, chunks[i].size};
        uint64_t need = 1 + test_random(&seed) % 800, room = test_random(&seed) % 3 ? UINT64_MAX : need + test_random(&seed) % 70;
        uint64_t covered = 0;
        size_t first = 0;
        while (covered < need) {
            uint64_t room_left = room == UINT64_MAX ? room : room - covered;
            ptrdiff_t expected = rule(idle, count, need - covered, room_left);
            ptrdiff_t pick = pages_pick_idle_chunk(idle, first, count, need - covered, room_left);
            CHECK_EQ_INT(pick, expected);
            if (pick < 0 || pick != expected)
                break;
            picks++;
            fallbacks += idle[pick].size < need - covered;
            covered += idle[pick].size;
            pages_take_idle_chunk(&engine, pick, &first, &count);
            CHECK(first == count || idle[first].chunk != NULL);     /* trimmed at the front */
            CHECK(count == first || idle[count - 1].chunk != NULL); /* and at the end */
            if (room != UINT64_MAX && covered > room)
                break;
        }
    }
    printf("%zu picks, %zu of them the largest below what remained\n", picks, fallbacks);
    CHECK(picks > 10000);   /* the sequences were long */
    CHECK(fallbacks > 1000); /* and took the largest below what remains many times */
}

RUN_TESTS(TEST_CASE(picks_follow_the_rule))
