/*
 * json_formats.c -- reading gpumem's JSON files back (json_formats.h): one walk of the top-level object
 * finds its format and version, a second reads the history's events or the snapshot's regions and
 * blocks into the structs the library itself hands out. Keys this reader does not know are skipped,
 * as docs/formats.md asks of readers; anything else that is not as written there fails with the place
 * in the file and the reason.
 */
#include "tools/json_formats.h"

#include "base/array.h"
#include "base/error.h"
#include "tools/json_reader.h"
#include "base/system_memory.h"
#include "tools/text_source.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KEY_SIZE = 128, SUPPORTED_VERSION = 1 };

/* ---------------------------------------------------------------- opening */

gm_status gm_input_open(const char *path, gm_input_file *input_out)
{
    memset(input_out, 0, sizeof *input_out);
    input_out->path = path;
    gm_text_source *source;
    gm_status result = gm_text_source_open(path, &source);
    int first = -1;
    if (result == GM_OK)
        result = gm_text_source_peek(source, &first);
    if (result == GM_OK && first != '{') { /* a trace: its reader goes on from here */
        input_out->source = source;
        return GM_OK;
    }
    if (result == GM_OK)
        result = gm_text_source_read_all(source, &input_out->text, &input_out->length);
    gm_text_source_close(source);
    if (result != GM_OK)
        return result;

    /* Which format: the top-level object's "format" and "version", wherever they stand. */
    gm_json_reader reader;
    gm_json_reader_init(&reader, input_out->text, input_out->length, path);
    char key[KEY_SIZE], format[64] = "";
    uint64_t version = 0;
    bool has_version = false;
    gm_json_begin_object(&reader);
    while (gm_json_next_member(&reader, key, sizeof key)) {
        if (!strcmp(key, "format") && !reader.failed)
            gm_json_read_string(&reader, format, sizeof format);
        else if (!strcmp(key, "version"))
            has_version = gm_json_read_uint64(&reader, &version);
        else
            gm_json_skip_value(&reader);
    }
    gm_json_end(&reader);
    if (reader.failed)
        result = gm_fail(GM_ERROR_PARSE, "%s", reader.error);
    else if (strcmp(format, "gpumem-history") && strcmp(format, "gpumem-snapshot"))
        result = gm_fail(GM_ERROR_PARSE, "%s: JSON, but not a gpumem snapshot or history (its \"format\" is '%s', "
                                         "not 'gpumem-snapshot' or 'gpumem-history')",
                         path, format);
    else if (!has_version)
        result = gm_fail(GM_ERROR_PARSE, "%s: a %s file without its \"version\" (this gpumem reads version %d)", path,
                         format, SUPPORTED_VERSION);
    else if (version != SUPPORTED_VERSION)
        result = gm_fail(GM_ERROR_PARSE, "%s: %s version %llu is not supported (this gpumem reads version %d)", path,
                         format, (unsigned long long)version, SUPPORTED_VERSION);
    if (result != GM_OK) {
        gm_input_close(input_out);
        return result;
    }
    input_out->kind = strcmp(format, "gpumem-history") ? GM_INPUT_SNAPSHOT : GM_INPUT_HISTORY;
    return GM_OK;
}

void gm_input_close(gm_input_file *input)
{
    gm_text_source_close(input->source);
    input->source = NULL;
    free(input->text);
    input->text = NULL;
    input->length = 0;
}

/* ---------------------------------------------------------------- history */

static bool read_event(gm_json_reader *reader, gm_event *event, bool *known_out)
{
    char key[KEY_SIZE], action[64] = "";
    uint64_t value = 0;
    memset(event, 0, sizeof *event);
    gm_json_begin_object(reader);
    while (gm_json_next_member(reader, key, sizeof key)) {
        if (!strcmp(key, "action"))
            gm_json_read_string(reader, action, sizeof action);
        else if (!strcmp(key, "time_ns"))
            gm_json_read_uint64(reader, &event->time_ns);
        else if (!strcmp(key, "address"))
            gm_json_read_uint64(reader, &event->address);
        else if (!strcmp(key, "size"))
            gm_json_read_uint64(reader, &event->size);
        else if (!strcmp(key, "tag"))
            gm_json_read_uint64(reader, &event->tag);
        else if (!strcmp(key, "stream")) {
            if (gm_json_read_uint64(reader, &value))
                event->stream = (gm_stream)value;
        } else
            gm_json_skip_value(reader);
    }
    if (reader->failed)
        return false;
    if (!action[0])
        return gm_json_fail(reader, "an event without an \"action\"");
    *known_out = false;
    for (int kind = 0; kind < GM_EVENT_KIND_COUNT; kind++)
        if (!strcmp(action, gm_event_name((gm_event_kind)kind))) {
            event->kind = (gm_event_kind)kind;
            *known_out = true;
        }
    return true;
}

static bool read_events(gm_json_reader *reader, gm_history_file *history)
{
    size_t capacity = 0;
    gm_json_begin_array(reader);
    while (gm_json_next_element(reader)) {
        gm_event *grown = gm_array_room_for_one(history->events, history->count, &capacity, sizeof *grown, 4096);
        if (!grown)
            return gm_json_fail(reader, "no host memory for the events");
        history->events = grown;
        bool known = false;
        if (!read_event(reader, &history->events[history->count], &known))
            return false;
        if (known)
            history->count++;
        else
            history->unknown_actions++;
    }
    return !reader->failed;
}

gm_status gm_history_parse(const gm_input_file *input, gm_history_file *history_out)
{
    memset(history_out, 0, sizeof *history_out);
    if (input->kind != GM_INPUT_HISTORY)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: not a history", input->path);
    gm_json_reader reader;
    gm_json_reader_init(&reader, input->text, input->length, input->path);
    char key[KEY_SIZE];
    bool has_events = false;
    gm_json_begin_object(&reader);
    while (gm_json_next_member(&reader, key, sizeof key)) {
        if (!strcmp(key, "events") && has_events)
            gm_json_fail(&reader, "a history with two \"events\"");
        else if (!strcmp(key, "events"))
            has_events = read_events(&reader, history_out);
        else if (!strcmp(key, "dropped"))
            gm_json_read_uint64(&reader, &history_out->dropped);
        else
            gm_json_skip_value(&reader);
    }
    gm_status status = GM_OK;
    if (!gm_json_end(&reader))
        status = gm_fail(GM_ERROR_PARSE, "%s", reader.error);
    else if (!has_events)
        status = gm_fail(GM_ERROR_PARSE, "%s: a history without \"events\"", input->path);
    if (status != GM_OK)
        gm_history_file_free(history_out);
    return status;
}

void gm_history_file_free(gm_history_file *history)
{
    free(history->events);
    memset(history, 0, sizeof *history);
}

/* ---------------------------------------------------------------- snapshot */

typedef struct snapshot_builder {
    gm_snapshot *snapshot;
    size_t region_capacity;
    size_t block_capacity;
} snapshot_builder;

static bool read_int64(gm_json_reader *reader, int64_t *value_out)
{
    uint64_t value = 0;
    if (!gm_json_read_uint64(reader, &value))
        return false;
    if (value > INT64_MAX)
        return gm_json_fail(reader, "integer too large");
    *value_out = (int64_t)value;
    return true;
}

/* One member of "stats": "allocated_bytes.all.peak", "num_ooms", "device_calls.map", "device_call_ns"... */
static bool read_statistic(gm_json_reader *reader, const char *key, gm_stats *stats)
{
    static const char *const pools[GM_POOL_COUNT] = {"all", "small_pool", "large_pool"};
    gm_stat *arrays[] = {
#define ARRAY(field, label, unit, origin) stats->field,
        GM_POOL_STATISTICS(ARRAY)
#undef ARRAY
    };
    int64_t *counters[] = {
#define COUNTER(field, label, origin) &stats->field,
        GM_COUNTERS(COUNTER)
#undef COUNTER
    };
    char name[KEY_SIZE + 32];
    for (size_t i = 0; gm_stat_name(i); i++)
        for (int pool = 0; pool < GM_POOL_COUNT; pool++) {
            snprintf(name, sizeof name, "%s.%s.current", gm_stat_name(i), pools[pool]);
            if (!strcmp(key, name))
                return read_int64(reader, &arrays[i][pool].current);
            snprintf(name, sizeof name, "%s.%s.peak", gm_stat_name(i), pools[pool]);
            if (!strcmp(key, name))
                return read_int64(reader, &arrays[i][pool].peak);
        }
    for (size_t i = 0; gm_counter_name(i); i++)
        if (!strcmp(key, gm_counter_name(i)))
            return read_int64(reader, counters[i]);
    for (size_t kind = 0; kind < gm_device_call_count(); kind++) {
        snprintf(name, sizeof name, "device_calls.%s", gm_device_call_name((gm_device_call)kind));
        if (!strcmp(key, name))
            return read_int64(reader, &stats->device_calls[kind]);
    }
    if (!strcmp(key, "device_call_ns"))
        return read_int64(reader, &stats->device_call_ns);
    return gm_json_skip_value(reader);
}

static bool read_stats(gm_json_reader *reader, gm_stats *stats)
{
    char key[KEY_SIZE];
    gm_json_begin_object(reader);
    while (gm_json_next_member(reader, key, sizeof key))
        read_statistic(reader, key, stats);
    return !reader->failed;
}

/* `from` into `to`, cut to fit. */
static void copy_cut(char *to, size_t size, const char *from)
{
    size_t length = strlen(from);
    length = length < size ? length : size - 1;
    memcpy(to, from, length);
    to[length] = '\0';
}

static bool read_device(gm_json_reader *reader, gm_device_info *device)
{
    char key[KEY_SIZE], name[256];
    uint64_t value = 0;
    gm_json_begin_object(reader);
    while (gm_json_next_member(reader, key, sizeof key)) {
        /* Names longer than gm_device_info holds are cut. */
        if (!strcmp(key, "backend")) {
            if (gm_json_read_string(reader, name, sizeof name))
                copy_cut(device->backend, sizeof device->backend, name);
        } else if (!strcmp(key, "engine")) {
            if (gm_json_read_string(reader, name, sizeof name))
                copy_cut(device->engine, sizeof device->engine, name);
        }
        else if (!strcmp(key, "total_bytes"))
            gm_json_read_uint64(reader, &device->total_bytes);
        else if (!strcmp(key, "free_bytes"))
            gm_json_read_uint64(reader, &device->free_bytes);
        else if (!strcmp(key, "page_size"))
            gm_json_read_uint64(reader, &device->granularity);
        else if (!strcmp(key, "device")) {
            if (gm_json_read_uint64(reader, &value) && value > 65535)
                return gm_json_fail(reader, "device index too large");
            device->device = (int)value;
        } else
            gm_json_skip_value(reader);
    }
    return !reader->failed;
}

static bool read_block(gm_json_reader *reader, gm_snapshot_block *block)
{
    static const char *const states[] = {[GM_BLOCK_KIND_FREE] = "free", [GM_BLOCK_KIND_ALLOCATED] = "allocated",
                                         [GM_BLOCK_KIND_PENDING] = "pending", [GM_BLOCK_KIND_UNMAPPED] = "unmapped"};
    char key[KEY_SIZE], state[32] = "";
    memset(block, 0, sizeof *block);
    gm_json_begin_object(reader);
    while (gm_json_next_member(reader, key, sizeof key)) {
        if (!strcmp(key, "address"))
            gm_json_read_uint64(reader, &block->address);
        else if (!strcmp(key, "size"))
            gm_json_read_uint64(reader, &block->size);
        else if (!strcmp(key, "requested"))
            gm_json_read_uint64(reader, &block->requested);
        else if (!strcmp(key, "state"))
            gm_json_read_string(reader, state, sizeof state);
        else
            gm_json_skip_value(reader);
    }
    if (reader->failed)
        return false;
    for (size_t kind = 0; kind < sizeof states / sizeof states[0]; kind++)
        if (!strcmp(state, states[kind])) {
            block->kind = (gm_block_kind)kind;
            return true;
        }
    char reason[160];
    snprintf(reason, sizeof reason, "a block whose \"state\" is '%.32s', not one of free, allocated, pending, unmapped",
             state);
    return gm_json_fail(reader, reason);
}

static bool read_blocks(gm_json_reader *reader, snapshot_builder *builder, gm_snapshot_region *region)
{
    gm_snapshot *snapshot = builder->snapshot;
    region->first_block = snapshot->block_count;
    gm_json_begin_array(reader);
    while (gm_json_next_element(reader)) {
        gm_snapshot_block *grown = gm_array_room_for_one(snapshot->blocks, snapshot->block_count,
                                                         &builder->block_capacity, sizeof *grown, 1024);
        if (!grown)
            return gm_json_fail(reader, "no host memory for the blocks");
        snapshot->blocks = grown;
        if (!read_block(reader, &snapshot->blocks[snapshot->block_count]))
            return false;
        snapshot->block_count++;
        region->block_count++;
    }
    return !reader->failed;
}

static bool read_region(gm_json_reader *reader, snapshot_builder *builder, gm_snapshot_region *region)
{
    char key[KEY_SIZE], pool[16] = "";
    uint64_t value = 0;
    bool lane = false;
    memset(region, 0, sizeof *region);
    region->first_block = builder->snapshot->block_count;
    gm_json_begin_object(reader);
    while (gm_json_next_member(reader, key, sizeof key)) {
        if (!strcmp(key, "address"))
            gm_json_read_uint64(reader, &region->address);
        else if (!strcmp(key, "size"))
            gm_json_read_uint64(reader, &region->size);
        else if (!strcmp(key, "mapped_bytes"))
            gm_json_read_uint64(reader, &region->mapped_bytes);
        else if (!strcmp(key, "stream")) {
            if (gm_json_read_uint64(reader, &value))
                region->stream = (gm_stream)value;
        } else if (!strcmp(key, "pool"))
            gm_json_read_string(reader, pool, sizeof pool);
        else if (!strcmp(key, "growth_lane")) {
            if (gm_json_read_bool(reader, &lane))
                region->growth_lane = lane;
        } else if (!strcmp(key, "blocks")) {
            if (region->block_count)
                return gm_json_fail(reader, "a region with two \"blocks\"");
            read_blocks(reader, builder, region);
        } else
            gm_json_skip_value(reader);
    }
    if (reader->failed)
        return false;
    region->pool = !strcmp(pool, "small") ? GM_POOL_SMALL : !strcmp(pool, "large") ? GM_POOL_LARGE : GM_POOL_ALL;
    if (region->address > UINT64_MAX - region->size)
        return gm_json_fail(reader, "a region that ends past the largest address");
    for (size_t b = 0; b < region->block_count; b++) {
        const gm_snapshot_block *block = &builder->snapshot->blocks[region->first_block + b];
        if (block->address < region->address || block->size > region->size ||
            block->address - region->address > region->size - block->size)
            return gm_json_fail(reader, "a region with a block outside it");
    }
    return true;
}

static bool read_regions(gm_json_reader *reader, snapshot_builder *builder)
{
    gm_snapshot *snapshot = builder->snapshot;
    gm_json_begin_array(reader);
    while (gm_json_next_element(reader)) {
        gm_snapshot_region *grown = gm_array_room_for_one(snapshot->regions, snapshot->region_count,
                                                          &builder->region_capacity, sizeof *grown, 16);
        if (!grown)
            return gm_json_fail(reader, "no host memory for the regions");
        snapshot->regions = grown;
        if (!read_region(reader, builder, &snapshot->regions[snapshot->region_count]))
            return false;
        snapshot->region_count++;
    }
    return !reader->failed;
}

gm_status gm_snapshot_parse(const gm_input_file *input, gm_snapshot **snapshot_out)
{
    *snapshot_out = NULL;
    if (input->kind != GM_INPUT_SNAPSHOT)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "%s: not a snapshot", input->path);
    snapshot_builder builder = {.snapshot = gm_system_calloc(1, sizeof(gm_snapshot))};
    if (!builder.snapshot)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the snapshot", input->path);
    gm_json_reader reader;
    gm_json_reader_init(&reader, input->text, input->length, input->path);
    char key[KEY_SIZE];
    bool has_regions = false;
    gm_json_begin_object(&reader);
    while (gm_json_next_member(&reader, key, sizeof key)) {
        if (!strcmp(key, "regions")) {
            if (has_regions)
                gm_json_fail(&reader, "a snapshot with two \"regions\"");
            else
                has_regions = read_regions(&reader, &builder);
        } else if (!strcmp(key, "stats"))
            read_stats(&reader, &builder.snapshot->stats);
        else if (!strcmp(key, "device"))
            read_device(&reader, &builder.snapshot->device);
        else
            gm_json_skip_value(&reader);
    }
    gm_status status = GM_OK;
    if (!gm_json_end(&reader))
        status = gm_fail(GM_ERROR_PARSE, "%s", reader.error);
    else if (!has_regions)
        status = gm_fail(GM_ERROR_PARSE, "%s: a snapshot without \"regions\"", input->path);
    if (status != GM_OK) {
        gm_snapshot_file_free(builder.snapshot);
        return status;
    }
    builder.snapshot->stats.device_total_bytes = builder.snapshot->device.total_bytes;
    builder.snapshot->stats.page_size = builder.snapshot->device.granularity;
    *snapshot_out = builder.snapshot;
    return GM_OK;
}

void gm_snapshot_file_free(gm_snapshot *snapshot)
{
    if (!snapshot)
        return;
    free(snapshot->regions);
    free(snapshot->blocks);
    free(snapshot);
}
