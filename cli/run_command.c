/*
 * run_command.c -- gpumem run: the front door. Runs a command with gpumem as PyTorch's allocator.
 *
 *   gpumem run [--conf KEY:VALUE,...] [--report FILE] [--tune] [--] COMMAND [ARGUMENTS...]
 *
 * The command gets the environment that gpumem's PyTorch hook needs: gpumem's python folder first
 * on PYTHONPATH (its sitecustomize installs gpumem when torch is imported), GPUMEM_TORCH=1 unless
 * set, GPUMEM_LIBRARY when running from a build tree, and publish:true in GPUMEM_CONF, so that
 * `gpumem top` and `gpumem stats` see it live from another shell. A command that never touches CUDA
 * (or is not Python) runs all the same.
 *
 * The final numbers: while the command runs, every region published by it or its descendants is
 * kept mapped (gm_published_watch), so that after it exits -- whether its allocators removed their
 * regions or it was killed -- the mapping still holds the last statistics. They are printed on
 * standard error (standard output is the command's) as peaks and the memory_summary() table; regions
 * its dead processes left behind are removed. With --report, the command's allocators also keep a
 * history ring, which gpumem's Python package writes at exit into a folder named by
 * GPUMEM_RUN_OUTPUT; the report is made from it. With --tune the same history (a larger ring: every
 * allocation of most programs) is replayed under each configuration of `gpumem tune`, which names the one
 * that would have reserved the least for this run.
 *
 * The exit status is the command's (128 + N when killed by signal N; 127 when it cannot be run).
 * Like system(), gpumem run ignores SIGINT and SIGQUIT while the command runs: a Ctrl-C reaches the
 * command, which decides, and the summary is still printed.
 */
#include "gpumem.h"

#include "base/format.h"
#include "base/options.h"
#include "commands.h"
#include "monitor/host_memory.h"
#include "monitor/published.h"
#include "run_report.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WATCHED 64
#define MAX_REJECTED 256
#define POLL_NANOSECONDS 50000000L
#define RUN_HISTORY_EVENTS "262144"   /* events kept for the report: a few MiB of host memory */
#define TUNE_HISTORY_EVENTS "1048576" /* for --tune, the most a ring keeps: 64 bytes each, 64 MiB */

typedef struct run_state {
    pid_t child;
    int64_t start_time_ns; /* CLOCK_REALTIME just before the command started */
    gm_published_watch *watches[MAX_WATCHED];
    char paths[MAX_WATCHED][4096];
    size_t watch_count;
    /* Regions of dead writers found not to be the command's, by file identity: such a region never
     * becomes the command's (a writer with a reused pid makes a new file), so it is read only once,
     * not at every poll. */
    struct rejected_region {
        dev_t device;
        ino_t inode;
    } rejected[MAX_REJECTED];
    size_t rejected_count;
} run_state;

static int usage(FILE *out, int status)
{
    fprintf(out, "usage: gpumem run [--conf KEY:VALUE,...] [--report FILE] [--tune] [--] COMMAND [ARGUMENTS...]\n"
                 "  runs COMMAND with gpumem as PyTorch's CUDA allocator, publishing its statistics\n"
                 "  (see them with gpumem top); at exit prints its peaks and memory summary on stderr,\n"
                 "  with --report writes an HTML report of its memory over time, and with --tune replays\n"
                 "  its allocations under each configuration of gpumem tune and names the one that\n"
                 "  reserves the least\n");
    return status;
}

static bool exists(const char *path)
{
    struct stat status;
    return stat(path, &status) == 0;
}

/* The folder of this executable. */
static bool executable_folder(char *buffer, size_t size)
{
    ssize_t length = readlink("/proc/self/exe", buffer, size - 1);
    if (length <= 0)
        return false;
    buffer[length] = '\0';
    char *slash = strrchr(buffer, '/');
    if (!slash)
        return false;
    *slash = '\0';
    return true;
}

/* gpumem's python folder: GPUMEM_PYTHON_DIR, an installed prefix's share/gpumem/python, or the source
 * tree's python folder (a build tree's gpumem, whose library is beside it). */
static bool find_python_folder(char *folder, size_t size, char *library, size_t library_size)
{
    char here[PATH_MAX], candidate[PATH_MAX + 64];
    library[0] = '\0';
    const char *configured = getenv("GPUMEM_PYTHON_DIR");
    if (configured && *configured) {
        snprintf(folder, size, "%s", configured);
        return true;
    }
    if (!executable_folder(here, sizeof here))
        return false;
    snprintf(candidate, sizeof candidate, "%s/../share/gpumem/python", here);
    char marker[PATH_MAX + 96];
    snprintf(marker, sizeof marker, "%s/gpumem/__init__.py", candidate);
    if (exists(marker) && realpath(candidate, folder) && strlen(folder) < size)
        return true;
    snprintf(marker, sizeof marker, "%s/gpumem/__init__.py", GPUMEM_SOURCE_PYTHON_DIR);
    if (!exists(marker))
        return false;
    snprintf(folder, size, "%s", GPUMEM_SOURCE_PYTHON_DIR);
    snprintf(candidate, sizeof candidate, "%s/libgpumem.so", here);
    if (exists(candidate) && strlen(candidate) < library_size)
        memcpy(library, candidate, strlen(candidate) + 1);
    return true;
}

/* "configuration,addition", or "addition" when configuration is empty; false, the configuration
 * unchanged, when that does not fit in `size` (a cut configuration would silently lose its last keys). */
static bool append_setting(char *configuration, size_t size, const char *addition)
{
    size_t length = strlen(configuration);
    int written = snprintf(configuration + length, size - length, "%s%s", length ? "," : "", addition);
    if (written < 0 || (size_t)written >= size - length) {
        configuration[length] = '\0';
        return false;
    }
    return true;
}

/* The same, unless `key` is set already (by GPUMEM_CONF or --conf). */
static bool default_setting(char *configuration, size_t size, const char *key, const char *addition)
{
    return strstr(configuration, key) || append_setting(configuration, size, addition);
}

/* The command's environment (in the child, before exec). */
static bool prepare_environment(const char *conf, const char *output_folder, const char *history_events)
{
    static char configuration[8192], python_path[16384];
    char folder[PATH_MAX], library[PATH_MAX];
    const char *inherited = getenv("GPUMEM_CONF");
    if (snprintf(configuration, sizeof configuration, "%s", inherited ? inherited : "") >= (int)sizeof configuration)
        return false;
    if (conf && *conf && !append_setting(configuration, sizeof configuration, conf)) /* after GPUMEM_CONF: it wins */
        return false;
    if (!default_setting(configuration, sizeof configuration, "publish:", "publish:true"))
        return false;
    if (output_folder &&
        !default_setting(configuration, sizeof configuration, "history:", history_events))
        return false;
    setenv("GPUMEM_CONF", configuration, 1);
    if (gm_torch_setting_is_off(getenv("GPUMEM_TORCH"))) /* running under gpumem is what was asked */
        setenv("GPUMEM_TORCH", "1", 1);
    if (output_folder)
        setenv("GPUMEM_RUN_OUTPUT", output_folder, 1);
    if (!find_python_folder(folder, sizeof folder, library, sizeof library)) {
        fprintf(stderr, "gpumem run: gpumem's Python package was not found (set GPUMEM_PYTHON_DIR): PyTorch "
                        "will use its own allocator\n");
        return true;
    }
    const char *old_path = getenv("PYTHONPATH");
    snprintf(python_path, sizeof python_path, "%s%s%s", folder, old_path && *old_path ? ":" : "",
             old_path ? old_path : "");
    setenv("PYTHONPATH", python_path, 1);
    if (library[0])
        setenv("GPUMEM_LIBRARY", library, 0);
    return true;
}

/* Whether `pid` is the command or one of its descendants. */
static bool in_command_tree(long pid, pid_t child)
{
    for (int depth = 0; depth < 64 && pid > 1; depth++) {
        if (pid == (long)child)
            return true;
        pid = gm_process_parent(NULL, pid);
    }
    return false;
}

static bool watched(const run_state *state, const char *path)
{
    for (size_t i = 0; i < state->watch_count; i++)
        if (!strcmp(state->paths[i], path))
            return true;
    return false;
}

/* A region whose writer is gone cannot be placed by walking the living processes' parents: its
 * writer may have been killed between two polls. The region names the writer's parent, and its
 * creation time tells it from a region some earlier process with a reused pid left. */
static bool dead_writer_in_command_tree(const run_state *state, gm_published_watch *watch)
{
    gm_published published;
    return gm_published_watch_read(watch, &published) == GM_OK && published.start_time_ns >= state->start_time_ns &&
           published.parent_pid > 1 && in_command_tree(published.parent_pid, state->child);
}

static bool rejected_before(const run_state *state, const struct stat *file)
{
    for (size_t i = 0; i < state->rejected_count; i++)
        if (state->rejected[i].device == file->st_dev && state->rejected[i].inode == file->st_ino)
            return true;
    return false;
}

static bool watch_new_region(const char *path, long pid, int device, void *context)
{
    run_state *state = context;
    (void)device;
    if (state->watch_count == MAX_WATCHED || watched(state, path))
        return true;
    bool alive_in_tree = in_command_tree(pid, state->child);
    if (!alive_in_tree && gm_published_process_alive(pid))
        return true;
    struct stat file;
    bool identified = !alive_in_tree && stat(path, &file) == 0; /* a dead writer's region, by its file */
    if (identified && rejected_before(state, &file))
        return true;
    gm_published_watch *watch = NULL;
    if (gm_published_watch_open(path, &watch) != GM_OK)
        return true;
    if (!alive_in_tree && !dead_writer_in_command_tree(state, watch)) {
        gm_published_watch_close(watch);
        if (identified && state->rejected_count < MAX_REJECTED)
            state->rejected[state->rejected_count++] = (struct rejected_region){file.st_dev, file.st_ino};
        return true;
    }
    state->watches[state->watch_count] = watch;
    snprintf(state->paths[state->watch_count++], sizeof state->paths[0], "%s", path);
    return true;
}

/* Wait for the command, watching its regions as they appear; its wait status. */
static int wait_for_command(run_state *state)
{
    int status = 0;
    for (;;) {
        gm_published_list(watch_new_region, state);
        pid_t done = waitpid(state->child, &status, WNOHANG);
        if (done == state->child)
            break;
        if (done < 0 && errno != EINTR)
            return -1;
        struct timespec pause = {0, POLL_NANOSECONDS};
        nanosleep(&pause, NULL);
    }
    /* Regions the command left behind (its allocators never destroyed): its pid, now dead. */
    gm_published_list(watch_new_region, state);
    return status;
}

static void print_final(const run_state *state, bool summary)
{
    if (!state->watch_count) {
        fprintf(stderr, "gpumem run: the command made no gpumem allocator (it allocated no device memory "
                        "through gpumem)\n");
        return;
    }
    for (size_t i = 0; i < state->watch_count; i++) {
        gm_published published;
        if (gm_published_watch_read(state->watches[i], &published) != GM_OK) {
            fprintf(stderr, "gpumem run: %s\n", gm_last_error());
            continue;
        }
        const gm_stats *stats = &published.stats;
        int64_t peak_allocated = stats->allocated_bytes[GM_POOL_ALL].peak;
        int64_t peak_reserved = stats->reserved_bytes[GM_POOL_ALL].peak;
        int64_t calls = 0;
        for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
            calls += stats->device_calls[kind];
        char allocated_text[32], reserved_text[32];
        fprintf(stderr, "gpumem run: process %ld, %s device %d (%s engine): peak allocated %s, peak reserved %s",
                published.pid, published.backend, published.device, published.engine,
                gm_format_bytes(allocated_text, sizeof allocated_text, (uint64_t)peak_allocated),
                gm_format_bytes(reserved_text, sizeof reserved_text, (uint64_t)peak_reserved));
        if (peak_allocated > 0)
            fprintf(stderr, " (%.3fx)", (double)peak_reserved / (double)peak_allocated);
        fprintf(stderr, ", %" PRId64 " OOMs, %" PRId64 " retries, %" PRId64 " device calls\n", stats->num_ooms,
                stats->num_alloc_retries, calls);
        if (published.torn)
            fprintf(stderr, "gpumem run: process %ld was killed inside an allocator call: that call may be counted "
                            "in part\n", published.pid);
        static char table[16384];
        if (summary && gm_summary_of_stats(stats, published.backend, published.device, table, sizeof table, NULL) ==
            GM_OK)
            fputs(table, stderr);
    }
}

/* Remove the regions of the command's processes that are gone, and stop watching. */
static void forget_regions(run_state *state)
{
    for (size_t i = 0; i < state->watch_count; i++) {
        gm_published published;
        if (gm_published_watch_read(state->watches[i], &published) == GM_OK &&
            !gm_published_process_alive(published.pid))
            unlink(state->paths[i]);
        gm_published_watch_close(state->watches[i]);
    }
    state->watch_count = 0;
}

static int exit_status_of(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return GM_EXIT_ERROR;
}

static void describe_end(char **command, int status, double seconds)
{
    if (WIFSIGNALED(status))
        fprintf(stderr, "gpumem run: '%s' was killed by signal %d after %.1f s\n", command[0], WTERMSIG(status),
                seconds);
    else
        fprintf(stderr, "gpumem run: '%s' exited with status %d after %.1f s\n", command[0], WEXITSTATUS(status),
                seconds);
}

static double now_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static int run(char **command, const char *conf, const char *report, bool tune)
{
    char output_folder[] = "/tmp/gpumem-run.XXXXXX";
    bool keep_history = report || tune;
    if (keep_history && !mkdtemp(output_folder)) {
        fprintf(stderr, "gpumem run: cannot make a folder for the command's history: %s\n", strerror(errno));
        return GM_EXIT_ERROR;
    }
    struct sigaction ignore = {.sa_handler = SIG_IGN}, old_interrupt, old_quit;
    sigaction(SIGINT, &ignore, &old_interrupt);
    sigaction(SIGQUIT, &ignore, &old_quit);
    double started = now_seconds();
    static run_state state;
    memset(&state, 0, sizeof state);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    state.start_time_ns = (int64_t)wall.tv_sec * 1000000000 + wall.tv_nsec;
    state.child = fork();
    if (state.child == 0) {
        sigaction(SIGINT, &old_interrupt, NULL);
        sigaction(SIGQUIT, &old_quit, NULL);
        const char *events = tune ? "history:" TUNE_HISTORY_EVENTS : "history:" RUN_HISTORY_EVENTS;
        if (!prepare_environment(conf, keep_history ? output_folder : NULL, events)) {
            fprintf(stderr, "gpumem run: GPUMEM_CONF with --conf is too long (more than 8191 characters)\n");
            _exit(GM_EXIT_USAGE);
        }
        execvp(command[0], command);
        fprintf(stderr, "gpumem run: cannot run '%s': %s\n", command[0], strerror(errno));
        _exit(127);
    }
    if (state.child < 0) {
        fprintf(stderr, "gpumem run: cannot start '%s': %s\n", command[0], strerror(errno));
        return GM_EXIT_ERROR;
    }
    int status = wait_for_command(&state);
    sigaction(SIGINT, &old_interrupt, NULL);
    sigaction(SIGQUIT, &old_quit, NULL);
    bool ran = !(WIFEXITED(status) && WEXITSTATUS(status) == 127 && !state.watch_count);
    if (ran) {
        describe_end(command, status, now_seconds() - started);
        print_final(&state, true);
    }
    forget_regions(&state);
    int exit_status = exit_status_of(status);
    if (report) {
        int report_status = ran ? gm_run_report(output_folder, report) : GM_EXIT_ERROR;
        if (exit_status == 0 && report_status != GM_EXIT_OK)
            exit_status = report_status;
    }
    if (tune) {
        int tune_status = ran ? gm_run_tune(output_folder, conf) : GM_EXIT_ERROR;
        if (exit_status == 0 && tune_status != GM_EXIT_OK)
            exit_status = tune_status;
    }
    if (keep_history)
        gm_run_report_cleanup(output_folder);
    return exit_status;
}

/* A bad configuration is a usage error here, not the command's failure at its first tensor: the keys the
 * command's allocator will apply, in its order (GPUMEM_CONF, --conf over it, then the PyTorch adapter's
 * GPUMEM_TORCH over both), each parsed on top of the last as the library does. */
static bool configuration_is_valid(const char *conf)
{
    const struct {
        const char *name, *text;
    } sources[] = {{"GPUMEM_CONF", getenv("GPUMEM_CONF")},
                   {"--conf", conf},
                   {"GPUMEM_TORCH", gm_torch_configuration()}};
    gm_options options;
    gm_options_default(&options);
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        if (sources[i].text && gm_options_parse(&options, sources[i].text) != GM_OK) {
            fprintf(stderr, "gpumem run: %s: %s\n", sources[i].name, gm_last_error());
            return false;
        }
    }
    return true;
}

int gm_command_run(int argc, char **argv)
{
    const char *conf = NULL, *report = NULL;
    bool tune = false;
    int i = 0;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return usage(stdout, GM_EXIT_OK);
        if ((!strcmp(argv[i], "--conf") || !strcmp(argv[i], "--report")) && i + 1 >= argc) {
            fprintf(stderr, "gpumem run: %s needs a value\n", argv[i]);
            return usage(stderr, GM_EXIT_USAGE);
        }
        if (!strcmp(argv[i], "--conf")) {
            conf = argv[++i];
        } else if (!strcmp(argv[i], "--report")) {
            report = argv[++i];
        } else if (!strcmp(argv[i], "--tune")) {
            tune = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "gpumem run: unknown option '%s' (put the command after --)\n", argv[i]);
            return usage(stderr, GM_EXIT_USAGE);
        } else {
            break;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "gpumem run: no command given\n");
        return usage(stderr, GM_EXIT_USAGE);
    }
    if (!configuration_is_valid(conf))
        return GM_EXIT_USAGE;
    return run(argv + i, conf, report, tune);
}
