/*
 * error.c -- status names and the per-thread detailed error message.
 *
 * Every failing path of the library records what went wrong, in words a user can act on, in a
 * thread-local buffer; gm_last_error() reads it. The buffer is fixed-size so that reporting an
 * error never allocates (an OOM report must work when memory is short).
 */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define GM_ERROR_MESSAGE_SIZE 8192

static _Thread_local char last_error_message[GM_ERROR_MESSAGE_SIZE];

const char *gm_strerror(gm_status status)
{
    switch (status) {
    case GM_OK: return "success";
    case GM_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case GM_ERROR_OUT_OF_MEMORY: return "out of memory";
    case GM_ERROR_INVALID_POINTER: return "invalid pointer";
    case GM_ERROR_BAD_CONFIG: return "bad configuration";
    case GM_ERROR_NO_DEVICE: return "no device";
    case GM_ERROR_DEVICE: return "device error";
    case GM_ERROR_NOT_SUPPORTED: return "not supported";
    case GM_ERROR_IO: return "input/output error";
    case GM_ERROR_PARSE: return "malformed input";
    case GM_ERROR_CORRUPT: return "inconsistent allocator state";
    case GM_ERROR_BUFFER_TOO_SMALL: return "buffer too small";
    }
    return "unknown status";
}

const char *gm_last_error(void)
{
    return last_error_message;
}

gm_status gm_fail(gm_status status, const char *format, ...)
{
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(last_error_message, sizeof last_error_message, format, arguments);
    va_end(arguments);
    return status;
}

void gm_error_append(const char *format, ...)
{
    size_t used = strlen(last_error_message);
    if (used + 1 >= sizeof last_error_message)
        return;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(last_error_message + used, sizeof last_error_message - used, format, arguments);
    va_end(arguments);
}
