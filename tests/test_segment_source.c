/*
 * test_segment_source.c -- an allocator whose memory comes from a source of the caller's
 * (gm_create_with_source), as PyTorch's MemPool(allocator=...) asks.
 *
 * The source here hands out host memory and keeps a ledger of what is out. Every segment the
 * allocator holds must come from it, reserved memory must be exactly what is out, a freed block
 * stays cached in its segment, and empty_cache, an out-of-memory retry and gm_destroy give every
 * segment back with the size it was asked for. A source that has nothing left is an out-of-memory
 * error that names it, and the allocator stays usable. Whatever the configuration asks for, the
 * engine is the segments engine: nothing is mapped.
 */
#include "test.h"

#include "pattern.h"

#include <stdbool.h>

#define MIB (1ull << 20)
#define MOST_SEGMENTS 64
#define BLOCKS 4

static const uint64_t block_sizes[BLOCKS] = {512, 3 * MIB, 30 * MIB, 700 * 1024};

typedef struct ledger {
    void *addresses[MOST_SEGMENTS];
    uint64_t sizes[MOST_SEGMENTS];
    int out;                 /* segments handed out and not yet given back */
    int allocations, frees;  /* calls */
    uint64_t budget;         /* bytes it may still hand out */
    gm_status refusal;       /* what it says when the budget is spent */
    int unknown_frees;       /* frees of memory it never handed out, or of the wrong size */
} ledger;

static gm_status ledger_allocate(void *context, uint64_t size, void **address_out)
{
    ledger *source = context;
    source->allocations++;
    if (size > source->budget || source->out == MOST_SEGMENTS)
        return source->refusal;
    void *memory = malloc(size);
    if (!memory)
        return GM_ERROR_OUT_OF_MEMORY;
    source->budget -= size;
    source->addresses[source->out] = memory;
    source->sizes[source->out++] = size;
    *address_out = memory;
    return GM_OK;
}

static void ledger_free(void *context, void *address, uint64_t size)
{
    ledger *source = context;
    source->frees++;
    for (int i = 0; i < source->out; i++)
        if (source->addresses[i] == address) {
            source->unknown_frees += source->sizes[i] != size;
            source->budget += source->sizes[i];
            free(address);
            source->out--;
            source->addresses[i] = source->addresses[source->out];
            source->sizes[i] = source->sizes[source->out];
            return;
        }
    source->unknown_frees++;
}

static uint64_t bytes_out(const ledger *source)
{
    uint64_t total = 0;
    for (int i = 0; i < source->out; i++)
        total += source->sizes[i];
    return total;
}

static bool inside_a_segment(const ledger *source, const void *block, uint64_t size)
{
    for (int i = 0; i < source->out; i++) {
        const char *start = source->addresses[i];
        if ((const char *)block >= start && (const char *)block + size <= start + source->sizes[i])
            return true;
    }
    return false;
}

static gm_allocator *allocator_on(const char *config, ledger *source)
{
    gm_segment_source from = {ledger_allocate, ledger_free, source};
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create_with_source(config, &from, &allocator) == GM_OK);
    return allocator;
}

static gm_stats stats_of(gm_allocator *allocator)
{
    gm_stats stats;
    REQUIRE(gm_get_stats(allocator, &stats) == GM_OK);
    return stats;
}

static void allocate_blocks(gm_allocator *allocator, void *blocks[BLOCKS])
{
    for (int i = 0; i < BLOCKS; i++) {
        REQUIRE(gm_malloc(allocator, block_sizes[i], 0, &blocks[i]) == GM_OK);
        pattern_stamp(blocks[i], block_sizes[i], (uint64_t)i + 1);
    }
}

static void every_segment_comes_from_the_source(void)
{
    ledger source = {.budget = 1ull << 30, .refusal = GM_ERROR_OUT_OF_MEMORY};
    gm_allocator *allocator = allocator_on("backend:host,capacity:2GiB", &source);
    void *blocks[BLOCKS];
    allocate_blocks(allocator, blocks);
    for (int i = 0; i < BLOCKS; i++) {
        CHECK(inside_a_segment(&source, blocks[i], block_sizes[i]));
        CHECK(pattern_intact(blocks[i], block_sizes[i], (uint64_t)i + 1));
    }
    gm_stats stats = stats_of(allocator);
    CHECK(source.out >= 2); /* a small-pool segment and large ones */
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, bytes_out(&source));
    CHECK_EQ_INT(stats.segment[GM_POOL_ALL].current, source.out);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_SEGMENT_ALLOCATE], source.allocations);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], 0);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_MAP], 0);
    for (int i = 0; i < BLOCKS; i++)
        CHECK_OK(gm_free(allocator, blocks[i]));
    CHECK_EQ_INT(source.frees, 0); /* cached */
    int made = source.allocations;
    allocate_blocks(allocator, blocks); /* the same sizes again: served from the cache */
    CHECK_EQ_INT(source.allocations, made);
    for (int i = 0; i < BLOCKS; i++)
        CHECK_OK(gm_free(allocator, blocks[i]));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_EQ_INT(source.out, 0);
    CHECK_EQ_INT(source.frees, source.allocations);
    CHECK_EQ_INT(source.unknown_frees, 0);
    CHECK_EQ_INT(stats_of(allocator).reserved_bytes[GM_POOL_ALL].current, 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* Asked for pages, an allocator with a source still takes segments: there is nothing to map. */
static void the_engine_is_always_segments(void)
{
    ledger source = {.budget = 1ull << 30, .refusal = GM_ERROR_OUT_OF_MEMORY};
    gm_allocator *allocator = allocator_on("backend:sim,engine:pages,capacity:8GiB", &source);
    void *block = NULL;
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &block));
    CHECK(inside_a_segment(&source, block, 64 * MIB));
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_ADDRESS_RESERVE], 0);
    CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], 0);
    CHECK_OK(gm_free(allocator, block));
    gm_destroy(allocator, NULL);
    CHECK_EQ_INT(source.out, 0);
}

/* A source with nothing left: out of memory, named; the cache is given back and the request retried
 * first, and once the source has memory again the allocator serves as before. */
static void an_empty_source_is_out_of_memory(gm_status refusal)
{
    ledger source = {.budget = 40 * MIB, .refusal = refusal};
    gm_allocator *allocator = allocator_on("backend:host,capacity:2GiB", &source);
    void *kept = NULL, *cached = NULL, *refused = NULL;
    CHECK_OK(gm_malloc(allocator, 12 * MIB, 0, &kept));
    pattern_stamp(kept, 12 * MIB, 7);
    CHECK_OK(gm_malloc(allocator, 24 * MIB, 0, &cached));
    CHECK_OK(gm_free(allocator, cached));
    /* A source out of memory: the cache goes back to it, the request is retried, then reported. Any
     * other failure is the source's error, passed on as a device error. */
    bool out_of_memory = refusal == GM_ERROR_OUT_OF_MEMORY;
    CHECK_STATUS(gm_malloc(allocator, 30 * MIB, 0, &refused), out_of_memory ? GM_ERROR_OUT_OF_MEMORY : GM_ERROR_DEVICE);
    CHECK(refused == NULL);
    CHECK_MESSAGE("memory source");
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_alloc_retries, out_of_memory);
    CHECK_EQ_INT(stats.num_ooms, out_of_memory);
    if (out_of_memory) {
        CHECK_EQ_INT(source.out, 1); /* the cached 24 MiB went back before the retry */
        CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_SOURCE); /* the cause the report names */
    }
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, bytes_out(&source));
    CHECK(pattern_intact(kept, 12 * MIB, 7));
    source.budget += 64 * MIB;
    CHECK_OK(gm_malloc(allocator, 30 * MIB, 0, &refused));
    CHECK(inside_a_segment(&source, refused, 30 * MIB));
    CHECK_OK(gm_free(allocator, refused));
    CHECK_OK(gm_free(allocator, kept));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    CHECK_EQ_INT(source.out, 0);
    CHECK_EQ_INT(source.unknown_frees, 0);
}

static void a_source_out_of_memory(void) { an_empty_source_is_out_of_memory(GM_ERROR_OUT_OF_MEMORY); }

static void a_source_that_fails_otherwise(void) { an_empty_source_is_out_of_memory(GM_ERROR_DEVICE); }

/* gm_destroy gives back every segment, those under live blocks too, and says how many blocks died. */
static void destroy_gives_every_segment_back(void)
{
    ledger source = {.budget = 1ull << 30, .refusal = GM_ERROR_OUT_OF_MEMORY};
    gm_allocator *allocator = allocator_on("backend:host,capacity:2GiB", &source);
    void *blocks[BLOCKS];
    allocate_blocks(allocator, blocks);
    CHECK_OK(gm_free(allocator, blocks[0]));
    size_t live = 0;
    gm_destroy(allocator, &live);
    CHECK_EQ_INT(live, BLOCKS - 1);
    CHECK_EQ_INT(source.out, 0);
    CHECK_EQ_INT(source.frees, source.allocations);
    CHECK_EQ_INT(source.unknown_frees, 0);
}

static void bad_arguments_are_refused(void)
{
    ledger source = {.budget = 1ull << 30, .refusal = GM_ERROR_OUT_OF_MEMORY};
    gm_segment_source whole = {ledger_allocate, ledger_free, &source};
    gm_segment_source no_free = {ledger_allocate, NULL, &source}, no_allocate = {NULL, ledger_free, &source};
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create_with_source("backend:sim", NULL, &allocator), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("allocate and a free function");
    CHECK_STATUS(gm_create_with_source("backend:sim", &no_free, &allocator), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_create_with_source("backend:sim", &no_allocate, &allocator), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_create_with_source("backend:sim", &whole, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("allocator_out");
    CHECK_STATUS(gm_create_with_source("backend:sim,no_such_key:1", &whole, &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("no_such_key");
    CHECK(allocator == NULL);
    CHECK_EQ_INT(source.allocations, 0);
}

RUN_TESTS(TEST_CASE(every_segment_comes_from_the_source), TEST_CASE(the_engine_is_always_segments),
          TEST_CASE(a_source_out_of_memory), TEST_CASE(a_source_that_fails_otherwise),
          TEST_CASE(destroy_gives_every_segment_back), TEST_CASE(bad_arguments_are_refused))
