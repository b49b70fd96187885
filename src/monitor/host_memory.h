/*
 * host_memory.h -- the host's memory, a process tree's and a process's memory cgroup, as Linux reports
 * them under /proc and /sys/fs/cgroup.
 *
 * Every reading goes through a root directory ("/" on a live machine), so that tests can point the
 * readers at a fixture tree of /proc and /sys files. Values the kernel does not give (an old kernel
 * without PSI, a process whose smaps_rollup is not readable, a cgroup without a memory.high file) are
 * -1, never a guess.
 */
#ifndef GM_HOST_MEMORY_H
#define GM_HOST_MEMORY_H

#include "gpumem.h"

#include <stdbool.h>
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

/* The first line of the file `path` under `root` ("/" or NULL for this machine), without its newline,
 * cut to `size` - 1 characters; false if the file is unreadable or empty. */
bool gm_read_first_line(const char *root, const char *path, char *buffer, size_t size);

/* The integer at the start of such a file's first line (a sysctl, memory.current); false if the file
 * is unreadable or does not start with a number. */
bool gm_read_integer_file(const char *root, const char *path, int64_t *value);

/* Which cgroup hierarchy a process's memory readings come from. */
typedef enum gm_cgroup_version {
    GM_CGROUP_NONE = 0, /* neither: no v1 memory cgroup, and no v2 cgroup whose memory.max reads (the v2
                           root cgroup has none; nor has a cgroup without the memory controller) */
    GM_CGROUP_V1 = 1,   /* the v1 hierarchy with the memory controller */
    GM_CGROUP_V2 = 2    /* the unified hierarchy; preferred when both are listed and its memory.max reads */
} gm_cgroup_version;

#define GM_CGROUP_PATH_SIZE 1024
#define GM_CGROUP_FILE_SIZE 1200

/* A process's memory cgroup. Each reading has a flag, true when its file was read and held a number
 * (or "max"); a reading not known is -1, and so is a limit that is not set. The byte readings are the
 * kernel's: memory.current counts the page cache too, and may exceed memory.high (which throttles)
 * but not memory.max (where the OOM killer strikes). */
typedef struct gm_cgroup_memory {
    gm_cgroup_version version;
    bool v2_listed;                     /* /proc/PID/cgroup has a v2 line ("0::PATH"), whatever version is */
    char path[GM_CGROUP_PATH_SIZE];     /* the cgroup as /proc/PID/cgroup names it, "/" for the root
                                           cgroup: the v1 memory line's for V1, else the v2 line's ("/"
                                           without one) */
    char max_file[GM_CGROUP_FILE_SIZE]; /* where max_bytes is read, relative to the root: the cgroup's
                                           memory.max (v2, and NONE), memory.limit_in_bytes (v1) */
    char current_file[GM_CGROUP_FILE_SIZE]; /* memory.current (v2, and NONE), memory.usage_in_bytes (v1) */
    int64_t max_bytes;      /* the hard limit; -1 for "max" (v2), v1's "no limit" (2^62 and up), or unknown */
    int64_t high_bytes;     /* memory.high, the throttling limit (v2 only); -1 for "max" or unknown */
    int64_t current_bytes;  /* memory in use, charged to the cgroup; -1 unknown */
    int64_t swap_max_bytes; /* memory.swap.max (v2 only); -1 for "max" or unknown */
    bool max_known, high_known, current_known, swap_max_known;
} gm_cgroup_memory;

/* Read the memory cgroup of process `pid` (0: /proc/self) under `root` ("/" or NULL for this machine):
 * /proc/PID/cgroup names the cgroup, /sys/fs/cgroup/PATH (v2) or /sys/fs/cgroup/memory/PATH (v1) holds
 * its files. GM_ERROR_IO when /proc/PID/cgroup is unreadable (the process is gone, or the root holds no
 * such file); GM_ERROR_INVALID_ARGUMENT for a negative pid or a NULL cgroup_out. A cgroup without a
 * limit, or no memory cgroup at all, is GM_OK with the readings at -1: it is the normal case on a host. */
gm_status gm_cgroup_memory_read(const char *root, long pid, gm_cgroup_memory *cgroup_out);

/* The limit the cgroup's memory meets first: the lower of memory.max and memory.high among those known
 * and set; -1 when neither is. */
int64_t gm_cgroup_memory_limit(const gm_cgroup_memory *cgroup);

#endif
