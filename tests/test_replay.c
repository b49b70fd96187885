/*
 * test_replay.c -- the bundled real traces, replayed through both engines with the heap validated
 * along the way; the replay's peak of live bytes must equal the trace's own.
 *
 * The traces (data/traces, copied from PyTorch runs on an H200) and their true peaks of live bytes
 * (summed request sizes, as listed in shared/traces/README.md to 0.1 MiB):
 *   resnet50 11785936912, gpt2 27026727624, bert_varlen 19865570828, llm_generate 2327239448;
 * and one recorded by gpumem's own bench/workloads.py (data/traces-extra): gpt2 at batch 8, 14417617608.
 */
#include "test.h"

#include <inttypes.h>

#include "tools/replay_lead.h"
#include "tools/trace.h"

typedef struct known_trace {
    const char *file;
    uint64_t peak_live_bytes;
} known_trace;

static const known_trace traces[] = {
    {"resnet50.csv.gz", 11785936912ull},
    {"gpt2.csv.gz", 27026727624ull},
    {"bert_varlen.csv.gz", 19865570828ull},
    {"llm_generate.csv.gz", 2327239448ull},
    {"../traces-extra/gpt2_batch8.csv.gz", 14417617608ull}, /* recorded by bench/workloads.py */
};

static void trace_path(char *buffer, size_t size, const char *file)
{
    const char *data = getenv("GPUMEM_DATA");
    snprintf(buffer, size, "%s/traces/%s", data ? data : "data", file);
}

/* Replay with gm_validate every `every` operations, plus the regular measured replay. */
static void replay_and_validate(const char *config, const known_trace *known, size_t every)
{
    char path[1024];
    trace_path(path, sizeof path, known->file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    REQUIRE(trace.count > 0);
    CHECK_EQ_INT(trace.peak_live_bytes, known->peak_live_bytes);

    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    void **pointers = calloc(trace.slot_count, sizeof *pointers);
    REQUIRE(pointers);
    for (size_t i = 0; i < trace.count; i++) {
        const gm_trace_operation *operation = &trace.operations[i];
        if (operation->kind == GM_TRACE_ALLOCATE) {
            CHECK_OK(gm_malloc(allocator, operation->size, trace.streams[operation->stream_index],
                               &pointers[operation->slot]));
        } else {
            CHECK_OK(gm_free(allocator, pointers[operation->slot]));
            pointers[operation->slot] = NULL;
        }
        if (i % every == 0 && gm_validate(allocator) != GM_OK) {
            fprintf(stderr, "[%s %s] operation %zu: %s\n", config, known->file, i, gm_last_error());
            test_failures++;
            break;
        }
    }
    CHECK_OK(gm_validate(allocator));
    for (size_t slot = 0; slot < trace.slot_count; slot++)
        CHECK_OK(gm_free(allocator, pointers[slot]));
    free(pointers);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);

    CHECK_OK(gm_create(config, &allocator));
    gm_replay_result result;
    CHECK_OK(gm_replay(allocator, &trace, &result));
    CHECK_EQ_INT(result.peak_live_bytes, known->peak_live_bytes);
    CHECK_EQ_INT(result.failed_allocations, 0);
    CHECK(result.peak_reserved_bytes >= result.peak_live_bytes);
    CHECK_EQ_INT(result.operations, trace.count);
    gm_destroy(allocator, NULL);
    gm_trace_free(&trace);
}

static void traces_replay_on_pages(void)
{
    for (size_t i = 0; i < sizeof traces / sizeof traces[0]; i++)
        replay_and_validate("engine:pages", &traces[i], i == 3 ? 50000 : 500);
}

static void traces_replay_on_segments(void)
{
    for (size_t i = 0; i < sizeof traces / sizeof traces[0]; i++)
        replay_and_validate("engine:segments", &traces[i], i == 3 ? 50000 : 500);
}

/* Replay `trace` on a fresh allocator made from `config`, check its heap afterwards. */
static void replay_with(const char *config, const gm_trace *trace, gm_replay_result *result)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    CHECK_OK(gm_replay(allocator, trace, result));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void traces_replay_with_small_capacity_report_oom(void)
{
    char path[1024];
    trace_path(path, sizeof path, "resnet50.csv.gz");
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    gm_replay_result result;
    replay_with("capacity:8GiB", &trace, &result);
    CHECK(result.failed_allocations > 0);
    CHECK(result.peak_live_bytes < trace.peak_live_bytes);
    CHECK(strstr(result.first_failure, "out of memory") != NULL);
    CHECK(result.stats.num_ooms == (int64_t)result.failed_allocations);
    gm_trace_free(&trace);
}

/* A memory limit below the device's capacity is a smaller device: gpt2 under a limit replays as on a
 * device of that size, peak and device calls alike, with idle pages recycled near it. Where a limit
 * 128 MiB below its uncapped peak reserved is too small for chunks that live blocks pin, page-sized
 * chunks (the out-of-memory report's first remedy) let every free page move and it fits, with the
 * heap valid throughout. A limit far above what the trace needs (nine tenths of the device, set as a
 * precaution) costs nothing: chunks about as large as without a limit (the room share counts the
 * room under it) and reserved memory within a thousandth of the uncapped replay's (every chunk
 * page-sized under any limit, as once, made many times the device calls). */
static void trace_fits_a_limit_below_its_uncapped_peak(void)
{
    char path[1024];
    trace_path(path, sizeof path, traces[1].file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    gm_replay_result uncapped, limited, device, fine;
    replay_with("engine:pages", &trace, &uncapped);
    CHECK_EQ_INT(uncapped.failed_allocations, 0);

    uint64_t near = uncapped.peak_reserved_bytes - (64ull << 20), tight = uncapped.peak_reserved_bytes - (128ull << 20);
    char config[128];
    snprintf(config, sizeof config, "engine:pages,memory_limit:%" PRIu64, near);
    replay_with(config, &trace, &limited);
    snprintf(config, sizeof config, "engine:pages,capacity:%" PRIu64, near);
    replay_with(config, &trace, &device);
    CHECK_EQ_INT(limited.failed_allocations, 0);
    CHECK(limited.peak_reserved_bytes <= near);
    CHECK_EQ_INT(limited.peak_reserved_bytes, device.peak_reserved_bytes);
    CHECK_EQ_INT(limited.stats.device_calls[GM_CALL_PHYSICAL_CREATE], device.stats.device_calls[GM_CALL_PHYSICAL_CREATE]);
    CHECK_EQ_INT(limited.stats.num_page_unmaps, device.stats.num_page_unmaps);
    CHECK(limited.stats.num_page_unmaps > 0); /* near the limit, idle pages are recycled */

    snprintf(config, sizeof config, "engine:pages,max_chunk_size:2MiB,memory_limit:%" PRIu64, tight);
    replay_with(config, &trace, &fine);
    CHECK_EQ_INT(fine.failed_allocations, 0);
    CHECK(fine.peak_reserved_bytes <= tight);
    CHECK_EQ_INT(fine.peak_live_bytes, traces[1].peak_live_bytes);

    gm_replay_result far;
    replay_with("engine:pages,memory_limit:129393MiB", &trace, &far); /* the sim's 143771 MiB x 0.9 */
    CHECK_EQ_INT(far.failed_allocations, 0);
    CHECK(far.stats.num_device_alloc <= uncapped.stats.num_device_alloc * 11 / 10);
    CHECK(far.peak_reserved_bytes <= uncapped.peak_reserved_bytes + uncapped.peak_reserved_bytes / 1000);
    gm_trace_free(&trace);
    replay_and_validate(config, &traces[1], 500);
}

/* A replay's device calls that make, map, unmap or release memory (not the events that mark its
 * streams' progress). */
static int64_t device_calls_of(const gm_replay_result *result)
{
    int64_t total = 0;
    for (int kind = 0; kind < GM_CALL_EVENT_RECORD; kind++)
        total += result->stats.device_calls[kind];
    return total;
}

/* `count` passes of `trace` on one allocator made with `config`, each pass with its own peaks and counts
 * (as `gpumem replay --passes`); the allocator validated and destroyed after them. */
static void replay_passes(const char *config, const gm_trace *trace, gm_replay_result *passes, int count)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator);
    for (int pass = 0; pass < count; pass++) {
        if (pass) {
            CHECK_OK(gm_reset_accumulated_stats(allocator));
            CHECK_OK(gm_reset_peak_stats(allocator));
        }
        CHECK_OK(gm_replay(allocator, trace, &passes[pass]));
    }
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* Three passes of resnet50 on one allocator with small chunks (max_chunk_size:8MiB), each pass with its
 * own peaks and counts (as `gpumem replay --passes 3`). Small chunks keep reserved memory so close to
 * the live peak that a warm pass whose fits differ a little from the last one's moves pages, and each
 * move makes the next pass differ again: without move_slack the third pass still moves pages and
 * reserves more than the first. With move_slack:0.01 the layout settles: the warm passes move no page
 * and the third makes, maps or unmaps nothing, and reserved memory stays within the slack above the live peak. */
static void small_chunks_settle_with_move_slack(void)
{
    char path[1024];
    trace_path(path, sizeof path, traces[0].file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    for (int slack = 0; slack < 2; slack++) {
        gm_replay_result passes[3];
        replay_passes(slack ? "max_chunk_size:8MiB,move_slack:0.01" : "max_chunk_size:8MiB", &trace, passes, 3);
        for (int pass = 0; pass < 3; pass++)
            CHECK_EQ_INT(passes[pass].failed_allocations, 0);
        if (slack) {
            CHECK_EQ_INT(passes[1].stats.num_page_unmaps, 0); /* at most a new page, no move */
            CHECK_EQ_INT(passes[2].stats.num_page_unmaps, 0);
            CHECK_EQ_INT(device_calls_of(&passes[2]), 0);
            for (int pass = 0; pass < 3; pass++)
                CHECK(passes[pass].ratio < 1.01);
        } else {
            CHECK(passes[2].stats.num_page_unmaps > 0);
            CHECK(passes[2].peak_reserved_bytes > passes[0].peak_reserved_bytes);
        }
    }
    gm_trace_free(&trace);
}

/* Four passes of resnet50 under a memory limit of 11378 MiB, 1.01 times what it reserves without one:
 * the limit is a small device, whose room share makes chunks small, and small chunks without a slack
 * never settle (with move_slack:0.001 every warm pass unmaps pages and reserved memory creeps; before the
 * slack that such a device gets, its third pass ran out of memory). By default the warm passes move no
 * page, the last two make no device call, and reserved memory stays within the slack. */
static void a_tight_limit_settles(void)
{
    char path[1024];
    trace_path(path, sizeof path, traces[0].file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    for (int slack = 0; slack < 2; slack++) {
        gm_replay_result passes[4];
        replay_passes(slack ? "memory_limit:11378MiB" : "memory_limit:11378MiB,move_slack:0.001", &trace, passes, 4);
        for (int pass = 1; pass < 4; pass++) {
            if (slack) {
                CHECK_EQ_INT(passes[0].failed_allocations, 0);
                CHECK_EQ_INT(passes[pass].failed_allocations, 0);
                CHECK_EQ_INT(passes[pass].stats.num_page_unmaps, 0);
                CHECK(passes[pass].ratio < 1.02);
            } else {
                CHECK(passes[pass].stats.num_page_unmaps > 0);
            }
        }
        if (slack) {
            CHECK_EQ_INT(device_calls_of(&passes[2]), 0);
            CHECK_EQ_INT(device_calls_of(&passes[3]), 0);
        }
    }
    gm_trace_free(&trace);
}

/* Generation under a memory limit a hair above its live peak: chunks are page-sized near it, and a growth
 * for a lane's window may back several parts of it in turn. Moving idle chunks for a later part must
 * leave alone the pages of the window already mapped, also those of a free block that starts before
 * the window's run and reaches into it (it once moved such a page away, and the growth failed with
 * "inconsistent allocator state"). Near the limit requests may fail, but only as out of memory, with
 * the heap valid. */
static void generation_under_a_tight_limit_fails_only_as_out_of_memory(void)
{
    char path[1024];
    trace_path(path, sizeof path, traces[3].file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    static const int thousandths[] = {1008, 1009, 1010, 1011, 1012, 1015, 1020};
    for (size_t i = 0; i < sizeof thousandths / sizeof thousandths[0]; i++) {
        char config[128];
        snprintf(config, sizeof config, "memory_limit:%" PRIu64, trace.peak_live_bytes / 1000 * (uint64_t)thousandths[i]);
        gm_replay_result result;
        replay_with(config, &trace, &result);
        if (result.failed_allocations)
            CHECK(strstr(result.first_failure, "out of memory") != NULL);
        CHECK(result.peak_reserved_bytes <= trace.peak_live_bytes / 1000 * (uint64_t)thousandths[i]);
    }
    gm_trace_free(&trace);
}

/* Generation under a limit set as a precaution (30 GiB for a 2.2 GiB workload): the growth lane's ring
 * recycles its own laps as it does without a limit. Two passes on one allocator reserve under 1.06 times
 * the live peak; when idle pages moved by choice only near a limit, the ring climbed through the room
 * under it, further in each pass, unless the lane was made an exception. */
static void generation_under_a_far_limit_keeps_its_ring(void)
{
    char path[1024];
    trace_path(path, sizeof path, traces[3].file);
    gm_trace trace;
    CHECK_OK(gm_trace_load(path, &trace));
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("memory_limit:30GiB", &allocator));
    REQUIRE(allocator);
    for (int pass = 0; pass < 2; pass++) {
        CHECK_OK(gm_reset_peak_stats(allocator));
        gm_replay_result result;
        CHECK_OK(gm_replay(allocator, &trace, &result));
        CHECK_EQ_INT(result.failed_allocations, 0);
        CHECK(result.ratio < 1.06);
    }
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
    gm_trace_free(&trace);
}

/* A device that runs behind its host (replay_lead.c: 500 operations) keeps chunks freed moments before
 * busy. Within their own stream they move ahead of it (aliases.c): every placement, peak and page map is
 * the one of a replay whose device keeps up, and the warm pass, whose memory is all made, waits for no
 * stream. (Chunks of other streams, and old mappings in the way of a growth, still wait.) With stitch:true
 * the placements are the same too: a stitch lies at the top of the highest hole however far behind the
 * device is, and the last stitch's second mappings still waiting there serve again (resnet50 on an
 * 80 GiB device stitches in both passes); those passes may wait. */
static void a_device_behind_its_host_changes_no_placement(void)
{
    const known_trace *chosen[] = {&traces[0], &traces[2]}; /* resnet50, bert_varlen */
    uint64_t unstitched_peak[2] = {0, 0};
    for (size_t t = 0; t < 4; t++) {
        int stitch = t >= 2;
        char path[1024];
        trace_path(path, sizeof path, chosen[t % 2]->file);
        gm_trace trace;
        CHECK_OK(gm_trace_load(path, &trace));
        gm_replay_result results[2][2];
        for (int behind = 0; behind < 2; behind++) {
            gm_allocator *allocator = NULL;
            CHECK_OK(gm_create(stitch ? "capacity:80GiB,stitch:true" : "capacity:80GiB,stitch:false", &allocator));
            REQUIRE(allocator);
            gm_replay_lead *lead = NULL;
            if (behind)
                CHECK_OK(gm_replay_lead_create(allocator, &trace, 500, &lead));
            gm_replay_hooks hooks = {.after_operation = behind ? gm_replay_lead_after_operation : NULL, .context = lead};
            for (int pass = 0; pass < 2; pass++) {
                CHECK_OK(gm_reset_accumulated_stats(allocator));
                CHECK_OK(gm_reset_peak_stats(allocator));
                uint64_t waited_before = 0, waited = 0;
                if (behind)
                    CHECK_OK(gm_sim_work_waited_for(allocator, &waited_before));
                CHECK_OK(gm_replay_with_hooks(allocator, &trace, &results[behind][pass], &hooks));
                if (behind) {
                    CHECK_OK(gm_sim_work_waited_for(allocator, &waited));
                    if (pass == 1 && !stitch) {
                        CHECK_EQ_INT(waited - waited_before, 0);
                        CHECK_EQ_INT(results[behind][pass].stats.device_calls[GM_CALL_EVENT_SYNCHRONIZE], 0);
                    }
                    CHECK_OK(gm_replay_lead_catch_up(lead));
                }
                CHECK_OK(gm_validate(allocator));
            }
            gm_replay_lead_free(lead);
            gm_destroy(allocator, NULL);
        }
        for (int pass = 0; pass < 2; pass++) {
            CHECK_EQ_INT(results[1][pass].peak_reserved_bytes, results[0][pass].peak_reserved_bytes);
            CHECK_EQ_INT(results[1][pass].stats.num_page_maps, results[0][pass].stats.num_page_maps);
        }
        if (!stitch)
            unstitched_peak[t] = results[0][0].peak_reserved_bytes;
        else if (t == 2) /* resnet50 did stitch: it reserves less than without the option */
            CHECK(results[0][0].peak_reserved_bytes < unstitched_peak[0]);
        gm_trace_free(&trace);
    }
}

RUN_TESTS(TEST_CASE(traces_replay_on_pages), TEST_CASE(traces_replay_on_segments),
          TEST_CASE(traces_replay_with_small_capacity_report_oom), TEST_CASE(trace_fits_a_limit_below_its_uncapped_peak),
          TEST_CASE(small_chunks_settle_with_move_slack), TEST_CASE(a_tight_limit_settles),
          TEST_CASE(generation_under_a_tight_limit_fails_only_as_out_of_memory),
          TEST_CASE(generation_under_a_far_limit_keeps_its_ring),
          TEST_CASE(a_device_behind_its_host_changes_no_placement))
