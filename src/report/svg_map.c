/*
 * svg_map.c -- the memory map at one moment as an SVG chart (svg_charts.h): one bar per region, the
 * full width of the chart, its blocks coloured by state. Neighbouring blocks of one state are drawn
 * as one rectangle. Free and pending runs are drawn last and at least 0.6 units wide, so that a free
 * sliver between two allocations -- memory that is reserved but stuck -- stays visible at any scale.
 * A pages-engine region is a large virtual range mostly unmapped (at its end; a growth lane's also at
 * its start): the bar runs from the first mapped block to the end of the last, and a note under it
 * says how much address space it leaves out. From 17 regions on
 * (the segments engine's many segments) the rows are compact: a short label, the full one on hover.
 */
#include "report/svg_charts.h"

#include "report/html_text.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>

enum { MAXIMUM_ROWS = 128, ROW_HEIGHT = 56, COMPACT_ROW_HEIGHT = 16, COMPACT_FROM = 17 };
static const double BAR_LEFT = 10, BAR_RIGHT = 990, BAR_TOP = 20, BAR_HEIGHT = 20;
static const double COMPACT_BAR_LEFT = 200, COMPACT_BAR_HEIGHT = 12;

/* Where a bar lies in its row. */
typedef struct bar {
    double left, top, height;
} bar;

typedef struct region_totals {
    uint64_t allocated, pending, free, largest_free;
    size_t free_blocks;
    /* What the bar shows: from the first mapped block to the end of the last (the whole region if
     * nothing is mapped). */
    uint64_t shown_start, shown_end;
} region_totals;

static region_totals totals_of(const gm_snapshot *map, const gm_snapshot_region *region)
{
    region_totals totals = {0};
    bool mapped = false;
    for (size_t b = 0; b < region->block_count; b++) {
        const gm_snapshot_block *block = &map->blocks[region->first_block + b];
        if (block->kind != GM_BLOCK_KIND_UNMAPPED) {
            if (!mapped)
                totals.shown_start = block->address;
            mapped = true;
            totals.shown_end = block->address + block->size;
        }
        if (block->kind == GM_BLOCK_KIND_ALLOCATED)
            totals.allocated += block->size;
        else if (block->kind == GM_BLOCK_KIND_PENDING)
            totals.pending += block->size;
        else if (block->kind == GM_BLOCK_KIND_FREE) {
            totals.free += block->size;
            totals.free_blocks++;
            totals.largest_free = block->size > totals.largest_free ? block->size : totals.largest_free;
        }
    }
    if (!mapped) {
        totals.shown_start = region->address;
        totals.shown_end = region->address + region->size;
    }
    return totals;
}

static const char *kind_class(gm_block_kind kind)
{
    static const char *const names[] = {"free", "allocated", "pending", "unmapped"};
    return (unsigned)kind < 4 ? names[kind] : "unmapped";
}

/* The runs of one region whose state is drawn in this pass (allocated and unmapped first, then free
 * and pending on top), within [shown->shown_start, shown->shown_end). */
static void runs(FILE *out, const gm_snapshot *map, const gm_snapshot_region *region, const region_totals *shown,
                 const bar *bar, bool top_pass)
{
    double extent = shown->shown_end > shown->shown_start ? (double)(shown->shown_end - shown->shown_start) : 1.0;
    double width = BAR_RIGHT - bar->left;
    size_t b = 0;
    while (b < region->block_count) {
        const gm_snapshot_block *first = &map->blocks[region->first_block + b];
        if (first->address >= shown->shown_end)
            break;
        if (first->address < shown->shown_start) { /* the unmapped addresses before the bar */
            b++;
            continue;
        }
        uint64_t bytes = 0;
        size_t blocks = 0;
        for (; b < region->block_count; b++, blocks++) {
            const gm_snapshot_block *block = &map->blocks[region->first_block + b];
            if (block->kind != first->kind || block->address >= shown->shown_end)
                break;
            bytes += block->size;
        }
        bool on_top = first->kind == GM_BLOCK_KIND_FREE || first->kind == GM_BLOCK_KIND_PENDING;
        if (on_top != top_pass)
            continue;
        double x = bar->left + (double)(first->address - shown->shown_start) / extent * width;
        double w = (double)bytes / extent * width;
        if (on_top && w < 0.6)
            w = 0.6;
        if (x + w > BAR_RIGHT)
            w = BAR_RIGHT - x;
        char size[32];
        fprintf(out, "<rect class=\"%s\" x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\">", kind_class(first->kind),
                x, bar->top, w, bar->height);
        if (w >= 2)
            fprintf(out, "<title>%s %s in %zu block%s from 0x%" PRIx64 "</title>", kind_class(first->kind),
                    gm_html_bytes(size, sizeof size, bytes), blocks, blocks == 1 ? "" : "s", first->address);
        fputs("</rect>", out);
    }
    fputc('\n', out);
}

/* What a region's label says: its number, pool, stream, address and how its memory is used. */
static void label(FILE *out, const gm_snapshot_region *region, size_t index, const region_totals *totals)
{
    char mapped[32], allocated[32], free_bytes[32], largest[32], pending[32];
    static const char *const pools[] = {"", " \u00b7 small pool", " \u00b7 large pool"};
    fprintf(out, "region %zu%s%s \u00b7 stream %" PRIuPTR " \u00b7 at 0x%" PRIx64 " \u00b7 %s mapped: %s allocated, %s free in %zu block%s (largest %s)",
            index, (unsigned)region->pool < 3 ? pools[region->pool] : "",
            region->growth_lane ? " \u00b7 growth lane" : "", region->stream, region->address,
            gm_html_bytes(mapped, sizeof mapped, region->mapped_bytes),
            gm_html_bytes(allocated, sizeof allocated, totals->allocated),
            gm_html_bytes(free_bytes, sizeof free_bytes, totals->free), totals->free_blocks,
            totals->free_blocks == 1 ? "" : "s", gm_html_bytes(largest, sizeof largest, totals->largest_free));
    if (totals->pending)
        fprintf(out, ", %s pending", gm_html_bytes(pending, sizeof pending, totals->pending));
}

/* A region as a labelled bar. Compact rows (many regions): a short label left of the bar, the full
 * one in a tooltip; else the full label above the bar and, below it, the unmapped tail left out. */
static void row(FILE *out, const gm_snapshot *map, size_t index, double y, bool compact)
{
    const gm_snapshot_region *region = &map->regions[index];
    region_totals totals = totals_of(map, region);
    double left = compact ? COMPACT_BAR_LEFT : BAR_LEFT, top = compact ? 2 : BAR_TOP;
    double height = compact ? COMPACT_BAR_HEIGHT : BAR_HEIGHT;
    char mapped[32], hidden[32];
    fprintf(out, "<g class=\"region\" transform=\"translate(0 %.0f)\">", y);
    if (compact) {
        fputs("<title>", out);
        label(out, region, index, &totals);
        fprintf(out, "</title><text class=\"region-label\" x=\"%.0f\" y=\"%.0f\">region %zu \u00b7 %s</text>\n",
                BAR_LEFT, top + 9, index, gm_html_bytes(mapped, sizeof mapped, region->mapped_bytes));
    } else {
        fprintf(out, "<text class=\"region-label\" x=\"%.0f\" y=\"14\">", BAR_LEFT);
        label(out, region, index, &totals);
        fputs("</text>\n", out);
        uint64_t before = totals.shown_start - region->address, after = region->address + region->size - totals.shown_end;
        char hidden_after[32];
        if (before || after)
            fprintf(out, "<text class=\"region-tail\" x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">unmapped address "
                         "space not drawn: %s before the bar, %s after it</text>\n",
                    BAR_RIGHT, BAR_TOP + BAR_HEIGHT + 11, gm_html_bytes(hidden, sizeof hidden, before),
                    gm_html_bytes(hidden_after, sizeof hidden_after, after));
    }
    fprintf(out, "<rect class=\"bar-frame\" x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\"/>\n", left, top,
            BAR_RIGHT - left, height);
    bar bar = {left, top, height};
    runs(out, map, region, &totals, &bar, false);
    runs(out, map, region, &totals, &bar, true);
    fprintf(out, "</g>\n");
}

typedef struct ranked_region {
    size_t index;
    uint64_t mapped;
} ranked_region;

static int by_mapped_then_index(const void *left, const void *right)
{
    const ranked_region *a = left, *b = right;
    if (a->mapped != b->mapped)
        return a->mapped > b->mapped ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

static int by_index(const void *left, const void *right)
{
    const ranked_region *a = left, *b = right;
    return a->index < b->index ? -1 : a->index > b->index;
}

void gm_svg_memory_map(FILE *out, const gm_snapshot *map)
{
    size_t count = map->region_count;
    ranked_region *ranked = gm_system_malloc((count ? count : 1) * sizeof *ranked);
    if (!ranked) {
        fputs("<p class=\"note\">No host memory to draw the map.</p>\n", out);
        return;
    }
    for (size_t r = 0; r < count; r++)
        ranked[r] = (ranked_region){r, map->regions[r].mapped_bytes};
    size_t shown = count;
    if (count > MAXIMUM_ROWS) { /* the regions holding the most memory, in their own order */
        qsort(ranked, count, sizeof *ranked, by_mapped_then_index);
        shown = MAXIMUM_ROWS;
        qsort(ranked, shown, sizeof *ranked, by_index);
    }
    bool compact = shown >= COMPACT_FROM;
    size_t row_height = compact ? COMPACT_ROW_HEIGHT : ROW_HEIGHT;
    fprintf(out, "<svg id=\"memory-map\" viewBox=\"0 0 1000 %zu\" role=\"img\" aria-label=\"memory map\">\n",
            shown * row_height + 4);
    for (size_t i = 0; i < shown; i++)
        row(out, map, ranked[i].index, (double)(i * row_height) + 2, compact);
    fprintf(out, "</svg>\n");
    if (shown < count) {
        uint64_t rest = 0;
        for (size_t r = 0; r < count; r++)
            rest += map->regions[r].mapped_bytes;
        for (size_t i = 0; i < shown; i++)
            rest -= map->regions[ranked[i].index].mapped_bytes;
        char bytes[32];
        fprintf(out, "<p class=\"note\">%zu more regions, holding %s, are not drawn.</p>\n", count - shown,
                gm_html_bytes(bytes, sizeof bytes, rest));
    }
    free(ranked);
}
