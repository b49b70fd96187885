/*
 * test_pending_queues.c -- the queues of pending cross-stream frees, white-box (pending_frees.c): one
 * queue per stream in the order its events were recorded (found through a map, or by a search for the
 * one stream value the map cannot hold), emptied queues recycled, and gm_validate's
 * check that each block waits for as many events as it has pending frees (a count off by one either
 * way is reported as corrupt, and the look leaves every count as it found it).
 */
#include "test.h"

#include "core/allocator.h"

static size_t queue_count(const gm_allocator *allocator)
{
    size_t count = 0;
    for (const gm_pending_queue *queue = allocator->pending_queues; queue; queue = queue->next)
        count++;
    return count;
}

static const gm_pending_queue *queue_of_stream(const gm_allocator *allocator, gm_stream stream)
{
    for (const gm_pending_queue *queue = allocator->pending_queues; queue; queue = queue->next)
        if (queue->stream == stream)
            return queue;
    return NULL;
}

/* A block used on streams 2 and 3 and one used on 3: two queues, stream 3's in the order of the frees;
 * stream 3 done, its queue goes back to the spares and the first block still waits for stream 2. */
static void one_queue_per_stream_in_the_order_of_the_frees(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    void *first = NULL, *second = NULL, *probe = NULL;
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 3, 1));
    CHECK_OK(gm_malloc(allocator, 4096, 1, &first));
    CHECK_OK(gm_malloc(allocator, 4096, 1, &second));
    CHECK_OK(gm_record_stream(allocator, first, 2));
    CHECK_OK(gm_record_stream(allocator, first, 3));
    CHECK_OK(gm_record_stream(allocator, second, 3));
    CHECK_OK(gm_free(allocator, first));
    CHECK_OK(gm_free(allocator, second));
    CHECK_EQ_INT(queue_count(allocator), 2);
    const gm_pending_queue *on_three = queue_of_stream(allocator, 3);
    CHECK(on_three && on_three->head && on_three->head->next && on_three->head->next == on_three->tail);
    CHECK(on_three->head->block->address == (uintptr_t)first && on_three->tail->block->address == (uintptr_t)second);
    CHECK_EQ_INT(on_three->head->block->pending_events, 2);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_sim_stream_complete(allocator, 3));
    CHECK_OK(gm_malloc(allocator, 8192, 1, &probe)); /* completes stream 3's frees */
    CHECK_EQ_INT(queue_count(allocator), 1);
    CHECK(queue_of_stream(allocator, 2) && allocator->spare_queues);
    CHECK_EQ_INT(queue_of_stream(allocator, 2)->head->block->pending_events, 1);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    CHECK_OK(gm_free(allocator, probe));
    CHECK_OK(gm_malloc(allocator, 8192, 1, &probe));
    CHECK(allocator->pending_queues == NULL);
    CHECK_OK(gm_free(allocator, probe));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* The one stream the queues' map cannot hold (UINTPTR_MAX: its key would be 0) has its queue all the
 * same, found by a search; a busy stream beside it keeps its own. */
static void the_last_stream_value_has_a_queue_too(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    const gm_stream last = UINTPTR_MAX;
    void *blocks[3] = {NULL};
    CHECK_OK(gm_sim_stream_enqueue(allocator, last, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_malloc(allocator, 4096, 1, &blocks[i]));
        CHECK_OK(gm_record_stream(allocator, blocks[i], i == 1 ? 2 : last));
        CHECK_OK(gm_free(allocator, blocks[i]));
    }
    CHECK_EQ_INT(queue_count(allocator), 2);
    CHECK_EQ_INT(allocator->queue_of_stream.count, 1);
    const gm_pending_queue *on_last = queue_of_stream(allocator, last);
    CHECK(on_last && on_last->head->next == on_last->tail && on_last->tail->block->address == (uintptr_t)blocks[2]);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_sim_stream_complete(allocator, last));
    void *probe = NULL;
    CHECK_OK(gm_malloc(allocator, 8192, 1, &probe));
    CHECK_EQ_INT(queue_count(allocator), 1);
    CHECK(queue_of_stream(allocator, 2) != NULL);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, probe));
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    gm_destroy(allocator, NULL);
}

/* A block's count of events one above or below its pending frees is corrupt; gm_validate says so and
 * leaves the count as it was. */
static void validate_finds_a_count_of_events_unlike_the_frees(void)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("backend:sim,capacity:1GiB", &allocator));
    void *block = NULL;
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 3, 1));
    CHECK_OK(gm_malloc(allocator, 4096, 1, &block));
    CHECK_OK(gm_record_stream(allocator, block, 2));
    CHECK_OK(gm_record_stream(allocator, block, 3));
    CHECK_OK(gm_free(allocator, block));
    gm_block *pending = allocator->pending_queues->head->block;
    CHECK_EQ_INT(pending->pending_events, 2);
    static const int changes[] = {1, -1};
    for (int i = 0; i < 2; i++) {
        pending->pending_events += (uint32_t)changes[i];
        uint32_t before = pending->pending_events;
        CHECK_STATUS(gm_validate(allocator), GM_ERROR_CORRUPT);
        CHECK_EQ_INT(pending->pending_events, before);
        pending->pending_events -= (uint32_t)changes[i];
        CHECK_OK(gm_validate(allocator));
    }
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    CHECK_OK(gm_sim_stream_complete(allocator, 3));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(one_queue_per_stream_in_the_order_of_the_frees), TEST_CASE(the_last_stream_value_has_a_queue_too),
          TEST_CASE(validate_finds_a_count_of_events_unlike_the_frees))
