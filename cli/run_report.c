/*
 * run_report.c -- what `gpumem run --report FILE` and `gpumem run --tune` make of the command's history.
 *
 * The command's allocators kept a history ring (run_command.c adds history:N to GPUMEM_CONF) and
 * gpumem's Python package wrote it at exit, one file per process and device, into the run's output
 * folder (history.<pid>.<device>.json). The report is made from the largest of them -- the busiest
 * allocator -- by the same code as `gpumem report HISTORY -o FILE`, and the tuning by `gpumem tune
 * HISTORY`; the others are named.
 */
#include "run_report.h"

#include "commands.h"
#include "tools/json_formats.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NO_HISTORY "the command wrote no gpumem history (only a PyTorch program using gpumem through gpumem run " \
                   "writes one at exit)"

/* The largest history file in `folder` into `path`, and how many there are. */
static int largest_history(const char *folder, char *path, size_t size)
{
    DIR *listing = opendir(folder);
    if (!listing)
        return 0;
    int count = 0;
    off_t largest = -1;
    struct dirent *entry;
    char candidate[4096];
    while ((entry = readdir(listing))) {
        size_t length = strlen(entry->d_name);
        if (strncmp(entry->d_name, "history.", 8) != 0 || length < 5 || strcmp(entry->d_name + length - 5, ".json"))
            continue;
        snprintf(candidate, sizeof candidate, "%s/%s", folder, entry->d_name);
        struct stat status;
        if (stat(candidate, &status) != 0)
            continue;
        count++;
        if (status.st_size > largest) {
            largest = status.st_size;
            snprintf(path, size, "%s", candidate);
        }
    }
    closedir(listing);
    return count;
}

/* largest_history, or 0 after saying on stderr that there is none: "gpumem run: `nothing`: ...". */
static int busiest_history(const char *folder, char *path, size_t size, const char *nothing)
{
    int count = largest_history(folder, path, size);
    if (count == 0)
        fprintf(stderr, "gpumem run: %s: " NO_HISTORY "\n", nothing);
    return count;
}

int gm_run_report(const char *folder, const char *report_path)
{
    char history[4096];
    int count = busiest_history(folder, history, sizeof history, "no report");
    if (count == 0)
        return GM_EXIT_ERROR;
    if (count > 1)
        fprintf(stderr, "gpumem run: %d allocators wrote a history; the report shows the busiest (%s)\n", count,
                strrchr(history, '/') + 1);
    char *arguments[] = {history, "-o", (char *)report_path, NULL};
    int status = gm_command_report(3, arguments);
    if (status == GM_EXIT_OK)
        fprintf(stderr, "gpumem run: report written to %s\n", report_path);
    return status;
}

/* What the device left the command's allocator: from the snapshot written beside `history`
 * (snapshot.<pid>.<device>.json), the device's free memory at exit and what the allocator still held
 * then, in whole MiB; 0 when there is no such snapshot. A memory limit the program set itself
 * (torch.cuda.set_per_process_memory_fraction) is not in the snapshot: the run's --conf and GPUMEM_CONF
 * reach gpumem tune, a limit given there applies. */
static uint64_t room_of_run(const char *history)
{
    char path[4096];
    const char *name = strrchr(history, '/') + 1;
    snprintf(path, sizeof path, "%.*ssnapshot.%s", (int)(name - history), history, name + strlen("history."));
    gm_input_file input;
    uint64_t room = 0;
    gm_snapshot *snapshot = NULL;
    if (gm_input_open(path, &input) == GM_OK && input.kind == GM_INPUT_SNAPSHOT &&
        gm_snapshot_parse(&input, &snapshot) == GM_OK) {
        room = snapshot->device.free_bytes + (uint64_t)snapshot->stats.reserved_bytes[GM_POOL_ALL].current;
        room = room < snapshot->device.total_bytes ? room : snapshot->device.total_bytes;
        gm_snapshot_file_free(snapshot);
    }
    gm_input_close(&input);
    return room >> 20;
}

int gm_run_tune(const char *folder, const char *conf)
{
    char history[4096];
    int count = busiest_history(folder, history, sizeof history, "nothing to tune");
    if (count == 0)
        return GM_EXIT_ERROR;
    uint64_t room_mib = room_of_run(history);
    char capacity[32];
    snprintf(capacity, sizeof capacity, "%" PRIu64 "MiB", room_mib);
    fprintf(stderr, "\ngpumem run: this run's allocations%s%s%s under each configuration (gpumem tune), on a "
            "simulated device of %s\n", count > 1 ? " (the busiest allocator's, " : "",
            count > 1 ? strrchr(history, '/') + 1 : "", count > 1 ? ")" : "",
            room_mib ? capacity : "an H200's size (the command left no snapshot to read its GPU's from)");
    if (room_mib)
        fprintf(stderr, "  (what the GPU left the command: its free memory at exit and what gpumem held then)\n");
    /* gpumem tune prints on standard output, which is the command's: here it goes to standard error, as
     * everything else gpumem run says does. */
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    if (saved >= 0)
        dup2(STDERR_FILENO, STDOUT_FILENO);
    char *arguments[6] = {history};
    int argument_count = 1;
    if (room_mib) {
        arguments[argument_count++] = "--capacity";
        arguments[argument_count++] = capacity;
    }
    if (conf) {
        arguments[argument_count++] = "--conf";
        arguments[argument_count++] = (char *)conf;
    }
    int status = gm_command_tune(argument_count, arguments);
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, STDOUT_FILENO);
        close(saved);
    }
    return status;
}

void gm_run_report_cleanup(const char *folder)
{
    DIR *listing = opendir(folder);
    if (listing) {
        struct dirent *entry;
        char path[4096];
        while ((entry = readdir(listing)))
            if (strcmp(entry->d_name, ".") && strcmp(entry->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
                unlink(path);
            }
        closedir(listing);
    }
    rmdir(folder);
}
