/*
 * fuzz_history.c -- libFuzzer harness for gpumem's own JSON files read back (src/tools/json_formats.c),
 * as `gpumem report` and `gpumem tune` read them: a history or a snapshot, told apart by content, and a
 * history's events made a trace (gm_trace_from_events, src/tools/trace.c) and replayed.
 *
 * gm_input_open reads only paths, so each input is written to a memory file (memfd) and opened through
 * /proc/self/fd/N. What must hold, else abort() (a finding):
 *   - every status is GM_OK, GM_ERROR_PARSE, GM_ERROR_IO or GM_ERROR_OUT_OF_MEMORY, with a message;
 *   - a parsed history's events: each of a known action; made a trace, GM_OK or GM_ERROR_PARSE (an
 *     address allocated twice, no allocation at all), and a trace made is consistent and, when small,
 *     replays on the simulated device with the allocator's books valid afterwards (fuzz_support.h);
 *   - a parsed snapshot: every region's blocks lie in the block array and inside their region;
 *   - what `gpumem report` makes of either: a history's curve and, when the ring dropped nothing, its
 *     memory map rebuilt at the peak (gm_history_peak_build, the CLI's own call: regions in address
 *     order, apart, each tiled by its blocks), and
 *     the HTML page of that curve and map or of the snapshot, written without a crash.
 * Input that is not JSON is a trace, fuzz_trace's part: it is left alone here.
 */
#include "report/history_map.h"
#include "report/html_report.h"
#include "tools/json_formats.h"
#include "tools/trace.h"
#include "fuzz_support.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_history: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* A failure must be one of the statuses a reader gives, and say why. */
static void check_failure(gm_status status, const char *what)
{
    if (status != GM_ERROR_PARSE && status != GM_ERROR_IO && status != GM_ERROR_OUT_OF_MEMORY)
        fail(what, gm_strerror(status));
    if (!gm_last_error()[0])
        fail(what, "a failure without a message");
}

/* The page gpumem report writes, into a memory stream that is then dropped. */
static void write_page(const gm_html_report *report)
{
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    if (!out)
        return;
    gm_html_report_write(report, out);
    fclose(out);
    if (length < 8 || strcmp(text + length - 8, "</html>\n") != 0)
        fail("the report page does not end with </html>", NULL);
    free(text);
}

/* Whether a region's blocks lie in the snapshot's block array. */
static bool blocks_in_array(const gm_snapshot *map, const gm_snapshot_region *region)
{
    return region->first_block <= map->block_count && region->block_count <= map->block_count - region->first_block;
}

/* Regions in address order and apart, each tiled by its blocks, as the report draws them. */
static void check_map(const gm_snapshot *map)
{
    uint64_t previous_end = 0;
    for (size_t r = 0; r < map->region_count; r++) {
        const gm_snapshot_region *region = &map->regions[r];
        if (r && region->address < previous_end)
            fail("the rebuilt map's regions overlap or are out of order", NULL);
        if (!blocks_in_array(map, region))
            fail("a rebuilt region's blocks lie outside the block array", NULL);
        uint64_t at = region->address;
        for (size_t b = region->first_block; b < region->first_block + region->block_count; b++) {
            if (map->blocks[b].address != at || map->blocks[b].size == 0)
                fail("a rebuilt region's blocks do not tile it", NULL);
            at += map->blocks[b].size;
        }
        if (at != region->address + region->size)
            fail("a rebuilt region's blocks do not reach its end", NULL);
        previous_end = region->address + region->size;
    }
}

/* The curve and the map at the peak of reserved memory, made as `gpumem report HISTORY` makes them. */
static void check_history_report(const gm_history_file *history)
{
    gm_history_peak at_peak;
    gm_status status = gm_history_peak_build(history->events, history->count, !history->dropped, 64, &at_peak);
    if (status != GM_OK) {
        check_failure(status, "gm_history_peak_build gave an unexpected status");
        return;
    }
    if (history->count && at_peak.curve.peak_reserved_x >= history->count)
        fail("the curve's peak lies past the last event", NULL);
    if (history->count && at_peak.moment >= history->count)
        fail("the map's moment lies past the last event", NULL);
    if (!at_peak.map != (!history->count || history->dropped))
        fail("a map where none can be rebuilt, or none where one can", NULL);
    if (at_peak.map)
        check_map(at_peak.map);
    gm_html_report report = {.input_name = "fuzz", .input_kind = "history", .has_peaks = history->count > 0,
                             .peak_live_bytes = at_peak.curve.peak_allocated,
                             .peak_reserved_bytes = at_peak.curve.peak_reserved, .curve = &at_peak.curve,
                             .curve_unit = "event", .no_curve_reason = "none", .map = at_peak.map,
                             .map_moment = "the peak", .no_map_reason = "none", .no_stats_reason = "none"};
    write_page(&report);
    gm_history_peak_free(&at_peak);
}

static void check_history(const gm_input_file *input, size_t size)
{
    gm_history_file history;
    gm_status status = gm_history_parse(input, &history);
    if (status != GM_OK) {
        check_failure(status, "gm_history_parse gave an unexpected status");
        return;
    }
    for (size_t i = 0; i < history.count; i++)
        if ((unsigned)history.events[i].kind >= GM_EVENT_KIND_COUNT)
            fail("a parsed event has an unknown action", NULL);
    gm_trace trace;
    size_t early = 0;
    status = gm_trace_from_events(input->path, history.events, history.count, &trace, &early);
    if (status == GM_OK) {
        fuzz_check_trace(&trace, fail);
        if (early > trace.allocation_count)
            fail("more early allocations than allocations", NULL);
        fuzz_replay_trace(&trace, size % 2 == 1, fail);
        gm_trace_free(&trace);
    } else if (status != GM_ERROR_PARSE && status != GM_ERROR_OUT_OF_MEMORY) {
        fail("gm_trace_from_events gave an unexpected status", gm_strerror(status));
    }
    check_history_report(&history);
    gm_history_file_free(&history);
}

static void check_snapshot(const gm_input_file *input)
{
    gm_snapshot *snapshot = NULL;
    gm_status status = gm_snapshot_parse(input, &snapshot);
    if (status != GM_OK) {
        check_failure(status, "gm_snapshot_parse gave an unexpected status");
        return;
    }
    for (size_t r = 0; r < snapshot->region_count; r++) {
        const gm_snapshot_region *region = &snapshot->regions[r];
        if (!blocks_in_array(snapshot, region))
            fail("a region's blocks lie outside the block array", NULL);
        for (size_t b = region->first_block; b < region->first_block + region->block_count; b++) {
            const gm_snapshot_block *block = &snapshot->blocks[b];
            if (block->address < region->address || block->size > region->size ||
                block->address - region->address > region->size - block->size)
                fail("a block lies outside its region", NULL);
        }
    }
    gm_html_report report = {.input_name = "fuzz", .input_kind = "snapshot", .no_curve_reason = "none",
                             .map = snapshot, .map_moment = "now", .stats = &snapshot->stats, .stats_moment = "now"};
    write_page(&report);
    gm_snapshot_file_free(snapshot);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gm_input_file input;
    gm_status status = gm_input_open(fuzz_memory_file(data, size, fail), &input);
    if (status != GM_OK) {
        check_failure(status, "gm_input_open gave an unexpected status");
        return 0;
    }
    if (input.kind == GM_INPUT_HISTORY)
        check_history(&input, size);
    else if (input.kind == GM_INPUT_SNAPSHOT)
        check_snapshot(&input);
    gm_input_close(&input);
    return 0;
}
