/*
 * doctor_command.c -- gpumem doctor [--json] [--pid PID] [--root DIR]: the audit of src/monitor/doctor.c
 * as a table (severity, id, value, then why and fix indented below) or as JSON.
 *
 * Exit status: 0 every finding ok (findings that could not be read, severity "unknown", do not count),
 * 4 the worst is warn, 5 the worst is fail; 1 an error (the root is not a directory, no such process,
 * or not one finding could be read: an audit that saw nothing is no "ok"), 2 bad usage. 3 stays the
 * replay's "out of memory".
 */
#include "gpumem.h"

#include "commands.h"
#include "monitor/doctor.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_usage(FILE *out)
{
    fprintf(out, "usage: gpumem doctor [--json] [--pid PID] [--root DIR]\n"
                 "  audit host memory, kernel settings, the cgroup, limits, /dev/shm and the GPUs for GPU training;\n"
                 "  --pid PID: also that process tree's RSS / PSS / USS / swap / locked memory;\n"
                 "  --root DIR: read /proc and /sys under DIR (fixture trees; /dev/shm from DIR/.statvfs/dev/shm)\n"
                 "  exit status: 0 all ok, 4 worst is warn, 5 worst is fail, 1 error (or nothing could be read),\n"
                 "  2 bad usage\n");
}

/* Whether any finding could be read at all. */
static int anything_read(const gm_doctor_report *report)
{
    for (size_t i = 0; i < report->finding_count; i++)
        if (report->findings[i].severity != GM_DOCTOR_UNKNOWN)
            return 1;
    return 0;
}

/* The worst finding; "unknown" when none could be read (gm_doctor_worst never gives "unknown"). */
static gm_doctor_severity worst_shown(const gm_doctor_report *report)
{
    return anything_read(report) ? gm_doctor_worst(report) : GM_DOCTOR_UNKNOWN;
}

static int exit_status_of(const gm_doctor_report *report)
{
    gm_doctor_severity worst = worst_shown(report);
    return worst == GM_DOCTOR_UNKNOWN ? GM_EXIT_ERROR
           : worst == GM_DOCTOR_FAIL  ? GM_EXIT_DOCTOR_FAIL
           : worst == GM_DOCTOR_WARN  ? GM_EXIT_DOCTOR_WARN
                                      : GM_EXIT_OK;
}

static void print_bytes_field(const char *name, long long bytes, int last)
{
    if (bytes < 0)
        printf("\"%s\": null%s", name, last ? "" : ", ");
    else
        printf("\"%s\": %lld%s", name, bytes, last ? "" : ", ");
}

static void print_json(const gm_doctor_report *report, const char *root, long pid)
{
    gm_doctor_severity worst = worst_shown(report);
    printf("{\n  \"format\": \"gpumem-doctor\",\n  \"version\": 1,\n  \"root\": ");
    gm_print_json_string(root ? root : "/");
    printf(",\n  \"pid\": ");
    if (pid > 0)
        printf("%ld", pid);
    else
        printf("null");
    printf(",\n  \"worst\": \"%s\",\n  \"exit_status\": %d,\n  \"findings\": [", gm_doctor_severity_name(worst),
           exit_status_of(report));
    for (size_t i = 0; i < report->finding_count; i++) {
        const gm_doctor_finding *finding = &report->findings[i];
        printf("%s\n    {\"id\": ", i ? "," : "");
        gm_print_json_string(finding->id);
        printf(", \"severity\": \"%s\", \"value\": ", gm_doctor_severity_name(finding->severity));
        gm_print_json_string(finding->value);
        printf(", \"why\": ");
        gm_print_json_string(finding->why);
        printf(", \"fix\": ");
        gm_print_json_string(finding->fix);
        printf("}");
    }
    printf("\n  ],\n  \"processes\": [");
    for (size_t i = 0; i < report->process_count; i++) {
        const gm_doctor_process *process = &report->processes[i];
        printf("%s\n    {\"pid\": %ld, \"parent\": %ld, \"depth\": %d, \"name\": ", i ? "," : "", process->pid,
               process->parent, process->depth);
        gm_print_json_string(process->name);
        printf(", ");
        print_bytes_field("rss_bytes", (long long)process->rss_bytes, 0);
        print_bytes_field("pss_bytes", (long long)process->pss_bytes, 0);
        print_bytes_field("uss_bytes", (long long)process->uss_bytes, 0);
        print_bytes_field("swap_bytes", (long long)process->swap_bytes, 0);
        print_bytes_field("locked_bytes", (long long)process->locked_bytes, 1);
        printf("}");
    }
    printf("\n  ],\n  \"processes_left_out\": %zu\n}\n", report->processes_left_out);
}

static void print_mebibytes(long long bytes)
{
    if (bytes < 0)
        printf(" %10s", "-");
    else
        printf(" %10.1f", (double)bytes / 1048576.0);
}

static void print_table(const gm_doctor_report *report)
{
    size_t unknown = 0;
    for (size_t i = 0; i < report->finding_count; i++) {
        const gm_doctor_finding *finding = &report->findings[i];
        unknown += finding->severity == GM_DOCTOR_UNKNOWN;
        printf("%-7s %-22s %s\n", gm_doctor_severity_name(finding->severity), finding->id, finding->value);
        if (finding->severity == GM_DOCTOR_WARN || finding->severity == GM_DOCTOR_FAIL) {
            printf("        why: %s\n", finding->why);
            if (finding->fix[0])
                printf("        fix: %s\n", finding->fix);
        }
    }
    if (report->process_count) {
        printf("\n%-24s %10s %10s %10s %10s %10s  (MiB)\n", "process", "RSS", "PSS", "USS", "swap", "locked");
        for (size_t i = 0; i < report->process_count; i++) {
            const gm_doctor_process *process = &report->processes[i];
            char label[96];
            snprintf(label, sizeof label, "%*s%ld %s", 2 * (process->depth > 8 ? 8 : process->depth), "", process->pid,
                     process->name);
            printf("%-24.24s", label);
            print_mebibytes((long long)process->rss_bytes);
            print_mebibytes((long long)process->pss_bytes);
            print_mebibytes((long long)process->uss_bytes);
            print_mebibytes((long long)process->swap_bytes);
            print_mebibytes((long long)process->locked_bytes);
            printf("\n");
        }
        if (report->processes_left_out)
            printf("(%zu more processes left out)\n", report->processes_left_out);
    }
    gm_doctor_severity worst = worst_shown(report);
    printf("\nworst: %s", gm_doctor_severity_name(worst));
    if (unknown)
        printf("; %zu finding%s could not be read (severity unknown)", unknown, unknown == 1 ? "" : "s");
    printf("\n");
}

int gm_command_doctor(int argc, char **argv)
{
    const char *root = NULL;
    long pid = 0;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout);
            return GM_EXIT_OK;
        } else if (!strcmp(argv[i], "--root") || !strcmp(argv[i], "--pid")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gpumem doctor: %s needs a value\n", argv[i]);
                return GM_EXIT_USAGE;
            }
            if (!strcmp(argv[i], "--root")) {
                root = argv[++i];
                continue;
            }
            char *end;
            const char *text = argv[++i];
            errno = 0;
            pid = strtol(text, &end, 10);
            if (!*text || *end || pid <= 0 || errno == ERANGE || pid > INT_MAX) {
                fprintf(stderr, "gpumem doctor: --pid needs a positive process id, not '%s'\n", text);
                return GM_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "gpumem doctor: unknown argument '%s'\n", argv[i]);
            print_usage(stderr);
            return GM_EXIT_USAGE;
        }
    }
    gm_doctor_report *report = calloc(1, sizeof *report);
    if (!report) {
        fprintf(stderr, "gpumem doctor: out of host memory\n");
        return GM_EXIT_ERROR;
    }
    gm_doctor_options options = {.root = root, .pid = pid};
    gm_status status = gm_doctor_run(&options, report);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem doctor: %s\n", gm_last_error());
        free(report);
        return GM_EXIT_ERROR;
    }
    if (json)
        print_json(report, root, pid);
    else
        print_table(report);
    int exit_status = exit_status_of(report);
    if (!anything_read(report))
        fprintf(stderr, "gpumem doctor: not one finding could be read%s%s: nothing was checked\n",
                root ? " under " : "", root ? root : "");
    free(report);
    return exit_status;
}
