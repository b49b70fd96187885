/*
 * main.c -- the gpumem command line.
 *
 *   gpumem replay TRACE [--backend sim|host|cuda] [--capacity BYTES] [--conf KEY:VALUE,...] [--json] [--passes N]
 *                       [--lead N] [--snapshot FILE] [--history FILE] [--report FILE]
 *   gpumem tune TRACE|HISTORY [--backend ...] [--capacity ...] [--conf ...] [--passes N] [--json]
 *   gpumem report TRACE|HISTORY|SNAPSHOT -o FILE [--backend ...] [--capacity ...] [--conf ...]
 *   gpumem info [--backend NAME] [--conf ...]
 *   gpumem stats PID [--device N] [--json]
 *   gpumem top [-d SECONDS] [--once] [--json]
 *   gpumem summary PID [--device N]
 *   gpumem run [--conf KEY:VALUE,...] [--report FILE] [--tune] [--] COMMAND [ARGUMENTS...]
 *   gpumem exporter [--listen HOST:PORT] [--allow-remote] [--textfile DIR [--interval SECONDS] [--once]]
 *   gpumem doctor [--json] [--pid PID] [--root DIR]
 *   gpumem config [KEY...] | --check [KEY:VALUE,...]
 *   gpumem version | --version     (the CMake project's version, GPUMEM_PROJECT_VERSION)
 *
 * Exit status: 0 success; 1 an error (unreadable file, no device); 2 bad usage, malformed input or a
 * bad configuration (gpumem config --check: 1); 3 the replay ran but some allocations failed with out
 * of memory; 4 and 5 gpumem doctor's worst finding is warn, fail; gpumem run: its command's status.
 * Configuration comes from GPUMEM_CONF, then --conf, then the explicit flags.
 */
#include "gpumem.h"

#include "commands.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static void print_usage(FILE *out)
{
    fprintf(out,
            "usage: gpumem <command> [options]\n"
            "\n"
            "commands:\n"
            "  replay TRACE [--backend sim|host|cuda] [--capacity BYTES] [--conf KEY:VALUE,...] [--json]\n"
            "               [--passes N]  (N replays on one allocator, each reported: cold, then warm; with --json\n"
            "                              one JSON object per pass, one per line (JSON lines))\n"
            "               [--lead N]  (sim, host: the device runs N operations behind the host, as a GPU does;\n"
            "                            the waits for streams are reported with the work they finished early)\n"
            "               [--snapshot FILE] [--history FILE]  the blocks at the end, the events (JSON)\n"
            "               [--report FILE]  the HTML report of gpumem report, for this trace\n"
            "                 replay an allocation trace (plain or .gz) and report peak live and\n"
            "                 reserved bytes, their ratio, CPU time per operation and device calls\n"
            "  tune TRACE|HISTORY [--backend ...] [--capacity ...] [--conf ...] [--passes N] [--json]\n"
            "                 replay a trace (or a history's allocations) under the defaults, the defaults\n"
            "                 without stitching and each opt-in setting (small chunks, compaction) and\n"
            "                 name the one that reserves the least\n"
            "  report TRACE|HISTORY|SNAPSHOT -o FILE [--backend ...] [--capacity ...] [--conf ...]\n"
            "                 a self-contained HTML report: memory over time, the memory map at the peak,\n"
            "                 the largest allocations then and the statistics table\n"
            "  info [--backend NAME] [--conf ...]\n"
            "                 describe the device: driver, memory, virtual-memory support, granularity\n"
            "  stats PID [--device N] [--json]\n"
            "                 the live statistics of process PID (run with GPUMEM_CONF=publish:true)\n"
            "  summary PID [--device N]\n"
            "                 process PID's statistics as torch.cuda.memory_summary() lays them out\n"
            "  top [-d SECONDS] [--once] [--json]\n"
            "                 every publishing gpumem process of this user, live, and the host's memory\n"
            "  run [--conf KEY:VALUE,...] [--report FILE] [--tune] [--] COMMAND [ARGUMENTS...]\n"
            "                 run a command (python train.py) with gpumem as PyTorch's allocator, its\n"
            "                 statistics published for gpumem top; at exit its peaks and memory summary\n"
            "                 (--tune: and gpumem tune of its allocations)\n"
            "  exporter [--listen HOST:PORT] [--allow-remote] [--textfile DIR [--interval SECONDS] [--once]]\n"
            "                 Prometheus metrics of those processes, the host and the GPUs: served at\n"
            "                 http://HOST:PORT/metrics (default 127.0.0.1:9464), or written to DIR/gpumem.prom\n"
            "  doctor [--json] [--pid PID] [--root DIR]\n"
            "                 audit the host for GPU training: memory, swap, pressure, vm settings, cgroup,\n"
            "                 memlock, /dev/shm, open files, GPUs; with --pid that process tree's memory;\n"
            "                 exit 0 all ok, 4 worst is warn, 5 worst is fail\n"
            "  config [KEY...]\n"
            "                 the GPUMEM_CONF keys: what each does and its default\n"
            "  config --check [KEY:VALUE,...]\n"
            "                 check a configuration (without one, $GPUMEM_CONF and $GPUMEM_TORCH) as the\n"
            "                 library parses it\n"
            "  version, --version\n"
            "                 print the version\n");
}

static int run_command(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? GM_EXIT_USAGE : GM_EXIT_OK;
    }
    const char *command = argv[1];
    if (!strcmp(command, "replay"))
        return gm_command_replay(argc - 2, argv + 2);
    if (!strcmp(command, "tune"))
        return gm_command_tune(argc - 2, argv + 2);
    if (!strcmp(command, "report"))
        return gm_command_report(argc - 2, argv + 2);
    if (!strcmp(command, "info"))
        return gm_command_info(argc - 2, argv + 2);
    if (!strcmp(command, "stats"))
        return gm_command_stats(argc - 2, argv + 2);
    if (!strcmp(command, "summary"))
        return gm_command_summary(argc - 2, argv + 2);
    if (!strcmp(command, "run"))
        return gm_command_run(argc - 2, argv + 2);
    if (!strcmp(command, "top"))
        return gm_command_top(argc - 2, argv + 2);
    if (!strcmp(command, "exporter"))
        return gm_command_exporter(argc - 2, argv + 2);
    if (!strcmp(command, "doctor"))
        return gm_command_doctor(argc - 2, argv + 2);
    if (!strcmp(command, "config"))
        return gm_command_config(argc - 2, argv + 2);
    if (!strcmp(command, "version") || !strcmp(command, "--version")) {
        printf("gpumem %s\n", GPUMEM_PROJECT_VERSION);
        return GM_EXIT_OK;
    }
    fprintf(stderr, "gpumem: unknown command '%s'\n\n", command);
    print_usage(stderr);
    return GM_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    /* On a pipe too, lines leave in the order they were written, stdout's and stderr's alike: an error
     * stands on its own line, not inside a table still held in stdout's buffer (as on a terminal). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int status = run_command(argc, argv);
    /* Output that could not be written (a full disk, a closed pipe or descriptor) is a failure, not a
     * success with nothing to show: its commands write their results to stdout. */
    errno = 0;
    bool unflushed = fflush(stdout) != 0;
    if (unflushed || ferror(stdout)) {
        fprintf(stderr, "gpumem: could not write all of its output to standard output%s%s\n", unflushed ? ": " : "",
                unflushed ? strerror(errno) : "");
        return status == GM_EXIT_OK ? GM_EXIT_ERROR : status;
    }
    return status;
}
