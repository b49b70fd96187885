/*
 * svg_charts.h -- the report's two pictures, as inline SVG that renders without any script: memory
 * over time (svg_curve.c) and the memory map at one moment (svg_map.c).
 */
#ifndef GM_SVG_CHARTS_H
#define GM_SVG_CHARTS_H

#include "gpumem.h"
#include "report/memory_curve.h"

#include <stdio.h>

/* <svg id="memory-curve">: allocated and reserved bytes (each bucket's range, so that peaks show),
 * their running peaks (#curve-allocated, #curve-reserved, #curve-peak-allocated, #curve-peak-reserved)
 * and a mark at the peak of reserved memory. `unit` names the x axis ("operation", "event"). */
void gm_svg_memory_curve(FILE *out, const gm_memory_curve *curve, const char *unit);

/* The curve's buckets as JSON, for the page's hover read-out: {"x": [first x of each bucket...],
 * "allocated": [highest...], "reserved": [highest...]}. */
void gm_svg_curve_data(FILE *out, const gm_memory_curve *curve);

/* <svg id="memory-map">: one bar per region (at most 128: those holding the most memory), its blocks
 * coloured by state (class allocated, pending, free, unmapped); a region's unmapped tail is not drawn
 * but said in its label. */
void gm_svg_memory_map(FILE *out, const gm_snapshot *map);

#endif
