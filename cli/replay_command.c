/*
 * replay_command.c -- gpumem replay: load a trace, replay it on a fresh allocator, report. With
 * --passes N the trace is replayed N times on the same allocator (the first pass cold, the later
 * ones warm, as bench/gpu_replay.py measures on the GPU); each pass is reported on its own, its
 * device calls and peaks counted from its start. --snapshot FILE writes the allocator's state at the
 * end of the last pass (before the trace's remaining allocations are freed), --history FILE its
 * events (the newest history:N of them; --history alone keeps up to 1048576), both as JSON
 * (docs/formats.md). --report FILE writes the HTML report of gpumem report (report_command.c), which
 * replays the trace again, cold, on fresh allocators of the same configuration, so that sampling the
 * curve does not slow the measured passes. With --json each pass is one JSON object on a line of its
 * own (JSON lines), as bench scripts read them.
 */
#include "gpumem.h"

#include "base/file_save.h"
#include "base/options.h"
#include "tools/replay_lead.h"
#include "tools/trace.h"
#include "commands.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* What a pass with --lead waited for: the units of queued work its waits finished early. */
typedef struct lead_report {
    size_t lead;             /* 0: no --lead */
    uint64_t units_waited;
} lead_report;

static void print_json(const char *trace_path, const gm_device_info *device, const gm_replay_result *result, int pass,
                       const lead_report *lead)
{
    const gm_stats *stats = &result->stats;
    int64_t total_calls = 0;
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        total_calls += stats->device_calls[kind];
    printf("{\"trace\": ");
    gm_print_json_string(base_name(trace_path));
    printf(", \"backend\": \"%s\", \"engine\": \"%s\", \"ops\": %zu, \"allocs\": %zu, "
           "\"frees\": %zu, \"ooms\": %zu, \"peak_live_bytes\": %" PRIu64 ", \"peak_reserved_bytes\": %" PRIu64
           ", \"ratio\": %.6f, \"ns_per_op\": %.1f, \"device_call_ms\": %.3f, \"num_alloc_retries\": %" PRId64
           ", \"page_maps\": %" PRId64 ", \"page_unmaps\": %" PRId64 ", \"stitches\": %" PRId64
           ", \"device_calls\": {\"total\": %" PRId64,
           device->backend, device->engine, result->operations, result->allocations,
           result->frees, result->failed_allocations, result->peak_live_bytes, result->peak_reserved_bytes,
           result->ratio, result->ns_per_operation, (double)stats->device_call_ns / 1e6, stats->num_alloc_retries,
           stats->num_page_maps, stats->num_page_unmaps, stats->num_stitches, total_calls);
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        printf(", \"%s\": %" PRId64, gm_device_call_name((gm_device_call)kind), stats->device_calls[kind]);
    printf("}, \"device_call_ms_by_kind\": {");
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        printf("%s\"%s\": %.3f", kind ? ", " : "", gm_device_call_name((gm_device_call)kind),
               (double)stats->device_call_ns_by_kind[kind] / 1e6);
    printf("}");
    if (lead->lead)
        printf(", \"lead\": %zu, \"units_waited\": %" PRIu64, lead->lead, lead->units_waited);
    printf(", \"pass\": %d}\n", pass);
}

static void print_text(const char *trace_path, const gm_device_info *device, const gm_replay_result *result,
                       gm_allocator *allocator, int pass, int passes, const lead_report *lead)
{
    const gm_stats *stats = &result->stats;
    if (passes > 1)
        printf("%spass            %d of %d (%s)\n", pass ? "\n" : "", pass + 1, passes, pass ? "warm" : "cold");
    printf("trace           %s (%zu ops: %zu allocations, %zu frees)\n", base_name(trace_path), result->operations,
           result->allocations, result->frees);
    printf("device          %s (%s backend), engine %s\n", device->name, device->backend, device->engine);
    printf("peak live       %.1f MiB\n", (double)result->peak_live_bytes / 1048576.0);
    printf("peak reserved   %.1f MiB\n", (double)result->peak_reserved_bytes / 1048576.0);
    printf("ratio           %.4f\n", result->ratio);
    printf("CPU time        %.1f ns per operation\n", result->ns_per_operation);
    printf("device calls    ");
    for (int kind = 0; kind < GM_CALL_KIND_COUNT; kind++)
        if (stats->device_calls[kind])
            printf("%s %" PRId64 "  ", gm_device_call_name((gm_device_call)kind), stats->device_calls[kind]);
    printf("\ndevice time     %.3f ms%s\n", (double)stats->device_call_ns / 1e6,
           strcmp(device->backend, "sim") ? " (measured)" : " (H200 cost model)");
    if (lead->lead)
        printf("waits           %" PRId64 " for streams, finishing %" PRIu64 " units of work early (the device %zu "
               "operations behind)\n", stats->device_calls[GM_CALL_EVENT_SYNCHRONIZE], lead->units_waited, lead->lead);
    printf("out of memory   %zu allocations failed\n", result->failed_allocations);
    char table[8192];
    if (gm_summary(allocator, table, sizeof table, NULL) != GM_OK)
        return;
    printf("\nafter the replay, once everything was freed:\n");
    gm_stats now; /* reserved memory in a table of freed memory looks like a leak unless it is named */
    if (gm_get_stats(allocator, &now) == GM_OK && now.reserved_bytes[GM_POOL_ALL].current > 0)
        printf("(the GPU reserved memory still counted, %.1f MiB, is the cache kept for reuse; gm_empty_cache "
               "releases it)\n", (double)now.reserved_bytes[GM_POOL_ALL].current / 1048576.0);
    printf("%s", table);
}

#define REPLAY_USAGE                                                                                          \
    "usage: gpumem replay TRACE [--backend sim|host|cuda] [--capacity BYTES] [--conf ...] [--json] [--passes N]\n" \
    "                           [--lead N] [--snapshot FILE] [--history FILE] [--report FILE]\n"                   \
    "  --capacity BYTES (e.g. 80GiB): the simulated device's memory, by default an H200's 143771 MiB; give\n"     \
    "           what your GPU leaves the process: chunk sizes, and so the results, depend on it (sim backend)\n" \
    "  --json prints one JSON object per pass, one per line (JSON lines), not one JSON document\n"                  \
    "  --lead N: the simulated device runs N operations behind the host, as a GPU does; waits for streams\n"    \
    "           are counted with the work they finished early (sim and host backends)\n"

typedef struct replay_outputs {
    const char *snapshot_path;
    const char *history_path;
    const char *report_path;
    size_t lead; /* --lead, else 0 */
} replay_outputs;

static void write_string(FILE *out, const void *text)
{
    fputs(text, out);
}

/* Write `text` to `path`, whole or not at all; 0, or -1 after saying why. */
static int write_text(const char *path, const char *text, const char *what)
{
    if (gm_file_save(path, what, write_string, text) == GM_OK)
        return 0;
    fprintf(stderr, "gpumem replay: %s\n", gm_last_error());
    return -1;
}

/* What a pass's hooks see. */
typedef struct pass_context {
    const replay_outputs *outputs;
    gm_replay_lead *lead;
} pass_context;

static gm_status after_operation(gm_allocator *allocator, size_t index, uint64_t live_bytes, void *context)
{
    return gm_replay_lead_after_operation(allocator, index, live_bytes, ((pass_context *)context)->lead);
}

/* The replay's end (before the final frees): the snapshot, when asked for. */
static gm_status write_snapshot(gm_allocator *allocator, void *context)
{
    const replay_outputs *outputs = ((pass_context *)context)->outputs;
    gm_snapshot *snapshot = NULL;
    char *json = NULL;
    gm_status status = gm_snapshot_take(allocator, &snapshot);
    if (status == GM_OK)
        status = gm_snapshot_json(snapshot, &json);
    if (status == GM_OK && write_text(outputs->snapshot_path, json, "snapshot") != 0)
        status = GM_ERROR_IO;
    gm_json_free(json);
    gm_snapshot_free(snapshot);
    return status;
}

static int write_history(gm_allocator *allocator, const char *path)
{
    char *json = NULL;
    gm_status status = gm_history_json(allocator, &json);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem replay: no history: %s\n", gm_last_error());
        return -1;
    }
    int result = write_text(path, json, "history");
    gm_json_free(json);
    return result;
}
#define MAX_PASSES 100
#define MAX_LEAD 1000000

/* A whole number from 1 to `most`, else 0. */
static long parse_count(const char *text, long most)
{
    char *end = NULL;
    errno = 0;
    long value = text ? strtol(text, &end, 10) : 0;
    return text && *text && !*end && !errno && value >= 1 && value <= most ? value : 0;
}

/* A replay on sim or host that failed because the trace alone needs more than the device: the capacity is
 * the user's to choose (the host backend's default is only 1 GiB), so say how, with a size that leaves a
 * quarter of room for the cache's fragmentation, within the largest capacity the options take. */
static void suggest_capacity(const gm_device_info *device, const gm_trace *trace)
{
    bool capacity_is_chosen = !strcmp(device->backend, "sim") || !strcmp(device->backend, "host");
    if (!capacity_is_chosen || trace->peak_live_bytes <= device->total_bytes)
        return;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (trace->peak_live_bytes > GM_MAX_CAPACITY) {
        fprintf(stderr, "gpumem replay: this trace's live allocations alone peak at %.2f GiB, more than the largest "
                "%s device gpumem makes (%.0f GiB): it cannot be replayed whole\n",
                (double)trace->peak_live_bytes / gib, device->backend, (double)GM_MAX_CAPACITY / gib);
        return;
    }
    uint64_t room = trace->peak_live_bytes + trace->peak_live_bytes / 4, most = GM_MAX_CAPACITY;
    uint64_t suggested_gib = ((room < most ? room : most) + (1ull << 30) - 1) >> 30;
    fprintf(stderr, "gpumem replay: this trace's live allocations alone peak at %.2f GiB, more than the %s "
            "device's %.2f GiB: raise it with --capacity, e.g. --capacity %" PRIu64 "GiB%s\n",
            (double)trace->peak_live_bytes / gib, device->backend, (double)device->total_bytes / gib, suggested_gib,
            strcmp(device->backend, "host") ? "" : " (the host backend's default is 1GiB)");
}

/* One pass, with the hooks it needs: the lead's (its work waited for counted in *waited_out) and, in the
 * last pass, the snapshot's. */
static gm_status replay_one_pass(gm_allocator *allocator, const gm_trace *trace, const replay_outputs *outputs,
                                 gm_replay_lead *lead, bool last, gm_replay_result *result_out, lead_report *waited_out)
{
    pass_context context = {outputs, lead};
    gm_replay_hooks hooks = {.after_operation = lead ? after_operation : NULL,
                             .at_end = last && outputs->snapshot_path ? write_snapshot : NULL,
                             .context = &context};
    uint64_t waited_before = 0;
    gm_status status = lead ? gm_sim_work_waited_for(allocator, &waited_before) : GM_OK;
    if (status == GM_OK)
        status = gm_replay_with_hooks(allocator, trace, result_out, &hooks);
    if (status == GM_OK && lead && (status = gm_sim_work_waited_for(allocator, &waited_out->units_waited)) == GM_OK) {
        waited_out->units_waited -= waited_before;
        status = gm_replay_lead_catch_up(lead); /* the next pass starts with the device caught up */
    }
    return status;
}

/* Replay `passes` times on one allocator, reporting each pass; the exit status. A pass that runs out of
 * memory is the last: the passes after it would measure a replay that failed, not a warm one. */
static int replay_passes(gm_allocator *allocator, const gm_trace *trace, const char *trace_path, int json, int passes,
                         const replay_outputs *outputs)
{
    gm_device_info device;
    gm_get_device_info(allocator, &device);
    gm_replay_lead *lead = NULL;
    if (outputs->lead && gm_replay_lead_create(allocator, trace, outputs->lead, &lead) != GM_OK) {
        fprintf(stderr, "gpumem replay: --lead: %s\n", gm_last_error());
        return GM_EXIT_USAGE;
    }
    int exit_status = GM_EXIT_OK;
    int pass = 0;
    for (; pass < passes && exit_status == GM_EXIT_OK; pass++) {
        if (pass) { /* each pass counts its own device calls and peaks */
            gm_reset_accumulated_stats(allocator);
            gm_reset_peak_stats(allocator);
        }
        gm_replay_result result;
        lead_report waited = {outputs->lead, 0};
        gm_status status = replay_one_pass(allocator, trace, outputs, lead, pass + 1 == passes, &result, &waited);
        if (status == GM_ERROR_IO) {
            gm_replay_lead_free(lead);
            return GM_EXIT_ERROR;
        }
        if (status != GM_OK) {
            fprintf(stderr, "gpumem replay: %s: %s\n", gm_strerror(status), gm_last_error());
            gm_replay_lead_free(lead);
            return GM_EXIT_ERROR;
        }
        if (json)
            print_json(trace_path, &device, &result, pass, &waited);
        else
            print_text(trace_path, &device, &result, allocator, pass, passes, &waited);
        if (result.failed_allocations) {
            fprintf(stderr, "gpumem replay: %zu allocations failed with out of memory; the first:\n%s\n",
                    result.failed_allocations, result.first_failure);
            suggest_capacity(&device, trace);
            exit_status = GM_EXIT_OUT_OF_MEMORY;
        }
    }
    gm_replay_lead_free(lead);
    if (pass < passes) {
        char skipped[48];
        snprintf(skipped, sizeof skipped, pass + 1 == passes ? "pass %d was" : "passes %d to %d were", pass + 1,
                 passes);
        fprintf(stderr, "gpumem replay: %s not run: pass %d ran out of memory\n", skipped, pass);
    }
    if (outputs->history_path && write_history(allocator, outputs->history_path) != 0)
        return GM_EXIT_ERROR;
    return exit_status;
}

/* What gpumem replay's command line asks for. */
typedef struct replay_arguments {
    gm_device_arguments device;
    const char *trace_path;
    int json;
    int passes;
    replay_outputs outputs;
} replay_arguments;

/* Parse the command line into *arguments: -1 after saying what is wrong, 1 after printing the help,
 * else 0. */
static int parse_arguments(int argc, char **argv, replay_arguments *arguments)
{
    replay_outputs *outputs = &arguments->outputs;
    for (int i = 0; i < argc; i++) {
        int taken = gm_take_device_argument(&arguments->device, argc, argv, &i);
        if (taken < 0)
            return -1;
        if (taken)
            continue;
        if (!strcmp(argv[i], "--json")) {
            arguments->json = 1;
        } else if (!strcmp(argv[i], "--passes")) {
            if (!(arguments->passes = (int)parse_count(i + 1 < argc ? argv[++i] : NULL, MAX_PASSES))) {
                fprintf(stderr, "gpumem replay: --passes needs a whole number from 1 to %d\n", MAX_PASSES);
                return -1;
            }
        } else if (!strcmp(argv[i], "--lead")) {
            if (!(outputs->lead = (size_t)parse_count(i + 1 < argc ? argv[++i] : NULL, MAX_LEAD))) {
                fprintf(stderr, "gpumem replay: --lead needs a whole number of operations from 1 to %d\n", MAX_LEAD);
                return -1;
            }
        } else if (!strcmp(argv[i], "--snapshot") || !strcmp(argv[i], "--history") || !strcmp(argv[i], "--report")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "gpumem replay: %s needs a file name\n", argv[i]);
                return -1;
            }
            *(argv[i][2] == 's' ? &outputs->snapshot_path
              : argv[i][2] == 'h' ? &outputs->history_path
                                  : &outputs->report_path) = argv[i + 1];
            i++;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s", REPLAY_USAGE);
            return 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "gpumem replay: unknown option '%s'\n", argv[i]);
            return -1;
        } else if (arguments->trace_path) {
            fprintf(stderr, "gpumem replay: one trace at a time ('%s' and '%s')\n", arguments->trace_path, argv[i]);
            return -1;
        } else {
            arguments->trace_path = argv[i];
        }
    }
    if (!arguments->trace_path) {
        fprintf(stderr, "%s", REPLAY_USAGE);
        return -1;
    }
    return 0;
}

int gm_command_replay(int argc, char **argv)
{
    replay_arguments arguments = {.passes = 1};
    int parsed = parse_arguments(argc, argv, &arguments);
    if (parsed)
        return parsed > 0 ? GM_EXIT_OK : GM_EXIT_USAGE;
    const replay_outputs *outputs = &arguments.outputs;
    const char *trace_path = arguments.trace_path;
    /* The report keeps no history; the replay keeps a ring unless --conf sized one. */
    char *report_configuration = gm_device_configuration(&arguments.device, NULL);
    bool add_history = outputs->history_path && report_configuration && !strstr(report_configuration, "history:");
    char *configuration = gm_device_configuration(&arguments.device, add_history ? "history:1048576" : NULL);
    if (!configuration || !report_configuration) {
        free(configuration);
        free(report_configuration);
        return GM_EXIT_ERROR;
    }
    gm_trace trace;
    gm_status status = gm_trace_load(trace_path, &trace);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem replay: %s\n", gm_last_error());
        free(configuration);
        free(report_configuration);
        return status == GM_ERROR_PARSE ? GM_EXIT_USAGE : GM_EXIT_ERROR;
    }
    gm_allocator *allocator = NULL;
    status = gm_create_from_environment(configuration, &allocator);
    free(configuration);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem replay: cannot create the allocator: %s: %s\n", gm_strerror(status), gm_last_error());
        gm_trace_free(&trace);
        free(report_configuration);
        return status == GM_ERROR_BAD_CONFIG ? GM_EXIT_USAGE : GM_EXIT_ERROR;
    }
    int exit_status = replay_passes(allocator, &trace, trace_path, arguments.json, arguments.passes, outputs);
    gm_destroy(allocator, NULL);
    if (outputs->report_path && (exit_status == GM_EXIT_OK || exit_status == GM_EXIT_OUT_OF_MEMORY)) {
        int report_status =
            gm_report_of_trace(&trace, trace_path, report_configuration, outputs->report_path, "replay");
        if (report_status != GM_EXIT_OK && report_status != GM_EXIT_OUT_OF_MEMORY)
            exit_status = report_status;
    }
    free(report_configuration);
    gm_trace_free(&trace);
    return exit_status;
}
