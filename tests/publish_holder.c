/*
 * publish_holder.c -- a process for test_stats_cli.sh to look at from outside: it allocates the
 * sizes given as arguments on the sim backend with publish:true, prints its pid and region path on
 * one line, then sleeps until it is killed (SIGKILL, so it cannot remove its region). With
 * HOLDER_CHILD_BYTES=N it first starts a child (as a DataLoader worker would be) that touches N bytes
 * of host memory and dies with its parent, for gpumem top's per-process-tree host memory. With
 * HOLDER_EXIT=leave it exits at once instead of sleeping, leaving its region behind (as a process that
 * never destroys its allocator does); with HOLDER_EXIT=destroy it frees the first allocation, destroys
 * the allocator half a second later (which removes the region) and exits: what `gpumem run` must still report.
 * Usage: publish_holder SIZE...
 */
#include "gpumem.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* Returns once the child has touched its memory. */
static void start_child(size_t bytes)
{
    pid_t parent = getpid();
    int ready[2];
    if (pipe(ready) != 0)
        return;
    if (fork() != 0) {
        char byte;
        close(ready[1]);
        if (read(ready[0], &byte, 1) != 1)
            fprintf(stderr, "publish_holder: the child did not start\n");
        close(ready[0]);
        return;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(0);
    volatile char *memory = malloc(bytes); /* volatile: the stores must happen, though nothing reads them */
    for (size_t offset = 0; memory && offset < bytes; offset += 4096)
        memory[offset] = 1;
    if (write(ready[1], "", 1) != 1)
        _exit(1);
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    const char *child_bytes = getenv("HOLDER_CHILD_BYTES");
    if (child_bytes)
        start_child((size_t)strtoull(child_bytes, NULL, 10));
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
    void *first = NULL;
    for (int i = 1; i < argc; i++) {
        void *pointer = NULL;
        if (gm_malloc(allocator, (size_t)strtoull(argv[i], NULL, 10), 0, &pointer) != GM_OK) {
            fprintf(stderr, "publish_holder: %s\n", gm_last_error());
            return 1;
        }
        if (i == 1)
            first = pointer;
    }
    printf("%ld %s\n", (long)getpid(), path);
    fflush(stdout);
    const char *exit_mode = getenv("HOLDER_EXIT");
    if (exit_mode && !strcmp(exit_mode, "leave"))
        _exit(0);
    if (exit_mode && !strcmp(exit_mode, "destroy")) {
        usleep(500000); /* longer than gpumem run's look for new regions (every 50 ms) */
        gm_free(allocator, first);
        gm_destroy(allocator, NULL);
        return 0;
    }
    for (;;)
        pause();
}
