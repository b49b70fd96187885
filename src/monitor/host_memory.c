/*
 * host_memory.c -- the host's memory (meminfo, memory pressure), a process tree's (smaps_rollup) and a
 * process's memory cgroup (its limits and usage).
 *
 * A process's own numbers come from /proc/PID/smaps_rollup, which gives the proportional set size
 * (PSS): the fair share of pages shared with other processes. It is the number that adds up across
 * a trainer and its DataLoader workers, whose copy-on-write pages RSS counts once per worker. Where
 * smaps_rollup cannot be read (another user's process, an old kernel) RSS and swap come from
 * /proc/PID/status and PSS is -1.
 *
 * The tree: every /proc/PID/stat names its parent; one pass over /proc collects (pid, parent) pairs
 * and the descendants of a process are found by repeatedly marking the children of marked ones.
 *
 * The cgroup: /proc/PID/cgroup lists one line per hierarchy. Under cgroup v2 it is "0::PATH" and the
 * files are in /sys/fs/cgroup/PATH; under v1 the line whose controllers include "memory" names the
 * cgroup in /sys/fs/cgroup/memory. A hybrid host lists both; v2 is taken when its memory.max reads,
 * since there the memory controller is on v2 and the v1 line is a leftover. The v2 root cgroup has no
 * memory.max: a process there has no limit but the machine's.
 */
#include "monitor/host_memory.h"

#include "base/error.h"
#include "base/process_stat.h"
#include "base/system_memory.h"

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

/* "Key: N kB" in an open file, in bytes; -1 if absent, negative or too large to count in bytes. */
static int64_t kilobytes_of(FILE *file, const char *key)
{
    char line[256];
    size_t key_length = strlen(key);
    rewind(file);
    while (fgets(line, sizeof line, file))
        if (!strncmp(line, key, key_length) && line[key_length] == ':') {
            long long kilobytes = strtoll(line + key_length + 1, NULL, 10);
            return kilobytes >= 0 && kilobytes <= INT64_MAX / 1024 ? (int64_t)kilobytes * 1024 : -1;
        }
    return -1;
}

/* A process that has exited but not been waited for (state Z, or X while it goes) holds no memory, and
 * its status has no VmRSS line. */
static bool is_zombie(FILE *status)
{
    char line[256];
    rewind(status);
    while (fgets(line, sizeof line, status))
        if (!strncmp(line, "State:", 6)) {
            const char *state = line + 6 + strspn(line + 6, " \t");
            return *state == 'Z' || *state == 'X';
        }
    return false;
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
    if (*rss < 0 && is_zombie(file))
        *rss = *pss = *swap = 0;
    fclose(file);
    return true;
}


long gm_process_parent(const char *root, long pid)
{
    gm_process_stat stat;
    return gm_process_stat_read(root, pid, &stat) ? stat.parent : -1;
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
            gm_process_link *grown = gm_system_realloc(links, capacity * sizeof *links);
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
    bool *in_tree = gm_system_calloc(count ? count : 1, sizeof *in_tree);
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

/* ---------------------------------------------------------------- the memory cgroup */

bool gm_read_first_line(const char *root, const char *path, char *buffer, size_t size)
{
    char full[4096];
    path_under(full, sizeof full, root, path);
    FILE *file = fopen(full, "r");
    if (!file)
        return false;
    bool read = fgets(buffer, (int)size, file) != NULL;
    fclose(file);
    if (!read)
        return false;
    buffer[strcspn(buffer, "\n")] = '\0';
    return true;
}

bool gm_read_integer_file(const char *root, const char *path, int64_t *value)
{
    char line[128], *end;
    if (!gm_read_first_line(root, path, line, sizeof line))
        return false;
    long long parsed = strtoll(line, &end, 10);
    if (end == line)
        return false;
    *value = parsed;
    return true;
}

/* A limit file: "max" (v2) is -1, and so is a number of 2^62 or more (v1 shows "no limit" as the
 * largest page multiple below 2^63) or a negative one (no kernel writes it). False if unreadable or
 * not a number: then *bytes is left as it was. */
static bool read_limit_file(const char *root, const char *path, int64_t *bytes)
{
    char line[128];
    if (!gm_read_first_line(root, path, line, sizeof line))
        return false;
    if (!strncmp(line, "max", 3)) {
        *bytes = -1;
        return true;
    }
    char *end;
    long long value = strtoll(line, &end, 10);
    if (end == line)
        return false;
    *bytes = value >= (1ll << 62) || value < 0 ? -1 : value;
    return true;
}

/* The v2 line ("0::PATH") and the v1 memory line ("N:CONTROLLERS:PATH", CONTROLLERS including
 * "memory") of an open /proc/PID/cgroup; the last of each wins. The root cgroup's "/" becomes "". */
static void read_membership(FILE *file, bool *v2, char *v2_path, bool *v1, char *v1_path)
{
    char line[GM_CGROUP_PATH_SIZE];
    *v2 = *v1 = false;
    v2_path[0] = v1_path[0] = '\0';
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\n")] = '\0';
        char *first = strchr(line, ':'), *second = first ? strchr(first + 1, ':') : NULL;
        if (!first || !second)
            continue;
        if (!strncmp(line, "0::", 3)) {
            *v2 = true;
            snprintf(v2_path, GM_CGROUP_PATH_SIZE, "%s", second + 1);
            continue;
        }
        *second = '\0';
        char *saved = NULL;
        for (char *controller = strtok_r(first + 1, ",", &saved); controller; controller = strtok_r(NULL, ",", &saved))
            if (!strcmp(controller, "memory")) {
                *v1 = true;
                snprintf(v1_path, GM_CGROUP_PATH_SIZE, "%s", second + 1);
            }
    }
    if (!strcmp(v2_path, "/"))
        v2_path[0] = '\0';
    if (!strcmp(v1_path, "/"))
        v1_path[0] = '\0';
}

gm_status gm_cgroup_memory_read(const char *root, long pid, gm_cgroup_memory *cgroup_out)
{
    if (!cgroup_out || pid < 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_cgroup_memory_read: %s",
                       cgroup_out ? "the pid is negative" : "cgroup_out is NULL");
    char relative[64], path[4096];
    if (pid)
        snprintf(relative, sizeof relative, "/proc/%ld/cgroup", pid);
    else
        snprintf(relative, sizeof relative, "/proc/self/cgroup");
    path_under(path, sizeof path, root, relative);
    FILE *file = fopen(path, "r");
    if (!file)
        return gm_fail(GM_ERROR_IO, "cannot read %s", path);
    bool v2, v1;
    char v2_path[GM_CGROUP_PATH_SIZE], v1_path[GM_CGROUP_PATH_SIZE];
    read_membership(file, &v2, v2_path, &v1, v1_path);
    fclose(file);

    gm_cgroup_memory *cgroup = cgroup_out;
    memset(cgroup, 0, sizeof *cgroup);
    cgroup->v2_listed = v2;
    cgroup->max_bytes = cgroup->high_bytes = cgroup->current_bytes = cgroup->swap_max_bytes = -1;
    snprintf(cgroup->max_file, sizeof cgroup->max_file, "/sys/fs/cgroup%s/memory.max", v2_path);
    snprintf(cgroup->current_file, sizeof cgroup->current_file, "/sys/fs/cgroup%s/memory.current", v2_path);
    if (v2 && (cgroup->max_known = read_limit_file(root, cgroup->max_file, &cgroup->max_bytes))) {
        cgroup->version = GM_CGROUP_V2;
        char high_file[GM_CGROUP_FILE_SIZE], swap_file[GM_CGROUP_FILE_SIZE];
        snprintf(high_file, sizeof high_file, "/sys/fs/cgroup%s/memory.high", v2_path);
        snprintf(swap_file, sizeof swap_file, "/sys/fs/cgroup%s/memory.swap.max", v2_path);
        cgroup->high_known = read_limit_file(root, high_file, &cgroup->high_bytes);
        cgroup->current_known = gm_read_integer_file(root, cgroup->current_file, &cgroup->current_bytes);
        cgroup->swap_max_known = read_limit_file(root, swap_file, &cgroup->swap_max_bytes);
    } else if (v1) {
        cgroup->version = GM_CGROUP_V1;
        snprintf(cgroup->max_file, sizeof cgroup->max_file, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", v1_path);
        snprintf(cgroup->current_file, sizeof cgroup->current_file, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes",
                 v1_path);
        cgroup->max_known = read_limit_file(root, cgroup->max_file, &cgroup->max_bytes);
        cgroup->current_known = gm_read_integer_file(root, cgroup->current_file, &cgroup->current_bytes);
    }
    const char *named = cgroup->version == GM_CGROUP_V1 ? v1_path : v2_path;
    snprintf(cgroup->path, sizeof cgroup->path, "%s", named[0] ? named : "/");
    return GM_OK;
}

int64_t gm_cgroup_memory_limit(const gm_cgroup_memory *cgroup)
{
    int64_t limit = cgroup->max_known ? cgroup->max_bytes : -1;
    if (cgroup->high_known && cgroup->high_bytes >= 0 && (limit < 0 || cgroup->high_bytes < limit))
        limit = cgroup->high_bytes;
    return limit;
}
