/*
 * text_source.h -- reading an input file's text once, plain or gzip, from a file or a pipe.
 *
 * The trace loader reads lines from it; `gpumem report` and `tune` first look at its first character
 * to tell JSON from a trace, then hand the same open source on, so that an input that can be read only
 * once (a pipe, /dev/stdin, <(...)) is read once. Lines come with their exact length (NUL bytes
 * included, which string functions would take for the end).
 */
#ifndef GM_TEXT_SOURCE_H
#define GM_TEXT_SOURCE_H

#include "gpumem.h"

#include <stdbool.h>
#include <stddef.h>

/* The longest line read, newline included: a valid trace line ("a,ID,BYTES,STREAM" with 20-digit
 * numbers) is under 70 bytes, so anything longer is not a trace; the limit also bounds what is read
 * before a binary file without newlines (/dev/zero) is refused. */
#define GM_TEXT_MAX_LINE_BYTES 512

typedef struct gm_text_source gm_text_source;

/* Open `path` (zlib reads gzip and plain alike; without zlib, a `gzip -dc` pipe for a name ending in
 * .gz). A UTF-8 byte-order mark at the start is skipped. GM_ERROR_IO when it cannot be opened. */
gm_status gm_text_source_open(const char *path, gm_text_source **source_out);

/* The first byte that is not white space, without reading past it (-1 at the end of the text, or when
 * the first 64 KiB are all white space). */
gm_status gm_text_source_peek(gm_text_source *source, int *first_out);

/* The next line (without its newline) and its length; *line_out is NULL at the end. A line without a
 * newline within GM_TEXT_MAX_LINE_BYTES comes back as its first that many bytes with *too_long set.
 * `lines` (the count read so far) names the place in an error. The line stays valid until the next
 * call, and may be written to up to and including line[length]. */
gm_status gm_text_source_next_line(gm_text_source *source, unsigned long lines, char **line_out, size_t *length_out,
                                   bool *too_long);

/* Everything not read yet, NUL-terminated, into *text_out (the caller frees it). */
gm_status gm_text_source_read_all(gm_text_source *source, char **text_out, size_t *length_out);

const char *gm_text_source_path(const gm_text_source *source);
void gm_text_source_close(gm_text_source *source);

#endif
