/*
 * run_report.c -- the report of `gpumem run --report FILE`.
 *
 * The command's allocators kept a history ring (run_command.c adds history:N to GPUMEM_CONF) and
 * gpumem's Python package wrote it at exit, one file per process and device, into the run's output
 * folder (history.<pid>.<device>.json). The report is made from the largest of them -- the busiest
 * allocator -- by the same code as `gpumem report HISTORY -o FILE`; the others are named, so that a
 * user can make theirs.
 */
#include "run_report.h"

#include "commands.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int gm_run_report(const char *folder, const char *report_path)
{
    char history[4096];
    int count = largest_history(folder, history, sizeof history);
    if (count == 0) {
        fprintf(stderr, "gpumem run: no report: the command wrote no gpumem history (only a PyTorch program "
                        "using gpumem through gpumem run writes one at exit)\n");
        return GM_EXIT_ERROR;
    }
    if (count > 1)
        fprintf(stderr, "gpumem run: %d allocators wrote a history; the report shows the busiest (%s)\n", count,
                strrchr(history, '/') + 1);
    char *arguments[] = {history, "-o", (char *)report_path, NULL};
    int status = gm_command_report(3, arguments);
    if (status == GM_EXIT_OK)
        fprintf(stderr, "gpumem run: report written to %s\n", report_path);
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
