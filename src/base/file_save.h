/*
 * file_save.h -- saving an output file whole or not at all.
 *
 * A regular file (or a new one) is written to a temporary file beside it and renamed over it, so that
 * a write that fails half-way (a full disk, a size limit) leaves the earlier file as it was and no
 * partial one; through a symbolic link, the file it names is replaced. A device or a pipe
 * (/dev/stdout, a FIFO) is written directly: there is nothing to replace. Used by the command-line
 * tools (reports, snapshots, histories), never by the library, which writes no files of its own.
 */
#ifndef GM_FILE_SAVE_H
#define GM_FILE_SAVE_H

#include "gpumem.h"

#include <stdio.h>

/* Writes the content to `out`; stdio errors are found by the caller through ferror. */
typedef void (*gm_file_writer)(FILE *out, const void *context);

/* GM_OK, or GM_ERROR_IO with "cannot write the WHAT to 'PATH': reason". */
gm_status gm_file_save(const char *path, const char *what, gm_file_writer write, const void *context);

#endif
