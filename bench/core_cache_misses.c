/*
 * bench/core_cache_misses.c -- the program bench/core_cache_misses.py runs under cachegrind: gm_malloc
 * and gm_free of one pattern on the sim, with 64 KiB read and 40 KiB of code run after every call.
 *
 * In an interpreter's loop (Python, with CuPy or PyTorch around the allocator) the processor's
 * first-level cache keeps little of gpumem from one call to the next, so what a call costs there is
 * largely the cache lines it touches. Timing that is at the mercy of the machine's drift; cachegrind
 * counts it: the reads between calls push gpumem's lines out of its simulated 32 KiB cache, and the
 * misses counted inside gpumem's functions are the lines a call touches (data, and code: 40 KiB of
 * no-ops run between calls push gpumem's code out of the simulated instruction cache).
 *
 *     gpumem_core_cache_misses ITERATIONS FIRST_SIZE SECOND_SIZE   (sizes alternate)
 */
#include "gpumem.h"

#include <stdio.h>
#include <stdlib.h>

#define STIRRED_BYTES (64 * 1024)

static volatile unsigned char stirred[STIRRED_BYTES];

/* Run 40 KiB of straight-line code (one-byte no-ops): the simulated 32 KiB instruction cache then
 * holds none of gpumem's code either, as after an interpreter's dispatch between two calls. */
__attribute__((noinline)) static void stir_code(void)
{
    __asm__ volatile(".rept 40960\n\tnop\n\t.endr" ::: "memory");
}

/* Read one byte of every cache line of `stirred` and run stir_code: kept out of gpumem's functions'
 * counts. */
__attribute__((noinline)) static void stir_caches(void)
{
    unsigned sum = 0;
    for (size_t i = 0; i < STIRRED_BYTES; i += 64)
        sum += stirred[i];
    stirred[0] = (unsigned char)sum;
    stir_code();
}

int main(int argc, char **argv)
{
    if (argc != 4 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: gpumem_core_cache_misses ITERATIONS FIRST_SIZE SECOND_SIZE\n");
        return 2;
    }
    long iterations = atol(argv[1]);
    size_t sizes[2] = {strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0)};
    gm_allocator *allocator = NULL;
    if (gm_create_from_environment("backend:sim", &allocator) != GM_OK) {
        fprintf(stderr, "gpumem_core_cache_misses: %s\n", gm_last_error());
        return 1;
    }
    int status = 0;
    for (long i = 0; i < iterations && status == 0; i++) {
        void *pointer = NULL;
        if (gm_malloc(allocator, sizes[i % 2], 0, &pointer) != GM_OK) {
            fprintf(stderr, "gpumem_core_cache_misses: %s\n", gm_last_error());
            status = 1;
            break;
        }
        stir_caches();
        gm_free(allocator, pointer);
        stir_caches();
    }
    gm_destroy(allocator, NULL);
    return status;
}
