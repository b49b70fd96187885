/*
 * format.c -- human-readable numbers for reports (no allocation: callers pass the buffer).
 */
#include "base/format.h"

#include <inttypes.h>
#include <stdio.h>

char *gm_format_bytes(char *buffer, size_t size, uint64_t bytes)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}; /* 2^64 - 1 is 16 EiB */
    if (bytes < 1024) {
        snprintf(buffer, size, "%" PRIu64 " B", bytes);
        return buffer;
    }
    double value = (double)bytes / 1024.0;
    size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buffer, size, "%.2f %s", value, units[unit]);
    return buffer;
}
