/*
 * html_report.c -- the report page (html_report.h): its style, its sections in reading order, the
 * small inline script, and saving it whole (base/file_save.c: a failed write never leaves a partial page
 * under the requested name).
 *
 * Numbers a test or a reader may want to check carry their exact value in a data-value attribute
 * (<tr id="peak-reserved" data-value="11813257216">), next to the human-readable form.
 */
#include "report/html_report.h"

#include "base/error.h"
#include "base/file_save.h"
#include "report/html_text.h"
#include "report/svg_charts.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { LARGEST_ALLOCATIONS = 20 };

static const char STYLE[] =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1100px;"
    "padding:0 16px;color:#222;background:#fff}\n"
    "h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;"
    "padding-bottom:4px}\n"
    ".subtitle{color:#555;margin:0 0 16px}.note{color:#555;font-size:14px}\n"
    "table{border-collapse:collapse;font-size:14px}td,th{padding:3px 10px;text-align:left;"
    "border-bottom:1px solid #eee}td.number{text-align:right;font-variant-numeric:tabular-nums}\n"
    "#headline th{font-weight:normal;color:#555}#headline td{font-weight:600}\n"
    "svg{width:100%;height:auto;display:block}text{font-size:11px;fill:#333}\n"
    ".grid line{stroke:#e8e8e8}.tick{fill:#666}.axis-title{fill:#555;font-size:12px}\n"
    "#memory-curve path{fill:none;stroke-width:1.3}.line.allocated{stroke:#4c78a8}.line.reserved{stroke:#e45756}\n"
    ".peak{stroke-dasharray:6 3}.peak.allocated{stroke:#4c78a8}.peak.reserved{stroke:#e45756}\n"
    "#peak-mark{stroke:#999;stroke-dasharray:2 3}.peak-dot{fill:#e45756}.peak-label{fill:#b33}\n"
    "#hover-line{stroke:#333;stroke-width:0.8}#hover-area{fill:transparent}\n"
    "#memory-map rect.allocated,.swatch.allocated{fill:#4c78a8;background:#4c78a8}"
    "#memory-map rect.pending,.swatch.pending{fill:#b279a2;background:#b279a2}\n"
    "#memory-map rect.free,.swatch.free{fill:#f58518;background:#f58518}"
    "#memory-map rect.unmapped,.swatch.unmapped{fill:#e6e6e6;background:#e6e6e6}\n"
    ".bar-frame{fill:#fafafa;stroke:#ccc;stroke-width:0.5}.region-label{font-size:11px}"
    ".region-tail{font-size:10px;fill:#777}\n"
    ".legend-list{list-style:none;padding:0;margin:4px 0 8px;font-size:14px}.legend-list li{display:inline-block;"
    "margin-right:18px}.swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}\n"
    "pre{font-size:12px;background:#f7f7f7;padding:8px;overflow-x:auto}\n"
    "#tooltip{position:absolute;display:none;background:#222;color:#fff;font-size:12px;padding:4px 8px;"
    "border-radius:3px;pointer-events:none}\n";

/* Adds the curve's hover read-out and checks that the page's parts are there: <body> gets
 * data-report-check="ok", or "failed: ..." naming what is missing. */
static const char SCRIPT[] =
    "(function () {\n"
    "  'use strict';\n"
    "  var body = document.body, problems = [];\n"
    "  function check(id, test, what) {\n"
    "    var element = document.getElementById(id);\n"
    "    if (!element || !test(element)) problems.push(what);\n"
    "  }\n"
    "  function bytes(n) {\n"
    "    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0;\n"
    "    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }\n"
    "    return (i ? n.toFixed(2) : String(n)) + ' ' + units[i];\n"
    "  }\n"
    "  function hover(svg, data) {\n"
    "    var tip = document.getElementById('tooltip'), line = document.getElementById('hover-line');\n"
    "    var left = +svg.getAttribute('data-plot-left'), right = +svg.getAttribute('data-plot-right');\n"
    "    var low = +svg.getAttribute('data-x-low'), high = +svg.getAttribute('data-x-high');\n"
    "    var unit = svg.getAttribute('data-unit');\n"
    "    function hide() { tip.style.display = 'none'; line.setAttribute('visibility', 'hidden'); }\n"
    "    svg.addEventListener('mousemove', function (event) {\n"
    "      var point = svg.createSVGPoint();\n"
    "      point.x = event.clientX; point.y = event.clientY;\n"
    "      var at = point.matrixTransform(svg.getScreenCTM().inverse());\n"
    "      if (at.x < left || at.x > right || !data.x.length) { hide(); return; }\n"
    "      var x = low + (at.x - left) / (right - left) * (high - low), first = 0, last = data.x.length - 1;\n"
    "      while (first < last) {\n"
    "        var middle = (first + last + 1) >> 1;\n"
    "        if (data.x[middle] <= x) first = middle; else last = middle - 1;\n"
    "      }\n"
    "      line.setAttribute('x1', at.x); line.setAttribute('x2', at.x);\n"
    "      line.setAttribute('visibility', 'visible');\n"
    "      tip.textContent = unit + ' ' + data.x[first] + ': allocated up to ' + bytes(data.allocated[first]) +\n"
    "        ', reserved up to ' + bytes(data.reserved[first]);\n"
    "      tip.style.left = (event.pageX + 14) + 'px'; tip.style.top = (event.pageY + 14) + 'px';\n"
    "      tip.style.display = 'block';\n"
    "    });\n"
    "    svg.addEventListener('mouseleave', hide);\n"
    "  }\n"
    "  if (body.getAttribute('data-expect-curve') === '1') {\n"
    "    ['curve-allocated', 'curve-reserved', 'curve-peak-allocated', 'curve-peak-reserved'].forEach(function (id) {\n"
    "      check(id, function (path) {\n"
    "        return (path.getAttribute('d') || '').length > 10 && path.getBBox().width > 100;\n"
    "      }, id + ' is empty');\n"
    "    });\n"
    "    var data = document.getElementById('curve-data'), curve = document.getElementById('memory-curve');\n"
    "    check('curve-data', function () { return data && curve; }, 'the curve or its data is missing');\n"
    "    if (data && curve) hover(curve, JSON.parse(data.textContent));\n"
    "  }\n"
    "  if (body.getAttribute('data-expect-map') === '1')\n"
    "    check('memory-map', function (svg) {\n"
    "      return svg.querySelectorAll('rect.allocated, rect.pending, rect.free').length > 0;\n"
    "    }, 'the memory map has no blocks');\n"
    "  body.setAttribute('data-report-check', problems.length ? 'failed: ' + problems.join('; ') : 'ok');\n"
    "})();\n";

static void text(FILE *out, const char *value)
{
    gm_html_escape(out, value);
}

static bool known(const char *value)
{
    return value && *value;
}

static void headline_row(FILE *out, const char *id, const char *label, const char *data_value, const char *shown)
{
    fprintf(out, "<tr id=\"%s\" data-value=\"%s\"><th>%s</th><td>", id, data_value, label);
    text(out, shown);
    fputs("</td></tr>\n", out);
}

static void bytes_row(FILE *out, const char *id, const char *label, uint64_t value, bool at_least)
{
    char exact[32], human[32], grouped[40], shown[112];
    snprintf(exact, sizeof exact, "%" PRIu64, value);
    snprintf(shown, sizeof shown, "%s%s (%s bytes)", at_least ? "at least " : "",
             gm_html_bytes(human, sizeof human, value), gm_html_grouped(grouped, sizeof grouped, value));
    headline_row(out, id, label, exact, shown);
}

static void ratio_row(FILE *out, const gm_html_report *report)
{
    if (report->peaks_are_lower_bounds) { /* two lower bounds make no ratio */
        headline_row(out, "ratio", "ratio", "", "not known (the history's ring dropped older events)");
        return;
    }
    char value[64], shown[96];
    double ratio =
        report->peak_live_bytes ? (double)report->peak_reserved_bytes / (double)report->peak_live_bytes : 0.0;
    snprintf(value, sizeof value, "%.6f", ratio);
    snprintf(shown, sizeof shown, "%.4f (reserved / live at their peaks)", ratio);
    headline_row(out, "ratio", "ratio", value, shown);
}

static void headline(FILE *out, const gm_html_report *report)
{
    char value[64], shown[96];
    fputs("<table id=\"headline\">\n", out);
    if (report->has_peaks) {
        bool at_least = report->peaks_are_lower_bounds;
        bytes_row(out, "peak-live", "peak live (bytes requested)", report->peak_live_bytes, at_least);
        bytes_row(out, "peak-reserved", "peak reserved", report->peak_reserved_bytes, at_least);
        ratio_row(out, report);
    }
    if (report->has_device_calls) {
        snprintf(value, sizeof value, "%" PRId64, report->device_calls);
        snprintf(shown, sizeof shown, "%" PRId64 " (%.3f ms%s)", report->device_calls,
                 (double)report->device_call_ns / 1e6,
                 known(report->backend) && !strcmp(report->backend, "sim") ? ", H200 cost model" : "");
        headline_row(out, "device-calls", "device calls", value, shown);
    }
    if (report->has_operations) {
        snprintf(value, sizeof value, "%zu", report->operations);
        headline_row(out, "operations", "operations", value, value);
        snprintf(value, sizeof value, "%zu", report->failed_allocations);
        headline_row(out, "failed-allocations", "allocations out of memory", value, value);
    }
    fputs("</table>\n", out);
}

static void curve_section(FILE *out, const gm_html_report *report)
{
    fputs("<section id=\"curve-section\">\n<h2>Memory over time</h2>\n", out);
    if (report->curve && report->curve->bucket_count) {
        fprintf(out, "<p class=\"note\">%" PRIu64 " samples, drawn as %zu buckets (each bucket's lowest and highest "
                     "reading, so every peak shows). Hover for values.</p>\n",
                report->curve->sample_count, report->curve->bucket_count);
        gm_svg_memory_curve(out, report->curve, report->curve_unit);
        fputs("<script type=\"application/json\" id=\"curve-data\">", out);
        gm_svg_curve_data(out, report->curve);
        fputs("</script>\n", out);
    } else {
        fputs("<p id=\"no-time-axis\" class=\"note\">", out);
        text(out, known(report->no_curve_reason) ? report->no_curve_reason : "No memory curve.");
        fputs("</p>\n", out);
    }
    fputs("</section>\n", out);
}

static void map_totals(FILE *out, const gm_snapshot *map)
{
    uint64_t totals[4] = {0}, largest_free = 0;
    size_t free_blocks = 0;
    for (size_t b = 0; b < map->block_count; b++) {
        const gm_snapshot_block *block = &map->blocks[b];
        if ((unsigned)block->kind < 4)
            totals[block->kind] += block->size;
        if (block->kind == GM_BLOCK_KIND_FREE) {
            free_blocks++;
            largest_free = block->size > largest_free ? block->size : largest_free;
        }
    }
    uint64_t mapped = 0;
    for (size_t r = 0; r < map->region_count; r++)
        mapped += map->regions[r].mapped_bytes;
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(out, "<p class=\"note\" id=\"map-totals\" data-mapped=\"%" PRIu64 "\">%zu regions: %s mapped, %s allocated, "
                 "%s pending, %s free (cached) in %zu blocks, the largest %s.</p>\n",
            mapped, map->region_count, gm_html_bytes(a, sizeof a, mapped),
            gm_html_bytes(b, sizeof b, totals[GM_BLOCK_KIND_ALLOCATED]),
            gm_html_bytes(c, sizeof c, totals[GM_BLOCK_KIND_PENDING]), gm_html_bytes(d, sizeof d, totals[GM_BLOCK_KIND_FREE]),
            free_blocks, gm_html_bytes(e, sizeof e, largest_free));
}

static void map_section(FILE *out, const gm_html_report *report)
{
    fputs("<section id=\"map-section\">\n<h2>Memory map</h2>\n", out);
    if (!report->map) {
        fputs("<p id=\"no-map\" class=\"note\">", out);
        text(out, known(report->no_map_reason) ? report->no_map_reason : "No memory map.");
        fputs("</p>\n</section>\n", out);
        return;
    }
    fputs("<p id=\"map-moment\">", out);
    text(out, report->map_moment);
    fputs("</p>\n<ul class=\"legend-list\"><li><span class=\"swatch allocated\"></span>allocated</li>"
          "<li><span class=\"swatch pending\"></span>pending (freed, still used by a stream)</li>"
          "<li><span class=\"swatch free\"></span>free (cached: reserved but not in use)</li>"
          "<li><span class=\"swatch unmapped\"></span>unmapped (addresses without memory)</li></ul>\n",
          out);
    map_totals(out, report->map);
    gm_svg_memory_map(out, report->map);
    fputs("</section>\n", out);
}

typedef struct live_allocation {
    const gm_snapshot_block *block;
    size_t region;
} live_allocation;

static int by_size_descending(const void *left, const void *right)
{
    const live_allocation *a = left, *b = right;
    if (a->block->size != b->block->size)
        return a->block->size > b->block->size ? -1 : 1;
    return a->block->address < b->block->address ? -1 : a->block->address > b->block->address;
}

static void largest_section(FILE *out, const gm_snapshot *map)
{
    fputs("<section id=\"largest-section\">\n<h2>Largest allocations live then</h2>\n", out);
    size_t count = 0;
    for (size_t b = 0; b < map->block_count; b++)
        count += map->blocks[b].kind == GM_BLOCK_KIND_ALLOCATED;
    live_allocation *live = gm_system_malloc((count ? count : 1) * sizeof *live);
    if (!live) {
        fputs("<p class=\"note\">No host memory to list them.</p>\n</section>\n", out);
        return;
    }
    count = 0;
    for (size_t r = 0; r < map->region_count; r++)
        for (size_t b = 0; b < map->regions[r].block_count; b++) {
            const gm_snapshot_block *block = &map->blocks[map->regions[r].first_block + b];
            if (block->kind == GM_BLOCK_KIND_ALLOCATED)
                live[count++] = (live_allocation){block, r};
        }
    qsort(live, count, sizeof *live, by_size_descending);
    fprintf(out, "<p class=\"note\">The %zu largest of %zu allocations.</p>\n",
            count < LARGEST_ALLOCATIONS ? count : (size_t)LARGEST_ALLOCATIONS, count);
    fputs("<table id=\"largest-allocations\">\n<tr><th>size</th><th>requested</th><th>stream</th><th>address</th>"
          "<th>region</th></tr>\n",
          out);
    for (size_t i = 0; i < count && i < LARGEST_ALLOCATIONS; i++) {
        const gm_snapshot_block *block = live[i].block;
        const gm_snapshot_region *region = &map->regions[live[i].region];
        char size[32], requested[32], grouped[40];
        fprintf(out, "<tr><td class=\"number\" data-value=\"%" PRIu64 "\">%s</td><td class=\"number\">%s (%s B)</td>"
                     "<td class=\"number\">%" PRIuPTR "</td><td>0x%" PRIx64 "</td><td>%zu, at +0x%" PRIx64 "</td></tr>\n",
                block->size, gm_html_bytes(size, sizeof size, block->size),
                gm_html_bytes(requested, sizeof requested, block->requested),
                gm_html_grouped(grouped, sizeof grouped, block->requested), region->stream, block->address,
                live[i].region, block->address - region->address);
    }
    fputs("</table>\n</section>\n", out);
    free(live);
}

static void statistics_section(FILE *out, const gm_html_report *report)
{
    fputs("<section id=\"statistics-section\">\n<h2>Statistics</h2>\n", out);
    char *table = NULL;
    size_t needed = 0;
    if (report->stats &&
        gm_summary_of_stats(report->stats, known(report->backend) ? report->backend : "unknown",
                            report->map ? report->map->device.device : 0, NULL, 0, &needed) ==
            GM_ERROR_BUFFER_TOO_SMALL &&
        (table = gm_system_malloc(needed)) &&
        gm_summary_of_stats(report->stats, known(report->backend) ? report->backend : "unknown",
                            report->map ? report->map->device.device : 0, table, needed, NULL) == GM_OK) {
        fputs("<p class=\"note\">", out);
        text(out, report->stats_moment);
        fputs(" As torch.cuda.memory_summary() lays them out.</p>\n<pre id=\"statistics-table\">", out);
        text(out, table);
        fputs("</pre>\n", out);
    } else {
        fputs("<p id=\"no-statistics\" class=\"note\">", out);
        text(out, known(report->no_stats_reason) ? report->no_stats_reason : "No statistics.");
        fputs("</p>\n", out);
    }
    free(table);
    fputs("</section>\n", out);
}

void gm_html_report_write(const gm_html_report *report, FILE *out)
{
    bool has_curve = report->curve && report->curve->bucket_count;
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>gpumem report: ",
          out);
    text(out, report->input_name);
    fprintf(out, "</title>\n<style>\n%s</style>\n</head>\n", STYLE);
    fprintf(out, "<body data-report-check=\"pending\" data-expect-curve=\"%d\" data-expect-map=\"%d\">\n", has_curve,
            report->map != NULL);
    fputs("<h1>gpumem memory report: ", out);
    text(out, report->input_name);
    fputs("</h1>\n<p class=\"subtitle\">A ", out);
    text(out, report->input_kind);
    if (known(report->backend)) {
        fputs(" on the ", out);
        text(out, report->backend);
        fputs(" backend", out);
    }
    if (known(report->device_name)) {
        fputs(" (", out);
        text(out, report->device_name);
        fputs(")", out);
    }
    if (known(report->engine)) {
        fputs(", engine ", out);
        text(out, report->engine);
    }
    fputs(".</p>\n", out);
    headline(out, report);
    if (report->note_count) {
        fputs("<ul id=\"notes\" class=\"note\">\n", out);
        for (size_t i = 0; i < report->note_count && i < GM_HTML_REPORT_MAXIMUM_NOTES; i++) {
            fputs("<li>", out);
            text(out, report->notes[i]);
            fputs("</li>\n", out);
        }
        fputs("</ul>\n", out);
    }
    curve_section(out, report);
    map_section(out, report);
    if (report->map)
        largest_section(out, report->map);
    statistics_section(out, report);
    fprintf(out, "<p class=\"note\">Written by gpumem %s. The page is self-contained: no network access.</p>\n"
                 "<div id=\"tooltip\"></div>\n<script>\n%s</script>\n</body>\n</html>\n",
            GPUMEM_VERSION, SCRIPT);
}

static void write_page(FILE *out, const void *report)
{
    gm_html_report_write(report, out);
}

gm_status gm_html_report_save(const gm_html_report *report, const char *path)
{
    return gm_file_save(path, "report", write_page, report);
}
