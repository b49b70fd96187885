/*
 * test_host.c -- a million randomized operations (fixed seed) on real host memory: every live
 * allocation carries a data pattern that is checked when it is freed and, all of them, every
 * 10000 operations; any overlap of live allocations, or live memory that the engine unmapped or
 * remapped under them, shows as a broken pattern (or a fault). Both engines; the pages engine
 * with a small capacity so that physical chunks are moved and released often.
 */
#include "test.h"

#include "data_workload.h"

static void host_workload(const char *config, int operations, uint64_t seed)
{
    data_workload workload = {.config = config, .operations = operations, .seed = seed, .model_streams = true};
    data_workload_run(&workload);
}

static void million_operations_pages_engine(void)
{
    host_workload("backend:host,engine:pages,capacity:160MiB", 1000000, 0xC0FFEE);
}

static void operations_pages_engine_small_pages(void)
{
    host_workload("backend:host,engine:pages,capacity:96MiB,page_size:64KiB", 200000, 0xBEEF);
}

static void operations_segments_engine(void)
{
    host_workload("backend:host,engine:segments,capacity:160MiB", 300000, 0xFACE);
}

RUN_TESTS(TEST_CASE(million_operations_pages_engine), TEST_CASE(operations_pages_engine_small_pages),
          TEST_CASE(operations_segments_engine))
