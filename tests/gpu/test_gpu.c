/*
 * test_gpu.c -- gpumem on a real GPU through the cuda backend.
 *
 *   data integrity    every live allocation is filled by a kernel and checked by a kernel when it
 *                     is freed and at the end, while a memory limit forces the pages engine to move
 *                     idle chunks and empty_cache releases them: live data never moves or breaks
 *   compaction        live blocks split out of a pinned chunk keep their bytes, even one that a
 *                     kernel on another stream is still writing
 *   moves ahead       a chunk still written by a kernel on its stream moves within that stream
 *                     without a wait, its old mapping kept until the kernel has finished
 *   stitching         a request laid across second mappings of two pinned chunks (stitch:true)
 *                     reaches their memory where it lies
 *   cross-stream      a block used by a slow kernel on another stream, recorded with
 *                     gm_record_stream and freed, is not handed out again before the kernel ends
 *                     (and a control without record_stream shows the test can see reuse)
 *   out of memory     allocating until the device is full gives an error code and a report; after
 *                     frees, allocation works again
 *   empty_cache       the device's own free-memory reading shows the memory given back
 *   borrowed streams  blocks of a stream destroyed under them (gm_malloc_on_borrowed_stream) and a
 *                     kernel still writing one: the memory is used again only after the kernel
 *   pinned memory     a pinned block freed on a stream that is then destroyed waits for that stream's
 *                     work and never has the stream asked again; a look at freed pinned blocks during a
 *                     graph capture of a blocking stream leaves the legacy stream alone (the capture
 *                     stays valid)
 *   replay            the bundled traces on the GPU reach the same peaks as on the sim backend
 *
 * The driver is loaded at run time like the library does, so this builds without CUDA; without a
 * driver or a GPU it prints why and exits 77, which CTest reports as skipped. The kernels are PTX
 * (slow_writer.cu) that the driver compiles at load time. GPUMEM_GPU_TEST_QUICK=1 shrinks the work
 * (for compute-sanitizer); GPUMEM_GPU_TEST_UNDER_SANITIZER=1 leaves out the one case whose driver
 * answer is an error by design (the legacy stream asked during a capture).
 */
#include "gpu_driver.h"

#include "tools/trace.h"

#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- data integrity */

static void data_survives_reuse_and_remapping(const char *config, int operations)
{
    enum { MAX_LIVE = 256 };
    gm_allocator *allocator = make(config);
    struct {
        void *pointer;
        size_t size;
        unsigned pattern;
    } live[MAX_LIVE];
    size_t count = 0;
    uint64_t seed = 0xD47A;
    unsigned long long broken = 0;
    int ooms = 0;
    for (int step = 0; step < operations; step++) {
        if (test_random(&seed) % 100 < 55 && count < MAX_LIVE) {
            unsigned shift = (unsigned)(test_random(&seed) % 20); /* 4 KiB .. 4 GiB, mostly small */
            size_t size = (4096ull << (shift % (quick ? 14 : 17))) + 4 * (test_random(&seed) % 100000);
            void *pointer = NULL;
            gm_status status = gm_malloc(allocator, size, 0, &pointer);
            if (status == GM_ERROR_OUT_OF_MEMORY) {
                ooms++;
                continue;
            }
            CHECK_OK(status);
            unsigned pattern = (unsigned)test_random(&seed) | 1u;
            fill(pointer, size, pattern, NULL);
            live[count].pointer = pointer;
            live[count].size = size;
            live[count].pattern = pattern;
            count++;
        } else if (count) {
            size_t victim = test_random(&seed) % count;
            broken += count_mismatches(live[victim].pointer, live[victim].size, live[victim].pattern);
            CHECK_OK(gm_free(allocator, live[victim].pointer));
            live[victim] = live[--count];
        }
        if (step % 500 == 499)
            CHECK_OK(gm_empty_cache(allocator));
    }
    for (size_t i = 0; i < count; i++) {
        broken += count_mismatches(live[i].pointer, live[i].size, live[i].pattern);
        CHECK_OK(gm_free(allocator, live[i].pointer));
    }
    CHECK_EQ_INT(broken, 0);
    CHECK_OK(gm_validate(allocator));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    printf("     %s: %d operations, %lld page maps, %lld unmaps, %d out-of-memory refusals\n", config, operations,
           (long long)stats.num_page_maps, (long long)stats.num_page_unmaps, ooms);
    gm_destroy(allocator, NULL);
}

static void data_integrity_pages_engine(void)
{
    /* A limit well below the workload's appetite: chunks move between places all the time. */
    data_survives_reuse_and_remapping("backend:cuda,engine:pages,memory_limit:6GiB", quick ? 300 : 4000);
}

static void data_integrity_segments_engine(void)
{
    data_survives_reuse_and_remapping("backend:cuda,engine:segments,memory_limit:6GiB", quick ? 300 : 2000);
}

/* Compaction on the device: a 64 MiB chunk pinned by three live blocks with free gaps, one of them
 * still being written by a slow kernel on another stream, then a request that would lift the peak.
 * The copy must wait for that kernel (a device-wide wait), the blocks keep their addresses and
 * bytes, and the chunk's free pages go back. With `map_failures` maps refused from the second copy's
 * on: one puts the chunk back (mapped again where it was, no pages given back), two finish the
 * compaction with the copies after the chunk's own map back failed; the bytes survive either way. */
static void compaction_with_map_failures(uint64_t map_failures, int64_t reserved_mib)
{
    gm_allocator *allocator = make("backend:cuda,engine:pages,compact_min:2MiB");
    cu_handle other = NULL;
    CU_CHECK(cu.stream_create(&other, 1));
    const size_t mib = 1u << 20, sizes[3] = {3 * mib, 5 * mib + 4096, 7 * mib};
    void *big = NULL, *fence = NULL, *large = NULL, *live[3] = {0}, *gaps[2] = {0};
    CHECK_OK(gm_malloc(allocator, 64 * mib, 0, &big));
    CHECK_OK(gm_malloc(allocator, 2 * mib, 0, &fence));
    CHECK_OK(gm_free(allocator, big));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(gm_malloc(allocator, sizes[i], 0, &live[i]));
        if (i < 2)
            CHECK_OK(gm_malloc(allocator, 20 * mib, 0, &gaps[i]));
    }
    for (int i = 0; i < 2; i++)
        CHECK_OK(gm_free(allocator, gaps[i]));
    fill(live[0], sizes[0], 0xA0A0A0A1u, NULL);
    fill(live[2], sizes[2], 0xC2C2C2C3u, NULL);
    unsigned long long address = (unsigned long long)(uintptr_t)live[1], words = sizes[1] / 4, spin = 20000;
    unsigned pattern = 0xB1B1B1B1u;
    void *arguments[] = {&address, &words, &pattern, &spin};
    CU_CHECK(cu.launch(slow_fill_kernel, 1, 1, 1, 256, 1, 1, 0, other, arguments, NULL)); /* many ms */
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    if (map_failures)
        CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_MAP, 1, map_failures));
    CHECK_OK(gm_malloc(allocator, 100 * mib, 0, &large));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK_EQ_INT(after.device_calls[GM_CALL_COPY] - before.device_calls[GM_CALL_COPY], 3);
    /* 64 + 2 reserved before; after a compaction: the live blocks' 2 + 4 + 4 pages, the fence and the
     * request. */
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, reserved_mib * (int64_t)mib);
    CHECK_EQ_INT(count_mismatches(live[0], sizes[0], 0xA0A0A0A1u), 0);
    CHECK_EQ_INT(count_mismatches(live[1], sizes[1], 0xB1B1B1B1u), 0);
    CHECK_EQ_INT(count_mismatches(live[2], sizes[2], 0xC2C2C2C3u), 0);
    fill(live[1], sizes[1], 0x5u, NULL); /* still writable where it was */
    CHECK_EQ_INT(count_mismatches(live[1], sizes[1], 0x5u), 0);
    printf("     compaction, %llu map failures: %lld copies, %.1f us of copy calls\n",
           (unsigned long long)map_failures, (long long)(after.device_calls[GM_CALL_COPY] - before.device_calls[GM_CALL_COPY]),
           (double)(after.device_call_ns_by_kind[GM_CALL_COPY] - before.device_call_ns_by_kind[GM_CALL_COPY]) / 1e3);
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(allocator, live[i]));
    CHECK_OK(gm_free(allocator, fence));
    CHECK_OK(gm_free(allocator, large));
    CHECK_OK(gm_validate(allocator));
    cu.stream_destroy(other);
    gm_destroy(allocator, NULL);
}

static void compaction_keeps_data_that_queued_work_still_writes(void)
{
    compaction_with_map_failures(0, 20 + 2 + 100);
    compaction_with_map_failures(1, 64 + 2 + 100);
    compaction_with_map_failures(2, 20 + 2 + 100);
}

/* ---------------------------------------------------------------- cross-stream safety */

/* Free a buffer still being written by a slow kernel on stream `other`, then ask for the same size
 * on `own`. Returns whether the new block had the old address while the kernel still ran, and
 * whether the new block's contents (filled on `own`, checked after everything finished) survived. */
static void free_under_running_kernel(gm_allocator *allocator, int record, bool *reused_early, bool *intact)
{
    cu_handle own = NULL, other = NULL, done = NULL;
    CU_CHECK(cu.stream_create(&own, 1));
    CU_CHECK(cu.stream_create(&other, 1));
    CU_CHECK(cu.event_create(&done, 2));
    size_t size = 16u << 20;
    void *buffer = NULL, *again = NULL;
    CHECK_OK(gm_malloc(allocator, size, (gm_stream)own, &buffer));
    unsigned long long address = (unsigned long long)(uintptr_t)buffer, words = size / 4;
    unsigned pattern = 0xDEADBEEFu;
    unsigned long long spin = 20000; /* about 10 us per round, 16384 rounds: well over 100 ms */
    void *arguments[] = {&address, &words, &pattern, &spin};
    CU_CHECK(cu.launch(slow_fill_kernel, 1, 1, 1, 256, 1, 1, 0, other, arguments, NULL));
    CU_CHECK(cu.event_record(done, other));
    if (record)
        CHECK_OK(gm_record_stream(allocator, buffer, (gm_stream)other));
    CHECK_OK(gm_free(allocator, buffer));
    CHECK_OK(gm_malloc(allocator, size, (gm_stream)own, &again));
    *reused_early = again == buffer && cu.event_query(done) != 0;
    fill(again, size, 0x11111111u, own);
    CU_CHECK(cu.context_synchronize());
    *intact = count_mismatches(again, size, 0x11111111u) == 0;
    CHECK_OK(gm_free(allocator, again));
    cu.stream_destroy(own);
    cu.stream_destroy(other);
}

static void recorded_stream_protects_memory_in_use(void)
{
    const char *configs[] = {"backend:cuda,engine:pages", "backend:cuda,engine:segments"};
    for (int c = 0; c < 2; c++) {
        gm_allocator *allocator = make(configs[c]);
        bool reused_early = true, intact = false;
        free_under_running_kernel(allocator, 1, &reused_early, &intact);
        CHECK(!reused_early);
        CHECK(intact);
        gm_destroy(allocator, NULL);
    }
}

static void without_record_stream_the_memory_is_reused(void)
{
    /* The control: the same scenario without gm_record_stream hands the buffer out again at once,
     * which is what makes the test above meaningful. */
    gm_allocator *allocator = make("backend:cuda");
    bool reused_early = false, intact = true;
    free_under_running_kernel(allocator, 0, &reused_early, &intact);
    CHECK(reused_early);
    gm_destroy(allocator, NULL);
}

/* A chunk freed on a stream whose slow kernel still writes it moves where a request of the same stream
 * needs it without the host waiting for that kernel (aliases.c): the request returns while the kernel
 * runs, and no event is waited for. The kernel's writes reach the memory through its old mapping, kept
 * until then (no fault), and show at the new addresses once it has finished. */
static void a_chunk_moves_ahead_of_its_stream(void)
{
    gm_allocator *allocator = make("backend:cuda,engine:pages");
    cu_handle own = NULL, done = NULL;
    CU_CHECK(cu.stream_create(&own, 1));
    CU_CHECK(cu.event_create(&done, 2));
    size_t size = 16u << 20;
    void *pin = NULL, *idle = NULL, *kept = NULL, *bigger = NULL;
    CHECK_OK(gm_malloc(allocator, 512, (gm_stream)own, &pin));
    CHECK_OK(gm_malloc(allocator, size, (gm_stream)own, &idle));
    CHECK_OK(gm_malloc(allocator, size, (gm_stream)own, &kept));
    unsigned long long address = (unsigned long long)(uintptr_t)idle, words = size / 4, spin = 20000;
    unsigned pattern = 0x5EEDF00Du;
    void *arguments[] = {&address, &words, &pattern, &spin};
    CU_CHECK(cu.launch(slow_fill_kernel, 1, 1, 1, 256, 1, 1, 0, own, arguments, NULL)); /* well over 100 ms */
    CU_CHECK(cu.event_record(done, own));
    CHECK_OK(gm_free(allocator, idle));
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    CHECK_OK(gm_malloc(allocator, 2 * size, (gm_stream)own, &bigger)); /* 16 MiB moved, 16 made */
    bool kernel_running = cu.event_query(done) != 0;
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK(kernel_running);
    CHECK_EQ_INT(after.device_calls[GM_CALL_EVENT_SYNCHRONIZE] - before.device_calls[GM_CALL_EVENT_SYNCHRONIZE], 0);
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current - before.reserved_bytes[GM_POOL_ALL].current,
                 (int64_t)size);
    CU_CHECK(cu.context_synchronize());
    char *start = bigger;
    CHECK(count_mismatches(start, size, pattern) == 0 || count_mismatches(start + size, size, pattern) == 0);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, bigger));
    CHECK_OK(gm_free(allocator, kept));
    CHECK_OK(gm_free(allocator, pin));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_destroy(allocator, NULL);
    cu.stream_destroy(own);
}

/* ---------------------------------------------------------------- out of memory, empty_cache */

static void out_of_memory_is_an_error_and_recoverable(void)
{
    const char *configs[] = {"backend:cuda,engine:pages", "backend:cuda,engine:segments"};
    for (int c = 0; c < 2; c++) {
        gm_allocator *allocator = make(configs[c]);
        enum { MAX_BLOCKS = 512 };
        void *blocks[MAX_BLOCKS];
        size_t count = 0;
        gm_status status = GM_OK;
        size_t block_size = quick ? (8ull << 30) : (2ull << 30);
        size_t free_bytes = 0, total = 0;
        CU_CHECK(cu.memory_info(&free_bytes, &total));
        while (count < MAX_BLOCKS && (status = gm_malloc(allocator, block_size, 0, &blocks[count])) == GM_OK)
            count++;
        CHECK_EQ_INT(status, GM_ERROR_OUT_OF_MEMORY);
        CHECK_MESSAGE("gpumem: out of memory");
        CHECK(count + 1 >= free_bytes / block_size); /* the device's free memory, less a block for the context's */
        CHECK(count > 2);
        for (size_t i = 0; i < count; i += 2)
            CHECK_OK(gm_free(allocator, blocks[i]));
        void *again = NULL;
        CHECK_OK(gm_malloc(allocator, block_size, 0, &again));
        fill(again, block_size, 0x5a5a5a5au, NULL);
        CHECK_EQ_INT(count_mismatches(again, block_size, 0x5a5a5a5au), 0);
        CHECK_OK(gm_free(allocator, again));
        for (size_t i = 1; i < count; i += 2)
            CHECK_OK(gm_free(allocator, blocks[i]));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

static void empty_cache_gives_memory_back(void)
{
    const char *configs[] = {"backend:cuda,engine:pages", "backend:cuda,engine:segments"};
    for (int c = 0; c < 2; c++) {
        gm_allocator *allocator = make(configs[c]);
        size_t free_before = 0, free_cached = 0, free_after = 0, total = 0;
        CU_CHECK(cu.memory_info(&free_before, &total));
        void *blocks[8];
        for (int i = 0; i < 8; i++)
            CHECK_OK(gm_malloc(allocator, 1ull << 30, 0, &blocks[i]));
        for (int i = 0; i < 8; i++)
            CHECK_OK(gm_free(allocator, blocks[i]));
        CU_CHECK(cu.memory_info(&free_cached, &total));
        CHECK(free_before - free_cached >= (8ull << 30)); /* cached, still held */
        CHECK_OK(gm_empty_cache(allocator));
        CU_CHECK(cu.memory_info(&free_after, &total));
        CHECK(free_after - free_cached >= (8ull << 30));
        CHECK(free_before - free_after < (64ull << 20));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
        gm_destroy(allocator, NULL);
    }
}

/* ---------------------------------------------------------------- memory held outside gpumem */

static _Atomic int device_pressure_calls[3]; /* by level: normal, high, critical */
static _Atomic int device_pressure_level = -1;

static void note_device_pressure(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                                 void *context)
{
    (void)allocator, (void)readings, (void)context;
    device_pressure_level = (int)level;
    if ((int)level >= 0 && (int)level < 3)
        device_pressure_calls[level]++;
}

/* Memory taken with cuMemAlloc beside gpumem: the sampling thread sees the driver's used memory rise, and
 * an allocation that does not fit names other processes as its cause, with the processes NVML lists. */
static void memory_used_outside_is_seen_and_named(void)
{
    size_t free_bytes = 0, total = 0;
    CU_CHECK(cu.memory_info(&free_bytes, &total));
    unsigned long long outside = 0;
    size_t held = free_bytes - (4ull << 30);
    CU_CHECK(cu.memory_allocate(&outside, held));
    gm_allocator *allocator = make("backend:cuda");
    CHECK_OK(gm_on_pressure(allocator, note_device_pressure, NULL));
    gm_pressure_policy policy = {.high = 0.5, .low = 0.25, .signals = GM_PRESSURE_SIGNAL_DEVICE, .interval_ms = 5};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy)); /* evaluated at once, on this thread */
    CHECK_EQ_INT(device_pressure_level, GM_PRESSURE_HIGH);
    gm_pressure_readings readings;
    CHECK_OK(gm_get_pressure(allocator, &readings));
    CHECK(readings.device_used_bytes >= held && readings.device_total_bytes == total);
    void *pointer = NULL;
    CHECK_STATUS(gm_malloc(allocator, 8ull << 30, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_OTHER_PROCESSES);
    CHECK_MESSAGE("\nCause: other processes. ");
    CHECK(strstr(gm_last_error(), "Processes on this GPU (NVML)") || strstr(gm_last_error(), "NVML cannot tell"));
    printf("     the report:\n%s", gm_last_error());
    CU_CHECK(cu.memory_free(outside)); /* the other user leaves: the sampling thread sees it */
    for (int i = 0; i < 2000 && device_pressure_level != GM_PRESSURE_NORMAL; i++)
        usleep(1000);
    CHECK_EQ_INT(device_pressure_level, GM_PRESSURE_NORMAL);
    /* high when set, critical before the failing allocation's last retry, normal once it is gone */
    CHECK_EQ_INT(device_pressure_calls[GM_PRESSURE_HIGH], 1);
    CHECK_EQ_INT(device_pressure_calls[GM_PRESSURE_CRITICAL], 1);
    CHECK_EQ_INT(device_pressure_calls[GM_PRESSURE_NORMAL], 1);
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- trace replay */

static void traces_reach_the_sim_peaks(void)
{
    static const char *const files[] = {"resnet50.csv.gz", "gpt2.csv.gz", "bert_varlen.csv.gz",
                                        "llm_generate.csv.gz"};
    const char *data = getenv("GPUMEM_DATA");
    gm_allocator *probe = make("backend:cuda");
    gm_device_info info;
    CHECK_OK(gm_get_device_info(probe, &info));
    gm_destroy(probe, NULL);
    for (size_t i = 0; i < (quick ? 1u : 4u); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/traces/%s", data ? data : "data", files[i]);
        gm_trace trace;
        CHECK_OK(gm_trace_load(path, &trace));
        char sim_config[256];
        /* The sim's capacity is the memory the GPU leaves free (its total less the CUDA context and
         * anything else already there): the room for new memory sizes the chunks (chunk_room_share),
         * so a sim of the whole device would make other chunks than the GPU once that share falls
         * below max_chunk_size, as it does on a device of 80 GB. */
        snprintf(sim_config, sizeof sim_config, "backend:sim,capacity:%llu,page_size:%llu",
                 (unsigned long long)(info.free_bytes / info.granularity * info.granularity),
                 (unsigned long long)info.granularity);
        gm_replay_result on_gpu, on_sim;
        gm_allocator *gpu = make("backend:cuda");
        CHECK_OK(gm_replay(gpu, &trace, &on_gpu));
        gm_destroy(gpu, NULL);
        gm_allocator *sim = make(sim_config);
        CHECK_OK(gm_replay(sim, &trace, &on_sim));
        gm_destroy(sim, NULL);
        CHECK_EQ_INT(on_gpu.failed_allocations, 0);
        CHECK_EQ_INT(on_gpu.peak_live_bytes, trace.peak_live_bytes);
        CHECK_EQ_INT(on_gpu.peak_reserved_bytes, on_sim.peak_reserved_bytes);
        printf("     %-20s peak live %.1f MiB, reserved %.1f MiB on the GPU (%.1f on sim), ratio %.4f, %.0f ns/op, "
               "device calls %.1f ms\n",
               files[i], on_gpu.peak_live_bytes / 1048576.0, on_gpu.peak_reserved_bytes / 1048576.0,
               on_sim.peak_reserved_bytes / 1048576.0, on_gpu.ratio, on_gpu.ns_per_operation,
               on_gpu.stats.device_call_ns / 1e6);
        gm_trace_free(&trace);
    }
}

/* A trace's stream ids are names: on the GPU each is a real stream (the ids used to be passed as
 * CUstream pointers, and libcuda crashed on the first one that was not 0). */
static void trace_streams_become_real_streams(void)
{
    char path[] = "/tmp/gpumem-streams-XXXXXX";
    int descriptor = mkstemp(path);
    REQUIRE(descriptor >= 0);
    FILE *file = fdopen(descriptor, "w");
    REQUIRE(file != NULL);
    for (int i = 0; i < 300; i++) {
        unsigned stream = i % 3 == 0 ? 0u : i % 3 == 1 ? 7u : 123456u;
        fprintf(file, "a,%d,%d,%u\n", i, (i % 17 + 1) << 20, stream);
        if (i >= 4)
            fprintf(file, "f,%d,%d,%u\n", i - 4, ((i - 4) % 17 + 1) << 20, stream);
    }
    fclose(file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    unlink(path);
    gm_allocator *allocator = make("backend:cuda");
    gm_replay_result result;
    for (int pass = 0; pass < 2; pass++) { /* the same names, the same streams */
        CHECK_OK(gm_replay(allocator, &trace, &result));
        CHECK_EQ_INT(result.failed_allocations, 0);
    }
    gm_stream first = 0, again = 0, zero = 1;
    CHECK_OK(gm_named_stream(allocator, 7, &first));
    CHECK_OK(gm_named_stream(allocator, 7, &again));
    CHECK_OK(gm_named_stream(allocator, 0, &zero));
    CHECK(first != 0 && first != 7 && first == again);
    CHECK(zero == 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    gm_trace_free(&trace);
}

/* ---------------------------------------------------------------- pinned host memory */

/* A kernel on `stream` that writes a device buffer for well over 100 ms; `done` is recorded after it. */
static void start_slow_writer(unsigned long long device, size_t size, cu_handle stream, cu_handle done)
{
    unsigned long long words = size / 4, spin = 20000;
    unsigned pattern = 0x5A5A5A5Au;
    void *arguments[] = {&device, &words, &pattern, &spin};
    CU_CHECK(cu.launch(slow_fill_kernel, 1, 1, 1, 256, 1, 1, 0, stream, arguments, NULL));
    CU_CHECK(cu.event_record(done, stream));
}

/* CuPy destroys a stream as soon as its last reference goes, which may be right after a pinned block
 * used on it is freed: the block must still wait for the stream's work, and no later look may ask the
 * destroyed stream (undefined in the driver). */
static void a_pinned_block_outlives_its_destroyed_stream(void)
{
    enum { held_count = 32 };
    gm_allocator *allocator = make("backend:cuda");
    cu_handle side = NULL, done = NULL;
    CU_CHECK(cu.stream_create(&side, 1));
    CU_CHECK(cu.event_create(&done, 2));
    size_t size = 16u << 20;
    unsigned long long device = 0;
    CU_CHECK(cu.memory_allocate(&device, size));
    void *block = NULL, *held[held_count] = {NULL}, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, 4096, &block));
    start_slow_writer(device, size, side, done);
    gm_stream stream = (gm_stream)side;
    CHECK_OK(gm_host_free_with_streams(allocator, block, &stream, 1));
    CU_CHECK(cu.stream_destroy(side)); /* its kernel goes on; the handle is gone */
    bool reused_early = false;
    for (int i = 0; i < held_count; i++) { /* each allocation may look at the freed block */
        CHECK_OK(gm_host_malloc(allocator, 4096, &held[i]));
        reused_early = reused_early || (held[i] == block && cu.event_query(done) != 0);
    }
    CHECK_OK(gm_host_empty_cache(allocator)); /* a look too */
    CHECK(!reused_early);
    CU_CHECK(cu.context_synchronize());
    for (int i = 0; i < held_count; i++)
        CHECK_OK(gm_host_free(allocator, held[i]));
    bool reused = false;
    for (int i = 0; i < held_count + 1 && !reused; i++) {
        CHECK_OK(gm_host_malloc(allocator, 4096, &again));
        reused = again == block;
    }
    CHECK(reused);
    CHECK_OK(gm_host_free(allocator, again));
    CU_CHECK(cu.memory_free(device));
    gm_destroy(allocator, NULL);
}

/* A stream that its owner destroys while a kernel on it still writes a freed block, and while blocks
 * made on it live (PyTorch's external streams): with the stream borrowed, gpumem never names it again,
 * and another stream's growth that needs its memory (a memory limit leaves no other room) waits for
 * the whole device first, so the kernel has finished before that memory is used again. */
static void a_borrowed_stream_destroyed_under_its_blocks(void)
{
    enum { small_count = 300 };
    size_t size = 96u << 20;
    gm_allocator *allocator = make("backend:cuda,memory_limit:192MiB");
    cu_handle side = NULL, done = NULL;
    CU_CHECK(cu.stream_create(&side, 1));
    CU_CHECK(cu.event_create(&done, 2));
    void *written = NULL, *small[small_count] = {NULL}, *later = NULL;
    CHECK_OK(gm_malloc_on_borrowed_stream(allocator, size, (gm_stream)side, &written));
    for (int i = 0; i < small_count; i++)
        CHECK_OK(gm_malloc_on_borrowed_stream(allocator, 64 << 10, (gm_stream)side, &small[i]));
    start_slow_writer((unsigned long long)(uintptr_t)written, 16u << 20, side, done); /* its first 16 MiB */
    CHECK_OK(gm_free(allocator, written)); /* in stream order: the kernel still writes it */
    CU_CHECK(cu.stream_destroy(side));     /* its kernel goes on; the handle is gone */
    for (int i = 0; i < small_count; i++)  /* more frees than a progress mark needs */
        CHECK_OK(gm_free(allocator, small[i]));
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    CHECK_OK(gm_malloc(allocator, size, 0, &later)); /* takes the destroyed stream's memory */
    bool kernel_done = cu.event_query(done) == 0;
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK(kernel_done);
    CHECK(after.device_calls[GM_CALL_EVENT_SYNCHRONIZE] > before.device_calls[GM_CALL_EVENT_SYNCHRONIZE]);
    CHECK(after.reserved_bytes[GM_POOL_ALL].current <= 192 << 20);
    unsigned pattern = 0xB0220EDu;
    fill(later, size, pattern, NULL);
    CHECK(count_mismatches(later, size, pattern) == 0);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, later));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_destroy(allocator, NULL);
}

/* While a blocking stream is captured into a graph, the legacy stream cannot be used: a look at pinned
 * blocks freed on it must leave it alone, or the capture is invalidated. The block is reused after. */
static void a_graph_capture_survives_a_look_at_pinned_blocks(void)
{
    gm_allocator *allocator = make("backend:cuda");
    cu_handle capturing = NULL, graph = NULL;
    CU_CHECK(cu.stream_create(&capturing, 0)); /* blocking: the legacy stream waits for it */
    size_t size = 1u << 20;
    unsigned long long device = 0;
    CU_CHECK(cu.memory_allocate(&device, size));
    void *block = NULL, *other = NULL, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, size, &block));
    gm_stream legacy = 0;
    CHECK_OK(gm_host_free_with_streams(allocator, block, &legacy, 1)); /* asked at a later look */
    CU_CHECK(cu.begin_capture(capturing, 0)); /* CU_STREAM_CAPTURE_MODE_GLOBAL */
    fill((void *)(uintptr_t)device, size, 0x22222222u, capturing);
    CHECK_OK(gm_host_malloc(allocator, size, &other)); /* a look, during the capture */
    CHECK(other != block); /* the legacy stream was not asked, so the block is not known idle */
    cu_result ended = cu.end_capture(capturing, &graph);
    CHECK(ended == 0); /* 901 (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) if the legacy stream was asked */
    if (graph)
        cu.graph_destroy(graph);
    CHECK_OK(gm_host_malloc(allocator, size, &again)); /* a look after the capture */
    CHECK(again == block);
    CHECK_OK(gm_host_free(allocator, other));
    CHECK_OK(gm_host_free(allocator, again));
    CU_CHECK(cu.memory_free(device));
    cu.stream_destroy(capturing);
    gm_destroy(allocator, NULL);
}

/* A pinned block freed on a stream during that stream's capture (a copy of it may be a node of the
 * graph, run at every replay): the free neither queries the stream nor records an event on it, which
 * would invalidate the capture, and the block is never handed out again, not even once the graph has
 * run and the stream is idle. */
static void a_pinned_block_freed_during_a_capture_is_held(void)
{
    gm_allocator *allocator = make("backend:cuda");
    cu_handle capturing = NULL, graph = NULL;
    CU_CHECK(cu.stream_create(&capturing, 1)); /* CU_STREAM_NON_BLOCKING */
    size_t size = 1u << 20;
    unsigned long long device = 0;
    CU_CHECK(cu.memory_allocate(&device, size));
    void *block = NULL, *again = NULL;
    CHECK_OK(gm_host_malloc(allocator, size, &block));
    CU_CHECK(cu.begin_capture(capturing, 0)); /* CU_STREAM_CAPTURE_MODE_GLOBAL */
    fill((void *)(uintptr_t)device, size, 0x33333333u, capturing);
    gm_stream stream = (gm_stream)(uintptr_t)capturing;
    CHECK_OK(gm_host_free_with_streams(allocator, block, &stream, 1));
    cu_result ended = cu.end_capture(capturing, &graph);
    CHECK(ended == 0); /* 901 (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) if the stream was asked */
    if (graph)
        cu.graph_destroy(graph);
    CU_CHECK(cu.stream_synchronize(capturing));
    gm_host_stats stats;
    CHECK_OK(gm_host_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.pending_blocks, 1);
    for (int i = 0; i < 4; i++) {
        CHECK_OK(gm_host_malloc(allocator, size, &again));
        CHECK(again != block);
        CHECK_OK(gm_host_free(allocator, again));
    }
    CU_CHECK(cu.memory_free(device));
    cu.stream_destroy(capturing);
    gm_destroy(allocator, NULL);
}

/* stitch:true on the GPU (the layout of tests/test_stitching.c): chunks A, B, C of 64 MiB; A's first
 * 10 MiB, all of B and C's last 42 MiB live. A 70 MiB request lies across second mappings of A's free
 * end and C's free start with no new memory, and what a kernel writes through it, a kernel reads where
 * that free end and start lie; the live blocks around keep their bytes. */
static void a_stitched_request_reaches_the_chunks_memory(void)
{
    const size_t mib = (size_t)1 << 20;
    gm_allocator *allocator = make("backend:cuda,max_chunk_size:64MiB,chunk_room_share:0,stitch:true");
    void *whole = NULL, *head = NULL, *end_free = NULL, *middle = NULL, *start_free = NULL, *tail = NULL;
    unsigned char *request = NULL;
    CHECK_OK(gm_malloc(allocator, 192 * mib, 0, &whole));
    CHECK_OK(gm_free(allocator, whole));
    unsigned char *base = whole;
    CHECK_OK(gm_malloc(allocator, 10 * mib, 0, &head));
    CHECK_OK(gm_malloc(allocator, 54 * mib, 0, &end_free));
    CHECK_OK(gm_malloc(allocator, 64 * mib, 0, &middle));
    CHECK_OK(gm_malloc(allocator, 22 * mib, 0, &start_free));
    CHECK_OK(gm_malloc(allocator, 42 * mib, 0, &tail));
    CHECK(end_free == (void *)(base + 10 * mib) && start_free == (void *)(base + 128 * mib));
    CHECK_OK(gm_free(allocator, end_free));
    CHECK_OK(gm_free(allocator, start_free));
    fill(head, 10 * mib, 0x10101010u, NULL);
    fill(middle, 64 * mib, 0x20202020u, NULL);
    fill(tail, 42 * mib, 0x30303030u, NULL);
    CHECK_OK(gm_malloc(allocator, 70 * mib, 0, (void **)&request));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].peak, 192 * mib); /* no new memory */
    fill(request, 54 * mib, 0x5717C4EDu, NULL);
    fill(request + 54 * mib, 16 * mib, 0x0DDBA11u, NULL);
    CHECK_EQ_INT(count_mismatches(base + 10 * mib, 54 * mib, 0x5717C4EDu), 0);
    CHECK_EQ_INT(count_mismatches(base + 128 * mib, 16 * mib, 0x0DDBA11u), 0);
    CHECK_EQ_INT(count_mismatches(head, 10 * mib, 0x10101010u), 0);
    CHECK_EQ_INT(count_mismatches(middle, 64 * mib, 0x20202020u), 0);
    CHECK_EQ_INT(count_mismatches(tail, 42 * mib, 0x30303030u), 0);
    CHECK_OK(gm_free(allocator, request));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, head));
    CHECK_OK(gm_free(allocator, middle));
    CHECK_OK(gm_free(allocator, tail));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

int main(void)
{
    gm_allocator *allocator = NULL;
    gm_status status = gm_create("backend:cuda", &allocator);
    if (status != GM_OK) {
        printf("skipped: no GPU to test on (%s)\n", gm_last_error());
        return 77;
    }
    gm_destroy(allocator, NULL);
    REQUIRE(load_driver_for_tests());
    quick = getenv("GPUMEM_GPU_TEST_QUICK") != NULL;
    under_sanitizer = getenv("GPUMEM_GPU_TEST_UNDER_SANITIZER") != NULL;
    static const test_case cases[] = {
        TEST_CASE(data_integrity_pages_engine),
        TEST_CASE(data_integrity_segments_engine),
        TEST_CASE(compaction_keeps_data_that_queued_work_still_writes),
        TEST_CASE(recorded_stream_protects_memory_in_use),
        TEST_CASE(without_record_stream_the_memory_is_reused),
        TEST_CASE(a_chunk_moves_ahead_of_its_stream),
        TEST_CASE(a_stitched_request_reaches_the_chunks_memory),
        TEST_CASE(out_of_memory_is_an_error_and_recoverable),
        TEST_CASE(empty_cache_gives_memory_back),
        TEST_CASE(memory_used_outside_is_seen_and_named),
        TEST_CASE(traces_reach_the_sim_peaks),
        TEST_CASE(trace_streams_become_real_streams),
        TEST_CASE(a_pinned_block_outlives_its_destroyed_stream),
        TEST_CASE(a_borrowed_stream_destroyed_under_its_blocks),
        TEST_CASE(a_pinned_block_freed_during_a_capture_is_held),
        TEST_CASE(a_graph_capture_survives_a_look_at_pinned_blocks), /* last: left out under the sanitizer */
    };
    size_t count = sizeof cases / sizeof cases[0];
    if (under_sanitizer) {
        count--;
        printf("skip a_graph_capture_survives_a_look_at_pinned_blocks: the driver answers the legacy stream asked\n"
               "     during a capture with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the documented signal, which the\n"
               "     sanitizer counts as an error (the tests step runs this case)\n");
    }
    return run_tests(cases, count);
}
