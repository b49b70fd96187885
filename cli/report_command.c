/*
 * report_command.c -- gpumem report INPUT -o FILE: one self-contained HTML page (src/report/html_report.h)
 * about a trace, a history or a snapshot, told apart by their content (src/tools/json_formats.h).
 *
 * A trace is replayed on a fresh allocator of the configured device with a hook that samples the
 * memory curve after every operation; then replayed again on another fresh allocator, which is
 * deterministic on the sim backend, to take a snapshot after the operation where reserved memory first
 * reached its peak. A history gives the curve from its events and, when it is whole, the map at its
 * peak rebuilt from them; a snapshot gives its map and statistics, and has no time axis.
 * `gpumem replay TRACE --report FILE` goes through gm_report_of_trace, the same code.
 */
#include "gpumem.h"

#include "base/format.h"
#include "commands.h"
#include "report/history_map.h"
#include "report/html_report.h"
#include "report/memory_curve.h"
#include "tools/json_formats.h"
#include "tools/trace.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { CURVE_BUCKETS = 1024, NOTE_SIZE = 512 };

#define REPORT_USAGE                                                                                          \
    "usage: gpumem report INPUT -o FILE [--backend sim|host|cuda] [--capacity BYTES] [--conf KEY:VALUE,...]\n" \
    "  INPUT: a trace (as gpumem replay reads it), or a history or snapshot (JSON, as gpumem replay\n"        \
    "  --history / --snapshot writes them); FILE: the HTML report. The device options apply to a trace.\n"

/* Notes for the page, kept here so that the report can point at them. */
typedef struct notes {
    char text[GM_HTML_REPORT_MAXIMUM_NOTES][NOTE_SIZE];
} notes;

static void add_note(gm_html_report *report, notes *notes, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

static void add_note(gm_html_report *report, notes *notes, const char *format, ...)
{
    if (report->note_count >= GM_HTML_REPORT_MAXIMUM_NOTES)
        return;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(notes->text[report->note_count], NOTE_SIZE, format, arguments);
    va_end(arguments);
    report->notes[report->note_count] = notes->text[report->note_count];
    report->note_count++;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The exit status for a failure of this status. */
static int exit_status_of(gm_status status)
{
    return status == GM_ERROR_PARSE || status == GM_ERROR_BAD_CONFIG ? GM_EXIT_USAGE : GM_EXIT_ERROR;
}

static int save(const gm_html_report *report, const char *output_path, const char *command)
{
    gm_status status = gm_html_report_save(report, output_path);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem %s: %s\n", command, gm_last_error());
        return GM_EXIT_ERROR;
    }
    return GM_EXIT_OK;
}

/* ---------------------------------------------------------------- a trace */

static gm_status sample_curve(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context)
{
    gm_stats stats;
    gm_status status = gm_get_stats(allocator, &stats);
    if (status == GM_OK)
        gm_memory_curve_add(context, index, live_bytes, (uint64_t)stats.reserved_bytes[GM_POOL_ALL].current);
    return status;
}

typedef struct peak_catcher {
    size_t index;
    gm_snapshot *snapshot;
} peak_catcher;

static gm_status catch_peak(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context)
{
    (void)live_bytes;
    peak_catcher *catcher = context;
    if (index != catcher->index || catcher->snapshot)
        return GM_OK;
    return gm_snapshot_take(allocator, &catcher->snapshot);
}

/* One replay on a fresh allocator of `configuration`, with `hooks`. */
static gm_status replay_once(const gm_trace *trace, const char *configuration, const gm_replay_hooks *hooks,
                             gm_replay_result *result, gm_device_info *device)
{
    gm_allocator *allocator = NULL;
    gm_status status = gm_create_from_environment(configuration, &allocator);
    if (status != GM_OK)
        return status;
    status = gm_get_device_info(allocator, device);
    if (status == GM_OK)
        status = gm_replay_with_hooks(allocator, trace, result, hooks);
    gm_destroy(allocator, NULL);
    return status;
}

/* The trace replayed twice on fresh allocators: once sampling its memory curve (result), once stopped
 * where reserved memory first reached its peak (catcher's snapshot). */
static gm_status replay_to_peak(const gm_trace *trace, const char *configuration, gm_memory_curve *curve,
                                gm_replay_result *result, peak_catcher *catcher, gm_device_info *device)
{
    gm_replay_hooks sampling = {.after_operation = sample_curve, .context = curve};
    gm_status status = replay_once(trace, configuration, &sampling, result, device);
    if (status != GM_OK)
        return status;
    catcher->index = curve->peak_reserved_x;
    gm_replay_result second;
    gm_replay_hooks stopping = {.after_operation = catch_peak, .context = catcher};
    return replay_once(trace, configuration, &stopping, &second, device);
}

/* What the report of a replayed trace says beside its numbers: where the two replays differ, a peak
 * inside an operation, allocations that failed. */
static void note_trace_replay(gm_html_report *report, notes *notes, const peak_catcher *catcher,
                              const gm_memory_curve *curve, const gm_replay_result *result)
{
    if (catcher->snapshot &&
        (uint64_t)catcher->snapshot->stats.reserved_bytes[GM_POOL_ALL].current != curve->peak_reserved)
        add_note(report, notes,
                 "The second replay held %" PRId64 " bytes reserved at operation %zu, not the first replay's %" PRIu64
                 ": this backend does not replay deterministically, so the map is of a nearby state.",
                 catcher->snapshot->stats.reserved_bytes[GM_POOL_ALL].current, catcher->index, curve->peak_reserved);
    if (curve->peak_reserved != result->peak_reserved_bytes)
        add_note(report, notes,
                 "Reserved memory peaked at %" PRIu64 " bytes inside an operation; after any operation it was at most %" PRIu64
                 " bytes (the curve and the map).",
                 result->peak_reserved_bytes, curve->peak_reserved);
    if (result->failed_allocations)
        add_note(report, notes, "%zu allocations failed with out of memory; the replay skipped their frees.",
                 result->failed_allocations);
}

int gm_report_of_trace(const gm_trace *trace, const char *trace_path, const char *configuration,
                       const char *output_path, const char *command)
{
    gm_memory_curve curve;
    gm_replay_result *result = calloc(1, sizeof *result);
    notes *notes = calloc(1, sizeof *notes);
    peak_catcher catcher = {0};
    gm_device_info device;
    int exit_status = GM_EXIT_ERROR;
    gm_status status = result && notes ? gm_memory_curve_init(&curve, CURVE_BUCKETS) : GM_ERROR_OUT_OF_MEMORY;
    if (status != GM_OK) {
        fprintf(stderr, "gpumem %s: no host memory for the report\n", command);
        free(result);
        free(notes);
        return GM_EXIT_ERROR;
    }
    status = replay_to_peak(trace, configuration, &curve, result, &catcher, &device);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem %s: cannot replay '%s' for the report: %s: %s\n", command, trace_path,
                gm_strerror(status), gm_last_error());
        exit_status = status == GM_ERROR_BAD_CONFIG ? GM_EXIT_USAGE : GM_EXIT_ERROR;
        goto done;
    }
    int64_t calls = 0;
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        calls += result->stats.device_calls[kind];
    char moment[NOTE_SIZE], peak[32];
    snprintf(moment, sizeof moment,
             "After operation %zu of %zu, where reserved memory first reached its peak (%s): the trace replayed a "
             "second time on a fresh allocator of the same configuration, stopped there.",
             catcher.index, trace->count, gm_format_bytes(peak, sizeof peak, curve.peak_reserved));
    gm_html_report report = {
        .input_name = base_name(trace_path), .input_kind = "trace replayed", .backend = device.backend,
        .engine = device.engine, .device_name = device.name, .has_peaks = true,
        .peak_live_bytes = result->peak_live_bytes, .peak_reserved_bytes = result->peak_reserved_bytes,
        .has_device_calls = true, .device_calls = calls, .device_call_ns = result->stats.device_call_ns,
        .has_operations = true, .operations = result->operations, .failed_allocations = result->failed_allocations,
        .curve = &curve, .curve_unit = "operation", .map = catcher.snapshot, .map_moment = moment,
        .no_map_reason = "The second replay did not reach the peak's operation.", .stats = &result->stats,
        .stats_moment = "At the end of the trace, before its remaining allocations are freed (peaks cover the "
                        "whole replay)."};
    note_trace_replay(&report, notes, &catcher, &curve, result);
    exit_status = save(&report, output_path, command);
    if (exit_status == GM_EXIT_OK && result->failed_allocations) {
        fprintf(stderr, "gpumem %s: %zu allocations failed with out of memory (the report shows them)\n", command,
                result->failed_allocations);
        exit_status = GM_EXIT_OUT_OF_MEMORY;
    }
done:
    gm_snapshot_free(catcher.snapshot);
    gm_memory_curve_free(&curve);
    free(result);
    free(notes);
    return exit_status;
}

/* ---------------------------------------------------------------- a history */

/* What the report of a history says beside its curve and map: its events by kind, what the ring
 * dropped, actions left out. */
static void note_history(gm_html_report *report, notes *notes, const gm_history_file *history,
                         uint64_t allocated_baseline, uint64_t reserved_baseline)
{
    size_t by_kind[GM_EVENT_KIND_COUNT] = {0};
    for (size_t i = 0; i < history->count; i++)
        by_kind[history->events[i].kind]++;
    add_note(report, notes,
             "%zu events: %zu alloc, %zu free_requested, %zu free_completed, %zu segment_map, %zu segment_unmap, "
             "%zu oom.",
             history->count, by_kind[GM_EVENT_ALLOC], by_kind[GM_EVENT_FREE_REQUESTED],
             by_kind[GM_EVENT_FREE_COMPLETED], by_kind[GM_EVENT_SEGMENT_MAP], by_kind[GM_EVENT_SEGMENT_UNMAP],
             by_kind[GM_EVENT_OOM]);
    if (history->dropped)
        add_note(report, notes,
                 "The ring dropped %" PRIu64 " older events: the levels start from the lowest baseline that keeps "
                 "them from going below zero (%" PRIu64 " bytes allocated, %" PRIu64 " reserved), a lower bound, "
                 "and the peaks are those of the events held.",
                 history->dropped, allocated_baseline, reserved_baseline);
    if (history->unknown_actions)
        add_note(report, notes, "%zu events of actions this gpumem does not know were left out.",
                 history->unknown_actions);
}

static int report_of_history(const gm_input_file *input, const char *output_path)
{
    gm_history_file history;
    gm_status status = gm_history_parse(input, &history);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem report: %s\n", gm_last_error());
        return exit_status_of(status);
    }
    gm_history_peak at_peak;
    notes *notes = calloc(1, sizeof *notes);
    status = notes ? gm_history_peak_build(history.events, history.count, !history.dropped, CURVE_BUCKETS, &at_peak)
                   : GM_ERROR_OUT_OF_MEMORY;
    if (status != GM_OK) {
        fprintf(stderr, "gpumem report: no host memory for the report\n");
        free(notes);
        gm_history_file_free(&history);
        return GM_EXIT_ERROR;
    }
    char moment[NOTE_SIZE], peak[32];
    snprintf(moment, sizeof moment,
             "After event %zu of %zu (reserved memory first reached its peak, %s, at event %" PRIu64 "), rebuilt "
             "from the events: the regions are the mappings then held (neighbouring ones of a stream joined), each "
             "block sized as requested, rounded up to 512 bytes.",
             at_peak.moment, history.count, gm_format_bytes(peak, sizeof peak, at_peak.curve.peak_reserved),
             at_peak.curve.peak_reserved_x);
    gm_html_report report = {
        .input_name = base_name(input->path), .input_kind = "history", .has_peaks = history.count > 0,
        .peaks_are_lower_bounds = history.dropped > 0,
        .peak_live_bytes = at_peak.curve.peak_allocated,
        .peak_reserved_bytes = at_peak.curve.peak_reserved, .curve = &at_peak.curve, .curve_unit = "event",
        .no_curve_reason = "The history holds no events.", .map = at_peak.map, .map_moment = moment,
        .no_map_reason = history.count ? "The history's ring dropped older events, so the memory map at the peak "
                                         "cannot be rebuilt from it."
                                       : "The history holds no events.",
        .no_stats_reason = "A history holds events, not statistics, so there is no memory_summary() table "
                           "(a snapshot has one: gpumem replay --snapshot)."};
    note_history(&report, notes, &history, at_peak.allocated_baseline, at_peak.reserved_baseline);
    int exit_status = save(&report, output_path, "report");
    gm_history_peak_free(&at_peak);
    gm_history_file_free(&history);
    free(notes);
    return exit_status;
}

/* ---------------------------------------------------------------- a snapshot */

static int report_of_snapshot(const gm_input_file *input, const char *output_path)
{
    gm_snapshot *snapshot = NULL;
    gm_status status = gm_snapshot_parse(input, &snapshot);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem report: %s\n", gm_last_error());
        return exit_status_of(status);
    }
    const gm_stats *stats = &snapshot->stats;
    int64_t calls = 0; /* a hand-made snapshot may hold any counts: the sum stops at INT64_MAX */
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        if (stats->device_calls[kind] > 0 && __builtin_add_overflow(calls, stats->device_calls[kind], &calls))
            calls = INT64_MAX;
    gm_html_report report = {
        .input_name = base_name(input->path), .input_kind = "snapshot", .backend = snapshot->device.backend,
        .engine = snapshot->device.engine, .has_peaks = true,
        .peak_live_bytes = (uint64_t)stats->requested_bytes[GM_POOL_ALL].peak,
        .peak_reserved_bytes = (uint64_t)stats->reserved_bytes[GM_POOL_ALL].peak, .has_device_calls = true,
        .device_calls = calls, .device_call_ns = stats->device_call_ns,
        .no_curve_reason = "A snapshot is one moment: it has no time axis, so there is no memory curve. The peaks "
                           "above are its statistics' (over the allocator's life up to the snapshot).",
        .map = snapshot,
        .map_moment = "The snapshot's moment (for gpumem replay --snapshot, the end of the trace before its "
                      "remaining allocations are freed), which need not be the peak.",
        .stats = stats,
        .stats_moment = "As the snapshot recorded them. A snapshot holds the current and peak readings only, so "
                        "Tot Alloc and Tot Freed read 0."};
    int exit_status = save(&report, output_path, "report");
    gm_snapshot_file_free(snapshot);
    return exit_status;
}

/* ---------------------------------------------------------------- the command */

/* The command line into its input, output and device arguments; -1 to go on, else the exit status. */
static int parse_arguments(int argc, char **argv, gm_device_arguments *device_arguments, const char **input_out,
                           const char **output_out)
{
    for (int i = 0; i < argc; i++) {
        int taken = gm_take_device_argument(device_arguments, argc, argv, &i);
        if (taken < 0)
            return GM_EXIT_USAGE;
        if (taken)
            continue;
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gpumem report: %s needs a file name\n", argv[i]);
                return GM_EXIT_USAGE;
            }
            *output_out = argv[++i];
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s", REPORT_USAGE);
            return GM_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "gpumem report: unknown option '%s'\n", argv[i]);
            return GM_EXIT_USAGE;
        } else if (*input_out) {
            fprintf(stderr, "gpumem report: one input at a time ('%s' and '%s')\n", *input_out, argv[i]);
            return GM_EXIT_USAGE;
        } else {
            *input_out = argv[i];
        }
    }
    if (!*input_out || !*output_out) {
        fprintf(stderr, "%s%s", *input_out ? "gpumem report: -o FILE is needed\n" : "", REPORT_USAGE);
        return GM_EXIT_USAGE;
    }
    struct stat input, output;
    if (stat(*input_out, &input) == 0 && S_ISREG(input.st_mode) && stat(*output_out, &output) == 0 &&
        input.st_dev == output.st_dev && input.st_ino == output.st_ino) {
        fprintf(stderr, "gpumem report: '%s' is the input: the report would replace it (give another -o FILE)\n",
                *output_out);
        return GM_EXIT_USAGE;
    }
    return -1;
}

/* A trace file replayed on the device the arguments describe, into a report. */
static int report_of_trace_file(gm_input_file *input, const gm_device_arguments *device_arguments,
                                const char *output_path)
{
    const char *input_path = input->path;
    char *configuration = gm_device_configuration(device_arguments, NULL);
    if (!configuration)
        return GM_EXIT_ERROR;
    gm_trace trace;
    gm_status status = gm_trace_load_source(input->source, &trace);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem report: %s\n", gm_last_error());
        free(configuration);
        return exit_status_of(status);
    }
    int exit_status = gm_report_of_trace(&trace, input_path, configuration, output_path, "report");
    free(configuration);
    gm_trace_free(&trace);
    return exit_status;
}

int gm_command_report(int argc, char **argv)
{
    gm_device_arguments device_arguments = {0};
    const char *input_path = NULL, *output_path = NULL;
    int parsed = parse_arguments(argc, argv, &device_arguments, &input_path, &output_path);
    if (parsed >= 0)
        return parsed;
    gm_input_file input;
    gm_status status = gm_input_open(input_path, &input);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem report: %s\n", gm_last_error());
        return exit_status_of(status);
    }
    int exit_status;
    if (input.kind == GM_INPUT_HISTORY)
        exit_status = report_of_history(&input, output_path);
    else if (input.kind == GM_INPUT_SNAPSHOT)
        exit_status = report_of_snapshot(&input, output_path);
    else
        exit_status = report_of_trace_file(&input, &device_arguments, output_path);
    gm_input_close(&input);
    return exit_status;
}
