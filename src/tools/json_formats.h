/*
 * json_formats.h -- gpumem's own JSON files read back (docs/formats.md): a history (`gpumem-history`)
 * as gm_event structs, a snapshot (`gpumem-snapshot`) as a gm_snapshot, and which kind of input a file
 * is -- one of those, or an allocation trace -- told by its content, not its name.
 *
 * Errors: an unreadable file gives GM_ERROR_IO, malformed JSON or a file of another format
 * GM_ERROR_PARSE, each with "FILE: reason" (or "FILE:LINE:COLUMN: reason") in gm_last_error().
 */
#ifndef GM_JSON_FORMATS_H
#define GM_JSON_FORMATS_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

typedef enum gm_input_kind { GM_INPUT_TRACE = 0, GM_INPUT_HISTORY = 1, GM_INPUT_SNAPSHOT = 2 } gm_input_kind;

struct gm_text_source;

/* A file opened as input: its kind and, for JSON, its whole text. */
typedef struct gm_input_file {
    const char *path;
    gm_input_kind kind;
    char *text; /* NULL for a trace */
    size_t length;
    struct gm_text_source *source; /* a trace's text, open where it starts: gm_trace_load_source */
} gm_input_file;

/* JSON (the first character that is not white space is '{') naming one of the two formats, else a
 * trace; either plain or gzip, from a file or a pipe, read once. */
gm_status gm_input_open(const char *path, gm_input_file *input_out);
void gm_input_close(gm_input_file *input);

typedef struct gm_history_file {
    gm_event *events;       /* oldest first */
    size_t count;
    uint64_t dropped;       /* older events the ring no longer held */
    size_t unknown_actions; /* events of actions this reader does not know, left out */
} gm_history_file;

gm_status gm_history_parse(const gm_input_file *input, gm_history_file *history_out);
void gm_history_file_free(gm_history_file *history);

/* The snapshot's regions and blocks, statistics (the current and peak readings the file holds) and
 * device. Blocks must lie inside their region. Free it with gm_snapshot_file_free. */
gm_status gm_snapshot_parse(const gm_input_file *input, gm_snapshot **snapshot_out);
void gm_snapshot_file_free(gm_snapshot *snapshot);

#endif
