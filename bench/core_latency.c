/*
 * bench/core_latency.c -- time per gm_malloc + gm_free of gpumem's C core, by allocation pattern.
 *
 * bench/torch_latency.py measures an allocation through PyTorch: Python, the dispatcher, the tensor,
 * the adapter and the core. This measures the core alone, with the same patterns (one block allocated
 * and freed at a time, except `ascending`, which holds up to 64 before freeing them), on the default
 * stream of any backend: the difference between the two is what lies around the core. Each pattern
 * runs three times after a warm-up; the fastest run is printed (the machine's speed drifts).
 *
 *     gpumem_core_latency [GPUMEM_CONF-style settings, e.g. backend:cuda] [iterations]
 */
#include "gpumem.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MEBIBYTE ((size_t)1 << 20)
#define HELD_AT_MOST 64

static const char *const patterns[] = {"same", "alternating", "cycling", "small", "ascending"};

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* The i-th size of a pattern, as bench/torch_latency.py's sizes_of makes it. */
static size_t size_of(const char *pattern, long i, uint64_t *random_state)
{
    static const size_t cycle[] = {512, 4096, 65536, MEBIBYTE, 3 * MEBIBYTE, 17 * MEBIBYTE, 64 * MEBIBYTE};
    if (strcmp(pattern, "same") == 0)
        return 4 * MEBIBYTE;
    if (strcmp(pattern, "alternating") == 0)
        return i % 2 ? 64 * MEBIBYTE : MEBIBYTE;
    if (strcmp(pattern, "cycling") == 0)
        return cycle[i % 7];
    if (strcmp(pattern, "small") == 0) {
        *random_state = *random_state * 6364136223846793005ull + 1442695040888963407ull;
        return (size_t)64 << ((*random_state >> 61) % 11);
    }
    return MEBIBYTE * (size_t)(1 + i % 64);
}

/* One run of a pattern over `sizes`; false (with the error printed) when an allocation fails. */
static bool run_once(gm_allocator *allocator, bool holding, const size_t *sizes, long count)
{
    void *held[HELD_AT_MOST];
    int held_count = 0;
    for (long i = 0; i < count; i++) {
        void *pointer = NULL;
        if (gm_malloc(allocator, sizes[i], 0, &pointer) != GM_OK) {
            fprintf(stderr, "gpumem_core_latency: %s\n", gm_last_error());
            return false;
        }
        if (!holding) {
            gm_free(allocator, pointer);
            continue;
        }
        held[held_count++] = pointer;
        if (held_count == HELD_AT_MOST) {
            while (held_count)
                gm_free(allocator, held[--held_count]);
        }
    }
    while (held_count)
        gm_free(allocator, held[--held_count]);
    return true;
}

int main(int argc, char **argv)
{
    const char *settings = argc > 1 ? argv[1] : "backend:sim";
    long count = argc > 2 ? atol(argv[2]) : 1000000;
    if (count <= 0) {
        fprintf(stderr, "gpumem_core_latency: iterations must be a positive number, not %s\n", argv[2]);
        return 2;
    }
    gm_allocator *allocator = NULL;
    if (gm_create_from_environment(settings, &allocator) != GM_OK) {
        fprintf(stderr, "gpumem_core_latency: %s\n", gm_last_error());
        return 1;
    }
    size_t *sizes = malloc(sizeof *sizes * (size_t)count);
    if (!sizes) {
        fprintf(stderr, "gpumem_core_latency: no host memory for %ld sizes\n", count);
        gm_destroy(allocator, NULL);
        return 1;
    }
    printf("| pattern | ns per malloc + free (%s) |\n|---|---|\n", settings);
    int status = 0;
    for (size_t p = 0; p < sizeof patterns / sizeof patterns[0] && status == 0; p++) {
        uint64_t random_state = 12345;
        for (long i = 0; i < count; i++)
            sizes[i] = size_of(patterns[p], i, &random_state);
        bool holding = strcmp(patterns[p], "ascending") == 0;
        double fastest = 0;
        for (int run = 0; run < 4 && status == 0; run++) { /* run 0 warms up */
            double started = seconds_now();
            if (!run_once(allocator, holding, sizes, count))
                status = 1;
            double elapsed = seconds_now() - started;
            if (run == 1 || (run > 1 && elapsed < fastest))
                fastest = elapsed;
        }
        if (status == 0)
            printf("| %s | %.1f |\n", patterns[p], fastest / (double)count * 1e9);
    }
    free(sizes);
    gm_destroy(allocator, NULL);
    return status;
}
