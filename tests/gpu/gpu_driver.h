/*
 * gpu_driver.h -- what test_gpu.c needs of the CUDA driver, loaded at run time as the library loads it
 * (gm_cuda_driver_symbol): streams, events, captures, device memory, and the test kernels of
 * slow_writer.cu (PTX, compiled by the driver at load time) that fill words with a pattern (slowly, to
 * stay at work for well over 100 ms), or count the words that differ from one.
 */
#ifndef GM_TEST_GPU_DRIVER_H
#define GM_TEST_GPU_DRIVER_H

#include "../test.h"

#include "backend/backend.h"
#include "slow_writer_ptx.h"

typedef int cu_result;
typedef struct opaque *cu_handle;

static struct {
    cu_result (*device_get)(int *, int);
    cu_result (*primary_retain)(cu_handle *, int);
    cu_result (*set_current)(cu_handle);
    cu_result (*stream_create)(cu_handle *, unsigned);
    cu_result (*stream_destroy)(cu_handle);
    cu_result (*stream_synchronize)(cu_handle);
    cu_result (*context_synchronize)(void);
    cu_result (*memory_info)(size_t *, size_t *);
    cu_result (*memory_allocate)(unsigned long long *, size_t);
    cu_result (*memory_free)(unsigned long long);
    cu_result (*copy_to_host)(void *, unsigned long long, size_t);
    cu_result (*memset32)(unsigned long long, unsigned, size_t);
    cu_result (*module_load)(cu_handle *, const void *);
    cu_result (*module_function)(cu_handle *, cu_handle, const char *);
    cu_result (*launch)(cu_handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, cu_handle,
                        void **, void **);
    cu_result (*event_create)(cu_handle *, unsigned);
    cu_result (*event_record)(cu_handle, cu_handle);
    cu_result (*event_query)(cu_handle);
    cu_result (*begin_capture)(cu_handle, int);
    cu_result (*end_capture)(cu_handle, cu_handle *);
    cu_result (*graph_destroy)(cu_handle);
} cu;

static cu_handle slow_fill_kernel, fill_kernel, check_kernel;
static unsigned long long mismatch_counter;
static int quick;
static int under_sanitizer;

#define CU_CHECK(call) REQUIRE((call) == 0)

static int load_driver_for_tests(void)
{
    static const struct {
        const char *name;
        void **slot;
    } symbols[] = {
        {"cuDeviceGet", (void **)&cu.device_get},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.primary_retain},
        {"cuCtxSetCurrent", (void **)&cu.set_current},
        {"cuStreamCreate", (void **)&cu.stream_create},
        {"cuStreamDestroy_v2", (void **)&cu.stream_destroy},
        {"cuStreamSynchronize", (void **)&cu.stream_synchronize},
        {"cuCtxSynchronize", (void **)&cu.context_synchronize},
        {"cuMemGetInfo_v2", (void **)&cu.memory_info},
        {"cuMemAlloc_v2", (void **)&cu.memory_allocate},
        {"cuMemFree_v2", (void **)&cu.memory_free},
        {"cuMemcpyDtoH_v2", (void **)&cu.copy_to_host},
        {"cuMemsetD32_v2", (void **)&cu.memset32},
        {"cuModuleLoadData", (void **)&cu.module_load},
        {"cuModuleGetFunction", (void **)&cu.module_function},
        {"cuLaunchKernel", (void **)&cu.launch},
        {"cuEventCreate", (void **)&cu.event_create},
        {"cuEventRecord", (void **)&cu.event_record},
        {"cuEventQuery", (void **)&cu.event_query},
        {"cuStreamBeginCapture_v2", (void **)&cu.begin_capture},
        {"cuStreamEndCapture", (void **)&cu.end_capture},
        {"cuGraphDestroy", (void **)&cu.graph_destroy},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
        if (!(*symbols[i].slot = gm_cuda_driver_symbol(symbols[i].name)))
            return 0;
    int device = 0;
    cu_handle context = NULL, module = NULL;
    CU_CHECK(cu.device_get(&device, 0));
    CU_CHECK(cu.primary_retain(&context, device));
    CU_CHECK(cu.set_current(context));
    CU_CHECK(cu.module_load(&module, slow_writer_ptx));
    CU_CHECK(cu.module_function(&slow_fill_kernel, module, "slow_fill"));
    CU_CHECK(cu.module_function(&fill_kernel, module, "fill_words"));
    CU_CHECK(cu.module_function(&check_kernel, module, "check_words"));
    CU_CHECK(cu.memory_allocate(&mismatch_counter, sizeof(unsigned long long)));
    return 1;
}

static void fill(void *pointer, size_t size, unsigned pattern, cu_handle stream)
{
    unsigned long long address = (unsigned long long)(uintptr_t)pointer, words = size / 4;
    void *arguments[] = {&address, &words, &pattern};
    CU_CHECK(cu.launch(fill_kernel, 264, 1, 1, 256, 1, 1, 0, stream, arguments, NULL));
}

/* Words of [pointer, pointer + size) that differ from `pattern` (synchronous). */
static unsigned long long count_mismatches(void *pointer, size_t size, unsigned pattern)
{
    unsigned long long address = (unsigned long long)(uintptr_t)pointer, words = size / 4, bad = 0;
    CU_CHECK(cu.memset32(mismatch_counter, 0, 2));
    void *arguments[] = {&address, &words, &pattern, &mismatch_counter};
    CU_CHECK(cu.launch(check_kernel, 264, 1, 1, 256, 1, 1, 0, NULL, arguments, NULL));
    CU_CHECK(cu.copy_to_host(&bad, mismatch_counter, sizeof bad));
    return bad;
}

static gm_allocator *make(const char *config)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    return allocator;
}

#endif
