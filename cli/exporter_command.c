/*
 * exporter_command.c -- gpumem exporter: every gpumem process on the machine as Prometheus metrics.
 *
 *   gpumem exporter [--listen HOST:PORT] [--allow-remote]
 *   gpumem exporter --textfile DIR [--interval SECONDS] [--once]
 *
 * Each scrape reads, at that moment, every region this user's processes publish (publish:true;
 * src/monitor/published.c refuses hostile ones, and regions of processes that are gone are left out;
 * both are counted), the host memory of each of those processes with its children and of the host
 * (/proc), and the GPUs (NVML, when there is one); src/report/prometheus.c renders them. The metrics
 * are served over HTTP (exporter_http.c, libmicrohttpd; loopback only unless --allow-remote), or
 * written for node_exporter's textfile collector: DIR/gpumem.prom, replaced atomically (written to
 * DIR/.gpumem.prom.PID.tmp, then renamed) every --interval seconds (15), or once with --once.
 * SIGINT and SIGTERM stop either mode, with exit status 0.
 */
#include "gpumem.h"

#include "commands.h"
#include "exporter.h"
#include "monitor/host_memory.h"
#include "monitor/nvml.h"
#include "monitor/published.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 64
#define DEFAULT_LISTEN_ADDRESS "127.0.0.1:9464"

/* ---------------------------------------------------------------- one scrape */

typedef struct scrape {
    gm_published *regions;
    size_t region_count, region_capacity;
    gm_prometheus_process *processes;
    size_t process_count;
    size_t stale, refused;
    bool out_of_memory;
} scrape;

static bool make_room_for_region(scrape *scrape)
{
    if (scrape->region_count < scrape->region_capacity)
        return true;
    size_t capacity = scrape->region_capacity ? 2 * scrape->region_capacity : 16;
    gm_published *grown = realloc(scrape->regions, capacity * sizeof *grown);
    if (!grown)
        return false;
    scrape->regions = grown;
    scrape->region_capacity = capacity;
    return true;
}

static bool collect_region(const char *path, long pid, int device, void *context)
{
    scrape *scrape = context;
    (void)device;
    if (!gm_published_process_alive(pid)) {
        scrape->stale++;
    } else if (!make_room_for_region(scrape)) {
        scrape->out_of_memory = true;
        return false;
    } else if (gm_published_read(path, &scrape->regions[scrape->region_count]) == GM_OK) {
        scrape->region_count++;
    } else if (!gm_published_process_alive(pid)) {
        scrape->stale++; /* it exited while being read */
    } else {
        scrape->refused++;
    }
    return true;
}

static bool process_listed(const scrape *scrape, long pid)
{
    for (size_t i = 0; i < scrape->process_count; i++)
        if (scrape->processes[i].pid == pid)
            return true;
    return false;
}

/* The host memory of each process that has a region (once, though it may have one per device). */
static void collect_process_memory(scrape *scrape)
{
    scrape->processes = calloc(scrape->region_count ? scrape->region_count : 1, sizeof *scrape->processes);
    if (!scrape->processes) {
        scrape->out_of_memory = true;
        return;
    }
    for (size_t i = 0; i < scrape->region_count; i++) {
        long pid = scrape->regions[i].pid;
        gm_prometheus_process *process = &scrape->processes[scrape->process_count];
        if (!process_listed(scrape, pid) && gm_process_memory_read(NULL, pid, &process->memory) == GM_OK) {
            process->pid = pid;
            scrape->process_count++;
        }
    }
}

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

gm_status gm_exporter_scrape(gm_text_buffer *buffer)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    scrape scrape = {0};
    gm_published_list(collect_region, &scrape); /* an unreadable directory: no regions */
    if (!scrape.out_of_memory)
        collect_process_memory(&scrape);
    gm_host_memory host;
    bool host_read = gm_host_memory_read(NULL, &host) == GM_OK;
    gm_gpu_reading gpus[MAX_GPUS];
    size_t gpu_count = 0;
    bool gpus_read = gm_read_gpus(gpus, MAX_GPUS, &gpu_count) == GM_OK;
    gm_prometheus_readings readings = {
        .regions = scrape.regions, .region_count = scrape.region_count,
        .processes = scrape.processes, .process_count = scrape.process_count,
        .host = host_read ? &host : NULL,
        .gpus = gpus, .gpu_count = gpus_read ? gpu_count : 0, .gpus_available = gpus_read,
        .stale_regions = scrape.stale, .refused_regions = scrape.refused,
        .collection_seconds = seconds_since(&start),
    };
    gm_status status = scrape.out_of_memory ? GM_ERROR_OUT_OF_MEMORY : gm_prometheus_render(&readings, buffer);
    free(scrape.regions);
    free(scrape.processes);
    return status;
}

void gm_exporter_block_stop_signals(sigset_t *signals_out)
{
    /* A shell starts background jobs with SIGINT ignored, and an ignored signal is discarded, not kept
     * pending for sigwait: back to the default action, which blocking then holds off. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigemptyset(signals_out);
    sigaddset(signals_out, SIGINT);
    sigaddset(signals_out, SIGTERM);
    pthread_sigmask(SIG_BLOCK, signals_out, NULL);
}

/* ---------------------------------------------------------------- the textfile */

static bool write_all(int descriptor, const char *text, size_t length)
{
    while (length > 0) {
        ssize_t written = write(descriptor, text, length);
        if (written < 0 && errno == EINTR)
            continue;
        if (written <= 0)
            return false;
        text += written;
        length -= (size_t)written;
    }
    return true;
}

/* DIR/.gpumem.prom.PID.tmp, then renamed to DIR/gpumem.prom: a reader sees the old file or the new. */
static int write_textfile(const char *directory, const gm_text_buffer *buffer)
{
    char path[4096], temporary[4096];
    if (snprintf(path, sizeof path, "%s/gpumem.prom", directory) >= (int)sizeof path ||
        snprintf(temporary, sizeof temporary, "%s/.gpumem.prom.%ld.tmp", directory, (long)getpid()) >=
            (int)sizeof temporary) {
        fprintf(stderr, "gpumem exporter: the directory name is too long: %s\n", directory);
        return GM_EXIT_USAGE;
    }
    int descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (descriptor < 0) {
        fprintf(stderr, "gpumem exporter: cannot write %s: %s\n", temporary, strerror(errno));
        return GM_EXIT_ERROR;
    }
    bool written = write_all(descriptor, buffer->text, buffer->length);
    int saved_errno = errno;
    if (close(descriptor) != 0 && written) {
        written = false;
        saved_errno = errno;
    }
    if (written && rename(temporary, path) == 0)
        return GM_EXIT_OK;
    if (written)
        saved_errno = errno;
    fprintf(stderr, "gpumem exporter: cannot write %s: %s\n", written ? path : temporary, strerror(saved_errno));
    unlink(temporary);
    return GM_EXIT_ERROR;
}

static int scrape_to_textfile(const char *directory)
{
    gm_text_buffer buffer = {0};
    int status = GM_EXIT_ERROR;
    if (gm_exporter_scrape(&buffer) != GM_OK)
        fprintf(stderr, "gpumem exporter: %s\n", gm_last_error());
    else
        status = write_textfile(directory, &buffer);
    gm_text_buffer_free(&buffer);
    return status;
}

/* Every `interval` seconds until SIGINT or SIGTERM (0 then), or once; a failed write ends it. */
static int run_textfile(const char *directory, double interval, bool once)
{
    sigset_t signals;
    gm_exporter_block_stop_signals(&signals);
    for (;;) {
        int status = scrape_to_textfile(directory);
        if (status != GM_EXIT_OK || once)
            return status;
        struct timespec pause = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
        int signal_number;
        while ((signal_number = sigtimedwait(&signals, NULL, &pause)) < 0 && errno == EINTR)
            continue;
        if (signal_number > 0)
            return GM_EXIT_OK;
    }
}

/* ---------------------------------------------------------------- arguments */

typedef struct exporter_arguments {
    const char *listen_address; /* NULL: the default */
    bool allow_remote;
    const char *textfile_directory;
    double interval;
    bool interval_given;
    bool once;
} exporter_arguments;

static int usage(FILE *out, int status)
{
    fprintf(out, "usage: gpumem exporter [--listen HOST:PORT] [--allow-remote]\n"
                 "       gpumem exporter --textfile DIR [--interval SECONDS] [--once]\n"
                 "  Prometheus metrics of every gpumem process of this user (run with publish:true), the\n"
                 "  host's memory and the GPUs: served at http://HOST:PORT/metrics (default %s; a\n"
                 "  non-loopback HOST needs --allow-remote; port 0 picks a free one), or written to\n"
                 "  DIR/gpumem.prom for node_exporter's textfile collector every SECONDS (default 15)\n",
            DEFAULT_LISTEN_ADDRESS);
    return status;
}

static int parse_interval(const char *text, double *seconds_out)
{
    char *end = NULL;
    double seconds = strtod(text, &end);
    if (!*text || *end || !(seconds >= 0.1 && seconds <= 86400)) {
        fprintf(stderr, "gpumem exporter: --interval needs a number of seconds from 0.1 to 86400\n");
        return GM_EXIT_USAGE;
    }
    *seconds_out = seconds;
    return GM_EXIT_OK;
}

/* The value of option argv[*index]; NULL (after saying so) when it is missing. */
static const char *option_value(int argc, char **argv, int *index)
{
    if (*index + 1 < argc)
        return argv[++*index];
    fprintf(stderr, "gpumem exporter: %s needs a value\n", argv[*index]);
    return NULL;
}

static int parse_argument(exporter_arguments *arguments, int argc, char **argv, int *index)
{
    const char *argument = argv[*index];
    if (!strcmp(argument, "--allow-remote")) {
        arguments->allow_remote = true;
    } else if (!strcmp(argument, "--once")) {
        arguments->once = true;
    } else if (!strcmp(argument, "--listen")) {
        if (!(arguments->listen_address = option_value(argc, argv, index)))
            return GM_EXIT_USAGE;
    } else if (!strcmp(argument, "--textfile")) {
        if (!(arguments->textfile_directory = option_value(argc, argv, index)))
            return GM_EXIT_USAGE;
    } else if (!strcmp(argument, "--interval")) {
        const char *value = option_value(argc, argv, index);
        arguments->interval_given = true;
        return value ? parse_interval(value, &arguments->interval) : GM_EXIT_USAGE;
    } else {
        fprintf(stderr, "gpumem exporter: unknown argument '%s'\n", argument);
        return usage(stderr, GM_EXIT_USAGE);
    }
    return GM_EXIT_OK;
}

/* The options of one mode only: --listen and --allow-remote, or --textfile with its own. */
static int check_combination(const exporter_arguments *arguments)
{
    if (arguments->textfile_directory && (arguments->listen_address || arguments->allow_remote)) {
        fprintf(stderr, "gpumem exporter: --textfile writes a file instead of serving HTTP: give it without "
                        "--listen and --allow-remote\n");
        return GM_EXIT_USAGE;
    }
    if (!arguments->textfile_directory && (arguments->interval_given || arguments->once)) {
        fprintf(stderr, "gpumem exporter: --interval and --once go with --textfile DIR\n");
        return GM_EXIT_USAGE;
    }
    return GM_EXIT_OK;
}

static int serve(const exporter_arguments *arguments)
{
    const char *address = arguments->listen_address ? arguments->listen_address : DEFAULT_LISTEN_ADDRESS;
#ifdef GPUMEM_HAVE_MICROHTTPD
    return gm_exporter_serve(address, arguments->allow_remote);
#else
    (void)address;
    fprintf(stderr, "gpumem exporter: gpumem was built without libmicrohttpd (install libmicrohttpd-dev and "
                    "rebuild); --textfile works without it\n");
    return GM_EXIT_ERROR;
#endif
}

int gm_command_exporter(int argc, char **argv)
{
    exporter_arguments arguments = {.interval = 15};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return usage(stdout, GM_EXIT_OK);
        int status = parse_argument(&arguments, argc, argv, &i);
        if (status != GM_EXIT_OK)
            return status;
    }
    int status = check_combination(&arguments);
    if (status != GM_EXIT_OK)
        return status;
    if (arguments.textfile_directory)
        return run_textfile(arguments.textfile_directory, arguments.interval, arguments.once);
    return serve(&arguments);
}
