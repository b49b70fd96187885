/*
 * bench/waiting_frees.c -- what frees waiting for busy streams cost every later allocation.
 *
 * A program that frees tensors used on a side or communication stream (record_stream) while that
 * stream still runs leaves pending frees, and each allocation first completes the ones whose events
 * are done. This prints the time of a 1 MiB gm_malloc + gm_free on the default stream of the simulated
 * device while N 4 KiB blocks wait for work queued on S other streams that never finishes: the cost
 * should follow the streams (one event asked per stream), not the frees. The fastest of three runs.
 *
 *     gpumem_waiting_frees [iterations]
 */
#include "gpumem.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* N frees waiting on streams 100 .. 100 + S - 1, each busy; false (error printed) on a failure. */
static bool leave_waiting_frees(gm_allocator *allocator, long waiting, int streams)
{
    for (gm_stream stream = 100; stream < (gm_stream)(100 + streams); stream++)
        if (gm_sim_stream_enqueue(allocator, stream, 1) != GM_OK)
            return false;
    for (long i = 0; i < waiting; i++) {
        void *block = NULL;
        if (gm_malloc(allocator, 4096, 0, &block) != GM_OK ||
            gm_record_stream(allocator, block, (gm_stream)(100 + i % streams)) != GM_OK || gm_free(allocator, block) != GM_OK)
            return false;
    }
    return true;
}

static double fastest_ns(gm_allocator *allocator, long iterations)
{
    double fastest = 1e30;
    for (int run = 0; run < 3; run++) {
        double start = seconds_now();
        for (long i = 0; i < iterations; i++) {
            void *block = NULL;
            if (gm_malloc(allocator, 1u << 20, 0, &block) != GM_OK || gm_free(allocator, block) != GM_OK)
                return -1;
        }
        double elapsed = seconds_now() - start;
        fastest = elapsed < fastest ? elapsed : fastest;
    }
    return fastest / (double)iterations * 1e9;
}

int main(int argc, char **argv)
{
    long iterations = argc > 1 ? atol(argv[1]) : 100000;
    if (iterations <= 0) {
        fprintf(stderr, "usage: gpumem_waiting_frees [iterations > 0]\n");
        return 2;
    }
    static const long waiting_counts[] = {0, 100, 1000, 10000};
    static const int stream_counts[] = {1, 64};
    printf("| frees waiting | busy streams | ns per malloc + free |\n|---|---|---|\n");
    for (size_t s = 0; s < sizeof stream_counts / sizeof stream_counts[0]; s++)
        for (size_t w = 0; w < sizeof waiting_counts / sizeof waiting_counts[0]; w++) {
            gm_allocator *allocator = NULL;
            double ns = -1;
            if (gm_create("backend:sim,capacity:16GiB", &allocator) == GM_OK &&
                leave_waiting_frees(allocator, waiting_counts[w], stream_counts[s]))
                ns = fastest_ns(allocator, iterations);
            if (ns < 0) {
                fprintf(stderr, "gpumem_waiting_frees: %s\n", gm_last_error());
                gm_destroy(allocator, NULL);
                return 1;
            }
            printf("| %ld | %d | %.1f |\n", waiting_counts[w], stream_counts[s], ns);
            gm_destroy(allocator, NULL);
        }
    return 0;
}
