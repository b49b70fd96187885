/*
 * test_threads.c -- four threads allocating and freeing at once on one allocator (host backend,
 * real memory): each thread stamps its allocations with a data pattern and checks it before
 * freeing, so a race that hands one block to two threads shows as a broken pattern. Each thread
 * uses its own stream and sometimes the shared default stream. At the end the heap is validated.
 */
#include "test.h"

#include "pattern.h"

#include <pthread.h>

#define THREADS 4
#define OPERATIONS 100000
#define MAX_LIVE 256

typedef struct worker {
    gm_allocator *allocator;
    uint64_t seed;
    int index;
    int broken;
    int errors;
} worker;

static void *work(void *argument)
{
    worker *self = argument;
    struct {
        char *pointer;
        size_t size;
        uint64_t identity;
    } live[MAX_LIVE];
    size_t count = 0;
    uint64_t identity = (uint64_t)self->index << 40;
    for (int step = 0; step < OPERATIONS; step++) {
        if (test_random(&self->seed) % 2 == 0 && count < MAX_LIVE) {
            size_t size = test_random(&self->seed) % 8 ? 1 + test_random(&self->seed) % 8192
                                                        : 1 + test_random(&self->seed) % (3u << 20);
            gm_stream stream = test_random(&self->seed) % 4 ? (gm_stream)(10 + self->index) : 0;
            void *pointer = NULL;
            gm_status status = gm_malloc(self->allocator, size, stream, &pointer);
            if (status != GM_OK) {
                self->errors += status != GM_ERROR_OUT_OF_MEMORY;
                continue;
            }
            live[count].pointer = pointer;
            live[count].size = size;
            live[count].identity = ++identity;
            pattern_stamp(pointer, size, identity);
            count++;
        } else if (count) {
            size_t victim = test_random(&self->seed) % count;
            self->broken += !pattern_intact(live[victim].pointer, live[victim].size, live[victim].identity);
            self->errors += gm_free(self->allocator, live[victim].pointer) != GM_OK;
            live[victim] = live[--count];
        }
        if (step % 20000 == 0 && self->index == 0)
            gm_empty_cache(self->allocator);
    }
    for (size_t i = 0; i < count; i++) {
        self->broken += !pattern_intact(live[i].pointer, live[i].size, live[i].identity);
        self->errors += gm_free(self->allocator, live[i].pointer) != GM_OK;
    }
    return NULL;
}

static void run_threads(const char *config)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){allocator, 0x5eed + (uint64_t)i * 7919, i, 0, 0};
        REQUIRE(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK_EQ_INT(workers[i].broken, 0);
        CHECK_EQ_INT(workers[i].errors, 0);
    }
    CHECK_OK(gm_validate(allocator));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].current, 0);
    CHECK(stats.allocation[GM_POOL_ALL].allocated > THREADS * OPERATIONS / 4);
    size_t leaked = 1;
    gm_destroy(allocator, &leaked);
    CHECK_EQ_INT(leaked, 0);
}

static void four_threads_pages_engine(void)
{
    run_threads("backend:host,engine:pages,capacity:512MiB");
}

static void four_threads_segments_engine(void)
{
    run_threads("backend:host,engine:segments,capacity:512MiB");
}

RUN_TESTS(TEST_CASE(four_threads_pages_engine), TEST_CASE(four_threads_segments_engine))
