/*
 * test_cuda_fake.c -- the cuda backend (src/backend/cuda.c) on a machine without a GPU, over
 * tests/fake_cuda.c: a stand-in libcuda.so.1 (LD_LIBRARY_PATH, set by CTest) whose device is host
 * memory and which refuses, tells and counts every call that breaks the driver's virtual-memory rules.
 *
 *   device            gpumem info's facts come from the driver (name, version, capacity, granularity)
 *   other processes   memory they hold (the fake's GPUMEM_FAKE_CUDA_USED_ELSEWHERE): the out-of-memory
 *                     report names that cause and lists them from NVML (tests/fake_nvml.c)
 *   trace replay      the bundled traces reach the sim's peaks exactly, as on a real GPU (test_gpu),
 *                     with the same device calls, one for one
 *   data              randomized operations with data patterns, both engines, compaction's copies
 *                     through a second mapping: live data never moves or breaks, and the driver's
 *                     memory is what the allocator counts as reserved
 *   driver failures   every seventh call that makes memory fails: errors, never a crash or lost data,
 *                     and nothing leaks once the allocator is gone
 *   pinned memory     gm_host_malloc through cuMemHostAlloc
 *   sharing           a block shared through POSIX descriptors reads the same in a second allocator
 *   threads           four threads on one allocator, each call in the primary context of its thread
 *   graph capture     memory made and given back while a stream is captured, in the relaxed capture
 *                     mode, with no device-wide wait until the capture ends
 *
 * After each, the fake counts no broken rule and holds no memory. test_gpu runs the same backend on a
 * real GPU, with kernels writing the memory.
 */
#include "test.h"

#include "backend/backend.h"
#include "data_workload.h"
#include "tools/trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

static unsigned long long (*fake_violations)(void);
static size_t (*fake_used_bytes)(void);

/* The fake's counters, looked up once (the driver is loaded on first use). */
static void find_fake(void)
{
    if (fake_violations && fake_used_bytes)
        return;
    *(void **)&fake_violations = gm_cuda_driver_symbol("fakeCudaViolations");
    *(void **)&fake_used_bytes = gm_cuda_driver_symbol("fakeCudaUsedBytes");
    REQUIRE(fake_violations && fake_used_bytes);
}

static void set_capacity(unsigned long long bytes)
{
    char text[32];
    snprintf(text, sizeof text, "%llu", bytes);
    setenv("GPUMEM_FAKE_CUDA_CAPACITY", text, 1);
}

/* Nothing broken, nothing held: run after each allocator is destroyed. */
static void fake_is_clean(void)
{
    find_fake();
    CHECK_EQ_INT(fake_violations(), 0);
    CHECK_EQ_INT(fake_used_bytes(), 0);
}

static void device_facts_come_from_the_driver(void)
{
    set_capacity(256 * MIB);
    gm_allocator *allocator = make_allocator("backend:cuda");
    find_fake();
    gm_device_info info;
    CHECK_OK(gm_get_device_info(allocator, &info));
    CHECK(!strcmp(info.backend, "cuda"));
    CHECK(!strcmp(info.name, "Fake GPU (tests/fake_cuda.c)"));
    CHECK(!strcmp(info.engine, "pages"));
    CHECK_EQ_INT(info.device_count, 1);
    CHECK_EQ_INT(info.driver_version, 13000);
    CHECK_EQ_INT(info.total_bytes, 256 * MIB);
    CHECK_EQ_INT(info.free_bytes, 256 * MIB);
    CHECK_EQ_INT(info.virtual_memory, 1);
    CHECK_EQ_INT(info.granularity, 2 * MIB);
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &pointer));
    CHECK_OK(gm_get_device_info(allocator, &info));
    CHECK(info.free_bytes <= 252 * MIB); /* the driver's free memory: what gpumem holds is gone */
    CHECK_OK(gm_free(allocator, pointer));
    gm_destroy(allocator, NULL);
    fake_is_clean();
}

/* Memory that other processes hold: the out-of-memory report names that cause and lists the processes
 * NVML sees on the device (tests/fake_nvml.c, found by the fake device's PCI bus id); once they are
 * gone the request fits. */
static void out_of_memory_lists_the_other_processes(void)
{
    set_capacity(256 * MIB);
    setenv("GPUMEM_FAKE_CUDA_USED_ELSEWHERE", "167772160", 1); /* 160 MiB */
    gm_allocator *allocator = make_allocator("backend:cuda");
    void *live = NULL, *request = NULL;
    CHECK_OK(gm_malloc(allocator, 32 * MIB, 0, &live));
    CHECK_STATUS(gm_malloc(allocator, 128 * MIB, 0, &request), GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_OTHER_PROCESSES);
    CHECK_MESSAGE("Cause: other processes. 160.00 MiB of the device is used outside this allocator");
    CHECK_MESSAGE("\nProcesses on this GPU (NVML): PID 4321 1.00 GiB.\n");
    CHECK_MESSAGE("  1. Stop the other processes on this GPU");
    unsetenv("GPUMEM_FAKE_CUDA_USED_ELSEWHERE");
    CHECK_OK(gm_malloc(allocator, 128 * MIB, 0, &request));
    CHECK_OK(gm_free(allocator, request));
    CHECK_OK(gm_free(allocator, live));
    gm_destroy(allocator, NULL);
    fake_is_clean();
}

static void traces_reach_the_sim_peaks(void)
{
    static const char *const files[] = {"resnet50.csv.gz", "gpt2.csv.gz", "bert_varlen.csv.gz",
                                        "llm_generate.csv.gz"};
    const unsigned long long capacity = 141ull << 30; /* an H200's; the fake's memory is never touched */
    set_capacity(capacity);
    const char *data = getenv("GPUMEM_DATA");
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024], sim_config[128];
        snprintf(path, sizeof path, "%s/traces/%s", data ? data : "data", files[i]);
        snprintf(sim_config, sizeof sim_config, "backend:sim,capacity:%llu,page_size:2MiB", capacity);
        gm_trace trace;
        CHECK_OK(gm_trace_load(path, &trace));
        gm_replay_result on_cuda, on_sim;
        gm_allocator *cuda = make_allocator("backend:cuda");
        CHECK_OK(gm_replay(cuda, &trace, &on_cuda));
        gm_destroy(cuda, NULL);
        fake_is_clean();
        gm_allocator *sim = make_allocator(sim_config);
        CHECK_OK(gm_replay(sim, &trace, &on_sim));
        gm_destroy(sim, NULL);
        CHECK_EQ_INT(on_cuda.failed_allocations, 0);
        CHECK_EQ_INT(on_cuda.peak_live_bytes, trace.peak_live_bytes);
        CHECK_EQ_INT(on_cuda.peak_reserved_bytes, on_sim.peak_reserved_bytes);
        for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++) /* the same device calls, one for one */
            CHECK_EQ_INT(on_cuda.stats.device_calls[kind], on_sim.stats.device_calls[kind]);
        gm_trace_free(&trace);
    }
}

/* The driver's physical memory is what the allocator counts as reserved (pages engine; the segments
 * engine's segments are rounded up to whole pages by the fake). */
static void driver_memory_is_reserved_memory(gm_allocator *allocator)
{
    find_fake();
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(fake_used_bytes(), stats.reserved_bytes[GM_POOL_ALL].current);
}

static void live_data_survives_both_engines(void)
{
    set_capacity(160 * MIB);
    data_workload pages = {.config = "backend:cuda", .operations = 60000, .seed = 0xC0DA,
                           .check = driver_memory_is_reserved_memory};
    data_workload_run(&pages);
    fake_is_clean();
    data_workload segments = {.config = "backend:cuda,engine:segments", .operations = 25000, .seed = 0xFACE};
    data_workload_run(&segments);
    fake_is_clean();
}

static int64_t copies_made;

/* Every 10000 operations: split the chunks that live blocks pin around their live pages, if any. */
static void defragment(gm_allocator *allocator)
{
    CHECK_OK(gm_defragment(allocator, 2 * MIB, NULL));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    copies_made = stats.device_calls[GM_CALL_COPY];
    driver_memory_is_reserved_memory(allocator);
}

/* Compaction copies live pages through a second mapping of the new memory (cuMemcpyDtoD), at growths
 * above the peak (compact_min; chunks larger than a page, so that live blocks pin free pages) and at
 * gm_defragment; the workload checks every byte of every live block after them. */
static void compaction_copies_keep_the_data(void)
{
    set_capacity(160 * MIB);
    data_workload workload = {.config = "backend:cuda,compact_min:2MiB,chunk_room_share:0", .operations = 60000, .seed = 0xC0DA,
                              .check = defragment};
    data_workload_run(&workload);
    CHECK(copies_made > 0);
    fake_is_clean();
}

static void driver_failures_lose_nothing(void)
{
    set_capacity(160 * MIB);
    setenv("GPUMEM_FAKE_CUDA_FAIL_EVERY", "7", 1);
    data_workload pages = {.config = "backend:cuda", .operations = 60000, .seed = 0xF417,
                           .device_errors_expected = true};
    data_workload_result result = data_workload_run(&pages);
    CHECK(result.device_errors > 0);
    data_workload segments = {.config = "backend:cuda,engine:segments", .operations = 25000, .seed = 0xF417,
                              .device_errors_expected = true};
    data_workload_run(&segments);
    unsetenv("GPUMEM_FAKE_CUDA_FAIL_EVERY");
    fake_is_clean();
}

static void pinned_memory_through_the_driver(void)
{
    set_capacity(64 * MIB);
    gm_allocator *allocator = make_allocator("backend:cuda");
    void *pointers[8];
    for (int i = 0; i < 8; i++) {
        CHECK_OK(gm_host_malloc(allocator, (size_t)(i + 1) << 16, &pointers[i]));
        pattern_stamp(pointers[i], (size_t)(i + 1) << 16, (uint64_t)i + 1);
    }
    for (int i = 0; i < 8; i++) {
        CHECK(pattern_intact(pointers[i], (size_t)(i + 1) << 16, (uint64_t)i + 1));
        CHECK_OK(gm_host_free(allocator, pointers[i]));
    }
    gm_host_stats host;
    CHECK_OK(gm_host_get_stats(allocator, &host));
    CHECK_EQ_INT(host.cache_misses, 8);
    gm_destroy(allocator, NULL);
    fake_is_clean();
}

/* With POSIX descriptor handles, a block shared with a second allocator (as with another process:
 * the descriptors taken with pidfd_getfd) reads and writes the same memory; without them gm_share is
 * refused. */
static void memory_shared_through_descriptors(void)
{
    set_capacity(1024 * MIB);
    gm_allocator *plain = make_allocator("backend:cuda");
    void *block = NULL;
    REQUIRE(gm_malloc(plain, 3 * MIB, 0, &block) == GM_OK);
    uint64_t offset = 0;
    gm_shared_piece pieces[64];
    size_t count = 0;
    CHECK_STATUS(gm_share(plain, block, &offset, pieces, 64, &count), GM_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE("cannot export memory");
    CHECK_OK(gm_free(plain, block));
    gm_destroy(plain, NULL);

    setenv("GPUMEM_FAKE_CUDA_EXPORT", "1", 1);
    gm_allocator *sharer = make_allocator("backend:cuda"), *taker = make_allocator("backend:cuda");
    REQUIRE(gm_malloc(sharer, 100 * MIB, 0, &block) == GM_OK);
    pattern_stamp(block, 100 * MIB, 7);
    CHECK_OK(gm_share(sharer, block, &offset, pieces, 64, &count));
    void *mapped = NULL;
    CHECK_OK(gm_open_shared(taker, getpid(), pieces, count, &mapped));
    if (mapped) {
        char *there = (char *)mapped + offset;
        CHECK(pattern_intact(there, 100 * MIB, 7));
        pattern_stamp(there, 100 * MIB, 8);
        CHECK(pattern_intact(block, 100 * MIB, 8));
        CHECK_OK(gm_close_shared(taker, mapped));
    }
    gm_shared_piece plain_file = pieces[0];
    plain_file.descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC); /* no memory the driver exported */
    CHECK_STATUS(gm_open_shared(taker, getpid(), &plain_file, 1, &mapped), GM_ERROR_DEVICE);
    CHECK_MESSAGE("cuMemImportFromShareableHandle failed");
    close(plain_file.descriptor);
    CHECK_OK(gm_free(sharer, block));
    CHECK_OK(gm_validate(sharer));
    gm_destroy(taker, NULL);
    gm_destroy(sharer, NULL);

    /* A driver whose attribute promises exportable memory but that refuses it: plain chunks instead,
     * the allocations work and gm_share says it cannot share. */
    setenv("GPUMEM_FAKE_CUDA_EXPORT", "refused", 1);
    gm_allocator *refused = make_allocator("backend:cuda");
    REQUIRE(gm_malloc(refused, 3 * MIB, 0, &block) == GM_OK);
    pattern_stamp(block, 3 * MIB, 9);
    CHECK(pattern_intact(block, 3 * MIB, 9));
    CHECK_STATUS(gm_share(refused, block, &offset, pieces, 64, &count), GM_ERROR_NOT_SUPPORTED);
    CHECK_MESSAGE("cannot export memory");
    CHECK_OK(gm_free(refused, block));
    CHECK_OK(gm_validate(refused));
    gm_destroy(refused, NULL);
    unsetenv("GPUMEM_FAKE_CUDA_EXPORT");
    fake_is_clean();
}

#define THREADS 4
#define THREAD_LIVE 64

typedef struct worker {
    gm_allocator *allocator;
    uint64_t seed, first_identity;
    int broken, failed;
} worker;

/* One thread's share: its own live blocks, stamped, checked and freed in a random order. */
static void *work(void *argument)
{
    worker *self = argument;
    char *pointers[THREAD_LIVE] = {0};
    size_t sizes[THREAD_LIVE] = {0};
    uint64_t identities[THREAD_LIVE] = {0}, identity = self->first_identity;
    for (int step = 0; step < 20000; step++) {
        size_t slot = test_random(&self->seed) % THREAD_LIVE;
        if (pointers[slot]) {
            self->broken += !pattern_intact(pointers[slot], sizes[slot], identities[slot]);
            self->failed += gm_free(self->allocator, pointers[slot]) != GM_OK;
            pointers[slot] = NULL;
            continue;
        }
        sizes[slot] = data_random_size(&self->seed) % (8 * MIB) + 1;
        gm_status status = gm_malloc(self->allocator, sizes[slot], 0, (void **)&pointers[slot]);
        self->failed += status != GM_OK && status != GM_ERROR_OUT_OF_MEMORY;
        if (status != GM_OK) {
            pointers[slot] = NULL;
            continue;
        }
        identities[slot] = ++identity;
        pattern_stamp(pointers[slot], sizes[slot], identities[slot]);
    }
    for (size_t slot = 0; slot < THREAD_LIVE; slot++)
        if (pointers[slot])
            self->failed += gm_free(self->allocator, pointers[slot]) != GM_OK;
    return NULL;
}

/* Threads of their own call the driver through one allocator: each call makes the primary context
 * current in its thread (the fake refuses a call without it) and gives the thread's own back. */
static void threads_share_one_allocator(void)
{
    set_capacity(512 * MIB);
    gm_allocator *allocator = make_allocator("backend:cuda");
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){allocator, 0x7EAD + (uint64_t)i, (uint64_t)i << 40, 0, 0};
        REQUIRE(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        CHECK_EQ_INT(workers[i].broken, 0);
        CHECK_EQ_INT(workers[i].failed, 0);
    }
    CHECK_OK(gm_validate(allocator));
    driver_memory_is_reserved_memory(allocator);
    gm_destroy(allocator, NULL);
    fake_is_clean();
}

/* While a stream is captured into a graph, memory is still made and given back (each call in the relaxed
 * capture mode, else the fake refuses it), and nothing needs a device-wide wait: compaction waits for
 * the capture's end, and gm_defragment is refused until then. */
static void memory_calls_during_a_capture(void)
{
    set_capacity(1024 * MIB);
    void (*set_capturing)(void *stream, int on) = NULL;
    *(void **)&set_capturing = gm_cuda_driver_symbol("fakeCudaSetCapturing");
    REQUIRE(set_capturing);
    gm_allocator *allocator = make_allocator("backend:cuda,compact_min:2MiB,chunk_room_share:0");
    gm_stream captured = 0;
    CHECK_OK(gm_named_stream(allocator, 9, &captured));
    void *pin = NULL, *big = NULL, *other = NULL;
    CHECK_OK(gm_malloc(allocator, 64 * MIB, captured, &big));
    CHECK_OK(gm_free(allocator, big));
    CHECK_OK(gm_malloc(allocator, MIB + 1, captured, &pin)); /* pins the 64 MiB chunk */
    set_capturing((void *)captured, 1);
    CHECK_OK(gm_malloc(allocator, 300 * MIB, 0, &big)); /* new memory: compaction would need a wait */
    CHECK_OK(gm_malloc(allocator, 5 * MIB, captured, &other));
    CHECK_OK(gm_free(allocator, big));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_STATUS(gm_defragment(allocator, 0, NULL), GM_ERROR_NOT_SUPPORTED);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.device_calls[GM_CALL_COPY], 0);
    set_capturing((void *)captured, 0);
    uint64_t released = 0;
    CHECK_OK(gm_defragment(allocator, 0, &released));
    CHECK(released > 0); /* the pinned chunk's free pages, once the capture is over */
    CHECK_OK(gm_free(allocator, pin));
    CHECK_OK(gm_free(allocator, other));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    fake_is_clean();
}

RUN_TESTS(TEST_CASE(device_facts_come_from_the_driver), TEST_CASE(out_of_memory_lists_the_other_processes),
          TEST_CASE(traces_reach_the_sim_peaks),
          TEST_CASE(live_data_survives_both_engines), TEST_CASE(compaction_copies_keep_the_data),
          TEST_CASE(driver_failures_lose_nothing), TEST_CASE(pinned_memory_through_the_driver),
          TEST_CASE(memory_shared_through_descriptors), TEST_CASE(threads_share_one_allocator),
          TEST_CASE(memory_calls_during_a_capture))
