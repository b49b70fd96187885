/*
 * host_memory.c -- the host's memory (meminfo, memory pressure) and a process tree's (smaps_rollup).
 *
 * A process's own numbers come from /proc/PID/smaps_rollup, which gives the proportional set size
 * (PSS): the fair share of pages shared with other processes. It is the number that adds up across
 * a trainer and its DataLoader workers, whose copy-on-write pages RSS counts once per worker. Where
 * smaps_rollup cannot be read (another user's process, an old kernel) RSS and swap come from
 * /proc/PID/status and PSS is -1.
 *
 * The tree: every /proc/PID/stat names its parent; one pass over /proc collects (pid, parent) pairs
 * and the descendants of a process are found by repeatedly marking the children of marked ones.
 */
#include "monitor/host_memory.h"

#include "base/error.h"

#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void path_under(char *buffer, size_t size, const char *root, const char *path)
{
    if (!root || !*root || !strcmp(root, "/"))
        root = "";
    snprintf(buffer, size, "%s%s", root, path);
}

/* "Key: N kB" in an open file, in bytes; -1 if absent. */
static int64_t kilobytes_of(FILE *file, const char *key)
{
    char line[256];
    size_t key_length = strlen(key);
    rewind(file);
    while (fgets(line, sizeof line, file))
        if (!strncmp(line, key, key_length) && line[key_length] == ':')
            return strtoll(line + key_length + 1, NULL, 10) * 1024;
    return -1;
}

/* "some avg10=A avg60=B ..." lines of a pressure file. */
static void read_pressure(const char *root, gm_host_memory *memory)
{
    char path[4096], line[256];
    path_under(path, sizeof path, root, "/proc/pressure/memory");
    FILE *file = fopen(path, "r");
    if (!file)
        return;
    while (fgets(line, sizeof line, file)) {
        double average10, average60;
        if (sscanf(line + 4, " avg10=%lf avg60=%lf", &average10, &average60) != 2)
            continue;
        if (!strncmp(line, "some", 4)) {
            memory->pressure_some_avg10 = average10;
            memory->pressure_some_avg60 = average60;
        } else if (!strncmp(line, "full", 4)) {
            memory->pressure_full_avg10 = average10;
            memory->pressure_full_avg60 = average60;
        }
    }
    fclose(file);
}

gm_status gm_host_memory_read(const char *root, gm_host_memory *memory_out)
{
    if (!memory_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_host_memory_read: memory_out is NULL");
    char path[4096];
    path_under(path, sizeof path, root, "/proc/meminfo");
    FILE *file = fopen(path, "r");
    if (!file)
        return gm_fail(GM_ERROR_IO, "cannot read %s", path);
    gm_host_memory memory = {
        .total_bytes = kilobytes_of(file, "MemTotal"),
        .available_bytes = kilobytes_of(file, "MemAvailable"),
        .swap_total_bytes = kilobytes_of(file, "SwapTotal"),
        .swap_free_bytes = kilobytes_of(file, "SwapFree"),
        .pressure_some_avg10 = -1, .pressure_some_avg60 = -1,
        .pressure_full_avg10 = -1, .pressure_full_avg60 = -1,
    };
    fclose(file);
    if (memory.total_bytes < 0)
        return gm_fail(GM_ERROR_IO, "%s has no MemTotal line", path);
    read_pressure(root, &memory);
    *memory_out = memory;
    return GM_OK;
}

/* One process's own RSS, PSS and swap; false if it is gone. */
static bool read_one_process(const char *root, long pid, int64_t *rss, int64_t *pss, int64_t *swap)
{
    char relative[64], path[4096];
    snprintf(relative, sizeof relative, "/proc/%ld/smaps_rollup", pid);
    path_under(path, sizeof path, root, relative);
    FILE *file = fopen(path, "r");
    if (file) {
        *rss = kilobytes_of(file, "Rss");
        *pss = kilobytes_of(file, "Pss");
        *swap = kilobytes_of(file, "Swap");
        fclose(file);
        if (*rss >= 0)
            return true;
    }
    snprintf(relative, sizeof relative, "/proc/%ld/status", pid);
    path_under(path, sizeof path, root, relative);
    file = fopen(path, "r");
    if (!file)
        return false;
    *rss = kilobytes_of(file, "VmRSS");
    *swap = kilobytes_of(file, "VmSwap");
    *pss = -1;
    fclose(file);
    return true;
}


/* The parent named in /proc/PID/stat: "PID (COMM) STATE PPID ...", COMM may hold anything. */
long gm_process_parent(const char *root, long pid)
{
    char relative[64], path[4096], line[1024];
    snprintf(relative, sizeof relative, "/proc/%ld/stat", pid);
    path_under(path, sizeof path, root, relative);
    FILE *file = fopen(path, "r");
    if (!file)
        return -1;
    size_t length = fread(line, 1, sizeof line - 1, file);
    fclose(file);
    line[length] = '\0';
    char *after_name = strrchr(line, ')');
    long parent = -1;
    if (!after_name || sscanf(after_name + 1, " %*c %ld", &parent) != 1)
        return -1;
    return parent;
}

gm_process_link *gm_process_list(const char *root, size_t *count_out)
{
    char path[4096];
    path_under(path, sizeof path, root, "/proc");
    *count_out = 0;
    DIR *directory = opendir(path);
    if (!directory)
        return NULL;
    size_t count = 0, capacity = 0;
    gm_process_link *links = NULL;
    struct dirent *entry;
    while ((entry = readdir(directory))) {
        if (!isdigit((unsigned char)entry->d_name[0]))
            continue;
        long pid = strtol(entry->d_name, NULL, 10);
        long parent = gm_process_parent(root, pid);
        if (parent < 0)
            continue;
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 256;
            gm_process_link *grown = realloc(links, capacity * sizeof *links);
            if (!grown)
                break;
            links = grown;
        }
        links[count++] = (gm_process_link){pid, parent};
    }
    closedir(directory);
    *count_out = count;
    return links;
}

/* Mark (in_tree[i]) the descendants of `pid`, a generation per pass, until a pass marks none. */
static void mark_descendants(const gm_process_link *links, bool *in_tree, size_t count, long pid)
{
    for (bool marked = true; marked;) {
        marked = false;
        for (size_t i = 0; i < count; i++) {
            if (in_tree[i])
                continue;
            bool parent_in_tree = links[i].parent == pid;
            for (size_t j = 0; j < count && !parent_in_tree; j++)
                parent_in_tree = in_tree[j] && links[j].pid == links[i].parent;
            if (parent_in_tree)
                in_tree[i] = marked = true;
        }
    }
}

static void add_known(int64_t *sum, int64_t value)
{
    if (value < 0 || *sum < 0)
        *sum = -1;
    else
        *sum += value;
}

gm_status gm_process_memory_read(const char *root, long pid, gm_process_memory *memory_out)
{
    if (!memory_out || pid <= 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_process_memory_read: bad pid or memory_out is NULL");
    gm_process_memory memory = {0};
    if (!read_one_process(root, pid, &memory.rss_bytes, &memory.pss_bytes, &memory.swap_bytes))
        return gm_fail(GM_ERROR_IO, "process %ld is gone", pid);
    memory.tree_rss_bytes = memory.rss_bytes;
    memory.tree_pss_bytes = memory.pss_bytes;
    memory.tree_swap_bytes = memory.swap_bytes;
    size_t count = 0;
    gm_process_link *links = gm_process_list(root, &count);
    bool *in_tree = calloc(count ? count : 1, sizeof *in_tree);
    if (in_tree)
        mark_descendants(links, in_tree, count, pid);
    for (size_t i = 0; i < count && in_tree; i++) {
        int64_t rss, pss, swap;
        if (!in_tree[i] || !read_one_process(root, links[i].pid, &rss, &pss, &swap))
            continue;
        memory.descendants++;
        add_known(&memory.tree_rss_bytes, rss);
        add_known(&memory.tree_pss_bytes, pss);
        add_known(&memory.tree_swap_bytes, swap);
    }
    free(in_tree);
    free(links);
    *memory_out = memory;
    return GM_OK;
}
