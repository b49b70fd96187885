/*
 * prometheus.c -- gpumem's readings as Prometheus metrics (text exposition format 0.0.4).
 *
 * One family at a time: its "# HELP" and "# TYPE" lines are written before its first sample (so a
 * family with no sample, such as the GPUs' without NVML, is left out whole), then every sample of it,
 * as the format requires. The per-process statistics follow gpumem.h's lists (GM_POOL_STATISTICS,
 * GM_COUNTERS, GM_DEVICE_CALLS), so a statistic added there is exported unasked:
 *
 *   pool statistic, BYTES  allocated_bytes   gpumem_allocated_bytes{...,pool=}   and ..._peak (gauges)
 *   pool statistic, COUNT  segment           gpumem_segments{...,pool=}          and ..._peak (gauges)
 *   counter                num_ooms          gpumem_ooms_total (counter)
 *   device call kind       map               gpumem_device_calls_total{call="map"},
 *                                            gpumem_device_call_seconds_total{call="map"}
 *
 * The pinned host cache's numbers (the region's own part, not a gpumem.h list) are named one by one:
 * gpumem_pinned_host_reserved_bytes and the rest (render_pinned_host).
 *
 * Readings the kernel or the driver did not give (-1) are left out, never written as -1. Label
 * values are escaped as the format says (backslash, double quote, line feed); so is help text.
 */
#include "report/prometheus.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LABEL_VALUE_SIZE 128
#define MAX_LABELS 6

/* ---------------------------------------------------------------- the growable text */

void gm_text_buffer_append(gm_text_buffer *buffer, const char *format, ...)
{
    for (int attempt = 0; attempt < 2 && !buffer->failed; attempt++) {
        va_list arguments;
        va_start(arguments, format);
        size_t room = buffer->capacity - buffer->length;
        int written = vsnprintf(buffer->text ? buffer->text + buffer->length : NULL, room, format, arguments);
        va_end(arguments);
        if (written < 0) {
            buffer->failed = true;
        } else if ((size_t)written < room) {
            buffer->length += (size_t)written;
            return;
        } else {
            size_t capacity = (buffer->capacity + (size_t)written + 1) * 2;
            char *grown = gm_system_realloc(buffer->text, capacity);
            if (!grown) {
                buffer->failed = true;
            } else {
                buffer->text = grown;
                buffer->capacity = capacity;
            }
        }
    }
}

void gm_text_buffer_free(gm_text_buffer *buffer)
{
    free(buffer->text);
    *buffer = (gm_text_buffer){0};
}

/* ---------------------------------------------------------------- families, labels and samples */

typedef struct family {
    char name[96];
    char help[384];
    const char *type; /* "gauge" or "counter" */
    bool started;     /* its HELP and TYPE lines are written */
} family;

typedef struct label_set {
    const char *names[MAX_LABELS];
    char values[MAX_LABELS][LABEL_VALUE_SIZE];
    size_t count;
} label_set;

static family make_family(const char *type, const char *name, const char *help)
{
    family made = {.type = type};
    snprintf(made.name, sizeof made.name, "%s", name);
    snprintf(made.help, sizeof made.help, "%s", help);
    return made;
}

/* `text` escaped into `out`: backslash and line feed always, the double quote in label values. */
static void escape(const char *text, bool label_value, char *out, size_t size)
{
    size_t used = 0;
    for (; *text && used + 3 <= size; text++) {
        char character = *text;
        if (character == '\\' || (label_value && character == '"')) {
            out[used++] = '\\';
            out[used++] = character;
        } else if (character == '\n') {
            out[used++] = '\\';
            out[used++] = 'n';
        } else {
            out[used++] = character;
        }
    }
    out[used] = '\0';
}

static void add_label(label_set *labels, const char *name, const char *format, ...) __attribute__((format(printf, 3, 4)));

static void add_label(label_set *labels, const char *name, const char *format, ...)
{
    if (labels->count == MAX_LABELS)
        return;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(labels->values[labels->count], LABEL_VALUE_SIZE, format, arguments);
    va_end(arguments);
    labels->names[labels->count++] = name;
}

static void write_header(gm_text_buffer *buffer, family *family)
{
    char help[2 * sizeof family->help + 1];
    escape(family->help, false, help, sizeof help);
    gm_text_buffer_append(buffer, "# HELP %s %s\n# TYPE %s %s\n", family->name, help, family->name, family->type);
    family->started = true;
}

/* One sample line: name{labels} value. */
static void write_sample(gm_text_buffer *buffer, family *family, const label_set *labels, const char *value)
{
    if (!family->started)
        write_header(buffer, family);
    gm_text_buffer_append(buffer, "%s", family->name);
    for (size_t i = 0; labels && i < labels->count; i++) {
        char escaped[2 * LABEL_VALUE_SIZE + 1];
        escape(labels->values[i], true, escaped, sizeof escaped);
        gm_text_buffer_append(buffer, "%s%s=\"%s\"", i ? "," : "{", labels->names[i], escaped);
    }
    gm_text_buffer_append(buffer, "%s %s\n", labels && labels->count ? "}" : "", value);
}

static void write_integer(gm_text_buffer *buffer, family *family, const label_set *labels, int64_t value)
{
    char text[32];
    snprintf(text, sizeof text, "%" PRId64, value);
    write_sample(buffer, family, labels, text);
}

/* Nanoseconds as seconds, exactly: "12.000345678". */
static void write_seconds(gm_text_buffer *buffer, family *family, const label_set *labels, int64_t nanoseconds)
{
    uint64_t magnitude = nanoseconds < 0 ? (uint64_t)0 - (uint64_t)nanoseconds : (uint64_t)nanoseconds;
    char text[48];
    snprintf(text, sizeof text, "%s%" PRIu64 ".%09" PRIu64, nanoseconds < 0 ? "-" : "", magnitude / 1000000000u,
             magnitude % 1000000000u);
    write_sample(buffer, family, labels, text);
}

static void write_real(gm_text_buffer *buffer, family *family, const label_set *labels, double value)
{
    char text[48];
    snprintf(text, sizeof text, "%.6g", value);
    write_sample(buffer, family, labels, text);
}

/* ---------------------------------------------------------------- per process and device */

/* gpumem.h's lists as tables. */
#define UNIT_IS_BYTES_BYTES true
#define UNIT_IS_BYTES_COUNT false
#define ORIGIN_NAME_TORCH "torch.cuda.memory_stats() key"
#define ORIGIN_NAME_GPUMEM "gpumem statistic"

typedef struct pool_statistic {
    const char *field;
    const char *label;
    bool bytes;
    const char *origin;
    size_t offset; /* of its gm_stat[GM_POOL_COUNT] in gm_stats */
} pool_statistic;

static const pool_statistic pool_statistics[] = {
#define POOL_STATISTIC(field, label, unit, origin) \
    {#field, label, UNIT_IS_BYTES_##unit, ORIGIN_NAME_##origin, offsetof(gm_stats, field)},
    GM_POOL_STATISTICS(POOL_STATISTIC)
#undef POOL_STATISTIC
};

typedef struct counter {
    const char *field;
    const char *label; /* NULL when the summary table has no row for it */
    const char *origin;
    size_t offset;
} counter;

static const counter counters[] = {
#define COUNTER(field, label, origin) {#field, label, ORIGIN_NAME_##origin, offsetof(gm_stats, field)},
    GM_COUNTERS(COUNTER)
#undef COUNTER
};

static const char *const pool_label_values[GM_POOL_COUNT] = {"all", "small", "large"};

static label_set region_labels(const gm_published *region)
{
    label_set labels = {.count = 0};
    add_label(&labels, "pid", "%ld", region->pid);
    add_label(&labels, "device", "%d", region->device);
    add_label(&labels, "backend", "%.*s", (int)sizeof region->backend, region->backend);
    add_label(&labels, "engine", "%.*s", (int)sizeof region->engine, region->engine);
    return labels;
}

static const gm_stat *statistic_of(const gm_published *region, const pool_statistic *statistic)
{
    return (const gm_stat *)((const char *)&region->stats + statistic->offset);
}

/* gpumem_allocated_bytes for a BYTES statistic (its unit added if its field lacks it), gpumem_segments
 * for the COUNT statistic segment. */
static void pool_statistic_name(const pool_statistic *statistic, char *name, size_t size)
{
    size_t length = strlen(statistic->field);
    bool has_unit = length >= 6 && !strcmp(statistic->field + length - 6, "_bytes");
    snprintf(name, size, "gpumem_%s%s", statistic->field, statistic->bytes ? (has_unit ? "" : "_bytes") : "s");
}

/* One family for one reading (current or peak) of a pool statistic, over every region and pool. */
static void render_pool_reading(const gm_prometheus_readings *readings, gm_text_buffer *buffer,
                                const pool_statistic *statistic, bool peak)
{
    char name[96], help[384];
    pool_statistic_name(statistic, name, sizeof name);
    if (peak)
        strncat(name, "_peak", sizeof name - strlen(name) - 1);
    snprintf(help, sizeof help, "%s%s%s, per pool (%s %s.POOL.%s)", statistic->label,
             peak ? ": the highest since the process started or last reset its peaks" : ", now",
             statistic->bytes ? ", in bytes" : "", statistic->origin, statistic->field, peak ? "peak" : "current");
    family family = make_family("gauge", name, help);
    for (size_t i = 0; i < readings->region_count; i++) {
        const gm_stat *stat = statistic_of(&readings->regions[i], statistic);
        for (int pool = 0; pool < GM_POOL_COUNT; pool++) {
            label_set labels = region_labels(&readings->regions[i]);
            add_label(&labels, "pool", "%s", pool_label_values[pool]);
            write_integer(buffer, &family, &labels, peak ? stat[pool].peak : stat[pool].current);
        }
    }
}

/* num_ooms -> gpumem_ooms_total. */
static void render_counter(const gm_prometheus_readings *readings, gm_text_buffer *buffer, const counter *counter)
{
    const char *stem = strncmp(counter->field, "num_", 4) ? counter->field : counter->field + 4;
    char name[96], help[384];
    snprintf(name, sizeof name, "gpumem_%s_total", stem);
    snprintf(help, sizeof help, "%s: events since the process started or last reset its accumulated statistics (%s %s)",
             counter->label ? counter->label : counter->field, counter->origin, counter->field);
    family family = make_family("counter", name, help);
    for (size_t i = 0; i < readings->region_count; i++) {
        label_set labels = region_labels(&readings->regions[i]);
        const int64_t *value = (const int64_t *)((const char *)&readings->regions[i].stats + counter->offset);
        write_integer(buffer, &family, &labels, *value);
    }
}

static void render_device_calls(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    family calls = make_family("counter", "gpumem_device_calls_total",
                               "Device calls made through the backend, by kind (cuMemMap is map, ...)");
    family seconds = make_family("counter", "gpumem_device_call_seconds_total",
                                 "Time spent in device calls, by kind: measured on the cuda and host backends, "
                                 "the H200 cost model's on sim");
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < readings->region_count; i++) {
            const gm_stats *stats = &readings->regions[i].stats;
            for (size_t kind = 0; kind < GM_CALL_KIND_COUNT; kind++) {
                label_set labels = region_labels(&readings->regions[i]);
                add_label(&labels, "call", "%s", gm_device_call_name((gm_device_call)kind));
                if (pass == 0)
                    write_integer(buffer, &calls, &labels, stats->device_calls[kind]);
                else
                    write_seconds(buffer, &seconds, &labels, stats->device_call_ns_by_kind[kind]);
            }
        }
}

typedef int64_t (*region_reading)(const gm_published *region);

static int64_t cache_free_bytes(const gm_published *region) { return (int64_t)region->cached_free_bytes; }
static int64_t largest_free_block_bytes(const gm_published *region) { return (int64_t)region->largest_free_block_bytes; }
static int64_t device_memory_bytes(const gm_published *region) { return (int64_t)region->device_total_bytes; }
static int64_t page_size_bytes(const gm_published *region) { return (int64_t)region->page_size; }
static int64_t start_time_ns(const gm_published *region) { return region->start_time_ns; }

/* A negative reading (none: a pinned cache without host_limit) is left out. */
static void render_region_family(const gm_prometheus_readings *readings, gm_text_buffer *buffer, const char *type,
                                 const char *name, const char *help, region_reading reading, bool nanoseconds)
{
    family family = make_family(type, name, help);
    for (size_t i = 0; i < readings->region_count; i++) {
        if (reading(&readings->regions[i]) < 0)
            continue;
        label_set labels = region_labels(&readings->regions[i]);
        if (nanoseconds)
            write_seconds(buffer, &family, &labels, reading(&readings->regions[i]));
        else
            write_integer(buffer, &family, &labels, reading(&readings->regions[i]));
    }
}

static void render_region_gauge(const gm_prometheus_readings *readings, gm_text_buffer *buffer, const char *name,
                                const char *help, region_reading reading, bool nanoseconds)
{
    render_region_family(readings, buffer, "gauge", name, help, reading, nanoseconds);
}

/* The pinned host memory cache (gm_host_malloc): page-locked host memory, which the kernel cannot swap
 * and which counts against RLIMIT_MEMLOCK. */
#define PINNED_READING(field) \
    static int64_t pinned_##field(const gm_published *region) { return (int64_t)region->pinned_host.field; }
PINNED_READING(reserved_bytes)
PINNED_READING(reserved_bytes_peak)
PINNED_READING(allocated_bytes)
PINNED_READING(allocated_bytes_peak)
PINNED_READING(requested_bytes)
PINNED_READING(allocations)
PINNED_READING(pending_blocks)
PINNED_READING(cache_hits)
PINNED_READING(cache_misses)
PINNED_READING(host_frees)
#undef PINNED_READING
static int64_t pinned_limit_bytes(const gm_published *region)
{
    return region->pinned_host.limit_bytes ? (int64_t)region->pinned_host.limit_bytes : -1;
}

static void render_pinned_host(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    static const struct {
        const char *type, *name, *help;
        region_reading reading;
    } families[] = {
        {"gauge", "gpumem_pinned_host_reserved_bytes",
         "Page-locked host memory the process's pinned cache holds (gm_host_malloc): handed out, idle or waiting "
         "for streams", pinned_reserved_bytes},
        {"gauge", "gpumem_pinned_host_reserved_bytes_peak", "The most page-locked host memory the pinned cache held",
         pinned_reserved_bytes_peak},
        {"gauge", "gpumem_pinned_host_allocated_bytes",
         "Page-locked host memory handed out by gm_host_malloc and not yet freed (power-of-two block sizes)",
         pinned_allocated_bytes},
        {"gauge", "gpumem_pinned_host_allocated_bytes_peak", "The most page-locked host memory handed out at once",
         pinned_allocated_bytes_peak},
        {"gauge", "gpumem_pinned_host_requested_bytes", "Bytes the live pinned blocks were asked for (unrounded)",
         pinned_requested_bytes},
        {"gauge", "gpumem_pinned_host_allocations", "Pinned blocks handed out now", pinned_allocations},
        {"gauge", "gpumem_pinned_host_pending_blocks", "Freed pinned blocks waiting for their streams' copies",
         pinned_pending_blocks},
        {"gauge", "gpumem_pinned_host_limit_bytes", "The pinned cache's cap (host_limit; left out without one)",
         pinned_limit_bytes},
        {"counter", "gpumem_pinned_host_cache_hits_total", "gm_host_malloc calls served from the pinned cache",
         pinned_cache_hits},
        {"counter", "gpumem_pinned_host_cache_misses_total",
         "gm_host_malloc calls that needed a new page-locked allocation (cuMemHostAlloc on cuda)", pinned_cache_misses},
        {"counter", "gpumem_pinned_host_backend_frees_total",
         "Pinned blocks given back to the backend (cuMemFreeHost on cuda): emptied or over host_limit",
         pinned_host_frees},
    };
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        render_region_family(readings, buffer, families[i].type, families[i].name, families[i].help,
                             families[i].reading, false);
}

static void render_regions(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    for (size_t i = 0; i < sizeof pool_statistics / sizeof pool_statistics[0]; i++) {
        render_pool_reading(readings, buffer, &pool_statistics[i], false);
        render_pool_reading(readings, buffer, &pool_statistics[i], true);
    }
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        render_counter(readings, buffer, &counters[i]);
    render_device_calls(readings, buffer);
    render_region_gauge(readings, buffer, "gpumem_cache_free_bytes",
                        "Bytes free in reserved memory (gm_cache_info), sampled with the device calls",
                        cache_free_bytes, false);
    render_region_gauge(readings, buffer, "gpumem_largest_free_block_bytes",
                        "The largest free block in reserved memory, sampled with the device calls",
                        largest_free_block_bytes, false);
    render_region_gauge(readings, buffer, "gpumem_device_memory_bytes", "The device's memory as its backend reports it",
                        device_memory_bytes, false);
    render_region_gauge(readings, buffer, "gpumem_page_size_bytes", "The backend's mapping granularity",
                        page_size_bytes, false);
    render_region_gauge(readings, buffer, "gpumem_process_start_time_seconds",
                        "When the process's allocator for this device was created and started publishing, in "
                        "seconds since the Unix epoch", start_time_ns, true);
    render_pinned_host(readings, buffer);
}

/* ---------------------------------------------------------------- host memory of each process tree */

typedef int64_t (*process_reading)(const gm_process_memory *memory);

static int64_t tree_resident_bytes(const gm_process_memory *memory) { return memory->tree_rss_bytes; }
static int64_t tree_proportional_bytes(const gm_process_memory *memory) { return memory->tree_pss_bytes; }
static int64_t tree_swap_bytes(const gm_process_memory *memory) { return memory->tree_swap_bytes; }
static int64_t descendants(const gm_process_memory *memory) { return memory->descendants; }

/* A negative reading (unknown) is left out. */
static void render_process_gauge(const gm_prometheus_readings *readings, gm_text_buffer *buffer, const char *name,
                                 const char *help, process_reading reading)
{
    family family = make_family("gauge", name, help);
    for (size_t i = 0; i < readings->process_count; i++) {
        int64_t value = reading(&readings->processes[i].memory);
        if (value < 0)
            continue;
        label_set labels = {.count = 0};
        add_label(&labels, "pid", "%ld", readings->processes[i].pid);
        write_integer(buffer, &family, &labels, value);
    }
}

static void render_processes(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    render_process_gauge(readings, buffer, "gpumem_process_resident_bytes",
                         "Host memory resident (RSS) in the process and its descendants", tree_resident_bytes);
    render_process_gauge(readings, buffer, "gpumem_process_proportional_bytes",
                         "Proportional set size (PSS: shared pages divided among their sharers) of the process and "
                         "its descendants", tree_proportional_bytes);
    render_process_gauge(readings, buffer, "gpumem_process_swap_bytes",
                         "Host memory of the process and its descendants swapped out", tree_swap_bytes);
    render_process_gauge(readings, buffer, "gpumem_process_descendants",
                         "Processes below the process (DataLoader workers, for example)", descendants);
}

/* ---------------------------------------------------------------- the host */

static void render_host_gauge(gm_text_buffer *buffer, const char *name, const char *help, int64_t value)
{
    family family = make_family("gauge", name, help);
    if (value >= 0)
        write_integer(buffer, &family, NULL, value);
}

static void render_pressure(const gm_host_memory *host, gm_text_buffer *buffer)
{
    family family = make_family("gauge", "gpumem_host_memory_pressure_ratio",
                                "Share of the window in which some task (kind=some) or every task (kind=full) "
                                "waited for memory (Linux pressure stall information)");
    const struct {
        const char *kind, *window;
        double percent;
    } averages[] = {{"some", "10s", host->pressure_some_avg10}, {"some", "60s", host->pressure_some_avg60},
                    {"full", "10s", host->pressure_full_avg10}, {"full", "60s", host->pressure_full_avg60}};
    for (size_t i = 0; i < sizeof averages / sizeof averages[0]; i++) {
        if (averages[i].percent < 0)
            continue;
        label_set labels = {.count = 0};
        add_label(&labels, "kind", "%s", averages[i].kind);
        add_label(&labels, "window", "%s", averages[i].window);
        write_real(buffer, &family, &labels, averages[i].percent / 100.0);
    }
}

static void render_host(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    const gm_host_memory *host = readings->host;
    if (!host)
        return;
    render_host_gauge(buffer, "gpumem_host_memory_total_bytes", "The host's memory (MemTotal)", host->total_bytes);
    render_host_gauge(buffer, "gpumem_host_memory_available_bytes",
                      "Host memory that can be allocated without swapping (MemAvailable)", host->available_bytes);
    render_host_gauge(buffer, "gpumem_host_swap_total_bytes", "The host's swap space (SwapTotal)",
                      host->swap_total_bytes);
    render_host_gauge(buffer, "gpumem_host_swap_free_bytes", "The host's unused swap space (SwapFree)",
                      host->swap_free_bytes);
    render_pressure(host, buffer);
}

/* ---------------------------------------------------------------- the GPUs */

static label_set gpu_labels(const gm_gpu_reading *gpu)
{
    label_set labels = {.count = 0};
    add_label(&labels, "gpu", "%d", gpu->index);
    add_label(&labels, "name", "%.*s", (int)sizeof gpu->name, gpu->name);
    return labels;
}

static void render_gpus(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    family available = make_family("gauge", "gpumem_gpu_available",
                                   "1 when NVML answered (the gpumem_gpu_ families follow), 0 without it");
    write_integer(buffer, &available, NULL, readings->gpus_available ? 1 : 0);
    family total = make_family("gauge", "gpumem_gpu_memory_total_bytes", "The GPU's memory, as its driver says");
    family used = make_family("gauge", "gpumem_gpu_memory_used_bytes", "The GPU's memory in use by any process");
    family busy = make_family("gauge", "gpumem_gpu_utilization_ratio",
                              "Share of the last sample period in which a kernel ran on the GPU");
    family temperature = make_family("gauge", "gpumem_gpu_temperature_celsius", "The GPU's temperature");
    for (int pass = 0; pass < 4; pass++)
        for (size_t i = 0; i < readings->gpu_count; i++) {
            const gm_gpu_reading *gpu = &readings->gpus[i];
            label_set labels = gpu_labels(gpu);
            if (pass == 0)
                write_integer(buffer, &total, &labels, (int64_t)gpu->total_bytes);
            else if (pass == 1)
                write_integer(buffer, &used, &labels, (int64_t)gpu->used_bytes);
            else if (pass == 2 && gpu->utilization_percent >= 0)
                write_real(buffer, &busy, &labels, gpu->utilization_percent / 100.0);
            else if (pass == 3 && gpu->temperature_celsius >= 0)
                write_integer(buffer, &temperature, &labels, gpu->temperature_celsius);
        }
}

/* ---------------------------------------------------------------- the exporter itself */

static void render_exporter(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    family regions = make_family("gauge", "gpumem_exporter_regions",
                                 "Statistics regions found at this scrape: read, stale (their process is gone) "
                                 "or refused (another owner, a symbolic link, a wrong layout)");
    const struct {
        const char *state;
        size_t count;
    } states[] = {{"read", readings->region_count}, {"stale", readings->stale_regions},
                  {"refused", readings->refused_regions}};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
        label_set labels = {.count = 0};
        add_label(&labels, "state", "%s", states[i].state);
        write_integer(buffer, &regions, &labels, (int64_t)states[i].count);
    }
    family duration = make_family("gauge", "gpumem_exporter_scrape_duration_seconds",
                                  "Time this scrape took to read the regions, /proc and NVML");
    write_real(buffer, &duration, NULL, readings->collection_seconds);
}

gm_status gm_prometheus_render(const gm_prometheus_readings *readings, gm_text_buffer *buffer)
{
    render_regions(readings, buffer);
    render_processes(readings, buffer);
    render_host(readings, buffer);
    render_gpus(readings, buffer);
    render_exporter(readings, buffer);
    if (buffer->failed)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the metrics text");
    return GM_OK;
}
