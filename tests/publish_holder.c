/*
 * publish_holder.c -- a process for test_stats_cli.sh to look at from outside: it allocates the
 * sizes given as arguments on the sim backend with publish:true, prints its pid and region path on
 * one line, then sleeps until it is killed (SIGKILL, so it cannot remove its region). With
 * HOLDER_CHILD_BYTES=N it first starts a child (as a DataLoader worker would be) that touches N bytes
 * of host memory and dies with its parent, for gpumem top's per-process-tree host memory. With
 * HOLDER_EXIT=leave it exits at once instead of sleeping, leaving its region behind (as a process that
 * never destroys its allocator does); with HOLDER_EXIT=destroy it frees the first allocation, destroys
 * the allocator half a second later (which removes the region) and exits: what `gpumem run` must still report.
 * With HOLDER_PINNED_BYTES=N it also takes N bytes of pinned host memory (gm_host_malloc) and keeps them;
 * with HOLDER_PINNED_FREED_BYTES=M it takes M more and frees them, so that they stay idle in the pinned
 * cache (reserved, not allocated): what gpumem stats, top and the exporter must show of the host cache.
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

/* The pinned host allocations HOLDER_PINNED_BYTES and HOLDER_PINNED_FREED_BYTES ask for. */
static gm_status take_pinned(gm_allocator *allocator)
{
    const char *kept_bytes = getenv("HOLDER_PINNED_BYTES");
    const char *freed_bytes = getenv("HOLDER_PINNED_FREED_BYTES");
    void *kept = NULL, *freed = NULL;
    gm_status status = GM_OK;
    if (kept_bytes)
        status = gm_host_malloc(allocator, (size_t)strtoull(kept_bytes, NULL, 10), &kept);
    if (status == GM_OK && freed_bytes)
        status = gm_host_malloc(allocator, (size_t)strtoull(freed_bytes, NULL, 10), &freed);
    if (status == GM_OK && freed)
        status = gm_host_free(allocator, freed);
    return status;
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
    if (take_pinned(allocator) != GM_OK) {
        fprintf(stderr, "publish_holder: %s\n", gm_last_error());
        return 1;
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
