/*
 * html_report.h -- one self-contained HTML page about an allocator's memory: headline numbers, memory
 * over time, the memory map at the peak of reserved memory, the largest allocations live then and the
 * memory_summary() table. No network access and no external resources: the charts are inline SVG
 * that render without script; a small inline script only adds a hover read-out to the curve and marks
 * <body data-report-check="ok"> once it has checked that the page's parts are there.
 *
 * The page is told what to show; what is missing (a snapshot has no time axis, a history has no
 * statistics) is said on the page with the reason given. Every string goes through HTML escaping.
 */
#ifndef GM_HTML_REPORT_H
#define GM_HTML_REPORT_H

#include "gpumem.h"
#include "report/memory_curve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { GM_HTML_REPORT_MAXIMUM_NOTES = 8 };

typedef struct gm_html_report {
    const char *input_name;  /* the input file, shown in the title */
    const char *input_kind;  /* "trace", "history" or "snapshot" */
    const char *backend;     /* may be NULL or "" when not known, as may the next two */
    const char *engine;
    const char *device_name;

    /* Headline numbers. */
    bool has_peaks;
    bool peaks_are_lower_bounds; /* a history whose ring dropped older events: "at least", and no ratio */
    uint64_t peak_live_bytes; /* bytes asked for, as gpumem replay's peak_live_bytes */
    uint64_t peak_reserved_bytes;
    bool has_device_calls;
    int64_t device_calls;
    int64_t device_call_ns;
    bool has_operations;
    size_t operations;
    size_t failed_allocations;

    /* Memory over time, or NULL with the reason. */
    const gm_memory_curve *curve;
    const char *curve_unit; /* "operation" or "event" */
    const char *no_curve_reason;

    /* The memory map, or NULL with the reason; map_moment says when it was taken. Its allocated
     * blocks give the table of the largest allocations. */
    const gm_snapshot *map;
    const char *map_moment;
    const char *no_map_reason;

    /* The statistics for the memory_summary() table, or NULL with the reason. */
    const gm_stats *stats;
    const char *stats_moment;
    const char *no_stats_reason;

    const char *notes[GM_HTML_REPORT_MAXIMUM_NOTES]; /* remarks shown under the headline */
    size_t note_count;
} gm_html_report;

/* The page, to `out`. */
void gm_html_report_write(const gm_html_report *report, FILE *out);

/* The page, to `path`, whole or not at all: written to a temporary file beside it, then renamed over
 * it. GM_ERROR_IO with the reason in gm_last_error() ("cannot write the report to 'PATH': ..."). */
gm_status gm_html_report_save(const gm_html_report *report, const char *path);

#endif
