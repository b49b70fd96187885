/*
 * process_stat.c -- see process_stat.h. The line is "PID (COMM) STATE PPID ... STARTTIME ...", and COMM
 * may hold anything, spaces and parentheses too: fields are counted from the last ')'.
 */
#include "base/process_stat.h"

#include <stdio.h>
#include <string.h>

bool gm_process_stat_read(const char *root, long pid, gm_process_stat *stat_out)
{
    char path[4096], line[1024];
    if (!root || !strcmp(root, "/"))
        root = "";
    snprintf(path, sizeof path, "%s/proc/%ld/stat", root, pid);
    FILE *file = fopen(path, "re");
    if (!file)
        return false;
    size_t length = fread(line, 1, sizeof line - 1, file);
    fclose(file);
    line[length] = '\0';
    const char *after_name = strrchr(line, ')');
    if (!after_name)
        return false;
    /* State (3), parent (4), then 5-8 signed, 9-15 unsigned, 16-21 signed, the start time (22). */
    int fields = sscanf(after_name + 1, " %*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                        "%*d %llu", &stat_out->parent, &stat_out->start_ticks);
    stat_out->has_start = fields == 2;
    return fields >= 1;
}
