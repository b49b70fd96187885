/*
 * test_prometheus.c -- the Prometheus renderer on fixed readings: exact sample lines for a process's
 * statistics, counters, device calls, pinned host cache, host memory, GPUs and the exporter's own
 * numbers; HELP and
 * TYPE once per family, before its samples, which stay together; label values with a double quote,
 * a backslash and a line feed escaped; unknown readings (-1) and families without samples left out;
 * counters, and only counters, ending in _total; the statistic lists of gpumem.h all exported; a
 * large scrape grown, not truncated.
 */
#include "report/prometheus.h"

#include "test.h"

#include <stdbool.h>

static gm_published make_region(long pid, int device, const char *backend)
{
    gm_published region = {.pid = pid, .device = device, .page_size = 2 << 20, .device_total_bytes = 1ull << 30};
    snprintf(region.backend, sizeof region.backend, "%s", backend);
    snprintf(region.engine, sizeof region.engine, "pages");
    region.start_time_ns = 1700000000123456789;
    region.stats.allocated_bytes[GM_POOL_ALL] = (gm_stat){.current = 3000, .peak = 5000};
    region.stats.allocated_bytes[GM_POOL_SMALL] = (gm_stat){.current = 1000, .peak = 1500};
    region.stats.allocated_bytes[GM_POOL_LARGE] = (gm_stat){.current = 2000, .peak = 4000};
    region.stats.reserved_bytes[GM_POOL_ALL] = (gm_stat){.current = 4194304, .peak = 6291456};
    region.stats.segment[GM_POOL_ALL] = (gm_stat){.current = 2, .peak = 3};
    region.stats.num_ooms = 3;
    region.stats.num_page_maps = 7;
    region.stats.device_calls[GM_CALL_MAP] = 5;
    region.stats.device_call_ns_by_kind[GM_CALL_MAP] = 1234567890;
    region.cached_free_bytes = 100;
    region.largest_free_block_bytes = 50;
    region.pinned_host = (gm_published_pinned_host){.allocated_bytes = 4096, .allocated_bytes_peak = 135168,
                                                    .reserved_bytes = 135168, .reserved_bytes_peak = 266240,
                                                    .allocations = 1, .requested_bytes = 3000, .cache_hits = 11,
                                                    .cache_misses = 2, .host_frees = 1, .pending_blocks = 3};
    return region;
}

static gm_host_memory make_host(void)
{
    return (gm_host_memory){.total_bytes = 16000, .available_bytes = 4000, .swap_total_bytes = 2000,
                            .swap_free_bytes = 500, .pressure_some_avg10 = 1.5, .pressure_some_avg60 = 0.25,
                            .pressure_full_avg10 = -1, .pressure_full_avg60 = -1};
}

/* Render `readings`; the text (NUL-terminated, never NULL), to free. */
static char *render(const gm_prometheus_readings *readings)
{
    gm_text_buffer buffer = {0};
    CHECK_OK(gm_prometheus_render(readings, &buffer));
    REQUIRE(buffer.text && strlen(buffer.text) == buffer.length);
    return buffer.text;
}

/* Whether `line` is a whole line of `text`. */
static bool has_line(const char *text, const char *line)
{
    size_t length = strlen(line);
    for (const char *found = strstr(text, line); found; found = strstr(found + 1, line))
        if ((found == text || found[-1] == '\n') && found[length] == '\n')
            return true;
    return false;
}

static size_t occurrences(const char *text, const char *part)
{
    size_t count = 0;
    for (const char *found = strstr(text, part); found; found = strstr(found + 1, part))
        count++;
    return count;
}

#define CHECK_LINE(text, line)                                                                            \
    do {                                                                                                  \
        if (!has_line((text), (line))) {                                                                  \
            fprintf(stderr, "%s:%d: [%s] no line '%s' in:\n%s\n", __FILE__, __LINE__, test_current, (line), \
                    (text));                                                                              \
            test_failures++;                                                                              \
        }                                                                                                 \
    } while (0)

#define CHECK_ABSENT(text, part)                                                                          \
    do {                                                                                                  \
        if (strstr((text), (part))) {                                                                     \
            fprintf(stderr, "%s:%d: [%s] '%s' should not be in the text\n", __FILE__, __LINE__,           \
                    test_current, (part));                                                                \
            test_failures++;                                                                              \
        }                                                                                                 \
    } while (0)

/* The text as the format requires it: every sample's family has had its HELP and TYPE lines (once
 * each, HELP first) just before its first sample, a family's samples are not interrupted by another
 * family's, counters end in _total and nothing else does. */
static void check_structure(const char *text)
{
    char families[256][96];
    size_t family_count = 0;
    char current[96] = "", type[16] = "";
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        REQUIRE(end);
        char name[96];
        if (!strncmp(line, "# HELP ", 7)) {
            size_t name_length = strcspn(line + 7, " \n");
            REQUIRE(name_length < sizeof name);
            memcpy(name, line + 7, name_length);
            name[name_length] = '\0';
            for (size_t i = 0; i < family_count; i++)
                CHECK(strcmp(families[i], name) != 0); /* a family appears once */
            REQUIRE(family_count < 256);
            snprintf(families[family_count++], sizeof families[0], "%s", name);
            snprintf(current, sizeof current, "%s", name);
            char type_line[128];
            snprintf(type_line, sizeof type_line, "# TYPE %s ", name);
            CHECK(!strncmp(end + 1, type_line, strlen(type_line))); /* TYPE follows HELP */
            const char *type_start = end + 1 + strlen(type_line);
            snprintf(type, sizeof type, "%.*s", (int)strcspn(type_start, "\n"), type_start);
            end = strchr(end + 1, '\n');
            REQUIRE(end);
            bool counter = !strcmp(type, "counter");
            size_t length = strlen(name);
            CHECK(counter == (length > 6 && !strcmp(name + length - 6, "_total")));
            CHECK(counter || !strcmp(type, "gauge"));
        } else {
            CHECK(line[0] != '#');
            size_t length = strcspn(line, "{ ");
            CHECK(length == strlen(current) && !strncmp(line, current, length)); /* of the family just opened */
        }
        line = end + 1;
    }
}

static void test_process_statistics(void)
{
    gm_published region = make_region(4242, 1, "sim");
    gm_prometheus_readings readings = {.regions = &region, .region_count = 1};
    char *text = render(&readings);
    check_structure(text);
    const char *labels = "pid=\"4242\",device=\"1\",backend=\"sim\",engine=\"pages\"";
    char line[512];
    snprintf(line, sizeof line, "gpumem_allocated_bytes{%s,pool=\"all\"} 3000", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_allocated_bytes{%s,pool=\"small\"} 1000", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_allocated_bytes{%s,pool=\"large\"} 2000", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_allocated_bytes_peak{%s,pool=\"all\"} 5000", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_reserved_bytes{%s,pool=\"all\"} 4194304", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_reserved_bytes_peak{%s,pool=\"all\"} 6291456", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_segments{%s,pool=\"all\"} 2", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_segments_peak{%s,pool=\"all\"} 3", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_ooms_total{%s} 3", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_page_maps_total{%s} 7", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_device_calls_total{%s,call=\"map\"} 5", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_device_call_seconds_total{%s,call=\"map\"} 1.234567890", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_cache_free_bytes{%s} 100", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_largest_free_block_bytes{%s} 50", labels);
    CHECK_LINE(text, line);
    snprintf(line, sizeof line, "gpumem_process_start_time_seconds{%s} 1700000000.123456789", labels);
    CHECK_LINE(text, line);
    CHECK_LINE(text, "# TYPE gpumem_allocated_bytes gauge");
    CHECK_LINE(text, "# TYPE gpumem_ooms_total counter");
    CHECK_LINE(text, "# TYPE gpumem_device_calls_total counter");
    CHECK_LINE(text, "# HELP gpumem_reserved_bytes GPU reserved memory, now, in bytes, per pool "
                     "(torch.cuda.memory_stats() key reserved_bytes.POOL.current)");
    free(text);
}

/* The pinned host cache's part: gauges and counters with the per-process labels; the limit only when set. */
static void test_pinned_host(void)
{
    gm_published regions[2] = {make_region(4242, 1, "sim"), make_region(4243, 0, "cuda")};
    regions[1].pinned_host.limit_bytes = 1 << 30;
    gm_prometheus_readings readings = {.regions = regions, .region_count = 2};
    char *text = render(&readings);
    check_structure(text);
    const char *labels = "pid=\"4242\",device=\"1\",backend=\"sim\",engine=\"pages\"";
    const struct {
        const char *name;
        const char *type;
        const char *value;
    } expected[] = {
        {"gpumem_pinned_host_reserved_bytes", "gauge", "135168"},
        {"gpumem_pinned_host_reserved_bytes_peak", "gauge", "266240"},
        {"gpumem_pinned_host_allocated_bytes", "gauge", "4096"},
        {"gpumem_pinned_host_allocated_bytes_peak", "gauge", "135168"},
        {"gpumem_pinned_host_requested_bytes", "gauge", "3000"},
        {"gpumem_pinned_host_allocations", "gauge", "1"},
        {"gpumem_pinned_host_pending_blocks", "gauge", "3"},
        {"gpumem_pinned_host_cache_hits_total", "counter", "11"},
        {"gpumem_pinned_host_cache_misses_total", "counter", "2"},
        {"gpumem_pinned_host_backend_frees_total", "counter", "1"},
    };
    char line[512];
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        snprintf(line, sizeof line, "%s{%s} %s", expected[i].name, labels, expected[i].value);
        CHECK_LINE(text, line);
        snprintf(line, sizeof line, "# TYPE %s %s", expected[i].name, expected[i].type);
        CHECK_LINE(text, line);
        snprintf(line, sizeof line, "\n%s{", expected[i].name);
        CHECK_EQ_INT(occurrences(text, line), 2); /* both processes */
    }
    CHECK_LINE(text, "# HELP gpumem_pinned_host_reserved_bytes Page-locked host memory the process's pinned cache "
                     "holds (gm_host_malloc): handed out, idle or waiting for streams");
    CHECK_LINE(text, "gpumem_pinned_host_limit_bytes{pid=\"4243\",device=\"0\",backend=\"cuda\",engine=\"pages\"} "
                     "1073741824");
    CHECK_EQ_INT(occurrences(text, "\ngpumem_pinned_host_limit_bytes{"), 1); /* 4242 has no host_limit */
    free(text);
}

/* Every statistic, counter and device-call kind of gpumem.h, under the names derived from it. */
static void test_names_follow_the_lists(void)
{
    gm_published region = make_region(7, 0, "sim");
    gm_prometheus_readings readings = {.regions = &region, .region_count = 1};
    char *text = render(&readings);
    char line[256];
    for (size_t i = 0; gm_stat_name(i); i++) {
        const char *field = gm_stat_name(i);
        bool bytes = strstr(field, "_bytes") != NULL;
        snprintf(line, sizeof line, "# TYPE gpumem_%s%s gauge", field, bytes ? "" : "s");
        CHECK_LINE(text, line);
        snprintf(line, sizeof line, "# TYPE gpumem_%s%s_peak gauge", field, bytes ? "" : "s");
        CHECK_LINE(text, line);
    }
    for (size_t i = 0; gm_counter_name(i); i++) {
        const char *field = gm_counter_name(i);
        snprintf(line, sizeof line, "# TYPE gpumem_%s_total counter", strncmp(field, "num_", 4) ? field : field + 4);
        CHECK_LINE(text, line);
    }
    for (size_t kind = 0; kind < gm_device_call_count(); kind++) {
        snprintf(line, sizeof line, "call=\"%s\"} ", gm_device_call_name((gm_device_call)kind));
        CHECK_EQ_INT(occurrences(text, line), 2); /* its count and its seconds */
    }
    CHECK_LINE(text, "# TYPE gpumem_allocations gauge");
    CHECK_LINE(text, "# TYPE gpumem_inactive_splits gauge");
    CHECK_LINE(text, "# TYPE gpumem_alloc_retries_total counter");
    free(text);
}

/* Two processes, one of them on two devices: one HELP and TYPE per family, every sample present. */
static void test_families_once(void)
{
    gm_published regions[3] = {make_region(10, 0, "sim"), make_region(10, 1, "sim"), make_region(11, 0, "cuda")};
    gm_prometheus_process processes[2] = {{.pid = 10, .memory = {.tree_rss_bytes = 1, .tree_pss_bytes = 2}},
                                          {.pid = 11, .memory = {.tree_rss_bytes = 3, .tree_pss_bytes = 4}}};
    gm_host_memory host = make_host();
    gm_prometheus_readings readings = {.regions = regions, .region_count = 3, .processes = processes,
                                       .process_count = 2, .host = &host};
    char *text = render(&readings);
    check_structure(text);
    CHECK_EQ_INT(occurrences(text, "# HELP gpumem_allocated_bytes "), 1);
    CHECK_EQ_INT(occurrences(text, "# TYPE gpumem_allocated_bytes gauge\n"), 1);
    CHECK_EQ_INT(occurrences(text, "\ngpumem_allocated_bytes{"), 9); /* 3 regions x 3 pools */
    CHECK_EQ_INT(occurrences(text, "\ngpumem_ooms_total{"), 3);
    CHECK_EQ_INT(occurrences(text, "# TYPE gpumem_process_resident_bytes gauge\n"), 1);
    CHECK_LINE(text, "gpumem_process_resident_bytes{pid=\"10\"} 1");
    CHECK_LINE(text, "gpumem_process_proportional_bytes{pid=\"11\"} 4");
    CHECK_LINE(text, "gpumem_allocated_bytes{pid=\"11\",device=\"0\",backend=\"cuda\",engine=\"pages\",pool=\"all\"} 3000");
    CHECK_LINE(text, "gpumem_allocated_bytes{pid=\"10\",device=\"1\",backend=\"sim\",engine=\"pages\",pool=\"all\"} 3000");
    free(text);
}

/* A double quote, a backslash and a line feed in label values (a backend name, a GPU's name). */
static void test_label_escaping(void)
{
    gm_published region = make_region(5, 0, "a\"b\\c\nd");
    gm_gpu_reading gpu = {.index = 0, .total_bytes = 80, .used_bytes = 20, .utilization_percent = 37,
                          .temperature_celsius = 41};
    snprintf(gpu.name, sizeof gpu.name, "NVIDIA \"H200\" \\ new\nline");
    gm_prometheus_readings readings = {.regions = &region, .region_count = 1, .gpus = &gpu, .gpu_count = 1,
                                       .gpus_available = true};
    char *text = render(&readings);
    check_structure(text);
    CHECK_LINE(text, "gpumem_ooms_total{pid=\"5\",device=\"0\",backend=\"a\\\"b\\\\c\\nd\",engine=\"pages\"} 3");
    CHECK_LINE(text, "gpumem_gpu_memory_total_bytes{gpu=\"0\",name=\"NVIDIA \\\"H200\\\" \\\\ new\\nline\"} 80");
    CHECK_LINE(text, "gpumem_gpu_memory_used_bytes{gpu=\"0\",name=\"NVIDIA \\\"H200\\\" \\\\ new\\nline\"} 20");
    CHECK_LINE(text, "gpumem_gpu_utilization_ratio{gpu=\"0\",name=\"NVIDIA \\\"H200\\\" \\\\ new\\nline\"} 0.37");
    CHECK_LINE(text, "gpumem_gpu_temperature_celsius{gpu=\"0\",name=\"NVIDIA \\\"H200\\\" \\\\ new\\nline\"} 41");
    CHECK_LINE(text, "gpumem_gpu_available 1");
    for (const char *line = text; (line = strchr(line, '\n')); line++)
        CHECK(line[1] == '\0' || line[1] == '#' || !strncmp(line + 1, "gpumem_", 7)); /* no raw line feed */
    free(text);
}

static void test_host_memory(void)
{
    gm_host_memory host = make_host();
    gm_prometheus_readings readings = {.host = &host};
    char *text = render(&readings);
    check_structure(text);
    CHECK_LINE(text, "gpumem_host_memory_total_bytes 16000");
    CHECK_LINE(text, "gpumem_host_memory_available_bytes 4000");
    CHECK_LINE(text, "gpumem_host_swap_total_bytes 2000");
    CHECK_LINE(text, "gpumem_host_swap_free_bytes 500");
    CHECK_LINE(text, "gpumem_host_memory_pressure_ratio{kind=\"some\",window=\"10s\"} 0.015");
    CHECK_LINE(text, "gpumem_host_memory_pressure_ratio{kind=\"some\",window=\"60s\"} 0.0025");
    CHECK_ABSENT(text, "kind=\"full\""); /* -1: the kernel did not say */
    CHECK_LINE(text, "# TYPE gpumem_host_memory_pressure_ratio gauge");
    free(text);
}

/* -1 readings and families with no sample are left out, never written as -1 or as bare headers. */
static void test_unknown_readings_left_out(void)
{
    gm_host_memory host = make_host();
    host.pressure_some_avg10 = host.pressure_some_avg60 = -1;
    host.swap_total_bytes = -1;
    gm_prometheus_process process = {.pid = 9, .memory = {.tree_rss_bytes = 4096, .tree_pss_bytes = -1,
                                                          .tree_swap_bytes = 0, .descendants = 2}};
    gm_gpu_reading gpu = {.index = 3, .name = "G", .total_bytes = 8, .used_bytes = 1, .utilization_percent = -1,
                          .temperature_celsius = -1};
    gm_prometheus_readings readings = {.processes = &process, .process_count = 1, .host = &host, .gpus = &gpu,
                                       .gpu_count = 1, .gpus_available = true};
    char *text = render(&readings);
    check_structure(text);
    CHECK_LINE(text, "gpumem_process_resident_bytes{pid=\"9\"} 4096");
    CHECK_LINE(text, "gpumem_process_swap_bytes{pid=\"9\"} 0");
    CHECK_LINE(text, "gpumem_process_descendants{pid=\"9\"} 2");
    CHECK_ABSENT(text, "gpumem_process_proportional_bytes");
    CHECK_ABSENT(text, "gpumem_host_memory_pressure_ratio");
    CHECK_ABSENT(text, "gpumem_host_swap_total_bytes");
    CHECK_ABSENT(text, "gpumem_gpu_utilization_ratio");
    CHECK_ABSENT(text, "gpumem_gpu_temperature_celsius");
    CHECK_ABSENT(text, " -1\n");
    CHECK_LINE(text, "gpumem_gpu_memory_total_bytes{gpu=\"3\",name=\"G\"} 8");
    free(text);
}

/* Nothing read: no process families, no GPU families but gpumem_gpu_available 0, the exporter's own. */
static void test_nothing_read(void)
{
    gm_prometheus_readings readings = {.stale_regions = 2, .refused_regions = 1, .collection_seconds = 0.25};
    char *text = render(&readings);
    check_structure(text);
    const char *expected =
        "# HELP gpumem_gpu_available 1 when NVML answered (the gpumem_gpu_ families follow), 0 without it\n"
        "# TYPE gpumem_gpu_available gauge\n"
        "gpumem_gpu_available 0\n"
        "# HELP gpumem_exporter_regions Statistics regions found at this scrape: read, stale (their process is "
        "gone) or refused (another owner, a symbolic link, a wrong layout)\n"
        "# TYPE gpumem_exporter_regions gauge\n"
        "gpumem_exporter_regions{state=\"read\"} 0\n"
        "gpumem_exporter_regions{state=\"stale\"} 2\n"
        "gpumem_exporter_regions{state=\"refused\"} 1\n"
        "# HELP gpumem_exporter_scrape_duration_seconds Time this scrape took to read the regions, /proc and NVML\n"
        "# TYPE gpumem_exporter_scrape_duration_seconds gauge\n"
        "gpumem_exporter_scrape_duration_seconds 0.25\n";
    if (strcmp(text, expected) != 0) {
        fprintf(stderr, "got:\n%s\nexpected:\n%s\n", text, expected);
        test_failures++;
    }
    free(text);
}

/* Many processes: the text grows; the last sample of the last process and the exporter's lines are there. */
static void test_large_scrape_not_truncated(void)
{
    enum { REGIONS = 600 };
    gm_published *regions = calloc(REGIONS, sizeof *regions);
    REQUIRE(regions);
    for (size_t i = 0; i < REGIONS; i++)
        regions[i] = make_region(100000 + (long)i, 0, "cuda");
    gm_prometheus_readings readings = {.regions = regions, .region_count = REGIONS};
    char *text = render(&readings);
    check_structure(text);
    CHECK(strlen(text) > (size_t)REGIONS * 5000);
    CHECK_EQ_INT(occurrences(text, "\ngpumem_process_start_time_seconds{"), REGIONS);
    CHECK_LINE(text, "gpumem_process_start_time_seconds{pid=\"100599\",device=\"0\",backend=\"cuda\",engine=\"pages\"} "
                     "1700000000.123456789");
    CHECK_LINE(text, "gpumem_exporter_regions{state=\"read\"} 600");
    free(text);
    free(regions);
}

static void test_text_buffer(void)
{
    gm_text_buffer buffer = {0};
    for (int i = 0; i < 10000; i++)
        gm_text_buffer_append(&buffer, "%d,", i % 10);
    CHECK(!buffer.failed);
    CHECK_EQ_INT(buffer.length, 20000);
    CHECK(buffer.text && buffer.text[buffer.length] == '\0' && !strncmp(buffer.text + 19996, "8,9,", 4));
    gm_text_buffer_free(&buffer);
    CHECK(buffer.text == NULL && buffer.length == 0);
}

RUN_TESTS(TEST_CASE(test_process_statistics), TEST_CASE(test_pinned_host), TEST_CASE(test_names_follow_the_lists),
          TEST_CASE(test_families_once),
          TEST_CASE(test_label_escaping), TEST_CASE(test_host_memory), TEST_CASE(test_unknown_readings_left_out),
          TEST_CASE(test_nothing_read), TEST_CASE(test_large_scrape_not_truncated), TEST_CASE(test_text_buffer))
