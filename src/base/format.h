/*
 * format.h -- human-readable numbers for reports.
 */
#ifndef GM_FORMAT_H
#define GM_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* "20.00 MiB", "512 B", "1.50 GiB": two decimals, binary units. Returns buffer. */
char *gm_format_bytes(char *buffer, size_t size, uint64_t bytes);

#endif
