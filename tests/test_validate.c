/*
 * test_validate.c -- gm_validate finds what it is there to find.
 *
 * The failure workloads and fuzz_api trust gm_validate to notice when the books and the memory part
 * ways; a check in it that never fires may be one that cannot. So each invariant it checks is broken
 * here by hand, one at a time, on a small allocator whose layout is known (three 8 MiB blocks, the
 * middle one freed, the rest of the region unmapped): gm_validate must return GM_ERROR_CORRUPT with a
 * message that names the fault, and pass again once the field is mended. The front end's checks (the
 * live map, the pending frees, the size indexes, the statistics, the device's own count) and the pages
 * engine's (blocks in place, pages mapped under every mapped block, the page table and its groups'
 * counts, mapped and waiting bytes, a growth lane's list of live blocks) each get theirs.
 */
#include "test.h"

#include "core/allocator.h"
#include "core/pages/pages.h"

#include <stdbool.h>

#define MIB (1ull << 20)
#define BLOCK_SIZE (8 * MIB)

/* Do `breaking`: gm_validate refuses with a message holding `message`; do `mending`: it passes. */
#define EXPECT_CAUGHT(allocator, breaking, mending, message)                                             \
    do {                                                                                                  \
        CHECK_OK(gm_validate(allocator));                                                                 \
        breaking;                                                                                         \
        CHECK_STATUS(gm_validate(allocator), GM_ERROR_CORRUPT);                                           \
        CHECK_MESSAGE(message);                                                                           \
        mending;                                                                                          \
        CHECK_OK(gm_validate(allocator));                                                                 \
    } while (0)

typedef struct scene {
    gm_allocator *allocator;
    void *first, *last;   /* the first and third blocks, allocated */
    gm_block *allocated;  /* the first's block */
    gm_block *freed;      /* the middle block, free */
    gm_block *unmapped;   /* the region's unmapped rest */
    gm_region *region;
} scene;

static gm_block *block_of(gm_allocator *allocator, const void *pointer)
{
    uint64_t value = 0;
    REQUIRE(gm_hash_map_get(&allocator->live_blocks, (uintptr_t)pointer, &value));
    return (gm_block *)(uintptr_t)value;
}

static gm_block *block_in(const gm_region *region, uintptr_t address, int state)
{
    for (gm_block *block = region->first_block; block; block = block->next)
        if ((!address || block->address == address) && block->state == state)
            return block;
    return NULL;
}

static scene make_scene(void)
{
    scene made = {.allocator = make_allocator("backend:sim,capacity:4GiB")};
    void *middle = NULL;
    CHECK_OK(gm_malloc(made.allocator, BLOCK_SIZE, 0, &made.first));
    CHECK_OK(gm_malloc(made.allocator, BLOCK_SIZE, 0, &middle));
    CHECK_OK(gm_malloc(made.allocator, BLOCK_SIZE, 0, &made.last));
    made.allocated = block_of(made.allocator, made.first);
    made.region = made.allocated->region;
    REQUIRE(block_of(made.allocator, middle)->region == made.region);
    CHECK_OK(gm_free(made.allocator, middle));
    made.freed = block_in(made.region, (uintptr_t)middle, GM_BLOCK_FREE);
    made.unmapped = block_in(made.region, 0, GM_BLOCK_UNMAPPED);
    REQUIRE(made.freed && made.unmapped && made.allocated->next == made.freed);
    CHECK_OK(gm_validate(made.allocator));
    return made;
}

static void end_scene(scene *made)
{
    CHECK_OK(gm_free(made->allocator, made->first));
    CHECK_OK(gm_free(made->allocator, made->last));
    CHECK_OK(gm_validate(made->allocator));
    gm_destroy(made->allocator, NULL);
}

/* ---------------------------------------------------------------- the front end's checks */

static void a_live_map_entry_that_is_not_allocated(void)
{
    scene made = make_scene();
    EXPECT_CAUGHT(made.allocator, made.allocated->state = GM_BLOCK_PENDING, made.allocated->state = GM_BLOCK_ALLOCATED,
                  "is not an allocated block");
    end_scene(&made);
}

static void a_size_index_out_of_step(void)
{
    scene made = make_scene();
    gm_size_index *index = gm_heap_index(made.freed->heap, made.freed->pool);
    EXPECT_CAUGHT(made.allocator, made.freed->state = GM_BLOCK_HELD, made.freed->state = GM_BLOCK_FREE,
                  "size index holds block");
    EXPECT_CAUGHT(made.allocator, index->block_count++, index->block_count--, "size index counts");
    EXPECT_CAUGHT(made.allocator, index->bytes += 512, index->bytes -= 512, "size index counts");
    end_scene(&made);
}

static void statistics_unlike_the_blocks(void)
{
    scene made = make_scene();
    gm_stat *reserved = &made.allocator->arena.stats->reserved_bytes[GM_POOL_LARGE];
    EXPECT_CAUGHT(made.allocator, reserved->current += 2 * MIB, reserved->current -= 2 * MIB,
                  "reserved_bytes.all.current is");
    end_scene(&made);
}

/* Device memory that no book counts: what a chunk released in the books but not on the device leaves. */
static void device_memory_outside_the_books(void)
{
    scene made = make_scene();
    gm_backend *backend = made.allocator->arena.backend;
    uint64_t handle = 0;
    EXPECT_CAUGHT(made.allocator, CHECK_OK(gm_backend_physical_create(backend, 2 * MIB, &handle)),
                  CHECK_OK(gm_backend_physical_release(backend, handle, 2 * MIB)), "the device holds");
    end_scene(&made);
}

/* A block used on streams 2 and 3 and freed waits in their queues. */
static void pending_frees_out_of_step(void)
{
    scene made = make_scene();
    gm_allocator *allocator = made.allocator;
    void *shared = NULL;
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    CHECK_OK(gm_malloc(allocator, 4096, 1, &shared));
    CHECK_OK(gm_record_stream(allocator, shared, 2));
    CHECK_OK(gm_free(allocator, shared));
    REQUIRE(allocator->pending_queues && allocator->pending_queues->head);
    gm_pending_free *pending = allocator->pending_queues->head;
    EXPECT_CAUGHT(allocator, pending->block->state = GM_BLOCK_ALLOCATED, pending->block->state = GM_BLOCK_PENDING,
                  "pending free of block");
    EXPECT_CAUGHT(allocator, pending->stream++, pending->stream--, "in the queue of stream");
    EXPECT_CAUGHT(allocator, allocator->queue_of_stream.count++, allocator->queue_of_stream.count--,
                  "streams map to queues of pending frees");
    /* More events than frees: the block never reads as active in the count, which the statistics show;
     * fewer: said as such. */
    EXPECT_CAUGHT(allocator, pending->block->pending_events++, pending->block->pending_events--,
                  "active_bytes.all.current is");
    EXPECT_CAUGHT(allocator, pending->block->pending_events--, pending->block->pending_events++,
                  "waits for another count of events than its pending frees");
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    end_scene(&made);
}

/* A block used on another stream and freed while a pool is being allocated to waits for the end. */
static void a_free_held_for_a_capture_out_of_step(void)
{
    scene made = make_scene();
    gm_allocator *allocator = made.allocator;
    void *shared = NULL;
    CHECK_OK(gm_malloc(allocator, 4096, 1, &shared));
    CHECK_OK(gm_record_stream(allocator, shared, 2));
    gm_pool_id pool = {7, 7};
    CHECK_OK(gm_begin_allocate_to_pool(allocator, pool, NULL, NULL));
    CHECK_OK(gm_free(allocator, shared));
    REQUIRE(allocator->held_for_capture);
    gm_block *held = allocator->held_for_capture->block;
    EXPECT_CAUGHT(allocator, held->pending_events++, held->pending_events--, "free held for a capture");
    CHECK_OK(gm_end_allocate_to_pool(allocator, pool));
    CHECK_OK(gm_release_pool(allocator, pool));
    end_scene(&made);
}

/* ---------------------------------------------------------------- the region's blocks */

static void blocks_out_of_place(void)
{
    scene made = make_scene();
    EXPECT_CAUGHT(made.allocator, made.freed->previous = NULL, made.freed->previous = made.allocated, "out of place");
    EXPECT_CAUGHT(made.allocator, made.freed->region = NULL, made.freed->region = made.region, "out of place");
    EXPECT_CAUGHT(made.allocator, made.region->size += 2 * MIB, made.region->size -= 2 * MIB, "blocks cover");
    end_scene(&made);
}

/* The first block made free beside the free middle, hidden from the live map so that the map's check
 * does not answer first: two free neighbours, and a free block that no size index holds. */
static void free_blocks_unmerged_or_unindexed(void)
{
    scene made = make_scene();
    gm_allocator *allocator = made.allocator;
    gm_block *first = made.allocated;
    uint64_t value = 0;
    REQUIRE(gm_hash_map_remove(&allocator->live_blocks, first->address, &value));
    first->state = GM_BLOCK_FREE;
    first->indexed = 1;
    CHECK_STATUS(gm_validate(allocator), GM_ERROR_CORRUPT);
    CHECK_MESSAGE("two adjacent blocks of state 0");
    first->indexed = 0;
    CHECK_STATUS(gm_validate(allocator), GM_ERROR_CORRUPT);
    CHECK_MESSAGE("is not indexed");
    first->state = GM_BLOCK_ALLOCATED;
    REQUIRE(gm_hash_map_put(&allocator->live_blocks, first->address, value));
    CHECK_OK(gm_validate(allocator));
    end_scene(&made);
}

/* ---------------------------------------------------------------- the pages engine's own */

static void a_vacant_block_of_another_heap(void)
{
    scene made = make_scene();
    void *elsewhere = NULL;
    CHECK_OK(gm_malloc(made.allocator, BLOCK_SIZE, 1, &elsewhere));
    gm_heap *other = block_of(made.allocator, elsewhere)->heap;
    REQUIRE(other != made.unmapped->heap);
    EXPECT_CAUGHT(made.allocator, made.unmapped->heap = other, made.unmapped->heap = made.region->heap,
                  "belongs to another heap than its region");
    CHECK_OK(gm_free(made.allocator, elsewhere));
    end_scene(&made);
}

static void the_page_table_out_of_step(void)
{
    scene made = make_scene();
    page_region *data = data_of(made.region);
    uint64_t page_size = engine_of(&made.allocator->arena)->page_size;
    uint64_t page = (made.allocated->address - made.region->base) / page_size;
    page_chunk *chunk = data->pages[page], stranger = {0};
    char expected[128];
    snprintf(expected, sizeof expected, "(state %d) has page %" PRIu64 " unmapped", GM_BLOCK_ALLOCATED, page);
    EXPECT_CAUGHT(made.allocator, data->pages[page] = NULL, data->pages[page] = chunk, expected);
    snprintf(expected, sizeof expected, "page %" PRIu64 " does not point at its chunk", page);
    EXPECT_CAUGHT(made.allocator, data->pages[page] = &stranger, data->pages[page] = chunk, expected);
    uint64_t unmapped_page = (made.unmapped->address - made.region->base) / page_size;
    snprintf(expected, sizeof expected, "(state %d) has page %" PRIu64 " mapped", GM_BLOCK_UNMAPPED, unmapped_page);
    EXPECT_CAUGHT(made.allocator, data->pages[unmapped_page] = &stranger, data->pages[unmapped_page] = NULL,
                  expected);
    end_scene(&made);
}

/* Each group of pages counts its mapped pages, so that validation can pass over unmapped groups: a count
 * above what the group holds, or a group counted as empty though a chunk lies in it, is caught. */
static void the_page_groups_out_of_step(void)
{
    scene made = make_scene();
    page_region *data = data_of(made.region);
    uint64_t page_size = engine_of(&made.allocator->arena)->page_size;
    uint64_t group = (made.allocated->address - made.region->base) / page_size / PAGE_GROUP;
    uint8_t count = data->mapped_in_group[group];
    REQUIRE(count > 0 && count < PAGE_GROUP);
    char expected[128];
    snprintf(expected, sizeof expected, "counts %u mapped pages in group %" PRIu64 ", holds %u", count + 1u, group,
             (unsigned)count);
    EXPECT_CAUGHT(made.allocator, data->mapped_in_group[group]++, data->mapped_in_group[group]--, expected);
    EXPECT_CAUGHT(made.allocator, data->mapped_in_group[group] = 0, data->mapped_in_group[group] = count,
                  "mapped pages in its groups, its chunks hold");
    end_scene(&made);
}

static void mapped_and_waiting_bytes_out_of_step(void)
{
    scene made = make_scene();
    page_region *data = data_of(made.region);
    page_engine *engine = engine_of(&made.allocator->arena);
    EXPECT_CAUGHT(made.allocator, data->mapped_bytes += engine->page_size, data->mapped_bytes -= engine->page_size,
                  "mapped bytes");
    EXPECT_CAUGHT(made.allocator, engine->waiting_bytes += engine->page_size,
                  engine->waiting_bytes -= engine->page_size, "waiting bytes");
    end_scene(&made);
}

/* Two key-value caches of stream 5 regrown 32 times, each by a copy 64 KiB larger, open the stream's
 * growth lane (lane.c); its list of live blocks must match the blocks it holds. */
static void a_growth_lane_out_of_step(void)
{
    scene made = make_scene();
    gm_allocator *allocator = made.allocator;
    void *caches[2][2] = {{NULL}};
    for (int step = 0; step < 32; step++)
        for (int cache = 0; cache < 2; cache++) {
            CHECK_OK(gm_malloc(allocator, 2 * MIB + (uint64_t)(step + 1) * (64 << 10), 5, &caches[cache][step % 2]));
            if (caches[cache][(step + 1) % 2])
                CHECK_OK(gm_free(allocator, caches[cache][(step + 1) % 2]));
            caches[cache][(step + 1) % 2] = NULL;
        }
    gm_block *newest = block_of(allocator, caches[0][1]);
    REQUIRE(newest->heap->engine_private);
    gm_heap *lane_heap = newest->heap;
    page_heap *lane = state_of(lane_heap);
    EXPECT_CAUGHT(allocator, lane->live_bytes += 512, lane->live_bytes -= 512, "lane lists 2 blocks, counts 2");
    EXPECT_CAUGHT(allocator, lane->live++, lane->live--, "lane lists 2 blocks, counts 3, holds 2");
    EXPECT_CAUGHT(allocator, newest->heap = lane->owner, newest->heap = lane_heap, "lane lists block");
    for (int cache = 0; cache < 2; cache++)
        CHECK_OK(gm_free(allocator, caches[cache][1]));
    end_scene(&made);
}

RUN_TESTS(TEST_CASE(a_live_map_entry_that_is_not_allocated), TEST_CASE(a_size_index_out_of_step),
          TEST_CASE(statistics_unlike_the_blocks), TEST_CASE(device_memory_outside_the_books),
          TEST_CASE(pending_frees_out_of_step), TEST_CASE(a_free_held_for_a_capture_out_of_step),
          TEST_CASE(blocks_out_of_place), TEST_CASE(free_blocks_unmerged_or_unindexed),
          TEST_CASE(a_vacant_block_of_another_heap), TEST_CASE(the_page_table_out_of_step),
          TEST_CASE(the_page_groups_out_of_step), TEST_CASE(mapped_and_waiting_bytes_out_of_step),
          TEST_CASE(a_growth_lane_out_of_step))
