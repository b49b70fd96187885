/*
 * file_save.c -- saving an output file whole or not at all (file_save.h).
 *
 * The temporary file is made by mkstemp beside the target (so that rename stays on one file system)
 * with the permissions a plain fopen would give (0666 less the umask); it is removed on any failure.
 */
#include "base/file_save.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes through `out` and closes it: 0, or the errno of the first failure. */
static int write_and_close(FILE *out, gm_file_writer write, const void *context, int error)
{
    write(out, context);
    if (fflush(out) != 0 || ferror(out))
        error = error ? error : errno ? errno : EIO;
    if (fclose(out) != 0 && !error)
        error = errno;
    return error;
}

/* Straight into a device or pipe: nothing there to replace atomically. */
static gm_status write_directly(const char *path, const char *what, gm_file_writer write, const void *context)
{
    FILE *out = fopen(path, "w");
    int error = out ? write_and_close(out, write, context, 0) : errno;
    return error ? gm_fail(GM_ERROR_IO, "cannot write the %s to '%s': %s", what, path, strerror(error)) : GM_OK;
}

/* To `target` (a regular file or none yet) through a temporary file beside it, renamed over it. */
static gm_status write_replacing(const char *path, const char *target, const char *what, gm_file_writer write,
                                 const void *context)
{
    size_t length = strlen(target);
    char *temporary = gm_system_malloc(length + 16);
    if (!temporary)
        return gm_fail(GM_ERROR_IO, "cannot write the %s to '%s': no host memory", what, path);
    snprintf(temporary, length + 16, "%s.tmp.XXXXXX", target);
    int descriptor = mkstemp(temporary);
    if (descriptor < 0) {
        int error = errno;
        free(temporary);
        return gm_fail(GM_ERROR_IO, "cannot write the %s to '%s': %s", what, path, strerror(error));
    }
    mode_t mask = umask(0);
    umask(mask);
    int error = fchmod(descriptor, 0666 & ~mask) != 0 ? errno : 0;
    FILE *out = fdopen(descriptor, "w");
    if (!out) {
        error = errno;
        close(descriptor);
    } else {
        error = write_and_close(out, write, context, error);
    }
    if (!error && rename(temporary, target) != 0)
        error = errno;
    if (error)
        unlink(temporary);
    free(temporary);
    return error ? gm_fail(GM_ERROR_IO, "cannot write the %s to '%s': %s", what, path, strerror(error)) : GM_OK;
}

gm_status gm_file_save(const char *path, const char *what, gm_file_writer write, const void *context)
{
    struct stat status;
    if (stat(path, &status) != 0) /* a new file */
        return write_replacing(path, path, what, write, context);
    if (S_ISDIR(status.st_mode))
        return gm_fail(GM_ERROR_IO, "cannot write the %s to '%s': it is a directory", what, path);
    if (!S_ISREG(status.st_mode))
        return write_directly(path, what, write, context);
    char *target = realpath(path, NULL); /* through a symbolic link, replace the file it names */
    if (!target)
        return gm_fail(GM_ERROR_IO, "cannot write the %s to '%s': %s", what, path, strerror(errno));
    gm_status result = write_replacing(path, target, what, write, context);
    free(target);
    return result;
}
