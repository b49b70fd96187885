/*
 * vmm_threads.c -- whether the CUDA driver's virtual-memory calls run side by side when several host
 * threads make chunks at once: the wall time to make (cuMemCreate, cuMemMap, cuMemSetAccess) and to
 * unmake (cuMemUnmap, cuMemRelease) a fixed number of chunks of one size, split over 1, 2, 4 and 8
 * threads, each thread in its own part of one reserved range. If the driver serialises these calls
 * the time stays flat; if it does not, a growth cut into many small chunks could make them in
 * parallel. Also: one cuMemSetAccess over many adjacent mappings against one per mapping. Prints a
 * table; exits non-zero if a call fails.
 *
 * Build (GPU machine): gcc -O2 -I/usr/local/cuda/include bench/vmm_threads.c -o vmm_threads -lcuda -lpthread
 */
#include "driver_probe.h"

#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { CHUNKS = 512, MAX_THREADS = 8 };

static CUcontext context;
static CUmemAllocationProp properties;
static CUmemAccessDesc access_descriptor;
static CUdeviceptr base;
static size_t chunk_size;
static CUmemGenericAllocationHandle handles[CHUNKS];

typedef struct {
    int first, count;
    int make; /* 1: create, map, set access; 0: unmap, release */
} work;

static void *run(void *argument)
{
    const work *w = argument;
    CHECK(cuCtxSetCurrent(context));
    for (int i = w->first; i < w->first + w->count; i++) {
        CUdeviceptr at = base + (CUdeviceptr)i * chunk_size;
        if (w->make) {
            CHECK(cuMemCreate(&handles[i], chunk_size, &properties, 0));
            CHECK(cuMemMap(at, chunk_size, 0, handles[i], 0));
            CHECK(cuMemSetAccess(at, chunk_size, &access_descriptor, 1));
        } else {
            CHECK(cuMemUnmap(at, chunk_size));
            CHECK(cuMemRelease(handles[i]));
        }
    }
    return NULL;
}

static double in_threads(int threads, int make)
{
    pthread_t ids[MAX_THREADS];
    work parts[MAX_THREADS];
    double start = now_us();
    for (int t = 0; t < threads; t++) {
        parts[t] = (work){t * (CHUNKS / threads), CHUNKS / threads, make};
        if (pthread_create(&ids[t], NULL, run, &parts[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    for (int t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    return now_us() - start;
}

/* Map `count` chunks side by side with no access, then set access once over all of them. */
static double one_access_for(int count)
{
    for (int i = 0; i < count; i++) {
        CHECK(cuMemCreate(&handles[i], chunk_size, &properties, 0));
        CHECK(cuMemMap(base + (CUdeviceptr)i * chunk_size, chunk_size, 0, handles[i], 0));
    }
    double start = now_us();
    CHECK(cuMemSetAccess(base, chunk_size * count, &access_descriptor, 1));
    double spent = now_us() - start;
    for (int i = 0; i < count; i++) {
        CHECK(cuMemUnmap(base + (CUdeviceptr)i * chunk_size, chunk_size));
        CHECK(cuMemRelease(handles[i]));
    }
    return spent;
}

int main(void)
{
    context = open_device(&properties, &access_descriptor);
    size_t sizes[] = {2u << 20, 8u << 20};
    CHECK(cuMemAddressReserve(&base, (size_t)CHUNKS * (8u << 20), 0, 0, 0));
    printf("| chunk MiB | threads | make: us per chunk (wall) | unmake: us per chunk (wall) |\n|---|---|---|---|\n");
    for (int s = 0; s < 2; s++) {
        chunk_size = sizes[s];
        in_threads(1, 1); /* warm the driver */
        in_threads(1, 0);
        for (int threads = 1; threads <= MAX_THREADS; threads *= 2) {
            double make = 1e30, unmake = 1e30;
            for (int round = 0; round < 3; round++) {
                double m = in_threads(threads, 1), u = in_threads(threads, 0);
                make = m < make ? m : make;
                unmake = u < unmake ? u : unmake;
            }
            printf("| %zu | %d | %.1f | %.1f |\n", chunk_size >> 20, threads, make / CHUNKS, unmake / CHUNKS);
        }
    }
    chunk_size = 8u << 20;
    printf("\n| chunks under one cuMemSetAccess | us per chunk |\n|---|---|\n");
    for (int count = 1; count <= 64; count *= 4)
        printf("| %d | %.1f |\n", count, one_access_for(count) / count);
    CHECK(cuMemAddressFree(base, (size_t)CHUNKS * (8u << 20)));
    return 0;
}
