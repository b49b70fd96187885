/*
 * json.c -- snapshots and the history as JSON (the format is in docs/formats.md).
 *
 * Made from the public API alone: gm_snapshot's arrays, gm_history_read, the statistics' names. The
 * text grows in one malloc'd buffer; a statistic added to gpumem.h's lists appears here unasked,
 * under its torch name ("allocated_bytes.all.current").
 */
#include "gpumem.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct json_text {
    char *data;
    size_t used;
    size_t capacity;
    bool failed; /* host memory ran out: the text is incomplete */
} json_text;

static void append(json_text *text, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void append(json_text *text, const char *format, ...)
{
    for (int attempt = 0; attempt < 2 && !text->failed; attempt++) {
        va_list arguments;
        va_start(arguments, format);
        size_t room = text->capacity - text->used;
        int written = vsnprintf(text->data ? text->data + text->used : NULL, room, format, arguments);
        va_end(arguments);
        if (written < 0) {
            text->failed = true;
        } else if ((size_t)written < room) {
            text->used += (size_t)written;
            return;
        } else {
            size_t capacity = (text->capacity + (size_t)written + 1) * 2;
            char *grown = gm_system_realloc(text->data, capacity);
            if (!grown)
                text->failed = true;
            else {
                text->data = grown;
                text->capacity = capacity;
            }
        }
    }
}

static gm_status finish(json_text *text, char **json_out)
{
    if (text->failed || !text->data) {
        free(text->data);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for the JSON text");
    }
    *json_out = text->data;
    return GM_OK;
}

static void append_stats(json_text *text, const gm_stats *stats)
{
    static const char *const pools[GM_POOL_COUNT] = {"all", "small_pool", "large_pool"};
    gm_stats copy = *stats;
    gm_stat *arrays[] = {
#define ARRAY(field, label, unit, origin) copy.field,
        GM_POOL_STATISTICS(ARRAY)
#undef ARRAY
    };
    int64_t counters[] = {
#define COUNTER(field, label, origin) copy.field,
        GM_COUNTERS(COUNTER)
#undef COUNTER
    };
    append(text, "{");
    for (size_t i = 0; gm_stat_name(i); i++)
        for (int pool = 0; pool < GM_POOL_COUNT; pool++)
            append(text, "%s\"%s.%s.current\": %" PRId64 ", \"%s.%s.peak\": %" PRId64, i || pool ? ", " : "",
                   gm_stat_name(i), pools[pool], arrays[i][pool].current, gm_stat_name(i), pools[pool],
                   arrays[i][pool].peak);
    for (size_t i = 0; gm_counter_name(i); i++)
        append(text, ", \"%s\": %" PRId64, gm_counter_name(i), counters[i]);
    for (size_t kind = 0; kind < gm_device_call_count(); kind++)
        append(text, ", \"device_calls.%s\": %" PRId64, gm_device_call_name((gm_device_call)kind),
               stats->device_calls[kind]);
    append(text, ", \"device_call_ns\": %" PRId64 "}", stats->device_call_ns);
}

static const char *block_kind_name(gm_block_kind kind)
{
    static const char *const names[] = {"free", "allocated", "pending", "unmapped"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "unknown";
}

static void append_region(json_text *text, const gm_snapshot *snapshot, const gm_snapshot_region *region)
{
    append(text, "{\"address\": %" PRIu64 ", \"size\": %" PRIu64 ", \"mapped_bytes\": %" PRIu64
                 ", \"stream\": %" PRIuPTR ", \"pool\": \"%s\", \"growth_lane\": %s, \"blocks\": [",
           region->address, region->size, region->mapped_bytes, (uintptr_t)region->stream,
           region->pool == GM_POOL_SMALL ? "small" : "large", region->growth_lane ? "true" : "false");
    for (size_t b = 0; b < region->block_count; b++) {
        const gm_snapshot_block *block = &snapshot->blocks[region->first_block + b];
        append(text, "%s{\"address\": %" PRIu64 ", \"size\": %" PRIu64 ", \"requested\": %" PRIu64
                     ", \"state\": \"%s\"}",
               b ? ", " : "", block->address, block->size, block->requested, block_kind_name(block->kind));
    }
    append(text, "]}");
}

gm_status gm_snapshot_json(const gm_snapshot *snapshot, char **json_out)
{
    if (!snapshot || !json_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_snapshot_json: %s is NULL", snapshot ? "json_out" : "snapshot");
    json_text text = {0};
    const gm_device_info *device = &snapshot->device;
    append(&text, "{\"format\": \"gpumem-snapshot\", \"version\": 1, \"device\": {\"backend\": \"%s\", "
                  "\"engine\": \"%s\", \"device\": %d, \"total_bytes\": %" PRIu64 ", \"free_bytes\": %" PRIu64
                  ", \"page_size\": %" PRIu64 "}, \"stats\": ",
           device->backend, device->engine, device->device, device->total_bytes, device->free_bytes,
           device->granularity);
    append_stats(&text, &snapshot->stats);
    append(&text, ", \"regions\": [");
    for (size_t r = 0; r < snapshot->region_count; r++) {
        append(&text, r ? ", " : "");
        append_region(&text, snapshot, &snapshot->regions[r]);
    }
    append(&text, "]}\n");
    return finish(&text, json_out);
}

gm_status gm_history_json(gm_allocator *allocator, char **json_out)
{
    if (!allocator || !json_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_history_json: %s is NULL", allocator ? "json_out" : "allocator");
    size_t count = 0;
    uint64_t dropped = 0;
    gm_status status = gm_history_read(allocator, NULL, 0, &count, &dropped);
    if (status != GM_OK)
        return status;
    size_t capacity = count ? count : 1;
    gm_event *events = gm_system_malloc(capacity * sizeof *events);
    if (!events)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to read the history");
    status = gm_history_read(allocator, events, capacity, &count, &dropped);
    json_text text = {0};
    append(&text, "{\"format\": \"gpumem-history\", \"version\": 1, \"dropped\": %" PRIu64 ", \"events\": [",
           dropped);
    for (size_t i = 0; status == GM_OK && i < count; i++)
        append(&text, "%s{\"time_ns\": %" PRIu64 ", \"action\": \"%s\", \"address\": %" PRIu64 ", \"size\": %" PRIu64
                      ", \"stream\": %" PRIuPTR ", \"tag\": %" PRIu64 "}",
               i ? ",\n" : "\n", events[i].time_ns, gm_event_name(events[i].kind), events[i].address,
               events[i].size, (uintptr_t)events[i].stream, events[i].tag);
    append(&text, "]}\n");
    free(events);
    if (status != GM_OK) {
        free(text.data);
        return status;
    }
    return finish(&text, json_out);
}

void gm_json_free(char *json)
{
    free(json);
}
