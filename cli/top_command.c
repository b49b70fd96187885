/*
 * top_command.c -- gpumem top: every gpumem process of this user, live, from outside.
 *
 *   gpumem top [-d SECONDS] [--once] [--json]
 *
 * Each GPU has a row from its driver (NVML, loaded at run time): memory total and used, utilisation,
 * temperature; without NVML the GPU rows say why. Each process that publishes its statistics (publish:true) has a row: allocated, reserved and peak
 * reserved bytes, fragmentation (reserved memory not allocated, and its largest free piece), OOMs,
 * retries, device calls, the page-locked host memory its pinned cache holds (gm_host_malloc), and the
 * host memory of the process with its children (DataLoader workers):
 * resident, proportional (PSS, which adds up across processes that share pages) and swapped; and the
 * host's available memory, swap and memory pressure (PSI). The numbers come from
 * the regions (src/monitor/published.c, which refuses hostile ones) and /proc. Regions whose process
 * is gone are left out and counted. On a terminal the view is redrawn every -d seconds (default 1)
 * until interrupted; --once, --json or an output that is not a terminal print one view. No colours
 * are used, so NO_COLOR needs nothing.
 */
#include "gpumem.h"

#include "commands.h"
#include "monitor/host_memory.h"
#include "monitor/nvml.h"
#include "monitor/published.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ROWS 256
#define MAX_GPUS 64

typedef struct top_view {
    gm_published rows[MAX_ROWS];
    size_t count;
    size_t stale; /* regions left out: their process is gone */
    size_t refused; /* regions left out: refused by the reader */
    size_t beyond; /* regions left out: readable, but past the table's MAX_ROWS */
    gm_gpu_reading gpus[MAX_GPUS];
    size_t gpu_count;
    char gpu_failure[256]; /* why there are no GPU rows, or "" */
} top_view;

static bool collect(const char *path, long pid, int device, void *context)
{
    top_view *view = context;
    (void)device;
    if (!gm_published_process_alive(pid)) {
        view->stale++;
        return true;
    }
    gm_published row;
    if (gm_published_read(path, view->count < MAX_ROWS ? &view->rows[view->count] : &row) != GM_OK)
        view->refused++;
    else if (view->count < MAX_ROWS)
        view->count++;
    else
        view->beyond++;
    return true;
}

static int64_t total_device_calls(const gm_stats *stats)
{
    int64_t calls = 0;
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        calls += stats->device_calls[kind];
    return calls;
}

static void print_gpus_json(const top_view *view)
{
    printf("\"gpus\": [");
    for (size_t i = 0; i < view->gpu_count; i++) {
        const gm_gpu_reading *gpu = &view->gpus[i];
        printf("%s{\"index\": %d, \"name\": ", i ? ", " : "", gpu->index);
        gm_print_json_string(gpu->name);
        printf(", \"total_bytes\": %" PRIu64 ", \"used_bytes\": %" PRIu64 ", \"utilization_percent\": %d, "
               "\"temperature_celsius\": %d}", gpu->total_bytes, gpu->used_bytes, gpu->utilization_percent,
               gpu->temperature_celsius);
    }
    printf("], \"gpu_error\": ");
    if (view->gpu_failure[0]) {
        gm_print_json_string(view->gpu_failure);
    } else {
        printf("null");
    }
    printf(", \"processes\": [");
}

static void print_host_json(void)
{
    gm_host_memory host;
    if (gm_host_memory_read(NULL, &host) != GM_OK) {
        printf("\"host\": null, ");
        return;
    }
    printf("\"host\": {\"memory_total_bytes\": %" PRId64 ", \"memory_available_bytes\": %" PRId64
           ", \"swap_total_bytes\": %" PRId64 ", \"swap_free_bytes\": %" PRId64 ", \"memory_pressure_some_avg10\": %.2f"
           ", \"memory_pressure_full_avg10\": %.2f}, ",
           host.total_bytes, host.available_bytes, host.swap_total_bytes, host.swap_free_bytes,
           host.pressure_some_avg10, host.pressure_full_avg10);
}

/* The process's host memory with its descendants (DataLoader workers): -1 where unknown. */
static gm_process_memory process_memory(long pid)
{
    gm_process_memory memory;
    if (gm_process_memory_read(NULL, pid, &memory) != GM_OK)
        memory = (gm_process_memory){-1, -1, -1, -1, -1, -1, 0};
    return memory;
}

static void print_json(const top_view *view)
{
    printf("{");
    print_host_json();
    printf("\"stale_regions\": %zu, \"refused_regions\": %zu, \"regions_beyond_the_table\": %zu, ", view->stale,
           view->refused, view->beyond);
    print_gpus_json(view);
    for (size_t i = 0; i < view->count; i++) {
        const gm_published *row = &view->rows[i];
        const gm_stats *stats = &row->stats;
        gm_process_memory host = process_memory(row->pid);
        printf("%s{\"pid\": %ld, \"device\": %d, \"backend\": \"%s\", \"engine\": \"%s\", \"allocated_bytes\": %" PRId64
               ", \"reserved_bytes\": %" PRId64 ", \"peak_reserved_bytes\": %" PRId64 ", \"peak_allocated_bytes\": %" PRId64
               ", \"cached_free_bytes\": %" PRIu64 ", \"largest_free_block_bytes\": %" PRIu64
               ", \"num_ooms\": %" PRId64 ", \"num_alloc_retries\": %" PRId64 ", \"device_calls\": %" PRId64,
               i ? ", " : "", row->pid, row->device, row->backend, row->engine,
               stats->allocated_bytes[GM_POOL_ALL].current, stats->reserved_bytes[GM_POOL_ALL].current,
               stats->reserved_bytes[GM_POOL_ALL].peak, stats->allocated_bytes[GM_POOL_ALL].peak,
               row->cached_free_bytes, row->largest_free_block_bytes, stats->num_ooms,
               stats->num_alloc_retries, total_device_calls(stats));
        printf(", \"pinned_host_reserved_bytes\": %" PRIu64 ", \"pinned_host_reserved_bytes_peak\": %" PRIu64
               ", \"pinned_host_allocated_bytes\": %" PRIu64, row->pinned_host.reserved_bytes,
               row->pinned_host.reserved_bytes_peak, row->pinned_host.allocated_bytes);
        printf(", \"host_rss_bytes\": %" PRId64 ", \"host_pss_bytes\": %" PRId64 ", \"host_swap_bytes\": %" PRId64
               ", \"descendants\": %d, \"tree_rss_bytes\": %" PRId64 ", \"tree_pss_bytes\": %" PRId64
               ", \"tree_swap_bytes\": %" PRId64 "}",
               host.rss_bytes, host.pss_bytes, host.swap_bytes, host.descendants, host.tree_rss_bytes,
               host.tree_pss_bytes, host.tree_swap_bytes);
    }
    printf("]}\n");
}

static double mib(int64_t bytes)
{
    return (double)bytes / 1048576.0;
}

static void print_host_line(const top_view *view)
{
    size_t processes = 0; /* a process has a region per device it uses */
    for (size_t i = 0; i < view->count; i++) {
        size_t j = 0;
        while (j < i && view->rows[j].pid != view->rows[i].pid)
            j++;
        processes += j == i;
    }
    printf("gpumem top -- %zu process%s, %zu region%s", processes, processes == 1 ? "" : "es", view->count,
           view->count == 1 ? "" : "s");
    if (view->stale || view->refused)
        printf(" (%zu stale and %zu refused regions left out)", view->stale, view->refused);
    if (view->beyond)
        printf(" (%zu more past the table's %d rows)", view->beyond, MAX_ROWS);
    gm_host_memory host;
    if (gm_host_memory_read(NULL, &host) != GM_OK) {
        printf("; host memory: %s\n\n", gm_last_error());
        return;
    }
    printf("; host: %.0f of %.0f MiB available, swap %.0f of %.0f MiB used", mib(host.available_bytes),
           mib(host.total_bytes), mib(host.swap_total_bytes - host.swap_free_bytes), mib(host.swap_total_bytes));
    if (host.pressure_some_avg10 >= 0)
        printf(", memory pressure %.1f%% some / %.1f%% full (10 s)", host.pressure_some_avg10, host.pressure_full_avg10);
    printf("\n\n");
}

static void print_gpu_rows(const top_view *view)
{
    if (view->gpu_failure[0])
        printf("GPUs: %s\n\n", view->gpu_failure);
    for (size_t i = 0; i < view->gpu_count; i++) {
        const gm_gpu_reading *gpu = &view->gpus[i];
        printf("GPU %d %-24.24s %10.0f / %.0f MiB used", gpu->index, gpu->name, mib((int64_t)gpu->used_bytes),
               mib((int64_t)gpu->total_bytes));
        if (gpu->utilization_percent >= 0)
            printf(", %3d%% busy", gpu->utilization_percent);
        if (gpu->temperature_celsius >= 0)
            printf(", %d C", gpu->temperature_celsius);
        printf("\n");
    }
    if (view->gpu_count)
        printf("\n");
}

/* Host memory of the process with its descendants; "-" where the kernel would not say. */
static void print_host_columns(long pid)
{
    gm_process_memory host = process_memory(pid);
    char pss[32] = "-", children[16] = "";
    if (host.tree_pss_bytes >= 0)
        snprintf(pss, sizeof pss, "%.1f", mib(host.tree_pss_bytes));
    if (host.descendants)
        snprintf(children, sizeof children, " +%d", host.descendants);
    printf(" %9.1f %9s %8.1f%s\n", mib(host.tree_rss_bytes), pss, mib(host.tree_swap_bytes), children);
}

static void print_table(const top_view *view)
{
    print_host_line(view);
    print_gpu_rows(view);
    printf("%8s %3s %-10s %10s %10s %10s %9s %9s %4s %7s %9s %8s %9s %9s %8s\n", "PID", "DEV", "BACKEND",
           "ALLOC MiB", "RESERV MiB", "PEAK MiB", "FRAG MiB", "LFREE MiB", "OOMS", "RETRIES", "DEV CALLS", "PIN MiB",
           "RSS MiB", "PSS MiB", "SWAP MiB");
    for (size_t i = 0; i < view->count; i++) {
        const gm_published *row = &view->rows[i];
        const gm_stats *stats = &row->stats;
        int64_t allocated = stats->allocated_bytes[GM_POOL_ALL].current;
        int64_t reserved = stats->reserved_bytes[GM_POOL_ALL].current;
        char backend[32];
        snprintf(backend, sizeof backend, "%s/%s", row->backend, row->engine);
        printf("%8ld %3d %-10.10s %10.1f %10.1f %10.1f %9.1f %9.1f %4" PRId64 " %7" PRId64 " %9" PRId64 " %8.1f",
               row->pid, row->device, backend, mib(allocated), mib(reserved),
               mib(stats->reserved_bytes[GM_POOL_ALL].peak), mib(reserved - allocated),
               mib((int64_t)row->largest_free_block_bytes), stats->num_ooms, stats->num_alloc_retries,
               total_device_calls(stats), mib((int64_t)row->pinned_host.reserved_bytes));
        print_host_columns(row->pid);
    }
    if (!view->count)
        printf("(no gpumem process publishes its statistics: run it with GPUMEM_CONF=publish:true)\n");
    else
        printf("\nFRAG: reserved but not allocated; LFREE: its largest free piece; PIN: page-locked host memory "
               "its pinned cache holds (gm_host_malloc); RSS, PSS, SWAP: host memory of the process and its "
               "children (+N)\n");
}

static int show(bool json)
{
    static top_view view;
    memset(&view, 0, sizeof view);
    if (gm_read_gpus(view.gpus, MAX_GPUS, &view.gpu_count) != GM_OK)
        snprintf(view.gpu_failure, sizeof view.gpu_failure, "%s", gm_last_error());
    if (gm_published_list(collect, &view) != GM_OK) {
        fprintf(stderr, "gpumem top: %s\n", gm_last_error());
        return GM_EXIT_ERROR;
    }
    if (json)
        print_json(&view);
    else
        print_table(&view);
    fflush(stdout);
    return GM_EXIT_OK;
}

static void print_usage(FILE *out)
{
    fputs("usage: gpumem top [-d SECONDS] [--once] [--json]\n", out);
}

int gm_command_top(int argc, char **argv)
{
    bool once = false, json = false;
    double seconds = 1.0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--once")) {
            once = true;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "-d")) {
            char *end = NULL;
            seconds = i + 1 < argc ? strtod(argv[++i], &end) : 0;
            if (!end || !*argv[i] || *end || !(seconds >= 0.1 && seconds <= 3600)) {
                fprintf(stderr, "gpumem top: -d needs a number of seconds from 0.1 to 3600\n");
                return GM_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout);
            printf("  every publishing gpumem process of this user (GPUMEM_CONF=publish:true), live, and the host's\n"
                   "  memory; -d: seconds between refreshes (default 1); --once: one table; --json: one JSON object\n");
            return GM_EXIT_OK;
        } else {
            fprintf(stderr, "gpumem top: unknown argument '%s'\n", argv[i]);
            print_usage(stderr);
            return GM_EXIT_USAGE;
        }
    }
    if (once || json || !isatty(STDOUT_FILENO))
        return show(json);
    for (;;) {
        printf("\033[H\033[2J");
        int status = show(false);
        if (status != GM_EXIT_OK)
            return status;
        struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
        nanosleep(&pause, NULL);
    }
}
