/*
 * text_source.c -- an input file's text, plain or gzip, read in blocks (text_source.h).
 *
 * gzip is read through zlib where the build found it (zlib reads plain text too, from a file or a
 * pipe), else through a `gzip -dc` pipe for a name ending in .gz and directly otherwise. Reading goes
 * through one buffer, so that looking at the first character, reading lines and reading the rest all
 * see the same bytes once: nothing is opened twice, and a pipe works as a file does. A gzip stream
 * that ends early or fails its checks is an I/O error naming the last good line.
 */
#include "tools/text_source.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#ifdef GPUMEM_HAVE_ZLIB
#include <zlib.h>
#endif

#define READ_BUFFER_BYTES 65536

struct gm_text_source {
    const char *path;
#ifdef GPUMEM_HAVE_ZLIB
    gzFile compressed;
#endif
    FILE *plain;
    bool piped;
    bool at_end;     /* the source gave everything it had, and ended cleanly */
    bool started;    /* the byte-order mark check is done */
    size_t start;    /* the unread bytes are buffer[start, end) */
    size_t end;
    char buffer[READ_BUFFER_BYTES + 1]; /* + 1: a last line without a newline may be ended in place */
};

#ifndef GPUMEM_HAVE_ZLIB
static bool is_gzip_name(const char *path)
{
    size_t length = strlen(path);
    return length > 3 && strcmp(path + length - 3, ".gz") == 0;
}
#endif

static gm_status open_underlying(const char *path, gm_text_source *source)
{
    struct stat status;
    if (stat(path, &status) != 0)
        return gm_fail(GM_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(status.st_mode))
        return gm_fail(GM_ERROR_IO, "%s: cannot open: it is a directory", path);
#ifdef GPUMEM_HAVE_ZLIB
    errno = 0;
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
        source->plain = fopen(path, "rb");
    }
    if (!source->plain)
        return gm_fail(GM_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    return GM_OK;
#endif
}

gm_status gm_text_source_open(const char *path, gm_text_source **source_out)
{
    *source_out = NULL;
    gm_text_source *source = gm_system_malloc(sizeof *source); /* its buffer is too large for the stack */
    if (!source)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory to read it", path);
    memset(source, 0, offsetof(gm_text_source, buffer));
    source->path = path;
    gm_status status = open_underlying(path, source);
    if (status != GM_OK) {
        free(source);
        return status;
    }
    *source_out = source;
    return GM_OK;
}

const char *gm_text_source_path(const gm_text_source *source)
{
    return source->path;
}

/* The source ended or failed: GM_OK if it ended cleanly, else an I/O error that says why. `lines` is the
 * count of lines read so far; a gzip stream that stops early is named as such, because the lines before
 * the cut were good and the cut line is not malformed but missing. */
static gm_status end_of_source(gm_text_source *source, unsigned long lines)
{
    const char *path = source->path;
    char where[48] = "before its first line";
    if (lines)
        snprintf(where, sizeof where, "after line %lu", lines);
#ifdef GPUMEM_HAVE_ZLIB
    if (source->compressed) {
        int error_number = 0;
        const char *message = gzerror(source->compressed, &error_number);
        size_t path_length = strlen(path); /* zlib's message starts with the path, said already */
        if (!strncmp(message, path, path_length) && !strncmp(message + path_length, ": ", 2))
            message += path_length + 2;
        if (error_number == Z_ERRNO)
            return gm_fail(GM_ERROR_IO, "%s: cannot read %s: %s", path, where, strerror(errno));
        if (error_number != Z_OK && error_number != Z_STREAM_END)
            return gm_fail(GM_ERROR_IO, "%s: truncated or corrupt gzip data %s: %s", path, where, message);
        return GM_OK;
    }
#endif
    if (ferror(source->plain))
        return gm_fail(GM_ERROR_IO, "%s: cannot read %s: %s", path, where, strerror(errno));
    if (source->piped) { /* gzip's exit status is the only word on the data's integrity */
        int closed = pclose(source->plain);
        source->plain = NULL;
        if (closed != 0)
            return gm_fail(GM_ERROR_IO, "%s: truncated or corrupt gzip data %s (gzip -dc failed, exit status %d)",
                           path, where, closed > 0 && WIFEXITED(closed) ? WEXITSTATUS(closed) : closed);
    }
    return GM_OK;
}

/* More bytes into the buffer (the unread ones moved to its start); at the end of the source, at_end,
 * or the source's error. */
static gm_status fill_buffer(gm_text_source *source, unsigned long lines)
{
    if (source->start > 0) {
        memmove(source->buffer, source->buffer + source->start, source->end - source->start);
        source->end -= source->start;
        source->start = 0;
    }
    size_t room = READ_BUFFER_BYTES - source->end;
    size_t got = 0;
    if (room == 0)
        return GM_OK;
#ifdef GPUMEM_HAVE_ZLIB
    if (source->compressed) {
        int read = gzread(source->compressed, source->buffer + source->end, (unsigned)room);
        got = read > 0 ? (size_t)read : 0;
    } else
#endif
    if (source->plain) {
        got = fread(source->buffer + source->end, 1, room, source->plain);
    }
    source->end += got;
    if (got > 0)
        return GM_OK;
    gm_status status = end_of_source(source, lines);
    source->at_end = status == GM_OK;
    return status;
}

/* Reads until at least `wanted` unread bytes are buffered, the buffer is full or the source ends. */
static gm_status buffer_at_least(gm_text_source *source, size_t wanted, unsigned long lines)
{
    while (source->end - source->start < wanted && !source->at_end) {
        if (source->start == 0 && source->end == READ_BUFFER_BYTES)
            return GM_OK;
        gm_status status = fill_buffer(source, lines);
        if (status != GM_OK)
            return status;
    }
    return GM_OK;
}

/* Once, before anything is read: a UTF-8 byte-order mark (which some editors write) is not text. */
static gm_status skip_byte_order_mark(gm_text_source *source)
{
    if (source->started)
        return GM_OK;
    source->started = true;
    gm_status status = buffer_at_least(source, 3, 0);
    if (status == GM_OK && source->end - source->start >= 3 &&
        !memcmp(source->buffer + source->start, "\xef\xbb\xbf", 3))
        source->start += 3;
    return status;
}

gm_status gm_text_source_peek(gm_text_source *source, int *first_out)
{
    *first_out = -1;
    gm_status status = skip_byte_order_mark(source);
    size_t offset = 0; /* from the first unread byte, which filling the buffer may move */
    while (status == GM_OK) {
        if (source->start + offset < source->end) {
            unsigned char c = (unsigned char)source->buffer[source->start + offset++];
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                *first_out = c;
                return GM_OK;
            }
            continue;
        }
        if (source->at_end || (source->start == 0 && source->end == READ_BUFFER_BYTES))
            return GM_OK;
        status = buffer_at_least(source, offset + 1, 0);
    }
    return status;
}

gm_status gm_text_source_next_line(gm_text_source *source, unsigned long lines, char **line_out, size_t *length_out,
                                   bool *too_long)
{
    *too_long = false;
    *line_out = NULL;
    gm_status status = skip_byte_order_mark(source);
    while (status == GM_OK) {
        char *first = source->buffer + source->start;
        size_t available = source->end - source->start;
        size_t scanned = available < GM_TEXT_MAX_LINE_BYTES ? available : GM_TEXT_MAX_LINE_BYTES;
        char *newline = memchr(first, '\n', scanned);
        bool last_without_newline = source->at_end && available > 0 && available < GM_TEXT_MAX_LINE_BYTES;
        if (newline || last_without_newline || available >= GM_TEXT_MAX_LINE_BYTES) {
            size_t length = newline ? (size_t)(newline - first) : scanned;
            *too_long = !newline && !last_without_newline;
            source->start += newline ? length + 1 : length;
            *line_out = first;
            *length_out = length;
            return GM_OK;
        }
        if (source->at_end)
            return GM_OK;
        status = fill_buffer(source, lines);
    }
    return status;
}

gm_status gm_text_source_read_all(gm_text_source *source, char **text_out, size_t *length_out)
{
    *text_out = NULL;
    gm_status status = skip_byte_order_mark(source);
    size_t capacity = 1 << 16, length = 0;
    char *text = status == GM_OK ? gm_system_malloc(capacity) : NULL;
    while (status == GM_OK && text) {
        size_t chunk = source->end - source->start;
        if (length + chunk + 1 > capacity) {
            char *grown = capacity < SIZE_MAX / 2 ? gm_system_realloc(text, capacity * 2) : NULL;
            if (!grown)
                break;
            text = grown;
            capacity *= 2;
            continue;
        }
        memcpy(text + length, source->buffer + source->start, chunk);
        length += chunk;
        source->start = source->end;
        if (source->at_end) {
            text[length] = '\0';
            *text_out = text;
            *length_out = length;
            return GM_OK;
        }
        status = fill_buffer(source, 0);
    }
    free(text);
    return status != GM_OK ? status : gm_fail(GM_ERROR_OUT_OF_MEMORY, "%s: no host memory to read it", source->path);
}

void gm_text_source_close(gm_text_source *source)
{
    if (!source)
        return;
#ifdef GPUMEM_HAVE_ZLIB
    if (source->compressed)
        gzclose(source->compressed);
#endif
    if (source->plain && source->piped)
        pclose(source->plain);
    else if (source->plain)
        fclose(source->plain);
    free(source);
}
