/*
 * region.c -- where published-statistics regions live and how they are named.
 *
 * One name for writer and readers: <directory>/gpumem.<uid>.<pid>.<device>, the directory being
 * GPUMEM_SHM_DIR when set (tests point it at a temporary folder) and /dev/shm otherwise. The uid in
 * the name keeps users apart; readers still check the file's owner, since anyone may create a file
 * of any name in /dev/shm.
 */
#include "monitor/region.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *gm_region_directory(void)
{
    const char *directory = getenv("GPUMEM_SHM_DIR");
    return directory && *directory ? directory : GM_REGION_DEFAULT_DIRECTORY;
}

bool gm_region_path(char *buffer, size_t size, long pid, int device)
{
    int length = snprintf(buffer, size, "%s/" GM_REGION_NAME_PREFIX "%u.%ld.%d", gm_region_directory(),
                          (unsigned)getuid(), pid, device);
    return length > 0 && (size_t)length < size;
}
