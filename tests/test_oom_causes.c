/*
 * test_oom_causes.c -- every out-of-memory failure names one primary cause, on the sim backend (and the
 * host backend for host memory), with exact expectations: the cause gm_last_oom_cause() returns, the
 * report's first line in PyTorch's shape, its "Cause:" line with the numbers behind it, and the
 * remedies for that cause in order. The classification itself is checked on hand-made totals too, at
 * the boundaries between causes.
 */
#include "base/system_memory.h"
#include "core/oom_report.h"

#include "test.h"

#include <pthread.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static void *take(gm_allocator *allocator, uint64_t size)
{
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, size, 0, &pointer));
    return pointer;
}

static void fail(gm_allocator *allocator, uint64_t size, gm_oom_cause cause)
{
    void *pointer = NULL;
    CHECK_STATUS(gm_malloc(allocator, size, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
    CHECK(pointer == NULL);
    CHECK_EQ_INT(gm_last_oom_cause(), cause);
    CHECK_MESSAGE("gpumem: out of memory. Tried to allocate ");
}

/* The second line of the report names the cause. */
static void check_cause_line(const char *cause_line)
{
    const char *second = strchr(gm_last_error(), '\n');
    if (!second || strncmp(second + 1, cause_line, strlen(cause_line))) {
        fprintf(stderr, "%s:%d: [%s] second line of '%s' is not '%s...'\n", __FILE__, __LINE__, test_current,
                gm_last_error(), cause_line);
        test_failures++;
    }
}

static void names_of_causes(void)
{
    static const char *const names[] = {"none",         "capacity", "fragmentation", "other_processes",
                                        "memory_limit", "host",     "source",        "address_space"};
    for (int cause = 0; cause <= GM_OOM_CAUSE_ADDRESS_SPACE; cause++)
        CHECK(!strcmp(gm_oom_cause_name((gm_oom_cause)cause), names[cause]));
    CHECK(!strcmp(gm_oom_cause_name((gm_oom_cause)42), "unknown"));
}

static void *cause_on_a_new_thread(void *unused)
{
    (void)unused;
    return (void *)(uintptr_t)gm_last_oom_cause();
}

static void cause_is_per_thread(void)
{
    pthread_t thread;
    void *cause = (void *)1;
    REQUIRE(pthread_create(&thread, NULL, cause_on_a_new_thread, NULL) == 0);
    pthread_join(thread, &cause);
    CHECK_EQ_INT((uintptr_t)cause, GM_OOM_CAUSE_NONE);
}

/* The order of the rules, at their boundaries. */
static void classification_boundaries(void)
{
    gm_oom_facts facts = {.size = 100 * MiB, .device_total = GiB, .device_free = 0, .memory_limit = GiB,
                          .reserved = GiB, .live = 924 * MiB, .outside = 0, .host_available = -1, .host_total = -1};
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_FRAGMENTATION); /* 924 + 100 = 1024 MiB: it fits */
    facts.live += 512;
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_CAPACITY); /* 512 bytes too many */
    facts.live = 500 * MiB;
    facts.memory_limit = 600 * MiB;
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_FRAGMENTATION); /* 600 MiB of 600 */
    facts.memory_limit = 600 * MiB - 512;
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_MEMORY_LIMIT);
    facts.memory_limit = GiB;
    facts.outside = 424 * MiB;
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_FRAGMENTATION); /* 600 MiB left: exactly enough */
    facts.outside += 512;
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_OTHER_PROCESSES);
    facts.outside = 0;
    facts.host_total = 16 * GiB;
    facts.host_available = (int64_t)(16 * GiB / 100); /* not below 1% of the host... */
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_FRAGMENTATION);
    facts.host_available -= 1; /* ...now it is */
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_HOST);
    facts.host_total = 1024 * GiB;
    facts.host_available = (int64_t)(256 * MiB); /* a large host: 256 MiB is the threshold */
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_FRAGMENTATION);
    facts.host_available -= 1;
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_HOST);
    facts.live = GiB; /* capacity comes before a low host */
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_CAPACITY);
    facts.host_failed = true; /* a host allocation that failed comes first */
    CHECK_EQ_INT(gm_classify_oom(&facts), GM_OOM_CAUSE_HOST);
}

static void capacity(void)
{
    static const char *const engines[] = {"engine:pages,capacity:1GiB", "engine:segments,capacity:1GiB"};
    for (int e = 0; e < 2; e++) {
        gm_allocator *allocator = make_allocator(engines[e]);
        fail(allocator, 2 * GiB, GM_OOM_CAUSE_CAPACITY);
        check_cause_line("Cause: capacity. The request alone (2.00 GiB) is larger than the whole device (1.00 GiB).");
        CHECK_MESSAGE("What to do, in order:\n  1. Split the work so that no single tensor needs 2.00 GiB");
        void *blocks[10];
        for (int i = 0; i < 10; i++)
            blocks[i] = take(allocator, 100 * MiB);
        fail(allocator, 100 * MiB, GM_OOM_CAUSE_CAPACITY);
        check_cause_line("Cause: capacity. Live allocations hold 1000.00 MiB of the device's 1.00 GiB and the "
                         "request needs 100.00 MiB more: 1.07 GiB in all, more than the whole device.");
        CHECK_MESSAGE("  1. Peak live is 1000.00 MiB of 1.00 GiB: halve the micro-batch and accumulate gradients");
        CHECK_MESSAGE("  2. Enable activation checkpointing on the repeated blocks");
        CHECK_MESSAGE("  3. Keep weights and activations in bf16 or fp16");
        for (int i = 0; i < 10; i++)
            CHECK_OK(gm_free(allocator, blocks[i]));
        gm_destroy(allocator, NULL);
    }
    /* In whole pages: a 70 MiB request needs two 64 MiB pages, and a 100 MiB device holds one. */
    gm_allocator *allocator = make_allocator("engine:pages,capacity:100MiB,page_size:64MiB");
    fail(allocator, 70 * MiB, GM_OOM_CAUSE_CAPACITY);
    check_cause_line("Cause: capacity. The request alone (70.00 MiB) needs 128.00 MiB in whole pages of 64.00 MiB, "
                     "more than the whole device's 100.00 MiB holds in such pages.");
    CHECK_MESSAGE("  1. Split the work so that no single tensor needs 70.00 MiB");
    CHECK_OK(gm_free(allocator, take(allocator, 60 * MiB))); /* one page's worth fits */
    gm_destroy(allocator, NULL);
}

/* A request that can never fit, asked for again and again (a retry loop, a batch-size search), costs
 * nothing that stays: no address range is reserved for it (the pages engine once reserved a region for
 * each request larger than a region and kept it, empty), nor kept by a request within a region's size. */
static void requests_that_never_fit_leave_nothing_behind(void)
{
    static const char *const configurations[] = {"engine:pages,capacity:1GiB", "engine:pages,memory_limit:1KiB",
                                                 "engine:segments,capacity:1GiB"};
    static const uint64_t sizes[] = {3 * GiB, 300 * MiB, 3 * GiB};
    for (int c = 0; c < 3; c++) {
        gm_allocator *allocator = make_allocator(configurations[c]);
        for (int attempt = 0; attempt < 50; attempt++) {
            void *pointer = NULL;
            CHECK_STATUS(gm_malloc(allocator, sizes[c], 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
        }
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.device_calls[GM_CALL_ADDRESS_RESERVE], 0);
        CHECK_EQ_INT(stats.num_ooms, 50);
        gm_destroy(allocator, NULL);
    }
    /* Within a region's size but over the device: one region, made once and used again. */
    gm_allocator *allocator = make_allocator("engine:pages,capacity:1GiB");
    for (int attempt = 0; attempt < 50; attempt++) {
        void *pointer = NULL;
        CHECK_STATUS(gm_malloc(allocator, 1536 * MiB, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
    }
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK(stats.device_calls[GM_CALL_ADDRESS_RESERVE] <= 1);
    gm_destroy(allocator, NULL);
}

/* A 1 GiB device, one chunk per growth, no stitching: an 800 MiB chunk (then a 100 MiB one) whose
 * middle 396 MiB is freed between two live 4 MiB blocks, which pin it: 792 MiB cached, none in one
 * piece over 396 MiB. */
static gm_allocator *pinned_big_chunk(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:1GiB,max_chunk_size:0,chunk_room_share:0,stitch:false");
    void *first = take(allocator, 800 * MiB);
    take(allocator, 100 * MiB);
    CHECK_OK(gm_free(allocator, first));
    take(allocator, 4 * MiB);
    void *middle = take(allocator, 396 * MiB);
    take(allocator, 4 * MiB);
    CHECK_OK(gm_free(allocator, middle));
    return allocator;
}

static void fragmentation(void)
{
    /* Segments: every other 4 MiB block of a full device freed: 100 MiB free, none in one piece. */
    gm_allocator *allocator = make_allocator("engine:segments,capacity:200MiB,release_before_growth:false");
    void *blocks[50];
    for (int i = 0; i < 50; i++)
        blocks[i] = take(allocator, 4 * MiB);
    for (int i = 0; i < 50; i += 2)
        CHECK_OK(gm_free(allocator, blocks[i]));
    fail(allocator, 30 * MiB, GM_OOM_CAUSE_FRAGMENTATION);
    check_cause_line("Cause: fragmentation. 100.00 MiB is free in total, enough for the request: 100.00 MiB cached "
                     "in gpumem's reserved memory and 0 B more that the device allows. But no free piece is large "
                     "enough: the largest in this stream's large pool is 4.00 MiB (the largest anywhere 4.00 MiB)");
    CHECK_MESSAGE("  1. Use the pages engine (engine:pages in GPUMEM_CONF)");
    CHECK_MESSAGE("  2. Empty the cache between phases");
    CHECK_MESSAGE("  3. Allocate long-lived tensors");
    gm_destroy(allocator, NULL);
    /* Pages, one chunk per growth: small blocks left inside a big chunk pin it. */
    allocator = pinned_big_chunk();
    fail(allocator, 500 * MiB, GM_OOM_CAUSE_FRAGMENTATION);
    check_cause_line("Cause: fragmentation. 916.00 MiB is free in total, enough for the request: 792.00 MiB cached "
                     "in gpumem's reserved memory and 124.00 MiB more that the device allows.");
    CHECK_MESSAGE("the largest in this stream's large pool is 396.00 MiB");
    CHECK_MESSAGE("a live block pins the free pages of every chunk it touches");
    CHECK_MESSAGE("\n792.00 MiB of the cached memory is whole free pages inside chunks that live blocks pin, which "
                  "gm_defragment would give back.\n");
    CHECK_MESSAGE("  1. max_chunk_size:2MiB in GPUMEM_CONF (now no limit): page-sized chunks, so free pages anywhere "
                  "serve a request, with no copies");
    CHECK_MESSAGE("  2. stitch:true in GPUMEM_CONF (the default; now false): a request may lie across second "
                  "mappings of the free end of one pinned chunk and the free start of another");
    CHECK_MESSAGE("  3. compact_min:2MiB in GPUMEM_CONF: a chunk that a few live blocks pin is split");
    CHECK_MESSAGE("; or the same at a moment the program chooses, between steps: gm_defragment, "
                  "gpumem.torch.defragment().\n");
    CHECK_MESSAGE("  4. chunk_room_share:1000 in GPUMEM_CONF (the default; now 0)");
    CHECK_MESSAGE("  5. Empty the cache between phases");
    CHECK_MESSAGE("\nWhich setting lets this program fit: gpumem run --tune -- python train.py replays its allocations "
                  "under each (gpumem tune) on what its GPU leaves it.\n");
    gm_destroy(allocator, NULL);
    /* Pages, no whole page pinned: 3 MiB blocks back to back fill a 64 MiB device (page-sized chunks, the
     * room share on so small a device); every other one freed leaves a whole idle page and a 1 MiB piece of
     * a page that the block before still uses (and the last block leaves 1 MiB of the last page). The idle
     * pages go back at the retry; what stays cached is pieces, which neither gm_defragment nor a smaller
     * chunk size joins, so the report offers neither. */
    allocator = make_allocator("engine:pages,capacity:64MiB");
    void *threes[21];
    for (int i = 0; i < 21; i++)
        threes[i] = take(allocator, 3 * MiB);
    for (int i = 1; i < 21; i += 2)
        CHECK_OK(gm_free(allocator, threes[i]));
    fail(allocator, 24 * MiB, GM_OOM_CAUSE_FRAGMENTATION);
    check_cause_line("Cause: fragmentation. 31.00 MiB is free in total, enough for the request: 11.00 MiB cached "
                     "in gpumem's reserved memory and 20.00 MiB more that the device allows. But no free piece is "
                     "large enough: the largest in this stream's large pool is 1.00 MiB");
    CHECK_MESSAGE("\nNo whole free page of the cached memory is pinned: it lies in pieces that hold no whole page "
                  "(free bytes that share their pages with live blocks) or in other heaps, and gm_defragment "
                  "cannot give any of it back.\n");
    CHECK_MESSAGE("  1. compact_min:2MiB in GPUMEM_CONF: a chunk that a few live blocks pin is split, its live pages "
                  "copied to new memory at the same addresses and its free pages given back (for a program in which "
                  "one thread at a time launches work on the device, as a training loop does; docs/engine.md, "
                  "\"Compaction\").\n");
    CHECK(strstr(gm_last_error(), "gm_defragment,") == NULL);
    CHECK(strstr(gm_last_error(), "whole free pages inside chunks") == NULL);
    CHECK(strstr(gm_last_error(), "stitch:true") == NULL); /* on by default: not offered */
    CHECK(strstr(gm_last_error(), "max_chunk_size:2MiB") == NULL); /* no chunk size joins pieces of pages */
    gm_destroy(allocator, NULL);
    /* The first two remedies work: three 300 MiB chunks, each pinned by a 4 MiB block at its start, 888 MiB
     * free but in pieces of 296 MiB and only 124 MiB more on the device. A 500 MiB request fails; with the
     * page-sized chunks the report offers it fits (the free pages move), and with compaction it fits (two
     * chunks are split around their pinned pages). chunk_room_share:0 keeps each
     * growth one chunk; with the default share (the fourth) no chunk exceeds a thousandth of the room left,
     * a page on this device, and the same program fits with no remedy at all. */
    static const char *const configs[] = {
        "engine:pages,capacity:1GiB,max_chunk_size:0,chunk_room_share:0",
        "engine:pages,capacity:1GiB,max_chunk_size:0,chunk_room_share:0,compact_min:2MiB",
        "engine:pages,capacity:1GiB,max_chunk_size:2MiB,chunk_room_share:0",
        "engine:pages,capacity:1GiB,max_chunk_size:0"};
    for (int remedy = 0; remedy <= 3; remedy++) {
        allocator = make_allocator(configs[remedy]);
        void *chunks[3], *pins[3], *rests[3];
        for (int i = 0; i < 3; i++)
            chunks[i] = take(allocator, 300 * MiB);
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, chunks[i]));
        for (int i = 0; i < 3; i++)
            pins[i] = take(allocator, 4 * MiB), rests[i] = take(allocator, 296 * MiB);
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, rests[i]));
        void *request = NULL;
        if (remedy == 0) {
            fail(allocator, 500 * MiB, GM_OOM_CAUSE_FRAGMENTATION);
            CHECK_MESSAGE("  1. max_chunk_size:2MiB in GPUMEM_CONF");
            CHECK_MESSAGE("  2. compact_min:2MiB in GPUMEM_CONF: a chunk that a few live blocks pin is split");
        } else if (remedy >= 2) {
            CHECK_OK(gm_malloc(allocator, 500 * MiB, 0, &request));
            CHECK_OK(gm_free(allocator, request));
        } else {
            CHECK_OK(gm_malloc(allocator, 500 * MiB, 0, &request));
            gm_stats stats = {0};
            CHECK_OK(gm_get_stats(allocator, &stats));
            CHECK_EQ_INT(stats.num_alloc_retries, 0); /* compaction served it, not the release of the cache */
            fail(allocator, 1 * GiB, GM_OOM_CAUSE_CAPACITY);
            CHECK(strstr(gm_last_error(), "compact_min") == NULL);
            CHECK_OK(gm_free(allocator, request));
        }
        for (int i = 0; i < 3; i++)
            CHECK_OK(gm_free(allocator, pins[i]));
        gm_destroy(allocator, NULL);
    }
}

static void other_processes(void)
{
    gm_allocator *allocator = make_allocator("capacity:1GiB");
    void *live = take(allocator, 100 * MiB);
    CHECK_OK(gm_sim_set_used_elsewhere(allocator, 600 * MiB));
    fail(allocator, 400 * MiB, GM_OOM_CAUSE_OTHER_PROCESSES); /* 500 MiB needed, 424 MiB left */
    check_cause_line("Cause: other processes. 600.00 MiB of the device is used outside this allocator (other "
                     "processes, this process's CUDA context, other allocators): without it the live allocations "
                     "(100.00 MiB) and the request (400.00 MiB) would fit in the device's 1.00 GiB.");
    CHECK_MESSAGE("\nThe sim backend counts 600.00 MiB as used elsewhere (gm_sim_set_used_elsewhere).\n");
    CHECK_MESSAGE("Device: 1.00 GiB total, 324.00 MiB free, 600.00 MiB of it used outside gpumem.");
    CHECK_MESSAGE("  1. Stop the other processes on this GPU, or give each job a GPU of its own (CUDA_VISIBLE_DEVICES)");
    CHECK_MESSAGE("  3. Otherwise fit in the 424.00 MiB left: peak live is 100.00 MiB");
    CHECK_OK(gm_sim_set_used_elsewhere(allocator, 0)); /* they exit: it fits */
    void *pointer = take(allocator, 400 * MiB);
    CHECK_OK(gm_free(allocator, pointer));
    CHECK_OK(gm_free(allocator, live));
    gm_destroy(allocator, NULL);
}

static void memory_limit(void)
{
    gm_allocator *allocator = make_allocator("capacity:1GiB,memory_limit:256MiB");
    void *live = take(allocator, 200 * MiB);
    fail(allocator, 100 * MiB, GM_OOM_CAUSE_MEMORY_LIMIT);
    check_cause_line("Cause: memory limit. The limit of 256.00 MiB (memory_limit in GPUMEM_CONF, gm_set_memory_limit, "
                     "or torch.cuda.set_per_process_memory_fraction) is reached: live allocations hold 200.00 MiB and "
                     "the request needs 100.00 MiB more, 300.00 MiB in all; the device has 1.00 GiB, 824.00 MiB of it "
                     "free.");
    CHECK_MESSAGE("Memory limit: 256.00 MiB.");
    CHECK_MESSAGE("  1. Raise the limit to at least 300.00 MiB if this process may use that much of the device");
    CHECK_MESSAGE("  2. Or fit the job under the limit: peak live is 200.00 MiB of 256.00 MiB");
    CHECK_OK(gm_set_memory_limit(allocator, 300 * MiB)); /* as the report says */
    void *pointer = take(allocator, 100 * MiB);
    CHECK_OK(gm_free(allocator, pointer));
    CHECK_OK(gm_free(allocator, live));
    gm_destroy(allocator, NULL);
}

/* A stream that allocates takes twice the device of addresses: on a simulated device of 1 TiB, the sim's
 * fake address space (about 95 TiB) holds the ranges of a few dozen streams. The stream past them is
 * told so, not that memory is fragmented; once streams' memory is given back, a new stream fits again,
 * and the next failure is judged on its own. */
static void address_space(void)
{
    gm_allocator *allocator = make_allocator("capacity:1TiB");
    void *pointers[100] = {0};
    gm_stream stream = 1;
    gm_status status = GM_OK;
    for (; stream < 100 && status == GM_OK; stream++)
        status = gm_malloc(allocator, 1 * MiB, (gm_stream)stream, &pointers[stream]);
    stream--;
    CHECK_STATUS(status, GM_ERROR_OUT_OF_MEMORY);
    CHECK(stream > 10 && stream < 100);
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_ADDRESS_SPACE);
    check_cause_line("Cause: address space. The device's virtual address space ran out: each stream that allocates");
    CHECK_MESSAGE("  1. Allocate on fewer streams");
    for (gm_stream i = 1; i < stream; i++)
        CHECK_OK(gm_free(allocator, pointers[i]));
    CHECK_OK(gm_empty_cache(allocator));
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, 1 * MiB, stream, &pointer));
    CHECK_STATUS(gm_malloc(allocator, 2 * (1ull << 40), stream, &pointers[0]), GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_CAPACITY);
    CHECK_OK(gm_free(allocator, pointer));
    gm_destroy(allocator, NULL);
}

/* ---------------------------------------------------------------- host */

static char root[256];

static void write_meminfo(long available_kb)
{
    char path[512];
    snprintf(path, sizeof path, "%s/proc", root);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    FILE *file = fopen(path, "w");
    REQUIRE(file);
    fprintf(file, "MemTotal:       16000000 kB\nMemAvailable:   %ld kB\n", available_kb);
    fclose(file);
}

/* The fragmentation case above, on a host whose MemAvailable a fixture /proc says (the pressure policy's
 * host_root is where the report reads it; its PSI signal never fires: the fixture has no PSI file). */
static void fragmented_on_host(long available_kb, gm_oom_cause cause)
{
    write_meminfo(available_kb);
    gm_allocator *allocator = make_allocator("engine:segments,capacity:200MiB,release_before_growth:false");
    gm_pressure_policy policy = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_PSI, .interval_ms = 3600000,
                                 .host_root = root};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    void *blocks[50];
    for (int i = 0; i < 50; i++)
        blocks[i] = take(allocator, 4 * MiB);
    for (int i = 0; i < 50; i += 2)
        CHECK_OK(gm_free(allocator, blocks[i]));
    fail(allocator, 30 * MiB, cause);
    gm_destroy(allocator, NULL);
}

static void host_memory_nearly_exhausted(void)
{
    snprintf(root, sizeof root, "/tmp/gpumem_oom_root_XXXXXX");
    REQUIRE(mkdtemp(root));
    fragmented_on_host(8000000, GM_OOM_CAUSE_FRAGMENTATION);
    fragmented_on_host(100000, GM_OOM_CAUSE_HOST); /* 97.66 MiB available, below 1% of the host */
    check_cause_line("Cause: host. The host is nearly out of memory, though the device's numbers leave room (the "
                     "driver needs host memory too). MemAvailable is 97.66 MiB of 15.26 GiB.");
    CHECK_MESSAGE("  1. Free host memory: fewer DataLoader workers");
    CHECK_MESSAGE("  2. See what uses it: `gpumem top`");
    char path[300];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    CHECK(unlink(path) == 0);
    snprintf(path, sizeof path, "%s/proc", root);
    CHECK(rmdir(path) == 0 && rmdir(root) == 0); /* the fixture leaves nothing in /tmp */
}

/* The count of pinned pages takes host memory. Where that runs out, the report says the count is
 * incomplete and still offers gm_defragment, instead of claiming that no whole page is pinned. Each
 * host allocation the failing request makes is failed in turn; at least one of them must be the count's. */
static void fragmentation_report_without_host_memory_to_count(void)
{
    gm_allocator *allocator = pinned_big_chunk();
    uint64_t before = gm_system_allocations_made();
    fail(allocator, 500 * MiB, GM_OOM_CAUSE_FRAGMENTATION);
    uint64_t positions = gm_system_allocations_made() - before;
    int uncounted = 0;
    for (uint64_t position = 0; position < positions; position++) {
        void *pointer = NULL;
        gm_fail_system_allocations(position, 1);
        gm_status status = gm_malloc(allocator, 500 * MiB, 0, &pointer);
        gm_fail_system_allocations(0, 0);
        CHECK(status != GM_OK && pointer == NULL);
        if (status != GM_ERROR_OUT_OF_MEMORY || !strstr(gm_last_error(), "could not be counted"))
            continue;
        uncounted++;
        CHECK_MESSAGE("\nHow much of the cached memory is whole free pages inside chunks that live blocks pin (what "
                      "gm_defragment would give back) could not be counted: the host's memory ran out; at least ");
        CHECK(strstr(gm_last_error(), "No whole free page") == NULL);
        CHECK_MESSAGE("; or the same at a moment the program chooses, between steps: gm_defragment, "
                      "gpumem.torch.defragment().\n");
    }
    CHECK(uncounted > 0);
    fail(allocator, 500 * MiB, GM_OOM_CAUSE_FRAGMENTATION); /* nothing lost: the same report as before */
    CHECK_MESSAGE("\n792.00 MiB of the cached memory is whole free pages inside chunks that live blocks pin");
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* The host backend's memory is the host's: with the address space capped (RLIMIT_AS), its reservation
 * fails, and the report names the host. */
static void host_backend_refused_by_the_host(void)
{
    gm_allocator *allocator = make_allocator("backend:host,engine:pages,capacity:4GiB");
    struct rlimit saved;
    REQUIRE(getrlimit(RLIMIT_AS, &saved) == 0);
    long kilobytes = -1;
    FILE *status = fopen("/proc/self/status", "r");
    REQUIRE(status);
    char line[256];
    while (fgets(line, sizeof line, status))
        if (!strncmp(line, "VmSize:", 7))
            kilobytes = strtol(line + 7, NULL, 10);
    fclose(status);
    REQUIRE(kilobytes > 0);
    struct rlimit capped = {.rlim_cur = (rlim_t)kilobytes * 1024 + (256u << 20), .rlim_max = saved.rlim_max};
    if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < capped.rlim_cur)
        capped.rlim_cur = saved.rlim_cur;
    REQUIRE(setrlimit(RLIMIT_AS, &capped) == 0);
    void *pointer = NULL;
    gm_status result = gm_malloc(allocator, 1 * GiB, 0, &pointer); /* its region reserves 8 GiB of addresses */
    gm_oom_cause cause = gm_last_oom_cause();
    char report[8192];
    snprintf(report, sizeof report, "%s", gm_last_error());
    REQUIRE(setrlimit(RLIMIT_AS, &saved) == 0);
    CHECK_EQ_INT(result, GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(cause, GM_OOM_CAUSE_HOST);
    CHECK(strstr(report, "\nCause: host. Host memory ran out: the backend could not map host memory.") != NULL);
    /* The flag is cleared by the report: the next failure is judged on its own. */
    CHECK_STATUS(gm_malloc(allocator, 8 * GiB, 0, &pointer), GM_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_INT(gm_last_oom_cause(), GM_OOM_CAUSE_CAPACITY);
    pointer = take(allocator, 1 * GiB); /* without the cap it works */
    CHECK_OK(gm_free(allocator, pointer));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(names_of_causes), TEST_CASE(cause_is_per_thread), TEST_CASE(classification_boundaries),
          TEST_CASE(capacity), TEST_CASE(requests_that_never_fit_leave_nothing_behind), TEST_CASE(fragmentation), TEST_CASE(fragmentation_report_without_host_memory_to_count),
          TEST_CASE(other_processes), TEST_CASE(memory_limit), TEST_CASE(address_space), TEST_CASE(host_memory_nearly_exhausted),
          TEST_CASE(host_backend_refused_by_the_host))
