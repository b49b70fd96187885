/*
 * publish_holder.c -- a process for test_stats_cli.sh to look at from outside: it allocates the
 * sizes given as arguments on the sim backend with publish:true, prints its pid and region path on
 * one line, then sleeps until it is killed (SIGKILL, so it cannot remove its region).
 * Usage: publish_holder SIZE...
 */
#include "gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    gm_allocator *allocator = NULL;
    if (gm_create("backend:sim,capacity:1GiB,publish:true", &allocator) != GM_OK) {
        fprintf(stderr, "publish_holder: %s\n", gm_last_error());
        return 1;
    }
    char path[4096];
    if (gm_publish_status(allocator, path, sizeof path) != GM_OK) {
        fprintf(stderr, "publish_holder: %s\n", gm_last_error());
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        void *pointer = NULL;
        if (gm_malloc(allocator, (size_t)strtoull(argv[i], NULL, 10), 0, &pointer) != GM_OK) {
            fprintf(stderr, "publish_holder: %s\n", gm_last_error());
            return 1;
        }
    }
    printf("%ld %s\n", (long)getpid(), path);
    fflush(stdout);
    for (;;)
        pause();
}
