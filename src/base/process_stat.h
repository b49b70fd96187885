/*
 * process_stat.h -- the fields of /proc/PID/stat that gpumem reads: a process's parent (the process tree
 * of gpumem top and doctor, the descendants the descriptor broker serves) and its start time (a published
 * region older than the process of its pid is a dead writer's).
 */
#ifndef GM_PROCESS_STAT_H
#define GM_PROCESS_STAT_H

#include <stdbool.h>

typedef struct gm_process_stat {
    long parent;
    bool has_start;                /* false for a stat line cut short before the 22nd field */
    unsigned long long start_ticks; /* clock ticks (sysconf(_SC_CLK_TCK)) after boot, suspend included */
} gm_process_stat;

/* /proc/PID/stat under `root` (NULL, "" or "/": this machine's); false when it cannot be read or names
 * no parent. */
bool gm_process_stat_read(const char *root, long pid, gm_process_stat *stat_out);

#endif
