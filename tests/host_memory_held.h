/*
 * host_memory_held.h -- how much of the host backend's physical memory this process holds: its memfd
 * descriptors and their mappings, read from /proc/self. A test compares it before an allocator is made
 * and after it is destroyed: nothing the backend made may outlive the allocator.
 */
#ifndef GM_TEST_HOST_MEMORY_HELD_H
#define GM_TEST_HOST_MEMORY_HELD_H

#include "test.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline int host_memory_held(void)
{
    int held = 0;
    DIR *descriptors = opendir("/proc/self/fd");
    REQUIRE(descriptors);
    for (struct dirent *entry; (entry = readdir(descriptors));) {
        char path[300], target[256] = {0};
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        if (readlink(path, target, sizeof target - 1) > 0 && strstr(target, "gpumem-physical"))
            held++;
    }
    closedir(descriptors);
    FILE *maps = fopen("/proc/self/maps", "r");
    REQUIRE(maps);
    for (char line[512]; fgets(line, sizeof line, maps);)
        held += strstr(line, "gpumem-physical") != NULL;
    fclose(maps);
    return held;
}

#endif
