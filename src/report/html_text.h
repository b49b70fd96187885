/*
 * html_text.h -- text into the HTML report: every string that may come from input (file names, device
 * and backend names read from a snapshot) goes through gm_html_escape, and numbers are written in the
 * few forms the report uses.
 */
#ifndef GM_HTML_TEXT_H
#define GM_HTML_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* `text` with & < > " ' as character references and control characters other than newline and tab as
 * U+FFFD: safe in element content and in quoted attribute values. NULL writes nothing. */
void gm_html_escape(FILE *out, const char *text);

/* "11.00 GiB". */
const char *gm_html_bytes(char *buffer, size_t size, uint64_t bytes);
/* "11,813,257,216". */
const char *gm_html_grouped(char *buffer, size_t size, uint64_t value);

#endif
