/*
 * test_host_cache.c -- the pinned host memory cache (gm_host_malloc and friends) on the sim and host
 * backends: reuse only after the recorded streams' work finished, exact statistics, host_limit,
 * gm_host_empty_cache, data integrity, four threads, bad inputs.
 */
#include "test.h"

#include "core/allocator.h"

#include <pthread.h>
#include <stdint.h>

static const char *const configs[] = {"backend:sim,capacity:1GiB", "backend:host,capacity:64MiB"};
enum { config_count = 2 };

static void freed_block_is_reused_at_once_without_streams(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(configs[c], &allocator));
        void *first = NULL, *second = NULL;
        CHECK_OK(gm_host_malloc(allocator, 1000, &first));
        CHECK(first != NULL);
        CHECK_OK(gm_host_free(allocator, first));
        CHECK_OK(gm_host_malloc(allocator, 1024, &second)); /* same class: 1024 bytes */
        CHECK(first == second);
        gm_host_stats stats;
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.cache_hits, 1);
        CHECK_EQ_INT(stats.cache_misses, 1);
        CHECK_EQ_INT(stats.host_allocations, 1);
        CHECK_EQ_INT(stats.host_frees, 0);
        CHECK_EQ_INT(stats.allocated_bytes.current, 1024);
        CHECK_EQ_INT(stats.reserved_bytes.current, 1024);
        CHECK_EQ_INT(stats.requested_bytes, 1024);
        CHECK_OK(gm_host_free(allocator, second));
        gm_destroy(allocator, NULL);
    }
}

/* A class of 1 MiB: its rotation is one block, so a malloc with no free block of the class looks at its
 * pending ones (test_host_pending.c has the small classes' rotation). */
enum { large = 1 << 20 };

static void reuse_waits_for_the_recorded_streams(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(configs[c], &allocator));
        void *block = NULL, *other = NULL, *again = NULL;
        CHECK_OK(gm_host_malloc(allocator, large, &block));
        CHECK_OK(gm_host_record_stream(allocator, block, 2));
        CHECK_OK(gm_host_record_stream(allocator, block, 2)); /* twice is once */
        CHECK_OK(gm_host_record_stream(allocator, block, 3));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* a copy on stream 2 reads it */
        CHECK_OK(gm_sim_stream_enqueue(allocator, 3, 1)); /* and one on stream 3 */
        CHECK_OK(gm_host_free(allocator, block));
        gm_host_stats stats;
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.pending_blocks, 1);
        CHECK_EQ_INT(stats.allocated_bytes.current, 0);
        CHECK_EQ_INT(stats.reserved_bytes.current, large);
        CHECK_OK(gm_host_malloc(allocator, large, &other));
        CHECK(other != block); /* streams 2 and 3 still run: an event on each */
        CHECK_OK(gm_host_free(allocator, other));
        CHECK_OK(gm_sim_stream_complete(allocator, 2));
        CHECK_OK(gm_host_malloc(allocator, large, &again));
        CHECK(again == other); /* block still waits for stream 3; `other` is idle */
        CHECK_OK(gm_host_free(allocator, again));
        CHECK_OK(gm_sim_stream_complete(allocator, 3));
        /* now both are idle: `other` from the free list, then `block` after a look at its events */
        void *first = NULL, *second = NULL;
        CHECK_OK(gm_host_malloc(allocator, large, &first));
        CHECK_OK(gm_host_malloc(allocator, large, &second));
        CHECK(first == other && second == block);
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.pending_blocks, 0);
        CHECK_EQ_INT(stats.host_allocations, 2);
        CHECK_EQ_INT(stats.cache_misses, 2);
        CHECK_EQ_INT(stats.cache_hits, 3);
        CHECK_EQ_INT(stats.allocations.current, 2);
        CHECK_EQ_INT(stats.allocations.peak, 2);
        CHECK_EQ_INT(stats.allocations.allocated, 5);
        CHECK_EQ_INT(stats.allocations.freed, 3);
        CHECK_OK(gm_host_free(allocator, first));
        CHECK_OK(gm_host_free(allocator, second));
        gm_destroy(allocator, NULL);
    }
}

/* A busy stream's event is recorded at the first look after the free: work queued on the stream after
 * it does not delay the block's reuse. */
static void work_after_the_look_does_not_delay_reuse(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(configs[0], &allocator));
    void *block = NULL, *other = NULL, *first = NULL, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, large, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 1, 1));
    CHECK_OK(gm_host_free(allocator, block));
    CHECK_OK(gm_host_malloc(allocator, large, &other)); /* the look: stream 1 busy, an event recorded */
    CHECK_OK(gm_host_free(allocator, other));
    CHECK_OK(gm_sim_stream_complete(allocator, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 1, 1)); /* queued after the event: not waited for */
    CHECK_OK(gm_host_malloc(allocator, large, &first));
    CHECK_OK(gm_host_malloc(allocator, large, &again));
    CHECK(first == other && again == block);
    CHECK_OK(gm_host_free(allocator, first));
    CHECK_OK(gm_host_free(allocator, again));
    gm_destroy(allocator, NULL);
}

static int64_t device_calls(gm_allocator *allocator, gm_device_call kind)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[kind];
}

/* A recorded stream found idle at the look needs no event: the block waits only for the busy ones, and
 * is reusable at the look when none is busy. */
static void idle_streams_are_not_waited_for(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(configs[0], &allocator));
    void *block = NULL, *other = NULL, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, large, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, 1)); /* idle */
    CHECK_OK(gm_host_record_stream(allocator, block, 0));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1)); /* busy */
    CHECK_OK(gm_host_free(allocator, block));
    gm_host_stats stats;
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.pending_blocks, 1);
    int64_t records = device_calls(allocator, GM_CALL_EVENT_RECORD);
    CHECK_OK(gm_host_malloc(allocator, large, &other));
    CHECK(other != block); /* stream 0 still runs */
    CHECK_EQ_INT(device_calls(allocator, GM_CALL_EVENT_RECORD) - records, 1); /* on stream 0 only */
    CHECK_OK(gm_host_record_stream(allocator, other, 1));
    CHECK_OK(gm_host_free(allocator, other)); /* pending, unchecked */
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.pending_blocks, 2);
    CHECK_OK(gm_host_malloc(allocator, large, &again)); /* the look: stream 1 idle, no event */
    CHECK(again == other);
    CHECK_EQ_INT(device_calls(allocator, GM_CALL_EVENT_RECORD) - records, 1);
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.pending_blocks, 1);
    CHECK_OK(gm_sim_stream_complete(allocator, 0));
    CHECK_OK(gm_host_free(allocator, again));
    CHECK_OK(gm_host_empty_cache(allocator));
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.pending_blocks, 0);
    CHECK_EQ_INT(stats.reserved_bytes.current, 0);
    gm_destroy(allocator, NULL);
}

static int64_t stream_queries(gm_allocator *allocator)
{
    return allocator->arena.backend->stream_queries;
}

/* Ten blocks freed after copies on one busy stream: the look asks the stream once, not ten times, and
 * records an event for each; the next look asks the oldest event only (a stream runs its work in
 * order); once the stream is done, each event is found done once, oldest first. */
static void a_busy_stream_is_queried_once_a_look(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(configs[0], &allocator));
    void *blocks[10], *fresh = NULL, *other = NULL, *reused = NULL;
    for (int i = 0; i < 10; i++)
        CHECK_OK(gm_host_malloc(allocator, 4096, &blocks[i]));
    for (int i = 0; i < 10; i++) {
        CHECK_OK(gm_host_record_stream(allocator, blocks[i], 0));
        CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1)); /* a copy from block i */
        CHECK_OK(gm_host_free(allocator, blocks[i]));
    }
    int64_t asked = stream_queries(allocator), queried = device_calls(allocator, GM_CALL_EVENT_QUERY),
            recorded = device_calls(allocator, GM_CALL_EVENT_RECORD);
    CHECK_OK(gm_host_malloc(allocator, 4096, &fresh));
    CHECK_EQ_INT(stream_queries(allocator) - asked, 1);
    CHECK_EQ_INT(device_calls(allocator, GM_CALL_EVENT_RECORD) - recorded, 10);
    CHECK_EQ_INT(device_calls(allocator, GM_CALL_EVENT_QUERY) - queried, 0);
    CHECK_OK(gm_host_malloc(allocator, 4096, &other));
    CHECK_EQ_INT(device_calls(allocator, GM_CALL_EVENT_QUERY) - queried, 1);
    CHECK_EQ_INT(stream_queries(allocator) - asked, 1);
    CHECK_OK(gm_sim_stream_complete(allocator, 0));
    queried = device_calls(allocator, GM_CALL_EVENT_QUERY);
    CHECK_OK(gm_host_malloc(allocator, 4096, &reused));
    CHECK_EQ_INT(device_calls(allocator, GM_CALL_EVENT_QUERY) - queried, 10);
    CHECK(reused == blocks[9]); /* the free list's head: the block moved there last, freed last */
    gm_host_stats stats;
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.pending_blocks, 0);
    CHECK_OK(gm_host_free(allocator, fresh));
    CHECK_OK(gm_host_free(allocator, other));
    CHECK_OK(gm_host_free(allocator, reused));
    gm_destroy(allocator, NULL);
}

static void statistics_are_exact(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(configs[c], &allocator));
        void *small = NULL, *middle = NULL, *large = NULL;
        CHECK_OK(gm_host_malloc(allocator, 1, &small));        /* 512 */
        CHECK_OK(gm_host_malloc(allocator, 5000, &middle));    /* 8192 */
        CHECK_OK(gm_host_malloc(allocator, 1u << 20, &large)); /* 1 MiB */
        gm_host_stats stats;
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.allocated_bytes.current, 512 + 8192 + (1 << 20));
        CHECK_EQ_INT(stats.requested_bytes, 1 + 5000 + (1 << 20));
        CHECK_EQ_INT(stats.reserved_bytes.current, 512 + 8192 + (1 << 20));
        CHECK_OK(gm_host_free(allocator, large));
        CHECK_OK(gm_host_free(allocator, middle));
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.allocated_bytes.current, 512);
        CHECK_EQ_INT(stats.allocated_bytes.peak, 512 + 8192 + (1 << 20));
        CHECK_EQ_INT(stats.allocated_bytes.freed, 8192 + (1 << 20));
        CHECK_EQ_INT(stats.reserved_bytes.current, 512 + 8192 + (1 << 20));
        CHECK_EQ_INT(stats.requested_bytes, 1);
        CHECK_OK(gm_host_empty_cache(allocator)); /* gives back the two idle blocks */
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes.current, 512);
        CHECK_EQ_INT(stats.reserved_bytes.peak, 512 + 8192 + (1 << 20));
        CHECK_EQ_INT(stats.host_frees, 2);
        CHECK_EQ_INT(stats.host_allocations, 3);
        CHECK_EQ_INT(stats.limit, 0);
        void *none = &none;
        CHECK_OK(gm_host_malloc(allocator, 0, &none));
        CHECK(none == NULL);
        CHECK_OK(gm_host_free(allocator, small));
        gm_destroy(allocator, NULL);
    }
}

static void empty_cache_keeps_pending_blocks(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(configs[1], &allocator));
    void *block = NULL;
    CHECK_OK(gm_host_malloc(allocator, 64u << 10, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, 7));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 7, 1));
    CHECK_OK(gm_host_free(allocator, block));
    CHECK_OK(gm_host_empty_cache(allocator));
    gm_host_stats stats;
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes.current, 64 << 10); /* a copy may still read it */
    CHECK_OK(gm_sim_stream_complete(allocator, 7));
    CHECK_OK(gm_host_empty_cache(allocator));
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes.current, 0);
    CHECK_EQ_INT(stats.host_frees, 1);
    /* gm_destroy waits for pending events and frees live blocks too */
    CHECK_OK(gm_host_malloc(allocator, 4096, &block));
    CHECK_OK(gm_host_record_stream(allocator, block, 7));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 7, 1));
    CHECK_OK(gm_host_free(allocator, block));
    CHECK_OK(gm_host_malloc(allocator, 4096, &block));
    gm_destroy(allocator, NULL);
}

static void limit_empties_the_idle_cache_then_fails(void)
{
    for (size_t c = 0; c < config_count; c++) {
        char config[128];
        snprintf(config, sizeof config, "%s,host_limit:64KiB", configs[c]);
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(config, &allocator));
        void *first = NULL, *second = NULL, *third = NULL;
        CHECK_OK(gm_host_malloc(allocator, 16u << 10, &first));
        CHECK_OK(gm_host_malloc(allocator, 16u << 10, &second));
        CHECK_OK(gm_host_free(allocator, second)); /* idle: 16 KiB cached */
        CHECK_OK(gm_host_malloc(allocator, 32u << 10, &third)); /* 64 KiB held: at the limit */
        gm_host_stats stats;
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes.current, 64 << 10);
        CHECK_EQ_INT(stats.limit, 64 << 10);
        void *fourth = NULL;
        CHECK_OK(gm_host_malloc(allocator, 8u << 10, &fourth)); /* the idle 16 KiB block goes back */
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes.current, (16 + 32 + 8) << 10);
        CHECK_EQ_INT(stats.host_frees, 1);
        void *fifth = NULL;
        CHECK_STATUS(gm_host_malloc(allocator, 16u << 10, &fifth), GM_ERROR_OUT_OF_MEMORY);
        CHECK_MESSAGE("host_limit");
        CHECK(fifth == NULL);
        CHECK_OK(gm_host_free(allocator, first));
        CHECK_OK(gm_host_free(allocator, third));
        CHECK_OK(gm_host_free(allocator, fourth));
        CHECK_OK(gm_host_malloc(allocator, 64u << 10, &fifth)); /* all idle: given back, then fits */
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes.current, 64 << 10);
        CHECK_OK(gm_host_free(allocator, fifth));
        gm_destroy(allocator, NULL);
    }
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create("host_limit:lots", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("host_limit");
}

static void data_survives_on_the_host_backend(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(configs[1], &allocator));
    enum { count = 16 };
    unsigned char *blocks[count];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < count; i++) {
            size_t size = (size_t)(1000 + 700 * i);
            REQUIRE(gm_host_malloc(allocator, size, (void **)&blocks[i]) == GM_OK);
            for (size_t b = 0; b < size; b++)
                blocks[i][b] = (unsigned char)(b * 31 + (size_t)i * 7 + (size_t)round);
        }
        for (int i = 0; i < count; i++) {
            size_t size = (size_t)(1000 + 700 * i), wrong = 0;
            for (size_t b = 0; b < size; b++)
                wrong += blocks[i][b] != (unsigned char)(b * 31 + (size_t)i * 7 + (size_t)round);
            CHECK_EQ_INT(wrong, 0);
            CHECK_OK(gm_host_free(allocator, blocks[i]));
        }
    }
    gm_host_stats stats;
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.cache_misses, count);
    CHECK_EQ_INT(stats.cache_hits, 2 * count);
    gm_destroy(allocator, NULL);
}

typedef struct worker {
    gm_allocator *allocator;
    int index;
    int failures;
} worker;

enum { thread_count = 4, rounds = 2000, slots = 8 };

static void *work(void *argument)
{
    worker *self = argument;
    unsigned char *held[slots] = {0};
    size_t sizes[slots] = {0};
    for (int round = 0; round < rounds; round++) {
        int slot = round % slots;
        if (held[slot]) {
            for (size_t b = 0; b < sizes[slot]; b++)
                self->failures += held[slot][b] != (unsigned char)(self->index + slot);
            gm_stream streams[] = {(gm_stream)(10 + self->index), (gm_stream)(20 + self->index)}; /* 20s: idle */
            if (round % 3 == 0)
                self->failures += gm_host_free_with_streams(self->allocator, held[slot], streams, 2) != GM_OK;
            else
                self->failures += gm_host_free(self->allocator, held[slot]) != GM_OK;
            held[slot] = NULL;
        }
        sizes[slot] = (size_t)(512u << ((round * 7 + self->index) % 6));
        if (gm_host_malloc(self->allocator, sizes[slot], (void **)&held[slot]) != GM_OK) {
            self->failures++;
            continue;
        }
        memset(held[slot], self->index + slot, sizes[slot]);
        if (round % 5 == 0)
            self->failures += gm_host_record_stream(self->allocator, held[slot], (gm_stream)(10 + self->index)) != GM_OK;
    }
    for (int slot = 0; slot < slots; slot++)
        if (held[slot])
            self->failures += gm_host_free(self->allocator, held[slot]) != GM_OK;
    return NULL;
}

static void four_threads_keep_exact_statistics(void)
{
    for (size_t c = 0; c < config_count; c++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(configs[c], &allocator));
        pthread_t threads[thread_count];
        worker workers[thread_count];
        for (int i = 0; i < thread_count; i++) {
            workers[i] = (worker){allocator, i, 0};
            REQUIRE(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
        }
        for (int i = 0; i < thread_count; i++) {
            pthread_join(threads[i], NULL);
            CHECK_EQ_INT(workers[i].failures, 0);
        }
        gm_host_stats stats;
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.allocated_bytes.current, 0);
        CHECK_EQ_INT(stats.allocations.current, 0);
        CHECK_EQ_INT(stats.allocations.allocated, thread_count * rounds);
        CHECK_EQ_INT(stats.allocations.freed, thread_count * rounds);
        CHECK_EQ_INT(stats.requested_bytes, 0);
        CHECK_EQ_INT(stats.cache_hits + stats.cache_misses, thread_count * rounds);
        CHECK_EQ_INT(stats.host_allocations, stats.cache_misses);
        CHECK(stats.allocations.peak <= thread_count * slots);
        CHECK(stats.allocated_bytes.peak <= stats.reserved_bytes.peak);
        CHECK_OK(gm_host_empty_cache(allocator)); /* the sim's streams never ran: pending ones stay */
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK(stats.reserved_bytes.current > 0 || stats.pending_blocks == 0);
        for (int i = 0; i < thread_count; i++)
            CHECK_OK(gm_sim_stream_complete(allocator, (gm_stream)(10 + i)));
        CHECK_OK(gm_host_empty_cache(allocator));
        CHECK_OK(gm_host_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes.current, 0);
        CHECK_EQ_INT(stats.pending_blocks, 0);
        CHECK_EQ_INT(stats.host_frees, stats.host_allocations);
        gm_destroy(allocator, NULL);
    }
}

static void bad_inputs_are_clear_errors(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(configs[1], &allocator));
    void *pointer = NULL;
    CHECK_STATUS(gm_host_malloc(NULL, 16, &pointer), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("allocator is NULL");
    CHECK_STATUS(gm_host_malloc(allocator, 16, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("pointer_out is NULL");
    CHECK_STATUS(gm_host_malloc(allocator, SIZE_MAX, &pointer), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_host_free(NULL, &pointer), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_host_free(allocator, NULL));
    int local = 0;
    CHECK_STATUS(gm_host_free(allocator, &local), GM_ERROR_INVALID_POINTER);
    CHECK_MESSAGE("not a live pinned host allocation");
    CHECK_STATUS(gm_host_record_stream(allocator, &local, 1), GM_ERROR_INVALID_POINTER);
    CHECK_STATUS(gm_host_record_stream(allocator, NULL, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_malloc(allocator, 4096, 0, &pointer)); /* a device allocation is not a host one */
    CHECK_STATUS(gm_host_free(allocator, pointer), GM_ERROR_INVALID_POINTER);
    CHECK_OK(gm_free(allocator, pointer));
    CHECK_OK(gm_host_malloc(allocator, 100, &pointer));
    CHECK_STATUS(gm_free(allocator, pointer), GM_ERROR_INVALID_POINTER); /* nor the reverse */
    CHECK_OK(gm_host_free(allocator, pointer));
    CHECK_STATUS(gm_host_free(allocator, pointer), GM_ERROR_INVALID_POINTER); /* double free */
    CHECK_MESSAGE("already freed");
    CHECK_STATUS(gm_host_empty_cache(NULL), GM_ERROR_INVALID_ARGUMENT);
    gm_host_stats stats;
    CHECK_STATUS(gm_host_get_stats(NULL, &stats), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_host_get_stats(allocator, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocations.current, 0);
    CHECK_EQ_INT(stats.allocations.allocated, 1);
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(freed_block_is_reused_at_once_without_streams), TEST_CASE(reuse_waits_for_the_recorded_streams),
          TEST_CASE(work_after_the_look_does_not_delay_reuse), TEST_CASE(idle_streams_are_not_waited_for),
          TEST_CASE(a_busy_stream_is_queried_once_a_look),
          TEST_CASE(statistics_are_exact),
          TEST_CASE(empty_cache_keeps_pending_blocks), TEST_CASE(limit_empties_the_idle_cache_then_fails),
          TEST_CASE(data_survives_on_the_host_backend), TEST_CASE(four_threads_keep_exact_statistics),
          TEST_CASE(bad_inputs_are_clear_errors))
