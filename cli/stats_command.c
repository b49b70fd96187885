/*
 * stats_command.c -- gpumem stats PID and gpumem summary PID: another process's statistics, read
 * from the region it publishes (publish:true; src/monitor/published.c checks and reads it), as a list
 * or as the memory_summary table (gm_summary_of_stats).
 *
 * Prints every pool statistic (under torch.cuda.memory_stats() names such as
 * "allocated_bytes.all.current"), the counters, the device calls and the pinned host memory cache
 * (gm_host_malloc: page-locked host memory the process holds), as a table or one JSON object.
 * The names come from the library's own lists (gm_stat_name, gm_counter_name, gm_device_call_name),
 * never from a list here. Exit 1, with the reason, when the process has no region, is gone (a stale
 * region) or its region is refused (another owner, a symbolic link, wrong size, magic or layout).
 */
#include "gpumem.h"

#include "commands.h"
#include "core/statistics.h"
#include "monitor/published.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const pool_names[GM_POOL_COUNT] = {"all", "small_pool", "large_pool"};
static const char *const reading_names[4] = {"current", "peak", "allocated", "freed"};

static int64_t reading(const gm_stat *stat, int which)
{
    const int64_t readings[4] = {stat->current, stat->peak, stat->allocated, stat->freed};
    return readings[which];
}

static void print_json(gm_published *published)
{
    printf("{\"pid\": %ld, \"device\": %d, \"backend\": \"%s\", \"engine\": \"%s\", \"page_size\": %" PRIu64
           ", \"device_total_bytes\": %" PRIu64 ", \"start_time_ns\": %" PRId64,
           published->pid, published->device, published->backend, published->engine, published->page_size,
           published->device_total_bytes, published->start_time_ns);
    gm_stat *array;
    for (size_t i = 0; (array = gm_stats_array(&published->stats, i)); i++)
        for (int pool = 0; pool < GM_POOL_COUNT; pool++)
            for (int which = 0; which < 4; which++)
                printf(", \"%s.%s.%s\": %" PRId64, gm_stat_name(i), pool_names[pool], reading_names[which],
                       reading(&array[pool], which));
    int64_t *counter;
    for (size_t i = 0; (counter = gm_stats_counter(&published->stats, i)); i++)
        printf(", \"%s\": %" PRId64, gm_counter_name(i), *counter);
    for (size_t kind = 0; kind < gm_device_call_count(); kind++)
        printf(", \"device_calls.%s\": %" PRId64 ", \"device_call_ns.%s\": %" PRId64,
               gm_device_call_name((gm_device_call)kind), published->stats.device_calls[kind],
               gm_device_call_name((gm_device_call)kind), published->stats.device_call_ns_by_kind[kind]);
    printf(", \"device_call_ns\": %" PRId64, published->stats.device_call_ns);
    const gm_published_pinned_host *pinned = &published->pinned_host;
    printf(", \"pinned_host\": {\"allocated_bytes\": %" PRIu64 ", \"allocated_bytes_peak\": %" PRIu64
           ", \"reserved_bytes\": %" PRIu64 ", \"reserved_bytes_peak\": %" PRIu64 ", \"allocations\": %" PRIu64
           ", \"requested_bytes\": %" PRIu64 ", \"cache_hits\": %" PRIu64 ", \"cache_misses\": %" PRIu64
           ", \"host_frees\": %" PRIu64 ", \"pending_blocks\": %" PRIu64 ", \"limit_bytes\": %" PRIu64 "}}\n",
           pinned->allocated_bytes, pinned->allocated_bytes_peak, pinned->reserved_bytes, pinned->reserved_bytes_peak,
           pinned->allocations, pinned->requested_bytes, pinned->cache_hits, pinned->cache_misses, pinned->host_frees,
           pinned->pending_blocks, pinned->limit_bytes);
}

/* One line: page-locked host memory held by the process's pinned cache (gm_host_malloc). */
static void print_pinned_host_line(const gm_published_pinned_host *pinned)
{
    printf("\npinned host: %" PRIu64 " bytes reserved (peak %" PRIu64 "), %" PRIu64 " allocated in %" PRIu64
           " block%s, %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " pending", pinned->reserved_bytes,
           pinned->reserved_bytes_peak, pinned->allocated_bytes, pinned->allocations,
           pinned->allocations == 1 ? "" : "s", pinned->cache_hits, pinned->cache_misses, pinned->pending_blocks);
    if (pinned->limit_bytes)
        printf(", host_limit %" PRIu64, pinned->limit_bytes);
    printf("\n");
}

static void print_table(gm_published *published)
{
    time_t started = (time_t)(published->start_time_ns / 1000000000);
    char when[64] = "";
    struct tm utc;
    if (gmtime_r(&started, &utc))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
    printf("process %ld, device %d: %s backend, %s engine, %.1f MiB, publishing since %s\n\n", published->pid,
           published->device, published->backend, published->engine,
           (double)published->device_total_bytes / 1048576.0, when);
    printf("%-22s %-10s %18s %18s %18s\n", "statistic", "reading", pool_names[0], pool_names[1], pool_names[2]);
    gm_stat *array;
    for (size_t i = 0; (array = gm_stats_array(&published->stats, i)); i++)
        for (int which = 0; which < 4; which++)
            printf("%-22s %-10s %18" PRId64 " %18" PRId64 " %18" PRId64 "\n", which ? "" : gm_stat_name(i),
                   reading_names[which], reading(&array[0], which), reading(&array[1], which),
                   reading(&array[2], which));
    printf("\n");
    int64_t *counter;
    for (size_t i = 0; (counter = gm_stats_counter(&published->stats, i)); i++)
        printf("%-33s %18" PRId64 "\n", gm_counter_name(i), *counter);
    printf("\n%-22s %10s %18s\n", "device calls", "count", "ns");
    for (size_t kind = 0; kind < gm_device_call_count(); kind++)
        printf("%-22s %10" PRId64 " %18" PRId64 "\n", gm_device_call_name((gm_device_call)kind),
               published->stats.device_calls[kind], published->stats.device_call_ns_by_kind[kind]);
    print_pinned_host_line(&published->pinned_host);
}

static int usage(FILE *out, int status)
{
    fprintf(out, "usage: gpumem stats PID [--device N] [--json]\n"
                 "       gpumem summary PID [--device N]   (as torch.cuda.memory_summary())\n"
                 "  the statistics process PID publishes (it runs with publish:true; regions are in\n"
                 "  GPUMEM_SHM_DIR, default /dev/shm)\n");
    return status;
}

static int parse_whole_number(const char *text, long *value_out)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || end == text || *end || value < 0 || value > INT_MAX) /* pids and devices are ints */
        return 0;
    *value_out = value;
    return 1;
}

static void print_summary(const gm_published *published)
{
    static char table[16384];
    if (gm_summary_of_stats(&published->stats, published->backend, published->device, table, sizeof table, NULL) ==
        GM_OK)
        fputs(table, stdout);
}

/* gpumem stats (summary 0) or gpumem summary (summary 1). */
static int command(int argc, char **argv, int summary)
{
    long pid = -1, device = -1;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return usage(stdout, GM_EXIT_OK);
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--device")) {
            if (i + 1 >= argc || !parse_whole_number(argv[++i], &device)) {
                fprintf(stderr, "gpumem %s: --device needs a device index\n", summary ? "summary" : "stats");
                return GM_EXIT_USAGE;
            }
        } else if (pid < 0 && parse_whole_number(argv[i], &pid) && pid > 0) {
            continue;
        } else if (pid <= 0 && argv[i][0] != '-') {
            fprintf(stderr, "gpumem %s: '%s' is not a process id (a whole number above 0)\n",
                    summary ? "summary" : "stats", argv[i]);
            return usage(stderr, GM_EXIT_USAGE);
        } else {
            fprintf(stderr, "gpumem %s: unexpected argument '%s'\n", summary ? "summary" : "stats", argv[i]);
            return usage(stderr, GM_EXIT_USAGE);
        }
    }
    if (pid <= 0) {
        fprintf(stderr, "gpumem %s: which process? (a process id is missing)\n", summary ? "summary" : "stats");
        return usage(stderr, GM_EXIT_USAGE);
    }
    char path[4096];
    gm_published published;
    gm_status status = gm_published_find(pid, (int)device, path, sizeof path);
    if (status == GM_OK)
        status = gm_published_read(path, &published);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem %s: %s\n", summary ? "summary" : "stats", gm_last_error());
        return GM_EXIT_ERROR;
    }
    if (published.torn)
        fprintf(stderr, "gpumem %s: process %ld was killed inside an allocator call: that call may be counted in "
                "part\n", summary ? "summary" : "stats", published.pid);
    if (summary)
        print_summary(&published);
    else if (json)
        print_json(&published);
    else
        print_table(&published);
    return GM_EXIT_OK;
}

int gm_command_stats(int argc, char **argv)
{
    return command(argc, argv, 0);
}

int gm_command_summary(int argc, char **argv)
{
    return command(argc, argv, 1);
}
