/*
 * host_memory.h -- the host's memory and a process tree's, as Linux reports them under /proc.
 *
 * Every reading goes through a root directory ("/" on a live machine), so that tests can point the
 * readers at a fixture tree of /proc files. Values the kernel does not give (an old kernel without
 * PSI, a process whose smaps_rollup is not readable) are -1, never a guess.
 */
#ifndef GM_HOST_MEMORY_H
#define GM_HOST_MEMORY_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

/* /proc/meminfo and /proc/pressure/memory. */
typedef struct gm_host_memory {
    int64_t total_bytes;
    int64_t available_bytes; /* MemAvailable: what can be allocated without swapping */
    int64_t swap_total_bytes;
    int64_t swap_free_bytes;
    /* Memory pressure stall information: the share of the last 10 s / 60 s in which some task (or
     * every task: "full") waited for memory, in percent; -1 without PSI. */
    double pressure_some_avg10, pressure_some_avg60;
    double pressure_full_avg10, pressure_full_avg60;
} gm_host_memory;

/* A process and its descendants (DataLoader workers, for example). */
typedef struct gm_process_memory {
    int64_t rss_bytes;  /* resident: shared pages counted in full */
    int64_t pss_bytes;  /* proportional: shared pages divided among their sharers; -1 if unreadable */
    int64_t swap_bytes; /* swapped out */
    int64_t tree_rss_bytes, tree_pss_bytes, tree_swap_bytes; /* with every descendant */
    int descendants;    /* processes below it */
} gm_process_memory;

/* Read the host's memory under `root` ("/" or NULL for this machine). GM_ERROR_IO when meminfo is
 * unreadable; a missing pressure file only leaves the pressure readings at -1. */
gm_status gm_host_memory_read(const char *root, gm_host_memory *memory_out);

/* Read process `pid`'s memory and its descendants' under `root`. GM_ERROR_IO when the process is
 * gone. The readings of a descendant that exits meanwhile are left out. */
gm_status gm_process_memory_read(const char *root, long pid, gm_process_memory *memory_out);

/* A process and its parent. */
typedef struct gm_process_link {
    long pid, parent;
} gm_process_link;

/* Every process under root/proc with its parent, in directory order; *count_out entries. The array is
 * the caller's to free; NULL (and 0) when /proc cannot be listed. */
gm_process_link *gm_process_list(const char *root, size_t *count_out);

/* The parent of process `pid` under `root`, or -1 when it is gone. */
long gm_process_parent(const char *root, long pid);

#endif
