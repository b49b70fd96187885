/*
 * summary.c -- gm_summary(): the statistics as a table in the layout of torch.cuda.memory_summary(),
 * so that users read it as they read PyTorch's. Sizes switch unit when the row's first reading
 * passes 768 of the unit below, counts at 750 thousand, exactly as PyTorch formats them. The last
 * rows are gpumem's own: device calls and the counters that GM_COUNTERS gives a label. Every row
 * comes from the statistics list in gpumem.h, and the table is made from gm_get_stats() and
 * gm_get_device_info() alone.
 */
#include "gpumem.h"

#include "base/error.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct text_buffer {
    char *data;
    size_t size;
    size_t used; /* may exceed size: then only the needed size is known */
} text_buffer;

static void append(text_buffer *text, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void append(text_buffer *text, const char *format, ...)
{
    va_list arguments;
    va_start(arguments, format);
    size_t room = text->used < text->size ? text->size - text->used : 0;
    int written = vsnprintf(room ? text->data + text->used : NULL, room, format, arguments);
    va_end(arguments);
    if (written > 0)
        text->used += (size_t)written;
}

static void format_size(char *out, size_t size, int64_t value, int64_t preferred)
{
    static const char *const prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t prefix = 0;
    double scale = (double)preferred;
    while (prefix + 1 < sizeof prefixes / sizeof prefixes[0] && scale >= 768 * 1024) {
        prefix++;
        value /= 1024;
        scale /= 1024;
    }
    snprintf(out, size, "%6" PRId64 " %s", value, prefixes[prefix]);
}

static void format_count(char *out, size_t size, int64_t value, int64_t preferred)
{
    static const char *const prefixes[] = {" ", "K", "M"};
    size_t prefix = 0;
    double scale = (double)preferred;
    while (prefix + 1 < sizeof prefixes / sizeof prefixes[0] && scale >= 750 * 1000) {
        prefix++;
        value /= 1000;
        scale /= 1000;
    }
    snprintf(out, size, "%7" PRId64 " %s ", value, prefixes[prefix]);
}

typedef void (*formatter)(char *out, size_t size, int64_t value, int64_t preferred);

/* The formatter of a statistic's unit (GM_POOL_STATISTICS: BYTES or COUNT). */
#define FORMAT_BYTES format_size
#define FORMAT_COUNT format_count

static void separator(text_buffer *text, char fill)
{
    char line[76];
    memset(line, fill, 75);
    line[75] = '\0';
    append(text, "|%s|\n", line);
}

static void metric_rows(text_buffer *text, const char *name, const gm_stat stat[GM_POOL_COUNT], formatter format)
{
    static const struct {
        int pool;
        const char *label;
    } rows[] = {{GM_POOL_ALL, NULL}, {GM_POOL_LARGE, "      from large pool"}, {GM_POOL_SMALL, "      from small pool"}};
    separator(text, '-');
    const gm_stat *first = &stat[GM_POOL_ALL];
    for (size_t i = 0; i < 3; i++) {
        const gm_stat *row = &stat[rows[i].pool];
        char current[24], peak[24], allocated[24], freed[24];
        format(current, sizeof current, row->current, first->current);
        format(peak, sizeof peak, row->peak, first->peak);
        format(allocated, sizeof allocated, row->allocated, first->allocated);
        format(freed, sizeof freed, row->freed, first->freed);
        append(text, "| %-21s | %s | %s | %s | %s |\n", rows[i].label ? rows[i].label : name, current, peak,
               allocated, freed);
    }
}

static void counter_row(text_buffer *text, const char *name, int64_t value)
{
    char formatted[24];
    format_count(formatted, sizeof formatted, value, value);
    append(text, "| %-21s | %s | %-36s |\n", name, formatted, "");
}

static void render(text_buffer *text, const gm_stats *stats, const char *backend, int device)
{
    char title[80], events[80];
    snprintf(title, sizeof title, "gpumem memory summary, %s device ID %d", backend, device);
    snprintf(events, sizeof events, "         OOMs: %-12" PRId64 " |        alloc retries: %-8" PRId64, stats->num_ooms,
             stats->num_alloc_retries);
    separator(text, '=');
    append(text, "| %-73s |\n", title);
    separator(text, '-');
    append(text, "| %-73s |\n", events);
    separator(text, '=');
    append(text, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");
#define METRIC_ROWS(field, label, unit, origin) metric_rows(text, label, stats->field, FORMAT_##unit);
    GM_POOL_STATISTICS(METRIC_ROWS)
#undef METRIC_ROWS
    separator(text, '-');
    int64_t calls = 0;
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        calls += stats->device_calls[kind];
    counter_row(text, "Device calls", calls);
    counter_row(text, "Device call time (us)", stats->device_call_ns / 1000);
#define COUNTER_ROW(field, label, origin)                                                                       \
    if (label)                                                                                                 \
        counter_row(text, label, stats->field);
    GM_COUNTERS(COUNTER_ROW)
#undef COUNTER_ROW
    separator(text, '=');
}

gm_status gm_summary_of_stats(const gm_stats *stats, const char *backend, int device, char *buffer,
                              size_t buffer_size, size_t *needed_out)
{
    if (!stats || !backend || (!buffer && buffer_size))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_summary_of_stats: %s",
                       !stats     ? "stats is NULL"
                       : !backend ? "backend is NULL"
                                  : "buffer is NULL but buffer_size is not 0");
    text_buffer text = {buffer, buffer_size, 0};
    render(&text, stats, backend, device);
    if (needed_out)
        *needed_out = text.used + 1;
    if (text.used + 1 > buffer_size)
        return gm_fail(GM_ERROR_BUFFER_TOO_SMALL, "gm_summary: the table needs %zu bytes, the buffer has %zu",
                       text.used + 1, buffer_size);
    return GM_OK;
}

gm_status gm_summary(gm_allocator *allocator, char *buffer, size_t buffer_size, size_t *needed_out)
{
    if (!allocator || (!buffer && buffer_size))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_summary: %s is NULL", allocator ? "buffer" : "allocator");
    gm_stats stats;
    gm_device_info info;
    gm_status status = gm_get_stats(allocator, &stats);
    if (status == GM_OK)
        status = gm_get_device_info(allocator, &info);
    if (status != GM_OK)
        return status;
    return gm_summary_of_stats(&stats, info.backend, info.device, buffer, buffer_size, needed_out);
}
