/*
 * many_streams_rss.c -- the loop of tests/test_many_streams.c without its checks or data patterns:
 * CONFIG, then N streams, each with a block of its own, a block of the default stream recorded on it
 * and freed across streams, the work completed, everything freed and the cache emptied; prints the
 * resident memory and the seconds of each tenth. Built by hand against any build's static library, so
 * that builds before and after a change compare (docs/benchmarks.md, "100,000 streams"):
 *   gcc -O2 -Wall -Iinclude bench/many_streams_rss.c build/libgpumem_static.a -lpthread -o many_streams_rss
 *   ./many_streams_rss backend:sim,capacity:8GiB 100000
 */
#include "gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double resident_mib(void)
{
    FILE *statm = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, resident = 0;
    if (!statm)
        return 0;
    if (fscanf(statm, "%llu %llu", &size, &resident) != 2)
        resident = 0;
    fclose(statm);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

static double now_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static int use_one_stream(gm_allocator *allocator, gm_stream stream, long index)
{
    void *own = NULL, *shared = NULL;
    int failures = gm_malloc(allocator, 65536 + (size_t)(index % 7) * 512, stream, &own) != GM_OK;
    failures += gm_malloc(allocator, 4096, 0, &shared) != GM_OK;
    failures += gm_record_stream(allocator, shared, stream) != GM_OK;
    failures += gm_sim_stream_enqueue(allocator, stream, 1) != GM_OK;
    failures += gm_free(allocator, shared) != GM_OK;
    failures += gm_sim_stream_complete(allocator, stream) != GM_OK;
    failures += gm_free(allocator, own) != GM_OK;
    failures += gm_empty_cache(allocator) != GM_OK;
    return failures;
}

int main(int argc, char **argv)
{
    long streams = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
    gm_allocator *allocator = NULL;
    if (streams < 10 || gm_create(argv[1], &allocator) != GM_OK) {
        fprintf(stderr, "usage: many_streams_rss CONFIG STREAMS (at least 10): %s\n", gm_last_error());
        return 2;
    }
    double tenth_started = now_seconds();
    int failures = 0;
    for (long i = 0; i < streams; i++) {
        failures += use_one_stream(allocator, (gm_stream)(1000 + i), i);
        if ((i + 1) % (streams / 10) == 0) {
            double now = now_seconds();
            printf("%s %ld streams: rss %.1f MiB, this tenth %.2f s\n", argv[1], i + 1, resident_mib(), now - tenth_started);
            fflush(stdout);
            tenth_started = now;
        }
    }
    gm_destroy(allocator, NULL);
    if (failures)
        fprintf(stderr, "%d calls failed\n", failures);
    return failures ? 1 : 0;
}
