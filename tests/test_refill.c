/*
 * test_refill.c -- a program that empties the cache at the end of every step (refill.c): once a step
 * repeats the last one, its memory comes back in few chunks, fewer device calls, and the peak of
 * reserved memory stays what it is with the rule off (refill_groups:false); the bytes of every block
 * stay intact on real memory. And the guards that keep the peak where it is: a chunk moved in joins no
 * group, a step of other shapes makes no group, memory made ahead of need that a step does not take
 * can move and is released by the next empty_cache, a step is followed only after one that repeated
 * an earlier step all through, groups only where the last two steps agree, and a loop alternating
 * between two layouts repeats the step before last. A snapshot taken mid-step shows the memory made
 * ahead that no request has taken yet as free memory, so that it adds up to the statistics. Last, two
 * recorded training
 * loops (data/traces-extra, data/traces-more) with the cache emptied at every step's end, as
 * bench/empty_cache_steps.py replays them: one of fixed shapes, one of variable lengths.
 */
#include "pattern.h"
#include "test.h"

#include "tools/trace.h"

#include <stdbool.h>

#define MIB (1ull << 20)

static gm_allocator *make(const char *config, int refill)
{
    char text[256];
    snprintf(text, sizeof text, "%s%s", config, refill ? "" : ",refill_groups:false");
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create(text, &allocator) == GM_OK);
    return allocator;
}

static void *take(gm_allocator *allocator, uint64_t mib, gm_stream stream)
{
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, mib * MIB, stream, &pointer));
    return pointer;
}

static void give(gm_allocator *allocator, void *pointer)
{
    CHECK_OK(gm_free(allocator, pointer));
}

static gm_stats stats_of(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats;
}

static int64_t chunks_made(gm_allocator *allocator)
{
    return stats_of(allocator).device_calls[GM_CALL_PHYSICAL_CREATE];
}

static int64_t peak_mib(gm_allocator *allocator)
{
    return stats_of(allocator).reserved_bytes[GM_POOL_ALL].peak / (int64_t)MIB;
}

/* The chunks made and the modelled device time of one step: what it allocated at its start and made
 * again, and the empty_cache at its end. */
typedef struct step_cost {
    int64_t chunks;
    int64_t device_ns;
} step_cost;

static step_cost cost_since(gm_allocator *allocator, const gm_stats *before)
{
    gm_stats now = stats_of(allocator);
    return (step_cost){now.device_calls[GM_CALL_PHYSICAL_CREATE] - before->device_calls[GM_CALL_PHYSICAL_CREATE],
                       now.device_call_ns - before->device_call_ns};
}

/* ---------------------------------------------------------------- the rule at work */

/* One step's body in the tests here: `count` activations taken on stream 0, the two at freed_early[0]
 * and [1] given back in that order (then gm_validate: pages made ahead wait under unmapped blocks),
 * `later_count` more taken, then every activation given back but the early ones and the one at `keep`
 * (-1: none), then the later ones. Returns the kept block, or NULL. */
static void *run_step(gm_allocator *allocator, const uint64_t *sizes, int count, const int freed_early[2],
                      const uint64_t *later, int later_count, int keep)
{
    void *blocks[8], *more[3];
    REQUIRE(count <= 8 && later_count <= 3);
    for (int i = 0; i < count; i++)
        blocks[i] = take(allocator, sizes[i], 0);
    give(allocator, blocks[freed_early[0]]);
    give(allocator, blocks[freed_early[1]]);
    CHECK_OK(gm_validate(allocator));
    for (int i = 0; i < later_count; i++)
        more[i] = take(allocator, later[i], 0);
    for (int i = 0; i < count; i++)
        if (i != freed_early[0] && i != freed_early[1] && i != keep)
            give(allocator, blocks[i]);
    for (int i = 0; i < later_count; i++)
        give(allocator, more[i]);
    return keep >= 0 ? blocks[keep] : NULL;
}

/* A training step of eight activations, two freed early and three more requests after them; the
 * cache emptied at its end. Eight steps after a block kept throughout: the last step's cost, and the
 * peak (*peak_out). */
static step_cost repeating_steps(int refill, int64_t *peak_out)
{
    static const uint64_t sizes[] = {24, 48, 96, 200, 300, 40, 160, 72}, later[] = {130, 20, 500};
    gm_allocator *allocator = make("capacity:140GiB", refill);
    void *kept = take(allocator, 100, 0);
    step_cost cost = {0, 0};
    for (int step = 0; step < 8; step++) {
        gm_stats before = stats_of(allocator);
        run_step(allocator, sizes, 8, (const int[2]){3, 1}, later, 3, -1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_empty_cache(allocator));
        cost = cost_since(allocator, &before);
    }
    *peak_out = peak_mib(allocator);
    give(allocator, kept);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 0);
    gm_destroy(allocator, NULL);
    return cost;
}

static void a_repeating_step_is_made_again_in_few_chunks(void)
{
    int64_t peak = 0, peak_without = 0;
    step_cost with = repeating_steps(1, &peak), without = repeating_steps(0, &peak_without);
    /* Without the rule: a chunk per growth, those of 300 and 500 MiB cut at 128 MiB. With it: the
     * memory the step held at its end, one run of adjacent chunks of 1440 MiB, made as two. */
    CHECK_EQ_INT(without.chunks, 16);
    CHECK_EQ_INT(with.chunks, 2); /* 1024 MiB (group_chunk_limit) and the rest */
    CHECK(with.device_ns * 10 < without.device_ns * 6);
    CHECK_EQ_INT(peak, peak_without);
    CHECK_EQ_INT(peak, 1540);
}

/* The steps above, then one more that keeps its first activation past its end: the empty_cache
 * cannot release the chunk that block lies in. A group is made of chunks of at most 1024 MiB, so the
 * kept 24 MiB hold at most that much (one chunk for the whole 1440 MiB group would hold all of it). */
static void a_block_kept_past_a_step_pins_one_piece_of_its_group(void)
{
    static const uint64_t sizes[] = {24, 48, 96, 200, 300, 40, 160, 72}, later[] = {130, 20, 500};
    gm_allocator *allocator = make("capacity:140GiB", 1);
    void *kept = take(allocator, 100, 0), *saved = NULL;
    for (int step = 0; step < 9; step++) {
        saved = run_step(allocator, sizes, 8, (const int[2]){3, 1}, later, 3, step == 8 ? 0 : -1);
        CHECK_OK(gm_empty_cache(allocator));
    }
    int64_t held_mib = stats_of(allocator).reserved_bytes[GM_POOL_ALL].current / (int64_t)MIB;
    CHECK(held_mib >= 100 + 24);
    CHECK(held_mib <= 100 + 1024);
    give(allocator, saved);
    give(allocator, kept);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 0);
    gm_destroy(allocator, NULL);
}

/* On the host backend (real bytes, chunks mapped where the engine says): blocks stamped when made and
 * checked when freed, in chunks of at most 8 MiB (chunk_room_share:0; with the room share, of pages on
 * this 1 GiB device), six steps. The chunks made in the last step. */
static int64_t stamped_steps(int refill, bool room_share)
{
    static const uint64_t sizes[] = {3, 10, 24, 6, 40, 12, 17};
    gm_allocator *allocator = make(room_share ? "backend:host,capacity:1GiB,page_size:2MiB,max_chunk_size:8MiB"
                                              : "backend:host,capacity:1GiB,page_size:2MiB,max_chunk_size:8MiB,"
                                                "chunk_room_share:0",
                                   refill);
    void *kept = take(allocator, 5, 0);
    pattern_stamp(kept, 5 * MIB, 1000);
    int64_t chunks = 0;
    for (int step = 0; step < 6; step++) {
        int64_t before = chunks_made(allocator);
        void *blocks[7];
        for (int i = 0; i < 7; i++) {
            blocks[i] = take(allocator, sizes[i], 0);
            pattern_stamp(blocks[i], sizes[i] * MIB, (uint64_t)(step * 10 + i));
        }
        for (int i = 6; i >= 0; i--) {
            CHECK(pattern_intact(blocks[i], sizes[i] * MIB, (uint64_t)(step * 10 + i)));
            give(allocator, blocks[i]);
            CHECK_OK(gm_validate(allocator));
        }
        CHECK_OK(gm_empty_cache(allocator));
        chunks = chunks_made(allocator) - before;
    }
    CHECK(pattern_intact(kept, 5 * MIB, 1000));
    give(allocator, kept);
    gm_destroy(allocator, NULL);
    return chunks;
}

static void bytes_stay_intact_in_memory_made_ahead(void)
{
    int64_t with = stamped_steps(1, false), without = stamped_steps(0, false);
    CHECK(without >= 14); /* 112 MiB in chunks of at most 8 MiB */
    CHECK(with <= 2);
    /* With the room share a group's chunks are at most 8 times the largest a growth may make, a page
     * here: 112 MiB in 16 MiB chunks, where the growths make 56 pages. */
    int64_t shared_with = stamped_steps(1, true), shared_without = stamped_steps(0, true);
    CHECK(shared_without >= 56);
    CHECK(shared_with >= 7 && shared_with <= 9);
}

/* ---------------------------------------------------------------- what keeps the peak */

/* A 640 MiB tensor freed, then held in place by blocks at its first and last chunks; a 600 MiB request
 * after it moves its three idle chunks and makes the rest. At the step's end those chunks lie beside
 * the memory made for the request: were they one group with it, the next step would make that memory
 * twice, once where the tensor is and once for the request. The peak after eight steps. */
static int64_t moves_every_step(int refill, int64_t *last_chunks_out)
{
    gm_allocator *allocator = make("capacity:140GiB", refill);
    void *kept = take(allocator, 300, 0);
    give(allocator, take(allocator, 1200, 0)); /* the peak the steps work under */
    CHECK_OK(gm_empty_cache(allocator));
    for (int step = 0; step < 8; step++) {
        int64_t before = chunks_made(allocator);
        void *tensor = take(allocator, 640, 0), *after = take(allocator, 256, 0);
        give(allocator, tensor);
        void *pin = take(allocator, 100, 0), *middle = take(allocator, 412, 0), *top = take(allocator, 100, 0);
        give(allocator, middle);
        void *request = take(allocator, 600, 0);
        give(allocator, pin);
        give(allocator, top);
        give(allocator, after);
        give(allocator, request);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_empty_cache(allocator));
        *last_chunks_out = chunks_made(allocator) - before;
    }
    int64_t peak = peak_mib(allocator);
    give(allocator, kept);
    gm_destroy(allocator, NULL);
    return peak;
}

static void a_chunk_moved_in_joins_no_group(void)
{
    int64_t chunks = 0, chunks_without = 0;
    CHECK_EQ_INT(moves_every_step(1, &chunks), moves_every_step(0, &chunks_without));
    CHECK(chunks < chunks_without);
}

/* 600 MiB of addresses between two kept blocks of 100 MiB (*low, *high), then five steps that each
 * make three blocks of 200 MiB there (one group) and empty the cache at their end. */
static void three_block_steps_between_kept_blocks(gm_allocator *allocator, void **low, void **high)
{
    *low = take(allocator, 100, 0);
    void *between = take(allocator, 600, 0);
    *high = take(allocator, 100, 0);
    give(allocator, between);
    CHECK_OK(gm_empty_cache(allocator));
    for (int step = 0; step < 5; step++) {
        void *blocks[3];
        for (int i = 0; i < 3; i++)
            blocks[i] = take(allocator, 200, 0);
        for (int i = 0; i < 3; i++)
            give(allocator, blocks[i]);
        CHECK_OK(gm_empty_cache(allocator));
    }
}

/* The steps of three_block_steps_between_kept_blocks (one group). Then a step that makes only the
 * first (`first` MiB), keeps it, and asks for 700 MiB more; *current_out: reserved memory after that
 * step's empty_cache. The peak. */
static int64_t a_step_that_stops_repeating(int refill, uint64_t first, int keep_first, int64_t *current_out)
{
    gm_allocator *allocator = make("capacity:140GiB", refill);
    void *low, *high;
    three_block_steps_between_kept_blocks(allocator, &low, &high);
    void *changed = take(allocator, first, 0);
    if (!keep_first)
        give(allocator, changed);
    void *other = take(allocator, 700, 0);
    CHECK_OK(gm_validate(allocator));
    if (keep_first)
        give(allocator, changed);
    give(allocator, other);
    CHECK_OK(gm_empty_cache(allocator));
    *current_out = stats_of(allocator).reserved_bytes[GM_POOL_ALL].current / (int64_t)MIB;
    int64_t peak = peak_mib(allocator);
    give(allocator, low);
    give(allocator, high);
    gm_destroy(allocator, NULL);
    return peak;
}

static void memory_made_ahead_that_a_step_leaves_can_move(void)
{
    /* The first 200 MiB block made the whole group (600 MiB); it is freed, and the 700 MiB request
     * finds no room between the kept blocks: the group's chunk moves to it. */
    int64_t current = 0, current_without = 0;
    int64_t peak = a_step_that_stops_repeating(1, 200, 0, &current);
    CHECK_EQ_INT(peak, a_step_that_stops_repeating(0, 200, 0, &current_without));
    CHECK_EQ_INT(peak, 900);
    CHECK_EQ_INT(current, 200); /* the kept blocks' */
    CHECK_EQ_INT(current_without, 200);
}

static void a_step_of_other_shapes_makes_no_group(void)
{
    /* The step's first block is 300 MiB, not 200: it does not repeat the last step, and kept while the
     * 700 MiB request comes, a group made for it would hold 300 MiB more. */
    int64_t current = 0;
    CHECK_EQ_INT(a_step_that_stops_repeating(1, 300, 1, &current), a_step_that_stops_repeating(0, 300, 1, &current));
    CHECK_EQ_INT(current, 200);
}

static void an_empty_cache_releases_memory_made_ahead(void)
{
    gm_allocator *allocator = make("capacity:140GiB", 1);
    void *low, *high;
    three_block_steps_between_kept_blocks(allocator, &low, &high);
    void *first = take(allocator, 200, 0); /* the step ends after its first block */
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 800 * (int64_t)MIB); /* the group's */
    CHECK_OK(gm_validate(allocator));
    give(allocator, first);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 200 * (int64_t)MIB);
    CHECK_OK(gm_validate(allocator));
    give(allocator, low);
    give(allocator, high);
    gm_destroy(allocator, NULL);
}

static void a_step_is_followed_only_after_one_that_repeated_all_through(void)
{
    /* 650 MiB of addresses between two kept blocks; two steps make three blocks of 200 MiB there (one
     * group, released twice), the second after a small block on another stream, so that it grew as no
     * step before it did. The next step repeats the one before last for its first block, then keeps it
     * and asks for 700 MiB: followed, it would have made the whole group for that block. */
    int64_t peak[2];
    for (int refill = 0; refill <= 1; refill++) {
        gm_allocator *allocator = make("capacity:140GiB", refill);
        void *low = take(allocator, 100, 0), *between = take(allocator, 650, 0), *high = take(allocator, 100, 0);
        give(allocator, between);
        CHECK_OK(gm_empty_cache(allocator));
        for (int step = 0; step < 2; step++) {
            if (step == 1)
                give(allocator, take(allocator, 10, 1));
            void *blocks[3];
            for (int i = 0; i < 3; i++)
                blocks[i] = take(allocator, 200, 0);
            for (int i = 0; i < 3; i++)
                give(allocator, blocks[i]);
            CHECK_OK(gm_empty_cache(allocator));
        }
        void *first = take(allocator, 200, 0), *other = take(allocator, 700, 0);
        CHECK_OK(gm_validate(allocator));
        give(allocator, first);
        give(allocator, other);
        CHECK_OK(gm_empty_cache(allocator));
        peak[refill] = peak_mib(allocator);
        give(allocator, low);
        give(allocator, high);
        gm_destroy(allocator, NULL);
    }
    CHECK_EQ_INT(peak[1], peak[0]);
    CHECK_EQ_INT(peak[1], 1100);
}

/* Steps whose fourth block alternates between 200 and 300 MiB (`alternate_fourth`) or whose second
 * alternates between 120 and 200 MiB: the layout after it changes from one step to the next. Ten
 * steps; the chunks made by each of the last two (*last_chunks_out) and the peak. */
static int64_t alternating_steps(int refill, int alternate_fourth, int64_t last_chunks_out[2])
{
    gm_allocator *allocator = make("capacity:140GiB", refill);
    void *kept = take(allocator, 100, 0);
    for (int step = 0; step < 10; step++) {
        int odd = step % 2;
        uint64_t sizes[] = {24, 200, 48, 200, 96, 160};
        if (alternate_fourth)
            sizes[3] = odd ? 300 : 200;
        else
            sizes[1] = odd ? 200 : 120;
        int64_t before = chunks_made(allocator);
        run_step(allocator, sizes, 6, (const int[2]){1, 3}, (const uint64_t[]){120, 250}, 2, -1);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_empty_cache(allocator));
        if (step >= 8)
            last_chunks_out[step - 8] = chunks_made(allocator) - before;
    }
    int64_t peak = peak_mib(allocator);
    give(allocator, kept);
    gm_destroy(allocator, NULL);
    return peak;
}

static void groups_only_where_the_last_two_steps_agree(void)
{
    /* Each step repeats the one before last, not the last: a group the last step released, made for
     * a step laid out otherwise, would hold memory that step places elsewhere. */
    int64_t chunks[2], chunks_without[2];
    for (int alternate_fourth = 0; alternate_fourth <= 1; alternate_fourth++)
        CHECK_EQ_INT(alternating_steps(1, alternate_fourth, chunks), alternating_steps(0, alternate_fourth, chunks_without));
}

static void a_loop_of_two_layouts_repeats_the_step_before_last(void)
{
    /* A block on another stream alternates between 40 and 60 MiB at the start of each step; the
     * stream's own memory repeats. Its growths match those of the step before last. */
    int64_t peak[2], chunks[2][2];
    for (int refill = 0; refill <= 1; refill++) {
        gm_allocator *allocator = make("capacity:140GiB", refill);
        void *kept = take(allocator, 100, 0);
        for (int step = 0; step < 10; step++) {
            int64_t before = chunks_made(allocator);
            void *other = take(allocator, step % 2 ? 40 : 60, 1);
            static const uint64_t sizes[] = {24, 200, 48, 300, 96, 160};
            run_step(allocator, sizes, 6, (const int[2]){1, 3}, (const uint64_t[]){120, 250}, 2, -1);
            give(allocator, other);
            CHECK_OK(gm_validate(allocator));
            CHECK_OK(gm_empty_cache(allocator));
            if (step >= 8)
                chunks[refill][step - 8] = chunks_made(allocator) - before;
        }
        peak[refill] = peak_mib(allocator);
        give(allocator, kept);
        gm_destroy(allocator, NULL);
    }
    CHECK_EQ_INT(peak[1], peak[0]);
    for (int step = 0; step < 2; step++) {
        CHECK_EQ_INT(chunks[0][step], 11);
        CHECK_EQ_INT(chunks[1][step], 2); /* the other stream's block, and the stream's memory */
    }
}

/* ---------------------------------------------------------------- snapshots mid-step */

/* The block of `snapshot` that starts at `address`, or NULL. */
static const gm_snapshot_block *block_at(const gm_snapshot *snapshot, const void *address)
{
    for (size_t b = 0; b < snapshot->block_count; b++)
        if (snapshot->blocks[b].address == (uint64_t)(uintptr_t)address)
            return &snapshot->blocks[b];
    return NULL;
}

/* A snapshot that adds up to the statistics taken with it: each region's mapped bytes are its blocks
 * but the unmapped ones, all regions' together are reserved_bytes, its allocated blocks are
 * allocated_bytes and its free blocks the rest of reserved_bytes (no pending block in these steps). */
static gm_snapshot *snapshot_adding_up(gm_allocator *allocator)
{
    gm_snapshot *snapshot = NULL;
    REQUIRE(gm_snapshot_take(allocator, &snapshot) == GM_OK);
    uint64_t mapped = 0, bytes_of_kind[4] = {0};
    for (size_t r = 0; r < snapshot->region_count; r++) {
        const gm_snapshot_region *region = &snapshot->regions[r];
        uint64_t region_mapped = 0;
        for (size_t b = 0; b < region->block_count; b++) {
            const gm_snapshot_block *block = &snapshot->blocks[region->first_block + b];
            bytes_of_kind[block->kind] += block->size;
            region_mapped += block->kind == GM_BLOCK_KIND_UNMAPPED ? 0 : block->size;
        }
        CHECK_EQ_INT(region->mapped_bytes, region_mapped);
        mapped += region->mapped_bytes;
    }
    const gm_stats *stats = &snapshot->stats;
    CHECK_EQ_INT(mapped, stats->reserved_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(bytes_of_kind[GM_BLOCK_KIND_ALLOCATED], stats->allocated_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(bytes_of_kind[GM_BLOCK_KIND_PENDING], 0);
    CHECK_EQ_INT(bytes_of_kind[GM_BLOCK_KIND_FREE],
                 stats->reserved_bytes[GM_POOL_ALL].current - stats->allocated_bytes[GM_POOL_ALL].current);
    return snapshot;
}

/* Whether `snapshot` shows `size` bytes at `address` as one block of `kind`. */
static int shows(const gm_snapshot *snapshot, const void *address, uint64_t size, gm_block_kind kind)
{
    const gm_snapshot_block *block = block_at(snapshot, address);
    return block && block->size == size && block->kind == kind;
}

/* The steps of a_repeating_step_is_made_again_in_few_chunks, then a ninth looked at request by request.
 * Its first growth makes the whole group (1440 MiB above the kept block); each activation then takes
 * its part of it, and what none has taken yet waits: a snapshot shows it as free memory, from the last
 * activation's end up to the group's end, and the addresses above it as unmapped. The last request
 * (500 MiB) takes the rest. */
static void a_snapshot_mid_step_shows_waiting_pages_as_free_memory(void)
{
    static const uint64_t sizes[] = {24, 48, 96, 200, 300, 40, 160, 72}, later[] = {130, 20, 500};
    gm_allocator *allocator = make("capacity:140GiB", 1);
    char *kept = take(allocator, 100, 0), *group_end = kept + 1540 * MIB, *taken_end = kept + 100 * MIB;
    for (int step = 0; step < 8; step++) {
        run_step(allocator, sizes, 8, (const int[2]){3, 1}, later, 3, -1);
        CHECK_OK(gm_empty_cache(allocator));
    }
    void *blocks[8], *more[3];
    for (int i = 0; i < 8; i++) {
        blocks[i] = take(allocator, sizes[i], 0);
        CHECK(blocks[i] == taken_end);
        taken_end += sizes[i] * MIB;
        gm_snapshot *snapshot = snapshot_adding_up(allocator);
        CHECK(shows(snapshot, blocks[i], sizes[i] * MIB, GM_BLOCK_KIND_ALLOCATED));
        CHECK(shows(snapshot, taken_end, (uint64_t)(group_end - taken_end), GM_BLOCK_KIND_FREE));
        CHECK(block_at(snapshot, group_end) && block_at(snapshot, group_end)->kind == GM_BLOCK_KIND_UNMAPPED);
        gm_snapshot_free(snapshot);
    }
    give(allocator, blocks[3]);
    give(allocator, blocks[1]);
    for (int i = 0; i < 3; i++) {
        more[i] = take(allocator, later[i], 0);
        gm_snapshot_free(snapshot_adding_up(allocator));
    }
    gm_snapshot *snapshot = snapshot_adding_up(allocator);
    CHECK(more[2] == taken_end);
    CHECK(shows(snapshot, more[2], 500 * MIB, GM_BLOCK_KIND_ALLOCATED));
    CHECK(block_at(snapshot, group_end) && block_at(snapshot, group_end)->kind == GM_BLOCK_KIND_UNMAPPED);
    gm_snapshot_free(snapshot);
    for (int i = 0; i < 8; i++)
        if (i != 1 && i != 3)
            give(allocator, blocks[i]);
    for (int i = 0; i < 3; i++)
        give(allocator, more[i]);
    CHECK_OK(gm_empty_cache(allocator));
    gm_snapshot_free(snapshot_adding_up(allocator));
    give(allocator, kept);
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- recorded training loops */

/* The operation indices after which a step ends, as bench/empty_cache_steps.py finds them: where live
 * memory comes back down to the level it keeps between steps (the minimum over the trace's second
 * half, plus 2% and 1 MiB) after it has been more than halfway up to its peak. Their count. */
static size_t find_step_ends(const gm_trace *trace, size_t *ends, size_t capacity)
{
    double *series = malloc(trace->count * sizeof *series), live = 0, peak = 0, floor = 0;
    REQUIRE(series);
    for (size_t i = 0; i < trace->count; i++) {
        const gm_trace_operation *operation = &trace->operations[i];
        live += operation->kind == GM_TRACE_ALLOCATE ? (double)operation->size : -(double)operation->size;
        series[i] = live;
        peak = live > peak ? live : peak;
    }
    floor = series[trace->count / 2];
    for (size_t i = trace->count / 2; i < trace->count; i++)
        floor = series[i] < floor ? series[i] : floor;
    size_t count = 0;
    int armed = 0;
    for (size_t i = 0; i < trace->count && count < capacity; i++) {
        if (series[i] > floor + (peak - floor) / 2) {
            armed = 1;
        } else if (armed && series[i] <= floor * 1.02 + (double)MIB) {
            ends[count++] = i;
            armed = 0;
        }
    }
    free(series);
    return count;
}

/* Replay `file` (under GPUMEM_DATA) with gm_empty_cache at every step's end, and a snapshot that must
 * add up to the statistics after every `snapshot_every`-th operation (0: none): the chunks made and the
 * device time of the last step, and the peak (*peak_out). */
static step_cost replay_emptying(const char *file, int refill, size_t snapshot_every, int64_t *peak_out)
{
    char path[1024];
    const char *data = getenv("GPUMEM_DATA");
    snprintf(path, sizeof path, "%s/%s", data ? data : "data", file);
    gm_trace trace;
    REQUIRE(gm_trace_load(path, &trace) == GM_OK);
    size_t ends[64], count = find_step_ends(&trace, ends, 64), next = 0;
    REQUIRE(count >= 4);
    gm_allocator *allocator = make("capacity:140GiB", refill);
    void **pointers = calloc(trace.slot_count, sizeof *pointers);
    REQUIRE(pointers);
    gm_stats before = stats_of(allocator);
    step_cost cost = {0, 0};
    for (size_t i = 0; i < trace.count; i++) {
        const gm_trace_operation *operation = &trace.operations[i];
        if (operation->kind == GM_TRACE_ALLOCATE) {
            CHECK_OK(gm_malloc(allocator, operation->size, trace.streams[operation->stream_index],
                               &pointers[operation->slot]));
        } else {
            give(allocator, pointers[operation->slot]);
        }
        if (snapshot_every && i % snapshot_every == 0)
            gm_snapshot_free(snapshot_adding_up(allocator));
        if (next < count && i == ends[next]) {
            next++;
            CHECK_OK(gm_empty_cache(allocator));
            CHECK_OK(gm_validate(allocator));
            cost = cost_since(allocator, &before);
            before = stats_of(allocator);
        }
    }
    *peak_out = peak_mib(allocator);
    free(pointers);
    gm_destroy(allocator, NULL);
    gm_trace_free(&trace);
    return cost;
}

static void a_recorded_loop_of_fixed_shapes_makes_its_steps_in_few_chunks(void)
{
    int64_t peak = 0, peak_without = 0;
    step_cost with = replay_emptying("traces-extra/gpt2_batch8.csv.gz", 1, 0, &peak);
    step_cost without = replay_emptying("traces-extra/gpt2_batch8.csv.gz", 0, 0, &peak_without);
    CHECK(with.chunks * 5 < without.chunks);
    CHECK(with.device_ns * 3 < without.device_ns * 2);
    CHECK_EQ_INT(peak, peak_without);
}

static void a_recorded_loop_of_variable_lengths_keeps_its_peak(void)
{
    /* Every step of other lengths than the last: no step repeats another, and none makes a group. */
    int64_t peak = 0, peak_without = 0;
    step_cost with = replay_emptying("traces-more/llama_varlen-seed0.csv.gz", 1, 0, &peak);
    step_cost without = replay_emptying("traces-more/llama_varlen-seed0.csv.gz", 0, 0, &peak_without);
    CHECK_EQ_INT(with.chunks, without.chunks);
    CHECK_EQ_INT(peak, peak_without);
}

/* The recorded loop of fixed shapes, a snapshot taken every 97 operations: in the steps that make
 * groups, several while pages wait; each adds up to the statistics as it is taken. */
static void snapshots_of_a_recorded_loop_add_up_mid_step(void)
{
    int64_t peak = 0;
    replay_emptying("traces-extra/gpt2_batch8.csv.gz", 1, 97, &peak);
}

RUN_TESTS(TEST_CASE(a_repeating_step_is_made_again_in_few_chunks),
          TEST_CASE(a_block_kept_past_a_step_pins_one_piece_of_its_group), TEST_CASE(bytes_stay_intact_in_memory_made_ahead),
          TEST_CASE(a_chunk_moved_in_joins_no_group), TEST_CASE(memory_made_ahead_that_a_step_leaves_can_move),
          TEST_CASE(a_step_of_other_shapes_makes_no_group), TEST_CASE(an_empty_cache_releases_memory_made_ahead),
          TEST_CASE(a_step_is_followed_only_after_one_that_repeated_all_through),
          TEST_CASE(groups_only_where_the_last_two_steps_agree),
          TEST_CASE(a_loop_of_two_layouts_repeats_the_step_before_last),
          TEST_CASE(a_snapshot_mid_step_shows_waiting_pages_as_free_memory),
          TEST_CASE(a_recorded_loop_of_fixed_shapes_makes_its_steps_in_few_chunks),
          TEST_CASE(a_recorded_loop_of_variable_lengths_keeps_its_peak),
          TEST_CASE(snapshots_of_a_recorded_loop_add_up_mid_step))
