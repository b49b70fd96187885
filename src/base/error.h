/*
 * error.h -- the thread-local detailed message behind gm_last_error().
 */
#ifndef GM_ERROR_H
#define GM_ERROR_H

#include "gpumem.h"

/* Record a detailed message for this thread and return `status`, so that a failing path reads
 * `return gm_fail(GM_ERROR_PARSE, "line %d: ...", line);`. */
gm_status gm_fail(gm_status status, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* Append a line to this thread's message (for multi-line reports such as the OOM report). */
void gm_error_append(const char *format, ...) __attribute__((format(printf, 1, 2)));

#endif
