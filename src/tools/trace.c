/*
 * trace.c -- reading allocation traces (plain or gzip) into a dense array.
 *
 * The text comes from text_source.c (plain or gzip, a file or a pipe, a byte-order mark skipped).
 *
 * Each line is checked: no NUL bytes (binary data), a newline within 512 bytes, the operation letter,
 * four fields, numbers that parse, an allocation id that is not already live, a free of an id that
 * is, live sizes that add up to at most 2^64 - 1 bytes. Ids become slots (reused after a free) so that
 * replay indexes an array; streams become a short table, each found through a hash map. The maps are
 * keyed with a secret of the process (gm_hash_map_init_keyed): a file cannot choose ids that all share
 * one slot and make loading take time quadratic in their number. The first bad line stops loading with
 * "FILE:LINE: reason".
 */
#include "tools/trace.h"

#include "base/array.h"
#include "base/error.h"
#include "base/hash_map.h"
#include "base/system_memory.h"
#include "tools/text_source.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct loader {
    const char *path;
    unsigned long line; /* of the trace; the event's number for a history */
    const char *line_name;
    gm_trace *trace;
    size_t operation_capacity;
    gm_hash_map live_ids;    /* id + 1 -> slot << 32 | line of allocation (low 32 bits) */
    gm_hash_map stream_indexes;  /* stream + 1 -> index into trace->streams */
    uint32_t all_ones_stream;    /* index + 1 of stream 2^64-1 (whose key would be the map's empty 0); 0: unseen */
    size_t stream_capacity;
    uint32_t *free_slots;
    size_t free_slot_count;
    uint64_t *slot_sizes;
    uint64_t live_bytes;
} loader;

static gm_status malformed(const loader *state, const char *reason)
{
    return gm_fail(GM_ERROR_PARSE, "%s:%lu: %s", state->path, state->line, reason);
}

static gm_status parse_number(const loader *state, const char *text, const char *what, uint64_t *value_out)
{
    char reason[160];
    if (*text < '0' || *text > '9') {
        snprintf(reason, sizeof reason, "%s '%.40s' is not a non-negative integer", what, text);
        return malformed(state, reason);
    }
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno == ERANGE || *end) {
        snprintf(reason, sizeof reason, "%s '%.40s' is not a non-negative integer", what, text);
        return malformed(state, reason);
    }
    *value_out = value;
    return GM_OK;
}

static gm_status grow(loader *state)
{
    gm_trace *trace = state->trace;
    gm_trace_operation *grown = gm_array_room_for_one(trace->operations, trace->count, &state->operation_capacity,
                                                      sizeof *grown, 65536);
    if (!grown)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
    trace->operations = grown;
    return GM_OK;
}

/* The maps a loader keeps while it reads; false when host memory cannot be had. */
static bool loader_start(loader *state)
{
    bool ids = gm_hash_map_init_keyed(&state->live_ids, 4096);
    bool streams = gm_hash_map_init_keyed(&state->stream_indexes, 16);
    return ids && streams;
}

static void loader_finish(loader *state)
{
    gm_hash_map_free(&state->live_ids);
    gm_hash_map_free(&state->stream_indexes);
    free(state->free_slots);
    free(state->slot_sizes);
}

/* The trace's index of a stream, the stream added when new: one lookup however many streams there are. */
static gm_status stream_index_of(loader *state, uint64_t stream, uint16_t *index_out)
{
    gm_trace *trace = state->trace;
    uint64_t index = 0;
    bool all_ones = stream == UINT64_MAX;
    if (all_ones ? state->all_ones_stream != 0 : gm_hash_map_get(&state->stream_indexes, stream + 1, &index)) {
        *index_out = (uint16_t)(all_ones ? state->all_ones_stream - 1 : index);
        return GM_OK;
    }
    if (trace->stream_count == UINT16_MAX)
        return malformed(state, "more than 65535 streams");
    gm_stream *grown = gm_array_room_for_one(trace->streams, trace->stream_count, &state->stream_capacity,
                                             sizeof *grown, 8);
    if (grown)
        trace->streams = grown; /* kept at once: the old array may be gone */
    if (!grown || (!all_ones && !gm_hash_map_put(&state->stream_indexes, stream + 1, trace->stream_count)))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
    grown[trace->stream_count] = (gm_stream)stream;
    if (all_ones)
        state->all_ones_stream = (uint32_t)trace->stream_count + 1;
    *index_out = (uint16_t)trace->stream_count++;
    return GM_OK;
}

static gm_status take_slot(loader *state, uint64_t size, uint32_t *slot_out)
{
    gm_trace *trace = state->trace;
    if (state->free_slot_count) {
        *slot_out = state->free_slots[--state->free_slot_count];
    } else {
        if (trace->slot_count == UINT32_MAX)
            return malformed(state, "too many live allocations");
        if ((trace->slot_count & (trace->slot_count - 1)) == 0) { /* grow at powers of two */
            size_t capacity = trace->slot_count ? trace->slot_count * 2 : 1;
            uint64_t *sizes = gm_system_realloc(state->slot_sizes, capacity * sizeof *sizes);
            uint32_t *slots = gm_system_realloc(state->free_slots, capacity * sizeof *slots);
            if (sizes)
                state->slot_sizes = sizes;
            if (slots)
                state->free_slots = slots;
            if (!sizes || !slots)
                return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
        }
        *slot_out = (uint32_t)trace->slot_count++;
    }
    state->slot_sizes[*slot_out] = size;
    return GM_OK;
}

/* One operation of the trace: an allocation of `size` bytes named `id` on `stream`, or the free of the
 * live allocation named `id`. Checked as a line is: an id already live, a free of one that is not. */
static gm_status add_operation(loader *state, bool allocate, uint64_t id, uint64_t size, uint64_t stream)
{
    gm_status status = grow(state);
    if (status != GM_OK)
        return status;
    gm_trace_operation *operation = &state->trace->operations[state->trace->count];
    status = stream_index_of(state, stream, &operation->stream_index);
    if (status != GM_OK)
        return status;
    uint64_t entry = 0;
    bool live = gm_hash_map_get(&state->live_ids, id + 1, &entry);
    char reason[128];
    if (allocate) {
        if (live) {
            snprintf(reason, sizeof reason, "allocation id %" PRIu64 " is already live (allocated at %s %" PRIu64 ")",
                     id, state->line_name, entry & 0xffffffffu);
            return malformed(state, reason);
        }
        if (size > UINT64_MAX - state->live_bytes) /* else live_bytes and peak_live_bytes would wrap around */
            return malformed(state, "the live allocations add up to more than 2^64 bytes");
        status = take_slot(state, size, &operation->slot);
        if (status != GM_OK)
            return status;
        if (!gm_hash_map_put(&state->live_ids, id + 1, (uint64_t)operation->slot << 32 | (state->line & 0xffffffffu)))
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
        operation->kind = GM_TRACE_ALLOCATE;
        operation->size = size;
        state->live_bytes += size;
        if (state->live_bytes > state->trace->peak_live_bytes)
            state->trace->peak_live_bytes = state->live_bytes;
        state->trace->allocation_count++;
    } else {
        if (!live) {
            snprintf(reason, sizeof reason, "free of id %" PRIu64 ", which is not live", id);
            return malformed(state, reason);
        }
        gm_hash_map_remove(&state->live_ids, id + 1, NULL);
        operation->kind = GM_TRACE_FREE;
        operation->slot = (uint32_t)(entry >> 32);
        operation->size = state->slot_sizes[operation->slot];
        state->live_bytes -= operation->size;
        state->free_slots[state->free_slot_count++] = operation->slot;
    }
    state->trace->count++;
    return GM_OK;
}

static gm_status parse_line(loader *state, char *line)
{
    char *fields[5];
    int count = 0;
    for (char *cursor = line; count < 5;) {
        fields[count++] = cursor;
        char *comma = strchr(cursor, ',');
        if (!comma)
            break;
        *comma = '\0';
        cursor = comma + 1;
    }
    if (count != 4)
        return malformed(state, "expected 4 comma-separated fields: a|f,id,bytes,stream");
    if (strcmp(fields[0], "a") != 0 && strcmp(fields[0], "f") != 0) {
        char reason[96];
        snprintf(reason, sizeof reason, "unknown operation '%.20s' (expected a or f)", fields[0]);
        return malformed(state, reason);
    }
    uint64_t id = 0, size = 0, stream = 0;
    gm_status status = parse_number(state, fields[1], "id", &id);
    if (status == GM_OK)
        status = parse_number(state, fields[2], "size", &size);
    if (status == GM_OK)
        status = parse_number(state, fields[3], "stream", &stream);
    if (status == GM_OK && id == UINT64_MAX)
        status = malformed(state, "id too large");
    if (status != GM_OK)
        return status;
    return add_operation(state, fields[0][0] == 'a', id, size, stream);
}

static gm_status read_lines(loader *state, gm_text_source *source)
{
    for (;;) {
        char *line = NULL;
        size_t length = 0;
        bool too_long = false;
        gm_status status = gm_text_source_next_line(source, state->line, &line, &length, &too_long);
        if (status != GM_OK || !line)
            return status;
        state->line++;
        const char *nul = memchr(line, '\0', length);
        if (nul) { /* binary data: said first, since it is also why a line seems too long */
            char reason[96];
            snprintf(reason, sizeof reason, "a NUL byte at column %zu (binary data, not a text trace)",
                     (size_t)(nul - line) + 1);
            return malformed(state, reason);
        }
        if (too_long)
            return malformed(state, "line too long (no newline within 512 bytes: not a trace)");
        while (length && line[length - 1] == '\r')
            length--;
        line[length] = '\0'; /* the newline's place, or inside the buffer after a last line without one */
        if (length == 0 || line[0] == '#')
            continue;
        status = parse_line(state, line);
        if (status != GM_OK)
            return status;
    }
}

gm_status gm_trace_load_source(gm_text_source *source, gm_trace *trace_out)
{
    const char *path = gm_text_source_path(source);
    memset(trace_out, 0, sizeof *trace_out);
    loader state = {.path = path, .trace = trace_out, .line_name = "line"};
    gm_status status = loader_start(&state) ? read_lines(&state, source)
                                            : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory");
    loader_finish(&state);
    if (status == GM_OK && trace_out->count == 0)
        status = gm_fail(GM_ERROR_PARSE, "%s:%lu: the trace holds no operations", path, state.line);
    if (status != GM_OK)
        gm_trace_free(trace_out);
    return status;
}

gm_status gm_trace_load(const char *path, gm_trace *trace_out)
{
    if (!path || !trace_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_trace_load: an argument is NULL");
    memset(trace_out, 0, sizeof *trace_out);
    gm_text_source *source;
    gm_status status = gm_text_source_open(path, &source);
    if (status != GM_OK)
        return status;
    status = gm_trace_load_source(source, trace_out);
    gm_text_source_close(source);
    return status;
}

/* The id of a request that ran out of memory: no block's address (allocated and freed at once, so one
 * id serves them all). */
#define OOM_REQUEST_ID (UINT64_MAX - 1)

/* A stream's name in the trace: 0 for the default stream (NULL), else 1, 2, ... in the order the
 * events first name them, so that a history's stream handles become the small names a trace uses.
 * `names` maps each handle seen (never NULL, so never the empty key 0) to its name. */
static gm_status stream_name_of(loader *state, gm_stream stream, gm_hash_map *names, uint64_t *name_out)
{
    *name_out = 0;
    if (!stream || gm_hash_map_get(names, (uint64_t)(uintptr_t)stream, name_out))
        return GM_OK;
    *name_out = names->count + 1;
    if (!gm_hash_map_put(names, (uint64_t)(uintptr_t)stream, *name_out))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
    return GM_OK;
}

/* Pass 1: the blocks freed in the events but allocated before them (the ring had dropped their
 * allocation, or it predates the history), allocated first, each with its free's size and stream. */
static gm_status add_early_allocations(loader *state, const gm_event *events, size_t count, gm_hash_map *names,
                                       size_t *early_out)
{
    gm_hash_map live; /* address + 1 -> 1 while allocated within the events */
    if (!gm_hash_map_init_keyed(&live, 4096))
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
    gm_status status = GM_OK;
    for (size_t i = 0; i < count && status == GM_OK; i++) {
        const gm_event *event = &events[i];
        bool names_a_block = event->kind == GM_EVENT_ALLOC || event->kind == GM_EVENT_FREE_REQUESTED;
        if (names_a_block && event->address >= OOM_REQUEST_ID) { /* no block starts there; the ids need it */
            state->line = i + 1;
            status = malformed(state, "an address within the last two bytes of the address space");
        } else if (event->kind == GM_EVENT_ALLOC && !gm_hash_map_put(&live, event->address + 1, 1)) {
            status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
        } else if (event->kind == GM_EVENT_FREE_REQUESTED && !gm_hash_map_remove(&live, event->address + 1, NULL)) {
            uint64_t name = 0;
            state->line = i + 1;
            status = stream_name_of(state, event->stream, names, &name);
            if (status == GM_OK)
                status = add_operation(state, true, event->address, event->size, name);
            ++*early_out;
        }
    }
    gm_hash_map_free(&live);
    return status;
}

gm_status gm_trace_from_events(const char *name, const gm_event *events, size_t count, gm_trace *trace_out,
                               size_t *early_out)
{
    if (!name || (!events && count) || !trace_out || !early_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_trace_from_events: an argument is NULL");
    memset(trace_out, 0, sizeof *trace_out);
    *early_out = 0;
    loader state = {.path = name, .trace = trace_out, .line_name = "event"};
    gm_hash_map names; /* a stream handle -> its name in the trace */
    bool have_names = gm_hash_map_init_keyed(&names, 16);
    gm_status status = loader_start(&state) && have_names ? add_early_allocations(&state, events, count, &names, early_out)
                                                          : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory");
    /* Pass 2: every allocation and free request, in order (a free's completion is gpumem's own wait), and
     * every request that ran out of memory as an allocation freed at once: whether it fits is the question. */
    for (size_t i = 0; i < count && status == GM_OK; i++) {
        const gm_event *event = &events[i];
        if (event->kind != GM_EVENT_ALLOC && event->kind != GM_EVENT_FREE_REQUESTED && event->kind != GM_EVENT_OOM)
            continue;
        uint64_t stream = 0;
        state.line = i + 1;
        status = stream_name_of(&state, event->stream, &names, &stream);
        if (status == GM_OK && event->kind == GM_EVENT_OOM) {
            status = add_operation(&state, true, OOM_REQUEST_ID, event->size, stream);
            if (status == GM_OK)
                status = add_operation(&state, false, OOM_REQUEST_ID, 0, stream);
        } else if (status == GM_OK) {
            status = add_operation(&state, event->kind == GM_EVENT_ALLOC, event->address, event->size, stream);
        }
    }
    gm_hash_map_free(&names);
    loader_finish(&state);
    if (status == GM_OK && trace_out->count == 0)
        status = gm_fail(GM_ERROR_PARSE, "%s: no allocation in its events", name);
    if (status != GM_OK)
        gm_trace_free(trace_out);
    return status;
}

void gm_trace_free(gm_trace *trace)
{
    if (!trace)
        return;
    free(trace->operations);
    free(trace->streams);
    memset(trace, 0, sizeof *trace);
}
