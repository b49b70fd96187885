/*
 * tune_command.c -- gpumem tune TRACE: which configuration suits this workload's memory?
 *
 * The defaults make memory in chunks of up to 128 MiB, cheap in device calls; on some models (a ViT,
 * a decoder whose lengths change, a diffusion UNet) live tensors then pin free pages inside those
 * chunks. Stitching, on by default, lays a request across second mappings of pinned chunks' free ends
 * and starts (a few device calls each); the free pages between live blocks inside a chunk it cannot
 * reach, and reserved memory may end a few percent above the live peak. Two settings, off by default
 * for what they cost elsewhere, fix that (docs/engine.md): small chunks that settle
 * (max_chunk_size:8MiB,move_slack:0.01: more device calls as memory is first made, and at every step
 * for shapes that change) and compaction (compact_min:2MiB: pinned chunks split, their live pages
 * copied, which is safe only when one thread at a time launches work on the device); and where the
 * defaults run out of memory, the OOM report's first remedy too, page-sized chunks (max_chunk_size:2MiB:
 * every free page can move). The defaults without stitching are
 * a candidate too, for what stitching costs and spares on this trace. Which one pays depends on the
 * program, and its own allocation trace answers that in seconds on the simulated device: each candidate replays the trace `passes` times on one allocator (the first pass cold, the
 * later ones warm, as a training loop repeats its steps), and the table gives each one's peak reserved
 * memory over all passes, its ratio to the live peak in each pass and its device-call time. The
 * recommendation is the candidate that reserves the least, when it saves at least half a percent of
 * the live peak over the defaults (less is within what the ratios swing between runs of a program),
 * or fits where the defaults run out of memory; otherwise the defaults.
 *
 * The allocations come from a trace (`python -m gpumem.whatif SNAPSHOT --trace FILE` makes one of a
 * PyTorch snapshot, under PyTorch's allocator or gpumem's; docs/formats.md) or from a gpumem history
 * (gm_trace_from_events: `gpumem replay --history`, or `gpumem run --tune`, which runs this on the
 * command's history with the memory its GPU left it as the simulated device's capacity, so that a program
 * that ran out of memory learns under which setting it fits).
 */
#include "gpumem.h"

#include "commands.h"
#include "tools/json_formats.h"
#include "tools/trace.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TUNE_MAX_PASSES 10
#define DEFAULT_PASSES 3
#define MIB 1048576.0

typedef struct candidate {
    const char *name;
    const char *configuration; /* keys over --conf; "" for the defaults */
    const char *cost;          /* what it costs, said with a recommendation */
} candidate;

/* The last, page-sized chunks, is tried only when the defaults run out of memory: it is the OOM report's
 * first remedy for fragmentation, and a program that fits does not need every free page to move at the
 * price of a device call per page made. */
static const candidate candidates[] = {
    {"defaults", "", ""},
    {"small chunks", "max_chunk_size:8MiB,move_slack:0.01",
     "more device calls as memory is first made, and in steps whose shapes change"},
    {"without stitching", "stitch:false",
     "more memory made anew, where stitching would lay requests across pinned chunks' free ends and starts "
     "(docs/engine.md, \"Stitching\")"},
    {"compaction", "compact_min:2MiB",
     "copies of live pages after a device-wide wait; only for programs in which one thread at a time launches "
     "work on the GPU (a training loop), not for servers whose threads launch work at once"},
    {"page-sized chunks", "max_chunk_size:2MiB",
     "a device call per page as memory is first made, and page moves in steps whose shapes change"},
};
enum { CANDIDATE_COUNT = sizeof candidates / sizeof candidates[0], ALWAYS_TRIED = CANDIDATE_COUNT - 1 };

typedef struct outcome {
    bool ran;       /* the allocator was made and the passes replayed */
    int passes_run; /* the passes replayed: a pass that runs out of memory is the last */
    double ratio[TUNE_MAX_PASSES];
    double device_ms[TUNE_MAX_PASSES];
    uint64_t peak_reserved; /* over every pass */
    size_t failed_allocations;
    double worst_warm_ms; /* the most device time of one pass after the first */
    uint64_t device_bytes; /* the device's memory, as the allocator sees it */
} outcome;

/* The candidates tried on one trace and how each did. */
typedef struct tuning {
    int count;                                   /* candidates tried: ALWAYS_TRIED, or all */
    outcome outcomes[CANDIDATE_COUNT];
} tuning;

#define TUNE_USAGE                                                                                            \
    "usage: gpumem tune TRACE|HISTORY [--backend sim|host|cuda] [--capacity BYTES] [--conf KEY:VALUE,...]\n"   \
    "                                 [--passes N] [--json]\n"                                               \
    "  replays the allocations of TRACE (or of a HISTORY: gpumem replay --history, gpumem run --tune) under\n" \
    "  the defaults and each opt-in setting of the pages engine, N passes each (default 3, at most 10; the\n"  \
    "  first cold), and names the configuration that reserves the least memory for it; --conf applies\n"      \
    "  under every candidate (a memory_limit, say); --capacity (e.g. 80GiB): the simulated device's memory,\n" \
    "  by default an H200's 143771 MiB; give what your GPU leaves the process, as results depend on it\n"

/* Replay `passes` times on one allocator of `configuration`; not GM_OK after saying why on stderr when
 * the allocator cannot be made or a replay fails for another reason than out of memory. */
static gm_status run_candidate(const gm_trace *trace, const char *configuration, int passes, outcome *result)
{
    gm_allocator *allocator = NULL;
    gm_status status = gm_create_from_environment(configuration, &allocator);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem tune: cannot create the allocator (%s): %s: %s\n", configuration, gm_strerror(status),
                gm_last_error());
        return status;
    }
    gm_device_info device;
    if (gm_get_device_info(allocator, &device) == GM_OK)
        result->device_bytes = device.total_bytes;
    for (int pass = 0; pass < passes && status == GM_OK && !result->failed_allocations; pass++) {
        if (pass) { /* each pass counts its own device calls and peaks */
            gm_reset_accumulated_stats(allocator);
            gm_reset_peak_stats(allocator);
        }
        gm_replay_result replay;
        status = gm_replay(allocator, trace, &replay);
        if (status != GM_OK) {
            fprintf(stderr, "gpumem tune: replay under '%s': %s: %s\n", configuration, gm_strerror(status),
                    gm_last_error());
            break;
        }
        result->ratio[pass] = replay.ratio;
        result->device_ms[pass] = (double)replay.stats.device_call_ns / 1e6;
        if (replay.peak_reserved_bytes > result->peak_reserved)
            result->peak_reserved = replay.peak_reserved_bytes;
        if (pass && result->device_ms[pass] > result->worst_warm_ms)
            result->worst_warm_ms = result->device_ms[pass];
        result->failed_allocations += replay.failed_allocations;
        result->passes_run = pass + 1;
    }
    gm_destroy(allocator, NULL);
    result->ran = status == GM_OK;
    return status;
}

/* The candidate to recommend: the one that fails the fewest allocations, then reserves the least; an
 * alternative to the defaults only when it fits where they do not, or saves at least half a percent
 * of the live peak. */
static int recommended(const tuning *tried, uint64_t peak_live)
{
    const outcome *outcomes = tried->outcomes;
    int best = 0;
    for (int i = 1; i < tried->count; i++) {
        const outcome *challenger = &outcomes[i], *holder = &outcomes[best];
        if (!challenger->ran)
            continue;
        if (challenger->failed_allocations != holder->failed_allocations) {
            if (challenger->failed_allocations < holder->failed_allocations)
                best = i;
            continue;
        }
        if (challenger->peak_reserved < holder->peak_reserved)
            best = i;
    }
    const outcome *choice = &outcomes[best], *defaults = &outcomes[0];
    if (best && choice->failed_allocations == defaults->failed_allocations &&
        (double)(defaults->peak_reserved - choice->peak_reserved) < 0.005 * (double)peak_live)
        return 0;
    return best;
}

#define RATIOS_TITLE "ratio, pass by pass"

/* The width of the ratios column: "1.0123 / 1.0145 / ..." or its title. */
static int ratios_width(int passes)
{
    int width = 6 * passes + 3 * (passes - 1);
    return width > (int)strlen(RATIOS_TITLE) ? width : (int)strlen(RATIOS_TITLE);
}

static void print_ratios(const outcome *result, int passes)
{
    char text[16 * TUNE_MAX_PASSES] = "";
    size_t used = 0;
    for (int pass = 0; pass < passes; pass++)
        if (pass < result->passes_run)
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%.4f", pass ? " / " : "", result->ratio[pass]);
        else
            used += (size_t)snprintf(text + used, sizeof text - used, "%s-", pass ? " / " : "");
    printf("  %-*s", ratios_width(passes), text);
}

static void print_table(const char *trace_path, const gm_trace *trace, const tuning *tried, int passes,
                        const gm_device_arguments *device)
{
    const outcome *outcomes = tried->outcomes;
    printf("trace %s: %zu operations, peak live %.1f MiB; %s backend, %.1f MiB; %d pass%s each%s\n\n", trace_path,
           trace->count, (double)trace->peak_live_bytes / MIB, device->backend ? device->backend : "sim",
           (double)outcomes[0].device_bytes / MIB, passes, passes > 1 ? "es" : "",
           passes > 1 ? " on one allocator (the first cold, the later ones warm)" : "");
    printf("%-17s %-36s %18s  %-*s %19s %23s %5s\n", "configuration", "keys", "peak reserved MiB", ratios_width(passes),
           RATIOS_TITLE, "device ms, 1st pass", "device ms, later (most)", "OOMs");
    for (int i = 0; i < tried->count; i++) {
        const outcome *result = &outcomes[i];
        printf("%-17s %-36s ", candidates[i].name, *candidates[i].configuration ? candidates[i].configuration : "-");
        if (!result->ran) {
            printf("%18s\n", "(could not run)");
            continue;
        }
        printf("%18.1f", (double)result->peak_reserved / MIB);
        print_ratios(result, passes);
        printf(" %19.1f", result->device_ms[0]);
        if (result->passes_run > 1)
            printf(" %23.1f", result->worst_warm_ms);
        else
            printf(" %23s", "-");
        printf(" %5zu\n", result->failed_allocations);
    }
}

/* No candidate replays the trace without running out of memory: say so, and when the live allocations
 * alone need more than the device, that no configuration can help. */
static void print_none_fits(const tuning *tried, uint64_t peak_live)
{
    const outcome *defaults = &tried->outcomes[0];
    printf("no configuration fits: every candidate ran out of memory (the defaults %zu times)", defaults->failed_allocations);
    if (peak_live > defaults->device_bytes)
        printf("; the trace's live allocations alone peak at %.1f MiB, more than the device's %.1f MiB (--capacity "
               "on the sim)", (double)peak_live / MIB, (double)defaults->device_bytes / MIB);
    printf("\n");
}

static void print_recommendation(const tuning *tried, int choice, int passes, uint64_t peak_live)
{
    const outcome *defaults = &tried->outcomes[0], *best = &tried->outcomes[choice];
    const char *keys = candidates[choice].configuration;
    printf("\n");
    if (best->failed_allocations) {
        print_none_fits(tried, peak_live);
        return;
    }
    if (!choice) {
        printf("recommended: the defaults: no candidate reserves at least %.1f MiB (half a percent of the live "
               "peak) less\n", 0.005 * (double)peak_live / MIB);
        return;
    }
    const candidate *pick = &candidates[choice];
    if (defaults->failed_allocations)
        printf("recommended: %s (%s): it fits, where %zu allocation%s ran out of memory under the defaults\n",
               pick->name, keys, defaults->failed_allocations,
               defaults->failed_allocations == 1 ? "" : "s");
    else
        printf("recommended: %s (%s): %.1f MiB less reserved at its peak than the defaults\n", pick->name, keys,
               (double)(defaults->peak_reserved - best->peak_reserved) / MIB);
    printf("  its cost: %.1f ms of device calls in the first pass (the defaults %.1f)", best->device_ms[0],
           defaults->device_ms[0]);
    if (passes > 1 && best->passes_run > 1)
        printf(", at most %.1f in a later one (%.1f)", best->worst_warm_ms, defaults->worst_warm_ms);
    printf(": %s\n", pick->cost);
    printf("  to use it: GPUMEM_CONF=%s, or with PyTorch gpumem run --conf %s -- python train.py\n", keys, keys);
}

static void print_json(const char *trace_path, const gm_trace *trace, const tuning *tried, int passes, int choice)
{
    const outcome *outcomes = tried->outcomes;
    printf("{\"trace\": ");
    gm_print_json_string(trace_path);
    printf(", \"operations\": %zu, \"peak_live_bytes\": %" PRIu64 ", \"passes\": %d, \"candidates\": [",
           trace->count, trace->peak_live_bytes, passes);
    for (int i = 0; i < tried->count; i++) {
        const outcome *result = &outcomes[i];
        printf("%s{\"name\": \"%s\", \"configuration\": \"%s\", \"ran\": %s", i ? ", " : "", candidates[i].name,
               candidates[i].configuration, result->ran ? "true" : "false");
        if (result->ran) {
            printf(", \"peak_reserved_bytes\": %" PRIu64 ", \"failed_allocations\": %zu, \"passes_run\": %d, "
                   "\"ratios\": [", result->peak_reserved, result->failed_allocations, result->passes_run);
            for (int pass = 0; pass < result->passes_run; pass++)
                printf("%s%.6f", pass ? ", " : "", result->ratio[pass]);
            printf("], \"device_call_ms\": [");
            for (int pass = 0; pass < result->passes_run; pass++)
                printf("%s%.3f", pass ? ", " : "", result->device_ms[pass]);
            printf("]");
        }
        printf("}");
    }
    if (outcomes[choice].failed_allocations) /* none fits */
        printf("], \"recommended\": null, \"configuration\": null}\n");
    else
        printf("], \"recommended\": \"%s\", \"configuration\": \"%s\"}\n", candidates[choice].name,
               candidates[choice].configuration);
}

/* The value of --passes: a whole number from 1 to TUNE_MAX_PASSES, else 0. */
static int parse_passes(const char *text)
{
    char *end = NULL;
    long value = text ? strtol(text, &end, 10) : 0;
    return text && *text && !*end && value >= 1 && value <= TUNE_MAX_PASSES ? (int)value : 0;
}

/* Parse the arguments; GM_EXIT_OK, or the exit status after saying why (-1: --help was printed). */
static int parse_arguments(int argc, char **argv, gm_device_arguments *device, const char **trace_path, int *passes,
                           int *json)
{
    for (int i = 0; i < argc; i++) {
        int taken = gm_take_device_argument(device, argc, argv, &i);
        if (taken < 0)
            return GM_EXIT_USAGE;
        if (taken)
            continue;
        if (!strcmp(argv[i], "--json")) {
            *json = 1;
        } else if (!strcmp(argv[i], "--passes")) {
            if (!(*passes = parse_passes(i + 1 < argc ? argv[++i] : NULL))) {
                fprintf(stderr, "gpumem tune: --passes needs a whole number from 1 to %d\n", TUNE_MAX_PASSES);
                return GM_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s", TUNE_USAGE);
            return -1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "gpumem tune: unknown option '%s'\n", argv[i]);
            return GM_EXIT_USAGE;
        } else if (*trace_path) {
            fprintf(stderr, "gpumem tune: one trace at a time ('%s' and '%s')\n", *trace_path, argv[i]);
            return GM_EXIT_USAGE;
        } else {
            *trace_path = argv[i];
        }
    }
    if (!*trace_path) {
        fprintf(stderr, "%s", TUNE_USAGE);
        return GM_EXIT_USAGE;
    }
    return GM_EXIT_OK;
}

/* One candidate over `device`'s configuration; GM_OK, or the reason it could not run. */
static gm_status try_candidate(const gm_trace *trace, const gm_device_arguments *device, int passes, tuning *tried)
{
    int i = tried->count++;
    const char *keys = candidates[i].configuration;
    char *configuration = gm_device_configuration(device, *keys ? keys : NULL);
    if (!configuration)
        return GM_ERROR_OUT_OF_MEMORY;
    gm_status status = run_candidate(trace, configuration, passes, &tried->outcomes[i]);
    free(configuration);
    return status;
}

/* Every candidate; page-sized chunks only where the defaults run out of memory. GM_EXIT_OK, or the
 * status after saying why. */
static int run_candidates(const gm_trace *trace, const gm_device_arguments *device, int passes, tuning *tried)
{
    gm_status status = try_candidate(trace, device, passes, tried);
    if (status != GM_OK) /* the defaults over --conf: a bad --conf or no device, as for every one */
        return status == GM_ERROR_BAD_CONFIG ? GM_EXIT_USAGE : GM_EXIT_ERROR;
    while (tried->count < ALWAYS_TRIED)
        try_candidate(trace, device, passes, tried);
    const outcome *defaults = &tried->outcomes[0];
    if (defaults->failed_allocations)
        try_candidate(trace, device, passes, tried);
    return GM_EXIT_OK;
}

/* A history's events as a trace, saying on stderr what the ring had dropped. */
static gm_status trace_of_history(const gm_input_file *input, gm_trace *trace)
{
    gm_history_file history;
    gm_status status = gm_history_parse(input, &history);
    if (status != GM_OK)
        return status;
    size_t early = 0;
    status = gm_trace_from_events(input->path, history.events, history.count, trace, &early);
    if (status == GM_OK && (history.dropped || early))
        fprintf(stderr, "gpumem tune: the history holds the newest %zu events (%" PRIu64 " older ones dropped); %zu "
                "blocks freed in it were allocated before it and are allocated at the start\n", history.count,
                history.dropped, early);
    gm_history_file_free(&history);
    return status;
}

/* The trace to compare on: an allocation trace, or a history (`gpumem replay --history`, `gpumem run
 * --tune`), told apart by content. GM_EXIT_OK, or the exit status after saying why. */
static int load_input(const char *path, gm_trace *trace)
{
    gm_input_file input;
    gm_status status = gm_input_open(path, &input);
    if (status == GM_OK && input.kind == GM_INPUT_SNAPSHOT) {
        fprintf(stderr, "gpumem tune: %s: a snapshot holds the blocks of one moment, not the allocations over time: "
                "give a trace or a history (python -m gpumem.whatif SNAPSHOT --trace FILE makes a trace of a PyTorch "
                "snapshot's history)\n", path);
        gm_input_close(&input);
        return GM_EXIT_USAGE;
    }
    if (status == GM_OK)
        status = input.kind == GM_INPUT_HISTORY ? trace_of_history(&input, trace)
                                                   : gm_trace_load_source(input.source, trace);
    gm_input_close(&input);
    if (status == GM_OK)
        return GM_EXIT_OK;
    fprintf(stderr, "gpumem tune: %s\n", gm_last_error());
    return status == GM_ERROR_PARSE ? GM_EXIT_USAGE : GM_EXIT_ERROR;
}

int gm_command_tune(int argc, char **argv)
{
    gm_device_arguments device = {0};
    const char *trace_path = NULL;
    int passes = DEFAULT_PASSES, json = 0;
    int parsed = parse_arguments(argc, argv, &device, &trace_path, &passes, &json);
    if (parsed != GM_EXIT_OK)
        return parsed < 0 ? GM_EXIT_OK : parsed;
    gm_trace trace;
    int loaded = load_input(trace_path, &trace);
    if (loaded != GM_EXIT_OK)
        return loaded;
    tuning tried;
    memset(&tried, 0, sizeof tried);
    int exit_status = run_candidates(&trace, &device, passes, &tried);
    if (exit_status == GM_EXIT_OK) {
        int choice = recommended(&tried, trace.peak_live_bytes);
        if (json) {
            print_json(trace_path, &trace, &tried, passes, choice);
        } else {
            print_table(trace_path, &trace, &tried, passes, &device);
            print_recommendation(&tried, choice, passes, trace.peak_live_bytes);
        }
        if (tried.outcomes[choice].failed_allocations)
            exit_status = GM_EXIT_OUT_OF_MEMORY;
    }
    gm_trace_free(&trace);
    return exit_status;
}
