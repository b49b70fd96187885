/*
 * vmm_probe.c -- what the CUDA driver's virtual-memory calls allow and cost on this GPU, for the
 * pages engine's design: whether a page of a larger allocation can be mapped at an offset, whether one
 * cuMemUnmap may cover several adjacent mappings, whether an allocation may be mapped twice, the
 * median time of each call, and of compaction's copy into new memory. Prints a table; exits non-zero
 * if a call that must work fails.
 *
 * Build (GPU machine): gcc -O2 -I/usr/local/cuda/include bench/vmm_probe.c -o vmm_probe -lcuda
 */
#include "driver_probe.h"

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *values, int count)
{
    qsort(values, count, sizeof *values, compare);
    return values[count / 2];
}

static CUmemAllocationProp properties;
static CUmemAccessDesc access_descriptor;

static CUmemGenericAllocationHandle create(size_t size)
{
    CUmemGenericAllocationHandle handle;
    CHECK(cuMemCreate(&handle, size, &properties, 0));
    return handle;
}

/* 7. What compaction's copy into new memory costs on an idle device (backend/cuda.c's copy_into): a
 * second mapping of the new allocation, a device-wide wait, the copy, a wait for it, the mapping gone. */
static void copy_timings(size_t page)
{
    enum { COPY_ROUNDS = 20 };
    const size_t sizes_mib[] = {2, 20, 256, 1024};
    printf("\n| copy into new memory through a second mapping (idle device) | median us |\n|---|---|\n");
    for (size_t s = 0; s < sizeof sizes_mib / sizeof sizes_mib[0]; s++) {
        size_t size = sizes_mib[s] << 20;
        size = (size + page - 1) / page * page;
        CUdeviceptr source;
        CHECK(cuMemAlloc(&source, size));
        CHECK(cuMemsetD8(source, 7, size));
        double times[COPY_ROUNDS];
        for (int round = 0; round < COPY_ROUNDS; round++) {
            CUmemGenericAllocationHandle target = create(size);
            CHECK(cuCtxSynchronize());
            double t0 = now_us();
            CUdeviceptr second;
            CHECK(cuMemAddressReserve(&second, size, page, 0, 0));
            CHECK(cuMemMap(second, size, 0, target, 0));
            CHECK(cuMemSetAccess(second, size, &access_descriptor, 1));
            CHECK(cuCtxSynchronize());
            CHECK(cuMemcpyDtoD(second, source, size));
            CHECK(cuCtxSynchronize());
            CHECK(cuMemUnmap(second, size));
            CHECK(cuMemAddressFree(second, size));
            times[round] = now_us() - t0;
            CHECK(cuMemRelease(target));
        }
        printf("| %zu MiB | %.1f |\n", sizes_mib[s], median(times, COPY_ROUNDS));
        CHECK(cuMemFree(source));
    }
}

int main(void)
{
    open_device(&properties, &access_descriptor);
    size_t page = 0;
    CHECK(cuMemGetAllocationGranularity(&page, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("granularity %zu bytes\n", page);

    enum { PAGES = 16, ROUNDS = 50 };
    CUdeviceptr base;
    CHECK(cuMemAddressReserve(&base, 64 * page, 0, 0, 0));

    /* 1. Mapping a page of a larger allocation at an offset (lets one allocation be split later). */
    CUmemGenericAllocationHandle big = create(2 * page);
    CUresult offset_map = cuMemMap(base, page, page, big, 0);
    const char *name = NULL;
    cuGetErrorName(offset_map, &name);
    printf("map one page of a 2-page allocation at offset 1 page: %s\n", name);
    if (offset_map == CUDA_SUCCESS)
        CHECK(cuMemUnmap(base, page));
    CHECK(cuMemRelease(big));

    /* 2. PAGES page-sized allocations mapped side by side, one set_access over all of them. */
    CUmemGenericAllocationHandle handles[PAGES];
    for (int i = 0; i < PAGES; i++) {
        handles[i] = create(page);
        CHECK(cuMemMap(base + i * page, page, 0, handles[i], 0));
    }
    CHECK(cuMemSetAccess(base, PAGES * page, &access_descriptor, 1));
    for (int i = 0; i < PAGES; i++)
        CHECK(cuMemsetD8(base + i * page, (unsigned char)(i + 1), page));
    CHECK(cuCtxSynchronize());
    printf("one set_access over %d adjacent mappings: ok\n", PAGES);

    /* 3. Unmap one page in the middle and map it elsewhere: its data comes along. */
    CHECK(cuMemUnmap(base + 5 * page, page));
    CHECK(cuMemMap(base + 40 * page, page, 0, handles[5], 0));
    CHECK(cuMemSetAccess(base + 40 * page, page, &access_descriptor, 1));
    unsigned char byte = 0;
    CHECK(cuMemcpyDtoH(&byte, base + 40 * page + 12345, 1));
    printf("a page moved to another address keeps its data: %s (byte %u)\n", byte == 6 ? "ok" : "FAILED", byte);
    int failures = byte != 6;

    /* 4. One cuMemUnmap over several adjacent whole mappings. */
    CUresult multi = cuMemUnmap(base + 8 * page, 4 * page);
    cuGetErrorName(multi, &name);
    printf("one unmap over 4 adjacent mappings: %s\n", name);
    if (multi != CUDA_SUCCESS)
        for (int i = 8; i < 12; i++)
            CHECK(cuMemUnmap(base + i * page, page));

    /* 5. A second mapping of the same allocation (an alias) while the first stays. */
    CUresult alias = cuMemMap(base + 41 * page, page, 0, handles[5], 0);
    cuGetErrorName(alias, &name);
    printf("a second mapping of the same allocation: %s\n", name);
    if (alias == CUDA_SUCCESS) {
        CHECK(cuMemSetAccess(base + 41 * page, page, &access_descriptor, 1));
        CHECK(cuMemsetD8(base + 41 * page, 99, page));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemcpyDtoH(&byte, base + 40 * page, 1));
        printf("  writes through the alias are seen through the first mapping: %s\n", byte == 99 ? "yes" : "no");
        CHECK(cuMemUnmap(base + 41 * page, page));
    }
    CHECK(cuMemUnmap(base + 40 * page, page));
    for (int i = 0; i < PAGES; i++) {
        if (i != 5 && (i < 8 || i >= 12))
            CHECK(cuMemUnmap(base + i * page, page));
        CHECK(cuMemRelease(handles[i]));
    }

    /* 6. Timings (median of ROUNDS), microseconds, on PAGES page-sized allocations. */
    double times[8][ROUNDS];
    for (int i = 0; i < PAGES; i++)
        handles[i] = create(page);
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_us();
        for (int i = 0; i < PAGES; i++)
            CHECK(cuMemMap(base + i * page, page, 0, handles[i], 0));
        double t1 = now_us();
        CHECK(cuMemSetAccess(base, PAGES * page, &access_descriptor, 1));
        double t2 = now_us();
        CHECK(cuMemUnmap(base + 3 * page, page));
        double t3 = now_us();
        CHECK(cuMemMap(base + 40 * page, page, 0, handles[3], 0));
        double t4 = now_us();
        CHECK(cuMemSetAccess(base + 40 * page, page, &access_descriptor, 1));
        double t5 = now_us();
        CHECK(cuMemUnmap(base + 40 * page, page));
        double t6 = now_us();
        int multi_ok = cuMemUnmap(base + 4 * page, 12 * page) == CUDA_SUCCESS;
        double t7 = now_us();
        if (!multi_ok)
            for (int i = 4; i < PAGES; i++)
                CHECK(cuMemUnmap(base + i * page, page));
        for (int i = 0; i < 3; i++)
            CHECK(cuMemUnmap(base + i * page, page));
        times[0][round] = (t1 - t0) / PAGES;
        times[1][round] = t2 - t1;
        times[2][round] = t3 - t2;
        times[3][round] = t4 - t3;
        times[4][round] = t5 - t4;
        times[5][round] = t6 - t5;
        times[6][round] = multi_ok ? t7 - t6 : -1;
    }
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_us();
        CUmemGenericAllocationHandle spare = create(page);
        double t1 = now_us();
        CHECK(cuMemRelease(spare));
        times[7][round] = t1 - t0;
        (void)t1;
    }
    printf("\n| call (2 MiB page allocations) | median us |\n|---|---|\n");
    printf("| cuMemCreate of one page | %.2f |\n", median(times[7], ROUNDS));
    printf("| cuMemMap of one page | %.2f |\n", median(times[0], ROUNDS));
    printf("| cuMemSetAccess over %d adjacent page mappings | %.2f |\n", PAGES, median(times[1], ROUNDS));
    printf("| cuMemUnmap of one page (neighbours stay) | %.2f |\n", median(times[2], ROUNDS));
    printf("| cuMemMap of that page elsewhere | %.2f |\n", median(times[3], ROUNDS));
    printf("| cuMemSetAccess of one page | %.2f |\n", median(times[4], ROUNDS));
    printf("| cuMemUnmap of one page | %.2f |\n", median(times[5], ROUNDS));
    printf("| cuMemUnmap over 12 adjacent page mappings, one call (-1: refused) | %.2f |\n", median(times[6], ROUNDS));
    for (int i = 0; i < PAGES; i++)
        CHECK(cuMemRelease(handles[i]));
    CHECK(cuMemAddressFree(base, 64 * page));
    copy_timings(page);
    printf("\n%s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
