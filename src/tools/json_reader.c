/*
 * json_reader.c -- a pull reader of JSON text (json_reader.h): the caller asks for the value it expects
 * next, the reader checks the syntax on the way and says where the text went wrong (file, line,
 * column). Nothing is allocated: keys and strings are copied into the caller's buffers.
 */
#include "tools/json_reader.h"

#include <stdio.h>
#include <string.h>

enum { MAXIMUM_DEPTH = 64 };

void gm_json_reader_init(gm_json_reader *reader, const char *text, size_t length, const char *name)
{
    memset(reader, 0, sizeof *reader);
    reader->text = text;
    reader->length = length;
    reader->name = name;
}

bool gm_json_fail(gm_json_reader *reader, const char *reason)
{
    if (reader->failed)
        return false;
    size_t line = 1, column = 1;
    for (size_t i = 0; i < reader->position && i < reader->length; i++) {
        if (reader->text[i] == '\n') {
            line++;
            column = 1;
        } else {
            column++;
        }
    }
    snprintf(reader->error, sizeof reader->error, "%s:%zu:%zu: %s", reader->name, line, column, reason);
    reader->failed = true;
    return false;
}

static void skip_space(gm_json_reader *reader)
{
    while (reader->position < reader->length) {
        char c = reader->text[reader->position];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        reader->position++;
    }
}

/* The next character after white space, not consumed; '\0' at the end of the text. */
static char peek(gm_json_reader *reader)
{
    skip_space(reader);
    return reader->position < reader->length ? reader->text[reader->position] : '\0';
}

static bool expect(gm_json_reader *reader, char wanted, const char *reason)
{
    if (reader->failed)
        return false;
    if (peek(reader) != wanted)
        return gm_json_fail(reader, reason);
    reader->position++;
    return true;
}

bool gm_json_begin_object(gm_json_reader *reader)
{
    reader->first = true;
    return expect(reader, '{', "expected an object ('{')");
}

bool gm_json_begin_array(gm_json_reader *reader)
{
    reader->first = true;
    return expect(reader, '[', "expected an array ('[')");
}

/* Before the next member or element: true if there is one (a comma consumed unless it is the first);
 * false at the closing character (consumed) or on failure. */
static bool next_item(gm_json_reader *reader, char closing)
{
    if (reader->failed)
        return false;
    char c = peek(reader);
    if (c == closing) {
        reader->position++;
        reader->first = false;
        return false;
    }
    if (!reader->first) {
        if (c != ',')
            return gm_json_fail(reader, closing == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        reader->position++;
    }
    reader->first = false;
    return true;
}

bool gm_json_next_member(gm_json_reader *reader, char *key, size_t key_size)
{
    if (!next_item(reader, '}'))
        return false;
    if (peek(reader) != '"')
        return gm_json_fail(reader, "expected a key (a string)");
    return gm_json_read_string(reader, key, key_size) && expect(reader, ':', "expected ':' after a key");
}

bool gm_json_next_element(gm_json_reader *reader)
{
    return next_item(reader, ']');
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Four hex digits after "\u": the code unit, or -1. */
static long code_unit(gm_json_reader *reader)
{
    if (reader->length - reader->position < 4)
        return -1;
    long value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(reader->text[reader->position + (size_t)i]);
        if (digit < 0)
            return -1;
        value = value * 16 + digit;
    }
    reader->position += 4;
    return value;
}

/* Append one byte to the output (when there is one); false when it is full. */
static bool put(char *buffer, size_t size, size_t *used, char c)
{
    if (!buffer)
        return true;
    if (*used + 1 >= size)
        return false;
    buffer[(*used)++] = c;
    return true;
}

static bool put_utf8(char *buffer, size_t size, size_t *used, unsigned long code)
{
    char bytes[4];
    int count;
    if (code < 0x80) {
        bytes[0] = (char)code;
        count = 1;
    } else if (code < 0x800) {
        bytes[0] = (char)(0xC0 | (code >> 6));
        bytes[1] = (char)(0x80 | (code & 0x3F));
        count = 2;
    } else if (code < 0x10000) {
        bytes[0] = (char)(0xE0 | (code >> 12));
        bytes[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        bytes[2] = (char)(0x80 | (code & 0x3F));
        count = 3;
    } else {
        bytes[0] = (char)(0xF0 | (code >> 18));
        bytes[1] = (char)(0x80 | ((code >> 12) & 0x3F));
        bytes[2] = (char)(0x80 | ((code >> 6) & 0x3F));
        bytes[3] = (char)(0x80 | (code & 0x3F));
        count = 4;
    }
    for (int i = 0; i < count; i++)
        if (!put(buffer, size, used, bytes[i]))
            return false;
    return true;
}

/* A \u escape (the reader after the 'u'), surrogate pairs joined. */
static bool read_unicode_escape(gm_json_reader *reader, char *buffer, size_t size, size_t *used)
{
    long code = code_unit(reader);
    if (code < 0)
        return gm_json_fail(reader, "bad \\u escape");
    if (code >= 0xD800 && code <= 0xDBFF) {
        if (reader->length - reader->position < 2 || reader->text[reader->position] != '\\' ||
            reader->text[reader->position + 1] != 'u')
            return gm_json_fail(reader, "unpaired surrogate in a \\u escape");
        reader->position += 2;
        long low = code_unit(reader);
        if (low < 0xDC00 || low > 0xDFFF)
            return gm_json_fail(reader, "unpaired surrogate in a \\u escape");
        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    } else if (code >= 0xDC00 && code <= 0xDFFF) {
        return gm_json_fail(reader, "unpaired surrogate in a \\u escape");
    }
    if (!put_utf8(buffer, size, used, (unsigned long)code))
        return gm_json_fail(reader, "string too long");
    return true;
}

/* A string into buffer (NULL: check and skip it). */
static bool read_string(gm_json_reader *reader, char *buffer, size_t size)
{
    if (!expect(reader, '"', "expected a string"))
        return false;
    size_t used = 0;
    for (;;) {
        if (reader->position >= reader->length)
            return gm_json_fail(reader, "unterminated string");
        char c = reader->text[reader->position++];
        if (c == '"')
            break;
        if ((unsigned char)c < 0x20)
            return gm_json_fail(reader, "control character in a string");
        if (c == '\\') {
            if (reader->position >= reader->length)
                return gm_json_fail(reader, "unterminated string");
            char escaped = reader->text[reader->position++];
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *known = escaped ? strchr(from, escaped) : NULL;
            if (known)
                c = to[known - from];
            else if (escaped == 'u') {
                if (!read_unicode_escape(reader, buffer, size, &used))
                    return false;
                continue;
            } else
                return gm_json_fail(reader, "bad escape in a string");
        }
        if (!put(buffer, size, &used, c))
            return gm_json_fail(reader, "string too long");
    }
    if (buffer)
        buffer[used] = '\0';
    return true;
}

bool gm_json_read_string(gm_json_reader *reader, char *buffer, size_t size)
{
    if (!buffer || size == 0)
        return gm_json_fail(reader, "no room for a string");
    return read_string(reader, buffer, size);
}

bool gm_json_read_uint64(gm_json_reader *reader, uint64_t *value_out)
{
    if (reader->failed)
        return false;
    char c = peek(reader);
    if (c < '0' || c > '9')
        return gm_json_fail(reader, "expected a non-negative integer");
    uint64_t value = 0;
    size_t start = reader->position;
    while (reader->position < reader->length && reader->text[reader->position] >= '0' &&
           reader->text[reader->position] <= '9') {
        unsigned digit = (unsigned)(reader->text[reader->position] - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return gm_json_fail(reader, "integer too large");
        value = value * 10 + digit;
        reader->position++;
    }
    if (reader->position - start > 1 && reader->text[start] == '0') {
        reader->position = start;
        return gm_json_fail(reader, "leading zero in a number");
    }
    if (reader->position < reader->length && strchr(".eE", reader->text[reader->position]) &&
        reader->text[reader->position]) {
        reader->position = start;
        return gm_json_fail(reader, "expected a non-negative integer");
    }
    *value_out = value;
    return true;
}

static bool literal(gm_json_reader *reader, const char *word)
{
    size_t length = strlen(word);
    if (reader->length - reader->position < length || memcmp(reader->text + reader->position, word, length) != 0)
        return false;
    reader->position += length;
    return true;
}

bool gm_json_read_bool(gm_json_reader *reader, bool *value_out)
{
    if (reader->failed)
        return false;
    peek(reader);
    if (literal(reader, "true"))
        *value_out = true;
    else if (literal(reader, "false"))
        *value_out = false;
    else
        return gm_json_fail(reader, "expected true or false");
    return true;
}

/* A number of any form (JSON's grammar). */
static bool skip_number(gm_json_reader *reader)
{
    const char *text = reader->text;
    size_t at = reader->position, end = reader->length;
    if (at < end && text[at] == '-')
        at++;
    if (at >= end || text[at] < '0' || text[at] > '9')
        return gm_json_fail(reader, "expected a value");
    if (text[at] == '0')
        at++;
    else
        while (at < end && text[at] >= '0' && text[at] <= '9')
            at++;
    if (at < end && text[at] == '.') {
        at++;
        if (at >= end || text[at] < '0' || text[at] > '9')
            return gm_json_fail(reader, "bad number");
        while (at < end && text[at] >= '0' && text[at] <= '9')
            at++;
    }
    if (at < end && (text[at] == 'e' || text[at] == 'E')) {
        at++;
        if (at < end && (text[at] == '+' || text[at] == '-'))
            at++;
        if (at >= end || text[at] < '0' || text[at] > '9')
            return gm_json_fail(reader, "bad number");
        while (at < end && text[at] >= '0' && text[at] <= '9')
            at++;
    }
    reader->position = at;
    return true;
}

static bool skip(gm_json_reader *reader, int depth)
{
    if (reader->failed)
        return false;
    if (depth > MAXIMUM_DEPTH)
        return gm_json_fail(reader, "nested too deeply");
    char c = peek(reader);
    if (c == '{') {
        gm_json_begin_object(reader);
        while (next_item(reader, '}')) {
            if (peek(reader) != '"')
                return gm_json_fail(reader, "expected a key (a string)");
            if (!read_string(reader, NULL, 0) || !expect(reader, ':', "expected ':' after a key") ||
                !skip(reader, depth + 1))
                return false;
        }
        return !reader->failed;
    }
    if (c == '[') {
        gm_json_begin_array(reader);
        while (next_item(reader, ']'))
            if (!skip(reader, depth + 1))
                return false;
        return !reader->failed;
    }
    if (c == '"')
        return read_string(reader, NULL, 0);
    if (literal(reader, "true") || literal(reader, "false") || literal(reader, "null"))
        return true;
    if (c == '\0')
        return gm_json_fail(reader, "unexpected end of the text");
    return skip_number(reader);
}

bool gm_json_skip_value(gm_json_reader *reader)
{
    return skip(reader, 0);
}

bool gm_json_end(gm_json_reader *reader)
{
    if (reader->failed)
        return false;
    if (peek(reader) != '\0' || reader->position < reader->length)
        return gm_json_fail(reader, "unexpected text after the end");
    return true;
}
