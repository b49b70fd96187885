/*
 * doctor.h -- gpumem doctor: an audit of the host settings that break GPU training jobs.
 *
 * The audit reads everything through a root directory ("/" on a live machine, a fixture tree of
 * /proc and /sys in tests) and produces plain findings: an id ("memory.available"), a severity, the
 * measured value, why it matters for GPU training and the fix. What cannot be read becomes a finding
 * of severity "unknown" naming the file, never a silent gap. The command line renders the findings
 * as a table or as JSON (cli/doctor_command.c); the thresholds are documented in doctor.c.
 */
#ifndef GM_DOCTOR_H
#define GM_DOCTOR_H

#include "gpumem.h"

#include <stddef.h>
#include <stdint.h>

typedef enum gm_doctor_severity {
    GM_DOCTOR_OK = 0,
    GM_DOCTOR_UNKNOWN = 1, /* could not be read: reported, but not worse than ok */
    GM_DOCTOR_WARN = 2,
    GM_DOCTOR_FAIL = 3,
} gm_doctor_severity;

typedef struct gm_doctor_finding {
    char id[48];
    gm_doctor_severity severity;
    char value[200]; /* the measured value, in words and numbers */
    char why[480];   /* why it matters for GPU training, with the threshold */
    char fix[320];   /* the command or configuration line; empty when nothing is to be done */
} gm_doctor_finding;

/* One process of the --pid tree; byte counts are -1 where the kernel did not say. */
typedef struct gm_doctor_process {
    long pid, parent;
    int depth; /* 0 for the process asked for, 1 for its children, ... */
    char name[64];
    int64_t rss_bytes, pss_bytes, uss_bytes, swap_bytes, locked_bytes;
} gm_doctor_process;

#define GM_DOCTOR_FINDINGS_MAX 64
#define GM_DOCTOR_PROCESSES_MAX 256

typedef struct gm_doctor_report {
    gm_doctor_finding findings[GM_DOCTOR_FINDINGS_MAX];
    size_t finding_count;
    gm_doctor_process processes[GM_DOCTOR_PROCESSES_MAX];
    size_t process_count;
    size_t processes_left_out; /* beyond GM_DOCTOR_PROCESSES_MAX */
} gm_doctor_report;

typedef struct gm_doctor_options {
    const char *root; /* NULL or "/" for this machine */
    long pid;         /* 0: no process tree; limits and cgroup are then those of /proc/self */
} gm_doctor_options;

/* Run the audit into *report. GM_ERROR_IO, with the reason in gm_last_error(), when the root is not a
 * readable directory or the process `pid` is not found under it; every other unreadable file is a
 * finding of severity unknown. */
gm_status gm_doctor_run(const gm_doctor_options *options, gm_doctor_report *report);

/* The worst severity among the findings (unknown counts as ok). */
gm_doctor_severity gm_doctor_worst(const gm_doctor_report *report);

/* "ok", "unknown", "warn", "fail". */
const char *gm_doctor_severity_name(gm_doctor_severity severity);

#endif
