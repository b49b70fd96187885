/*
 * test_lingering_aliases.c -- undone stitches' second mappings kept once their stream has passed them
 * (aliases.c): a growth's look at the old mappings unmaps those of chunks moved ahead at once, but leaves
 * up to MAX_LINGERING_ALIASES lingering ones, the oldest going first beyond that. White-box: the
 * mappings are made on the simulated device directly and handed to the engine's list, as an undone
 * stitch leaves them.
 */
#include "test.h"

#include "core/allocator.h"
#include "core/pages/pages.h"

#include <stdbool.h>

#define MIB (1ull << 20)
#define MAPPINGS (MAX_LINGERING_ALIASES + 4)

static void beyond_the_cap_the_oldest_lingering_mappings_go(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
    void *block = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &block)); /* stream 0's heap */
    gm_arena *arena = gm_lock_arena(allocator);
    page_engine *engine = engine_of(arena);
    gm_heap *heap = arena->heaps[0];
    uint64_t page = engine->page_size, handle = 0;
    uintptr_t range = 0;
    CHECK_OK(gm_backend_address_reserve(arena->backend, (MAPPINGS + 1) * page, &range));
    CHECK_OK(gm_backend_physical_create(arena->backend, page, &handle));
    state_of(heap)->waited_at = engine->frees + MAPPINGS + 1; /* the stream has passed every free below */
    for (uint64_t i = 0; i < MAPPINGS; i++) {
        CHECK_OK(gm_backend_map(arena->backend, range + i * page, page, handle));
        REQUIRE(pages_alias_room(arena, 1));
        /* Listed newest first, so that the list's order is not the age's. */
        page_alias alias = {range + i * page, page, handle, heap, engine->frees + MAPPINGS - i, false, true};
        pages_add_alias(arena, &alias);
    }
    page_alias moved = {range + MAPPINGS * page, page, handle, heap, engine->frees + 1, false, false};
    CHECK_OK(gm_backend_map(arena->backend, moved.address, page, handle));
    REQUIRE(pages_alias_room(arena, 1));
    pages_add_alias(arena, &moved);
    int64_t unmaps_before = arena->backend->calls[GM_CALL_UNMAP];
    pages_retire_passed_aliases(arena);
    CHECK_EQ_INT(arena->backend->calls[GM_CALL_UNMAP] - unmaps_before, 4 + 1);
    CHECK_EQ_INT(engine->alias_count, MAX_LINGERING_ALIASES);
    for (size_t i = 0; i < engine->alias_count; i++) { /* the four oldest went: freed at frees + 1..4 */
        CHECK(engine->aliases[i].lingering);
        CHECK(engine->aliases[i].freed_at > engine->frees + 4);
    }
    pages_retire_passed_aliases(arena); /* within the cap: they stay */
    CHECK_EQ_INT(engine->alias_count, MAX_LINGERING_ALIASES);
    CHECK_OK(pages_retire_aliases_of(arena, handle)); /* the chunk's memory going: every one goes */
    CHECK_EQ_INT(engine->alias_count, 0);
    CHECK_OK(gm_backend_physical_release(arena->backend, handle, page));
    CHECK_OK(gm_backend_address_free(arena->backend, range, (MAPPINGS + 1) * page));
    gm_unlock_arena(allocator);
    CHECK_OK(gm_free(allocator, block));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(beyond_the_cap_the_oldest_lingering_mappings_go))
