/*
 * json_reader.h -- a small pull reader of JSON text, for reading gpumem's own files back (snapshots and
 * histories, docs/formats.md) without building a tree: the caller walks the text in the order it is
 * written, asking for the value it expects next and skipping what it does not know.
 *
 *     gm_json_reader reader;
 *     gm_json_reader_init(&reader, text, length, "history.json");
 *     char key[64];
 *     gm_json_begin_object(&reader);
 *     while (gm_json_next_member(&reader, key, sizeof key))
 *         if (!strcmp(key, "dropped")) gm_json_read_uint64(&reader, &dropped);
 *         else gm_json_skip_value(&reader);
 *     if (reader.failed) ... reader.error says "history.json:3:17: expected a number"
 *
 * Every call returns false once the reader has failed, so a walk may check `failed` once at the end.
 * Only what gpumem writes needs to be read as values (objects, arrays, strings, non-negative integers,
 * booleans); anything valid can be skipped.
 */
#ifndef GM_JSON_READER_H
#define GM_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gm_json_reader {
    const char *text;
    size_t length;
    size_t position;
    const char *name; /* the file's name, for messages */
    bool failed;
    bool first;       /* no member or element read yet in the innermost object or array */
    char error[320];  /* "NAME:LINE:COLUMN: reason" once failed */
} gm_json_reader;

void gm_json_reader_init(gm_json_reader *reader, const char *text, size_t length, const char *name);

/* Fail with a reason at the current position (false, for `return gm_json_fail(...)`). */
bool gm_json_fail(gm_json_reader *reader, const char *reason);

/* '{' or '['. */
bool gm_json_begin_object(gm_json_reader *reader);
bool gm_json_begin_array(gm_json_reader *reader);
/* The next member's key (the reader then stands before its value): true; false at the closing '}'
 * (consumed) or on failure. Keys longer than key_size - 1 bytes fail. */
bool gm_json_next_member(gm_json_reader *reader, char *key, size_t key_size);
/* True when another element follows (the reader stands before it); false at ']' or on failure. */
bool gm_json_next_element(gm_json_reader *reader);

/* Values. A string longer than size - 1 bytes fails; \u escapes become UTF-8. */
bool gm_json_read_string(gm_json_reader *reader, char *buffer, size_t size);
bool gm_json_read_uint64(gm_json_reader *reader, uint64_t *value_out);
bool gm_json_read_bool(gm_json_reader *reader, bool *value_out);
/* Any value, nested up to 64 deep. */
bool gm_json_skip_value(gm_json_reader *reader);
/* Only white space remains. */
bool gm_json_end(gm_json_reader *reader);

#endif
