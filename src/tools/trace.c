/*
 * trace.c -- reading allocation traces (plain or gzip) into a dense array.
 *
 * gzip is read through zlib where the build found it, else through a `gzip -dc` pipe (zlib reads
 * plain files too; without it, plain files are read directly).
 *
 * Each line is checked: the operation letter, four fields, numbers that parse, an allocation id
 * that is not already live, a free of an id that is. Ids become slots (reused after a free) so
 * that replay indexes an array; streams become a short table. The first bad line stops loading
 * with "FILE:LINE: reason".
 */
#include "tools/trace.h"

#include "base/error.h"
#include "base/hash_map.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef GPUMEM_HAVE_ZLIB
#include <zlib.h>
#endif

typedef struct loader {
    const char *path;
    unsigned long line;
    gm_trace *trace;
    size_t operation_capacity;
    gm_hash_map live_ids;    /* id + 1 -> slot << 32 | line of allocation (low 32 bits) */
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
    if (trace->count < state->operation_capacity)
        return GM_OK;
    size_t capacity = state->operation_capacity ? state->operation_capacity * 2 : 65536;
    gm_trace_operation *grown = realloc(trace->operations, capacity * sizeof *grown);
    if (!grown)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
    trace->operations = grown;
    state->operation_capacity = capacity;
    return GM_OK;
}

static gm_status stream_index_of(loader *state, uint64_t stream, uint16_t *index_out)
{
    gm_trace *trace = state->trace;
    for (size_t i = 0; i < trace->stream_count; i++) {
        if (trace->streams[i] == stream) {
            *index_out = (uint16_t)i;
            return GM_OK;
        }
    }
    if (trace->stream_count == UINT16_MAX)
        return malformed(state, "more than 65535 streams");
    gm_stream *grown = realloc(trace->streams, (trace->stream_count + 1) * sizeof *grown);
    if (!grown)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory for the trace", state->path);
    trace->streams = grown;
    grown[trace->stream_count] = (gm_stream)stream;
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
            uint64_t *sizes = realloc(state->slot_sizes, capacity * sizeof *sizes);
            uint32_t *slots = realloc(state->free_slots, capacity * sizeof *slots);
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
    if (status == GM_OK)
        status = grow(state);
    if (status != GM_OK)
        return status;
    gm_trace_operation *operation = &state->trace->operations[state->trace->count];
    status = stream_index_of(state, stream, &operation->stream_index);
    if (status != GM_OK)
        return status;
    uint64_t entry = 0;
    bool live = gm_hash_map_get(&state->live_ids, id + 1, &entry);
    char reason[128];
    if (fields[0][0] == 'a') {
        if (live) {
            snprintf(reason, sizeof reason, "allocation id %" PRIu64 " is already live (allocated at line %" PRIu64 ")",
                     id, entry & 0xffffffffu);
            return malformed(state, reason);
        }
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

/* A line source: zlib, or a plain stream (a file, or a `gzip -dc` pipe). */
typedef struct line_source {
#ifdef GPUMEM_HAVE_ZLIB
    gzFile compressed;
#endif
    FILE *plain;
    bool piped;
} line_source;

#ifndef GPUMEM_HAVE_ZLIB
static bool is_gzip_name(const char *path)
{
    size_t length = strlen(path);
    return length > 3 && strcmp(path + length - 3, ".gz") == 0;
}
#endif

static gm_status open_source(const char *path, line_source *source)
{
    memset(source, 0, sizeof *source);
    struct stat status;
    if (stat(path, &status) != 0)
        return gm_fail(GM_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(status.st_mode))
        return gm_fail(GM_ERROR_IO, "%s: cannot open: it is a directory", path);
#ifdef GPUMEM_HAVE_ZLIB
    source->compressed = gzopen(path, "rb");
    if (!source->compressed)
        return gm_fail(GM_ERROR_IO, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    return GM_OK;
#else
    if (is_gzip_name(path)) {
        char command[4200];
        if (strchr(path, '\'') || strlen(path) > 4000)
            return gm_fail(GM_ERROR_IO, "%s: cannot open: unusual file name", path);
        snprintf(command, sizeof command, "gzip -dc -- '%s'", path);
        source->plain = popen(command, "r");
        source->piped = true;
    } else {
        source->plain = fopen(path, "r");
    }
    if (!source->plain)
        return gm_fail(GM_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    return GM_OK;
#endif
}

static char *read_line(line_source *source, char *buffer, int size)
{
#ifdef GPUMEM_HAVE_ZLIB
    if (source->compressed)
        return gzgets(source->compressed, buffer, size);
#endif
    return fgets(buffer, size, source->plain);
}

/* Close the source; GM_OK if everything was read cleanly. */
static gm_status close_source(const char *path, line_source *source, unsigned long line)
{
    gm_status status = GM_OK;
#ifdef GPUMEM_HAVE_ZLIB
    if (source->compressed) {
        int error_number = 0;
        const char *message = gzerror(source->compressed, &error_number);
        if (error_number != Z_OK && error_number != Z_STREAM_END)
            status = gm_fail(GM_ERROR_IO, "%s:%lu: cannot read: %s", path, line + 1,
                             error_number == Z_ERRNO ? strerror(errno) : message);
        gzclose(source->compressed);
        return status;
    }
#endif
    if (ferror(source->plain))
        status = gm_fail(GM_ERROR_IO, "%s:%lu: cannot read: %s", path, line + 1, strerror(errno));
    int closed = source->piped ? pclose(source->plain) : fclose(source->plain);
    if (status == GM_OK && source->piped && closed != 0)
        status = gm_fail(GM_ERROR_IO, "%s:%lu: cannot read: gzip -dc failed (exit status %d)", path, line + 1, closed);
    return status;
}

static gm_status read_lines(loader *state, line_source *source)
{
    char line[512];
    while (read_line(source, line, sizeof line)) {
        state->line++;
        size_t length = strlen(line);
        if (length == sizeof line - 1 && line[length - 1] != '\n')
            return malformed(state, "line too long");
        while (length && (line[length - 1] == '\n' || line[length - 1] == '\r'))
            line[--length] = '\0';
        if (length == 0 || line[0] == '#')
            continue;
        gm_status status = parse_line(state, line);
        if (status != GM_OK)
            return status;
    }
    return GM_OK;
}

gm_status gm_trace_load(const char *path, gm_trace *trace_out)
{
    if (!path || !trace_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_trace_load: an argument is NULL");
    memset(trace_out, 0, sizeof *trace_out);
    line_source source;
    gm_status status = open_source(path, &source);
    if (status != GM_OK)
        return status;
    loader state = {.path = path, .trace = trace_out};
    status = gm_hash_map_init(&state.live_ids, 4096) ? read_lines(&state, &source)
                                                     : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory");
    gm_status closed = close_source(path, &source, state.line);
    if (status == GM_OK)
        status = closed;
    gm_hash_map_free(&state.live_ids);
    free(state.free_slots);
    free(state.slot_sizes);
    if (status == GM_OK && trace_out->count == 0)
        status = gm_fail(GM_ERROR_PARSE, "%s:%lu: the trace holds no operations", path, state.line);
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
