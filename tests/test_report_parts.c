/*
 * test_report_parts.c -- the parts behind gpumem report: the memory curve keeps every peak however far
 * it is downsampled; the JSON reader accepts JSON and says where bad text goes wrong; snapshots and
 * histories read back equal what was written; the memory map rebuilt from a history at the peak of
 * reserved memory equals a snapshot taken then, and one from an inconsistent history still tiles its
 * regions; HTML escaping; a page without curve, map or statistics; a map of more regions than it draws.
 */
#include "test.h"

#include "base/system_memory.h"
#include "report/history_map.h"
#include "report/html_report.h"
#include "report/html_text.h"
#include "report/svg_charts.h"
#include "report/memory_curve.h"
#include "tools/json_formats.h"
#include "tools/json_reader.h"
#include "tools/trace.h"

#include <stdbool.h>
#include <unistd.h>

#define MiB (1ull << 20)

/* ---------------------------------------------------------------- the curve */

static void curve_keeps_every_peak(void)
{
    enum { SAMPLES = 100003 };
    uint64_t *allocated = malloc(SAMPLES * sizeof *allocated), *reserved = malloc(SAMPLES * sizeof *reserved);
    REQUIRE(allocated && reserved);
    uint64_t seed = 7;
    for (size_t i = 0; i < SAMPLES; i++) {
        allocated[i] = test_random(&seed) % 1000;
        reserved[i] = 5000 + test_random(&seed) % 100;
    }
    allocated[31337] = 123456; /* one-sample peaks */
    reserved[77777] = 999999;
    gm_memory_curve curve;
    CHECK_OK(gm_memory_curve_init(&curve, 63)); /* rounded up to 64 */
    CHECK_EQ_INT(curve.max_buckets, 64);
    for (size_t i = 0; i < SAMPLES; i++)
        gm_memory_curve_add(&curve, i, allocated[i], reserved[i]);
    CHECK(curve.bucket_count >= 32 && curve.bucket_count <= 64);
    CHECK_EQ_INT(curve.sample_count, SAMPLES);
    CHECK_EQ_INT(curve.peak_allocated, 123456);
    CHECK_EQ_INT(curve.peak_allocated_x, 31337);
    CHECK_EQ_INT(curve.peak_reserved, 999999);
    CHECK_EQ_INT(curve.peak_reserved_x, 77777);
    CHECK_EQ_INT(curve.buckets[0].first_x, 0);
    CHECK_EQ_INT(curve.buckets[curve.bucket_count - 1].last_x, SAMPLES - 1);
    for (size_t b = 0; b < curve.bucket_count; b++) { /* each bucket against its samples */
        const gm_curve_bucket *bucket = &curve.buckets[b];
        if (b)
            CHECK_EQ_INT(bucket->first_x, curve.buckets[b - 1].last_x + 1);
        uint64_t low = UINT64_MAX, high = 0, reserved_low = UINT64_MAX, reserved_high = 0;
        for (uint64_t x = bucket->first_x; x <= bucket->last_x; x++) {
            low = allocated[x] < low ? allocated[x] : low;
            high = allocated[x] > high ? allocated[x] : high;
            reserved_low = reserved[x] < reserved_low ? reserved[x] : reserved_low;
            reserved_high = reserved[x] > reserved_high ? reserved[x] : reserved_high;
        }
        CHECK_EQ_INT(bucket->allocated_low, low);
        CHECK_EQ_INT(bucket->allocated_high, high);
        CHECK_EQ_INT(bucket->allocated_last, allocated[bucket->last_x]);
        CHECK_EQ_INT(bucket->reserved_low, reserved_low);
        CHECK_EQ_INT(bucket->reserved_high, reserved_high);
        CHECK_EQ_INT(bucket->reserved_last, reserved[bucket->last_x]);
    }
    gm_memory_curve_free(&curve);
    free(allocated);
    free(reserved);
}

static gm_event event(gm_event_kind kind, uint64_t address, uint64_t size)
{
    return (gm_event){.kind = kind, .address = address, .size = size};
}

static void curve_from_events(void)
{
    const gm_event events[] = {
        event(GM_EVENT_SEGMENT_MAP, 0x10000, 4 * MiB), event(GM_EVENT_ALLOC, 0x10000, 1000),
        event(GM_EVENT_ALLOC, 0x10400, 3000),          event(GM_EVENT_FREE_REQUESTED, 0x10000, 1000),
        event(GM_EVENT_FREE_COMPLETED, 0x10000, 1000), event(GM_EVENT_SEGMENT_MAP, 0x410000, 2 * MiB),
        event(GM_EVENT_ALLOC, 0x410000, 5000),         event(GM_EVENT_SEGMENT_UNMAP, 0x10000, 4 * MiB),
    };
    gm_memory_curve curve;
    uint64_t allocated_baseline = 1, reserved_baseline = 1;
    CHECK_OK(gm_memory_curve_from_events(&curve, 16, events, 8, &allocated_baseline, &reserved_baseline));
    CHECK_EQ_INT(allocated_baseline, 0);
    CHECK_EQ_INT(reserved_baseline, 0);
    CHECK_EQ_INT(curve.peak_allocated, 8000);
    CHECK_EQ_INT(curve.peak_allocated_x, 6);
    CHECK_EQ_INT(curve.peak_reserved, 6 * MiB);
    CHECK_EQ_INT(curve.peak_reserved_x, 5);
    CHECK_EQ_INT(curve.buckets[curve.bucket_count - 1].reserved_last, 2 * MiB);
    CHECK_EQ_INT(gm_history_operation_end(events, 8, 5), 6); /* the mapping's allocation */
    CHECK_EQ_INT(gm_history_operation_end(events, 8, 3), 3);
    gm_memory_curve_free(&curve);
    /* A history whose ring dropped its start: the levels are lifted to stay at or above zero, reserved
     * memory to hold the 5000 bytes still allocated after the unmap; the baseline is the first sample. */
    CHECK_OK(gm_memory_curve_from_events(&curve, 16, events + 3, 5, &allocated_baseline, &reserved_baseline));
    CHECK_EQ_INT(allocated_baseline, 1000);
    CHECK_EQ_INT(reserved_baseline, 2 * MiB + 5000);
    CHECK_EQ_INT(curve.sample_count, 6);
    CHECK_EQ_INT(curve.buckets[0].allocated_last, 1000);
    CHECK_EQ_INT(curve.buckets[1].allocated_last, 0);
    CHECK_EQ_INT(curve.buckets[5].reserved_last, 5000);
    gm_memory_curve_free(&curve);
}

/* ---------------------------------------------------------------- the JSON reader */

/* Walk `text` skipping every value; the reader's error ("" when none). */
static const char *walk(const char *text)
{
    static gm_json_reader reader;
    gm_json_reader_init(&reader, text, strlen(text), "t.json");
    gm_json_skip_value(&reader);
    gm_json_end(&reader);
    return reader.failed ? reader.error : "";
}

static void json_reader_reads_and_refuses(void)
{
    CHECK(!strcmp(walk(" {\"a\": [1, -2.5e+3, true, false, null, \"x\\\"\\u00e9\"], \"b\": {}} "), ""));
    CHECK(!strcmp(walk("{\"a\": 1,}"), "t.json:1:9: expected a key (a string)"));
    CHECK(!strcmp(walk("{\"a\": 1\n  \"b\": 2}"), "t.json:2:3: expected ',' or '}'"));
    CHECK(!strcmp(walk("[1, 2"), "t.json:1:6: expected ',' or ']'"));
    CHECK(!strcmp(walk("{\"a\" 1}"), "t.json:1:6: expected ':' after a key"));
    CHECK(!strcmp(walk("\"\\q\""), "t.json:1:4: bad escape in a string"));
    CHECK(!strcmp(walk("\"\\ud800\""), "t.json:1:8: unpaired surrogate in a \\u escape"));
    CHECK(!strcmp(walk("\"abc"), "t.json:1:5: unterminated string"));
    CHECK(!strcmp(walk("[1] 2"), "t.json:1:5: unexpected text after the end"));
    CHECK(!strcmp(walk(""), "t.json:1:1: unexpected end of the text"));
    CHECK(!strcmp(walk("[01]"), "t.json:1:3: expected ',' or ']'"));
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    deep[sizeof deep - 1] = '\0';
    CHECK(strstr(walk(deep), "nested too deeply") != NULL);

    gm_json_reader reader;
    const char *text = "{\"n\": 18446744073709551615, \"s\": \"\\ud83d\\ude00<&>\", \"big\": 18446744073709551616}";
    gm_json_reader_init(&reader, text, strlen(text), "t.json");
    char key[16], string[16];
    uint64_t number = 0;
    CHECK(gm_json_begin_object(&reader));
    CHECK(gm_json_next_member(&reader, key, sizeof key) && !strcmp(key, "n"));
    CHECK(gm_json_read_uint64(&reader, &number) && number == UINT64_MAX);
    CHECK(gm_json_next_member(&reader, key, sizeof key) && !strcmp(key, "s"));
    CHECK(gm_json_read_string(&reader, string, sizeof string) && !strcmp(string, "\xf0\x9f\x98\x80<&>"));
    CHECK(gm_json_next_member(&reader, key, sizeof key) && !strcmp(key, "big"));
    CHECK(!gm_json_read_uint64(&reader, &number) && strstr(reader.error, "integer too large"));
    CHECK(!gm_json_next_member(&reader, key, sizeof key)); /* failed stays failed */
    gm_json_reader_init(&reader, "\"0123456789abcdef\"", 18, "t.json");
    CHECK(!gm_json_read_string(&reader, string, sizeof string) && strstr(reader.error, "string too long"));
}

/* ---------------------------------------------------------------- files read back */

static char *write_temporary(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/gpumem-test-report-XXXXXX");
    int descriptor = mkstemp(path);
    REQUIRE(descriptor >= 0);
    size_t length = strlen(text);
    REQUIRE(write(descriptor, text, length) == (ssize_t)length);
    close(descriptor);
    return path;
}

static void snapshot_reads_back(void)
{
    static const char *const engines[] = {"engine:pages,capacity:1GiB", "engine:segments,capacity:1GiB"};
    for (int e = 0; e < 2; e++) {
        gm_allocator *allocator = NULL;
        CHECK_OK(gm_create(engines[e], &allocator));
        void *pointers[5];
        size_t sizes[5] = {1000, 3 * MiB, 700 * 1024, 25 * MiB + 1, 64};
        for (int i = 0; i < 5; i++)
            CHECK_OK(gm_malloc(allocator, sizes[i], 0, &pointers[i]));
        CHECK_OK(gm_free(allocator, pointers[1]));
        gm_snapshot *written = NULL, *read = NULL;
        char *json = NULL;
        CHECK_OK(gm_snapshot_take(allocator, &written));
        CHECK_OK(gm_snapshot_json(written, &json));
        const char *path = write_temporary(json);
        gm_input_file input;
        CHECK_OK(gm_input_open(path, &input));
        CHECK_EQ_INT(input.kind, GM_INPUT_SNAPSHOT);
        CHECK_OK(gm_snapshot_parse(&input, &read));
        REQUIRE(read);
        CHECK_EQ_INT(read->region_count, written->region_count);
        CHECK_EQ_INT(read->block_count, written->block_count);
        for (size_t r = 0; r < read->region_count && r < written->region_count; r++) {
            const gm_snapshot_region *a = &read->regions[r], *b = &written->regions[r];
            CHECK(a->address == b->address && a->size == b->size && a->mapped_bytes == b->mapped_bytes &&
                  a->stream == b->stream && a->pool == b->pool && a->growth_lane == b->growth_lane &&
                  a->first_block == b->first_block && a->block_count == b->block_count);
        }
        for (size_t b = 0; b < read->block_count && b < written->block_count; b++)
            CHECK(!memcmp(&read->blocks[b], &written->blocks[b], sizeof read->blocks[b]));
        for (int pool = 0; pool < GM_POOL_COUNT; pool++) {
            CHECK_EQ_INT(read->stats.reserved_bytes[pool].current, written->stats.reserved_bytes[pool].current);
            CHECK_EQ_INT(read->stats.requested_bytes[pool].peak, written->stats.requested_bytes[pool].peak);
            CHECK_EQ_INT(read->stats.inactive_split[pool].peak, written->stats.inactive_split[pool].peak);
        }
        CHECK_EQ_INT(read->stats.num_page_maps, written->stats.num_page_maps);
        CHECK(!memcmp(read->stats.device_calls, written->stats.device_calls, sizeof read->stats.device_calls));
        CHECK_EQ_INT(read->stats.device_call_ns, written->stats.device_call_ns);
        CHECK(!strcmp(read->device.backend, "sim") && !strcmp(read->device.engine, written->device.engine));
        CHECK_EQ_INT(read->device.granularity, written->device.granularity);
        gm_snapshot_file_free(read);
        gm_input_close(&input);
        unlink(path);
        gm_json_free(json);
        gm_snapshot_free(written);
        for (int i = 0; i < 5; i++)
            if (i != 1)
                CHECK_OK(gm_free(allocator, pointers[i]));
        gm_destroy(allocator, NULL);
    }
}

static void input_kinds(void)
{
    gm_input_file input;
    const char *path = write_temporary("a,0,100,0\n");
    CHECK_OK(gm_input_open(path, &input));
    CHECK(input.kind == GM_INPUT_TRACE && !input.text && input.source);
    gm_input_close(&input); /* a trace's source stays open until then */
    unlink(path);
    path = write_temporary("\n  {\"events\": [], \"version\": 1, \"format\": \"gpumem-history\"}");
    CHECK_OK(gm_input_open(path, &input)); /* the format need not come first */
    CHECK_EQ_INT(input.kind, GM_INPUT_HISTORY);
    gm_input_close(&input);
    unlink(path);
    path = write_temporary("{\"format\": \"gpumem-history\"}");
    CHECK_STATUS(gm_input_open(path, &input), GM_ERROR_PARSE);
    CHECK_MESSAGE("a gpumem-history file without its \"version\" (this gpumem reads version 1)");
    unlink(path);
    path = write_temporary("{\"format\": \"gpumem-history\", \"version\": 0}");
    CHECK_STATUS(gm_input_open(path, &input), GM_ERROR_PARSE);
    CHECK_MESSAGE("gpumem-history version 0 is not supported (this gpumem reads version 1)");
    unlink(path);
    CHECK_STATUS(gm_input_open("/nonexistent/input.json", &input), GM_ERROR_IO);
    CHECK_MESSAGE("/nonexistent/input.json: cannot open: No such file or directory");
}

/* ---------------------------------------------------------------- the map from a history */

typedef struct peak_watch {
    uint64_t peak;
    size_t peak_index;
    size_t snapshot_index; /* second replay: where to take the snapshot */
    gm_snapshot *snapshot;
} peak_watch;

static gm_status watch_peak(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context)
{
    (void)live_bytes;
    peak_watch *watch = context;
    gm_stats stats;
    gm_get_stats(allocator, &stats);
    if ((uint64_t)stats.reserved_bytes[GM_POOL_ALL].current > watch->peak) {
        watch->peak = (uint64_t)stats.reserved_bytes[GM_POOL_ALL].current;
        watch->peak_index = index;
    }
    if (index == watch->snapshot_index)
        return gm_snapshot_take(allocator, &watch->snapshot);
    return GM_OK;
}

/* Replay the trace with a history, take a snapshot at the peak of reserved memory (a second replay),
 * rebuild the map at the peak from the history's JSON and compare. */
static void history_map_equals_the_snapshot_at_the_peak(void)
{
    const char *data = getenv("GPUMEM_DATA");
    char trace_path[512];
    snprintf(trace_path, sizeof trace_path, "%s/traces/resnet50.csv.gz", data ? data : "data");
    gm_trace trace;
    CHECK_OK(gm_trace_load(trace_path, &trace));
    peak_watch watch = {.snapshot_index = SIZE_MAX};
    gm_replay_hooks hooks = {.after_operation = watch_peak, .context = &watch};
    gm_replay_result result;
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("history:1048576", &allocator));
    CHECK_OK(gm_replay_with_hooks(allocator, &trace, &result, &hooks));
    CHECK_EQ_INT(watch.peak, result.peak_reserved_bytes);
    char *json = NULL;
    CHECK_OK(gm_history_json(allocator, &json));
    gm_destroy(allocator, NULL);
    watch.snapshot_index = watch.peak_index;
    CHECK_OK(gm_create("", &allocator));
    CHECK_OK(gm_replay_with_hooks(allocator, &trace, &result, &hooks));
    gm_destroy(allocator, NULL);
    REQUIRE(watch.snapshot && json);

    const char *path = write_temporary(json);
    gm_input_file input;
    gm_history_file history;
    CHECK_OK(gm_input_open(path, &input));
    CHECK_OK(gm_history_parse(&input, &history));
    CHECK_EQ_INT(history.dropped, 0);
    /* What gpumem report builds: no map of a history that dropped events, and none of an empty one. */
    gm_history_peak at_peak;
    CHECK_OK(gm_history_peak_build(history.events, history.count, false, 1024, &at_peak));
    CHECK(at_peak.map == NULL && at_peak.curve.peak_reserved == result.peak_reserved_bytes);
    gm_history_peak_free(&at_peak);
    CHECK_OK(gm_history_peak_build(history.events, 0, true, 1024, &at_peak));
    CHECK(at_peak.map == NULL && at_peak.moment == 0 && at_peak.curve.peak_reserved == 0);
    gm_history_peak_free(&at_peak);
    /* Every host allocation of the build may fail: out of memory then, with nothing left to free. */
    uint64_t before = gm_system_allocations_made();
    CHECK_OK(gm_history_peak_build(history.events, history.count, true, 1024, &at_peak));
    uint64_t made = gm_system_allocations_made() - before;
    gm_history_peak_free(&at_peak);
    CHECK(made >= 3); /* the curve, and the map's mappings, blocks and snapshot */
    for (uint64_t position = 0; position < made; position++) {
        gm_fail_system_allocations(position, 1);
        gm_status status = gm_history_peak_build(history.events, history.count, true, 1024, &at_peak);
        gm_fail_system_allocations(0, 0);
        CHECK_STATUS(status, GM_ERROR_OUT_OF_MEMORY);
        CHECK(at_peak.map == NULL && at_peak.curve.buckets == NULL);
    }
    CHECK_OK(gm_history_peak_build(history.events, history.count, true, 1024, &at_peak));
    CHECK_EQ_INT(at_peak.curve.peak_reserved, result.peak_reserved_bytes);
    CHECK_EQ_INT(at_peak.curve.peak_allocated, result.peak_live_bytes);
    CHECK_EQ_INT(at_peak.moment,
                 gm_history_operation_end(history.events, history.count, at_peak.curve.peak_reserved_x));
    const gm_snapshot *map = at_peak.map;
    REQUIRE(map);

    /* The same allocations (address, bytes requested), the same memory mapped and free. */
    uint64_t totals[2][4] = {{0}}, sums[2] = {0};
    const gm_snapshot *both[2] = {watch.snapshot, map};
    for (int s = 0; s < 2; s++)
        for (size_t b = 0; b < both[s]->block_count; b++) {
            const gm_snapshot_block *block = &both[s]->blocks[b];
            totals[s][block->kind] += block->size;
            if (block->kind == GM_BLOCK_KIND_ALLOCATED)
                sums[s] += block->address * 31 + block->requested;
        }
    CHECK_EQ_INT(totals[1][GM_BLOCK_KIND_ALLOCATED], totals[0][GM_BLOCK_KIND_ALLOCATED]);
    CHECK_EQ_INT(totals[1][GM_BLOCK_KIND_FREE], totals[0][GM_BLOCK_KIND_FREE]);
    CHECK_EQ_INT(totals[1][GM_BLOCK_KIND_ALLOCATED] + totals[1][GM_BLOCK_KIND_FREE], result.peak_reserved_bytes);
    CHECK_EQ_INT(sums[1], sums[0]);
    for (size_t r = 0; r < map->region_count; r++) { /* blocks tile each rebuilt region */
        uint64_t at = map->regions[r].address;
        for (size_t b = 0; b < map->regions[r].block_count; b++) {
            CHECK(map->blocks[map->regions[r].first_block + b].address == at);
            at += map->blocks[map->regions[r].first_block + b].size;
        }
        CHECK(at == map->regions[r].address + map->regions[r].size);
    }
    gm_history_peak_free(&at_peak);
    gm_history_file_free(&history);
    gm_input_close(&input);
    unlink(path);
    gm_json_free(json);
    gm_snapshot_free(watch.snapshot);
    gm_trace_free(&trace);
}

/* A history that no allocator writes (a damaged or hand-edited file can say anything): mappings that
 * overlap or run past the largest address, blocks outside every mapping, overlapping their neighbour or
 * running past their region's end. The map leaves out what it cannot place and cuts what overlaps, so
 * its blocks still tile its regions. */
static void history_map_of_an_inconsistent_history(void)
{
    const gm_event events[] = {
        {.kind = GM_EVENT_SEGMENT_MAP, .address = 0x10000, .size = 0x10000, .stream = 1},          /* region A */
        {.kind = GM_EVENT_SEGMENT_MAP, .address = 0x18000, .size = 0x10000, .stream = 1},          /* overlaps A */
        {.kind = GM_EVENT_SEGMENT_MAP, .address = 0x30000, .size = 0x8000, .stream = 2},           /* region C */
        {.kind = GM_EVENT_SEGMENT_MAP, .address = UINT64_MAX - 0xfff, .size = 0x2000, .stream = 1}, /* past 2^64 */
        {.kind = GM_EVENT_SEGMENT_MAP, .address = 0x50000, .size = 0x1000, .stream = 1},
        {.kind = GM_EVENT_SEGMENT_UNMAP, .address = 0x50000, .size = 0x1000, .stream = 1},         /* gone again */
        {.kind = GM_EVENT_ALLOC, .address = 0x1000, .size = 512, .stream = 1},                     /* outside */
        {.kind = GM_EVENT_ALLOC, .address = 0x10000, .size = 0x1000, .stream = 1},
        {.kind = GM_EVENT_ALLOC, .address = 0x10800, .size = 0x1000, .stream = 1}, /* overlaps the last one */
        {.kind = GM_EVENT_FREE_REQUESTED, .address = 0x1f000, .size = 0x4000, .stream = 1}, /* past A's end */
        {.kind = GM_EVENT_ALLOC, .address = 0x30000, .size = 0x100, .stream = 2},
        {.kind = GM_EVENT_FREE_COMPLETED, .address = 0x30000, .size = 0x100, .stream = 2},
        {.kind = GM_EVENT_ALLOC, .address = 0x34000, .size = 100, .stream = 2},
    };
    size_t count = sizeof events / sizeof events[0];
    gm_snapshot *map = NULL;
    CHECK_STATUS(gm_history_map(events, count, count, &map), GM_ERROR_INVALID_ARGUMENT);
    CHECK(map == NULL && strstr(gm_last_error(), "no event 13 in a history of 13") != NULL);
    CHECK_STATUS(gm_history_map(NULL, count, 0, &map), GM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(gm_history_map(events, count, count - 1, &map));
    REQUIRE(map);
    CHECK_EQ_INT(map->region_count, 2);
    const struct {
        uint64_t address, size, requested;
        gm_block_kind kind;
    } expected[] = {
        {0x10000, 0x1000, 0x1000, GM_BLOCK_KIND_ALLOCATED}, {0x11000, 0x800, 0x1000, GM_BLOCK_KIND_ALLOCATED},
        {0x11800, 0xd800, 0, GM_BLOCK_KIND_FREE},           {0x1f000, 0x1000, 0x4000, GM_BLOCK_KIND_PENDING},
        {0x30000, 0x4000, 0, GM_BLOCK_KIND_FREE},           {0x34000, 512, 100, GM_BLOCK_KIND_ALLOCATED},
        {0x34200, 0x3e00, 0, GM_BLOCK_KIND_FREE},
    };
    REQUIRE(map->region_count == 2 && map->block_count == sizeof expected / sizeof expected[0]);
    CHECK(map->regions[0].address == 0x10000 && map->regions[0].size == 0x10000 && map->regions[0].stream == 1);
    CHECK(map->regions[1].address == 0x30000 && map->regions[1].size == 0x8000 && map->regions[1].stream == 2);
    CHECK_EQ_INT(map->regions[0].block_count, 4);
    CHECK_EQ_INT(map->regions[1].first_block, 4);
    for (size_t b = 0; b < map->block_count; b++) {
        const gm_snapshot_block *block = &map->blocks[b];
        CHECK(block->address == expected[b].address && block->size == expected[b].size &&
              block->requested == expected[b].requested && block->kind == expected[b].kind);
    }
    gm_history_map_free(map);
}

/* ---------------------------------------------------------------- HTML */

static char *page_of(const gm_html_report *report)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    REQUIRE(out);
    gm_html_report_write(report, out);
    fclose(out);
    return text;
}

static void html_is_escaped(void)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    REQUIRE(out);
    gm_html_escape(out, "<script>a & 'b' \"c\"\x01\n</script>");
    fclose(out);
    CHECK(!strcmp(text, "&lt;script&gt;a &amp; &#39;b&#39; &quot;c&quot;&#xFFFD;\n&lt;/script&gt;"));
    free(text);
    char grouped[32];
    CHECK(!strcmp(gm_html_grouped(grouped, sizeof grouped, 11813257216u), "11,813,257,216"));
    CHECK(!strcmp(gm_html_grouped(grouped, sizeof grouped, 999), "999"));

    gm_html_report report = {.input_name = "<b>x</b>", .input_kind = "snapshot", .backend = "<i>",
                             .no_curve_reason = "no <time>", .no_map_reason = "no map", .no_stats_reason = "none"};
    char *page = page_of(&report);
    CHECK(strstr(page, "<title>gpumem report: &lt;b&gt;x&lt;/b&gt;</title>") != NULL);
    CHECK(strstr(page, "on the &lt;i&gt; backend") != NULL);
    CHECK(strstr(page, "<p id=\"no-time-axis\" class=\"note\">no &lt;time&gt;</p>") != NULL);
    CHECK(strstr(page, "<p id=\"no-map\" class=\"note\">no map</p>") != NULL);
    CHECK(strstr(page, "<p id=\"no-statistics\" class=\"note\">none</p>") != NULL);
    CHECK(strstr(page, "data-expect-curve=\"0\" data-expect-map=\"0\"") != NULL);
    CHECK(!strstr(page, "<b>") && !strstr(page, "<i>") && !strstr(page, "http"));
    size_t length = strlen(page);
    CHECK(length > 8 && !strcmp(page + length - 8, "</html>\n"));
    free(page);
}

/* More regions than the map draws (the segments engine's many segments): the largest are drawn, in
 * their own order, and a note says how many are left out and what they hold. */
static void memory_map_with_more_regions_than_rows(void)
{
    enum { REGIONS = 130 };
    gm_snapshot_region regions[REGIONS];
    gm_snapshot_block blocks[REGIONS];
    for (size_t r = 0; r < REGIONS; r++) {
        uint64_t size = (r == 3 || r == 100 ? 1 : 4 + r % 3) * MiB, address = 0x7000000000 + r * 64 * MiB;
        blocks[r] = (gm_snapshot_block){address, size, size, r == 7 ? GM_BLOCK_KIND_PENDING : GM_BLOCK_KIND_ALLOCATED};
        regions[r] = (gm_snapshot_region){.address = address, .size = size, .mapped_bytes = size, .stream = r % 5,
                                          .pool = GM_POOL_LARGE, .first_block = r, .block_count = 1};
    }
    gm_snapshot map = {.region_count = REGIONS, .regions = regions, .block_count = REGIONS, .blocks = blocks};
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    REQUIRE(out);
    gm_svg_memory_map(out, &map);
    fclose(out);
    size_t rows = 0;
    for (const char *at = text; (at = strstr(at, "<g class=\"region\"")); at++)
        rows++;
    CHECK_EQ_INT(rows, 128);
    CHECK(strstr(text, ">region 3 \u00b7") == NULL && strstr(text, ">region 100 \u00b7") == NULL);
    const char *second = strstr(text, ">region 2 \u00b7"), *fourth = strstr(text, ">region 4 \u00b7");
    const char *last = strstr(text, ">region 129 \u00b7");
    CHECK(second && fourth && last && second < fourth && fourth < last);
    CHECK(strstr(text, "region 7 \u00b7 large pool \u00b7 stream 2 \u00b7 at 0x701c000000 \u00b7 5.00 MiB mapped: "
                       "0 B allocated, 0 B free in 0 blocks (largest 0 B), 5.00 MiB pending") != NULL);
    CHECK(strstr(text, "<p class=\"note\">2 more regions, holding 2.00 MiB, are not drawn.</p>") != NULL);
    free(text);
}

RUN_TESTS(TEST_CASE(curve_keeps_every_peak), TEST_CASE(curve_from_events), TEST_CASE(json_reader_reads_and_refuses),
          TEST_CASE(snapshot_reads_back), TEST_CASE(input_kinds), TEST_CASE(history_map_equals_the_snapshot_at_the_peak),
          TEST_CASE(history_map_of_an_inconsistent_history), TEST_CASE(html_is_escaped),
          TEST_CASE(memory_map_with_more_regions_than_rows))
