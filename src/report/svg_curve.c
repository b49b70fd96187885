/*
 * svg_curve.c -- memory over time as an SVG chart (svg_charts.h).
 *
 * Each bucket of the curve is drawn at its middle x as its lowest, highest and last readings, so a
 * line runs through every bucket and a bucket whose readings varied shows as a vertical stroke: at a
 * few thousand points the chart looks as the full curve would, with every peak in it. The running
 * peaks are step lines. Axes are in binary byte units and whole operation (or event) numbers, with
 * ticks at 1, 2, 2.5 or 5 times a power of ten.
 */
#include "report/svg_charts.h"

#include "report/html_text.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

enum { WIDTH = 1000, HEIGHT = 390 };
static const double PLOT_LEFT = 80, PLOT_RIGHT = 985, PLOT_TOP = 40, PLOT_BOTTOM = 340;

typedef struct axes {
    double x_low, x_high; /* data range of x */
    double y_high;        /* bytes at the top of the plot */
} axes;

static double to_x(const axes *axes, double x)
{
    return PLOT_LEFT + (x - axes->x_low) / (axes->x_high - axes->x_low) * (PLOT_RIGHT - PLOT_LEFT);
}

static double to_y(const axes *axes, double bytes)
{
    return PLOT_BOTTOM - bytes / axes->y_high * (PLOT_BOTTOM - PLOT_TOP);
}

static double bucket_x(const axes *axes, const gm_curve_bucket *bucket)
{
    return to_x(axes, ((double)bucket->first_x + (double)bucket->last_x) / 2.0);
}

/* 1, 2, 2.5 or 5 times a power of ten, at least `rough`. */
static double nice_step(double rough)
{
    if (rough <= 0)
        return 1;
    double power = pow(10, floor(log10(rough)));
    static const double multiples[] = {1, 2, 2.5, 5, 10};
    for (size_t i = 0; i < sizeof multiples / sizeof multiples[0]; i++)
        if (multiples[i] * power >= rough)
            return multiples[i] * power;
    return 10 * power;
}

/* The unit for byte ticks: the largest binary unit not above `bytes`. */
static void byte_unit(double bytes, double *unit_out, const char **name_out)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t unit = 0;
    double scale = 1;
    while (unit + 1 < sizeof names / sizeof names[0] && bytes >= scale * 1024) {
        scale *= 1024;
        unit++;
    }
    *unit_out = scale;
    *name_out = names[unit];
}

static void grid(FILE *out, const axes *axes, const char *unit_name, double y_step, double y_unit,
                 const char *y_unit_name)
{
    fprintf(out, "<g class=\"grid\">\n");
    for (double tick = 0; tick <= axes->y_high * 1.0000001; tick += y_step * y_unit) {
        double y = to_y(axes, tick);
        fprintf(out, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>"
                     "<text class=\"tick\" x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%g %s</text>\n",
                PLOT_LEFT, y, PLOT_RIGHT, y, PLOT_LEFT - 6, y + 4, tick / y_unit, y_unit_name);
    }
    double x_step = fmax(1, nice_step((axes->x_high - axes->x_low) / 8)); /* whole operations */
    for (double tick = ceil(axes->x_low / x_step) * x_step; tick <= axes->x_high; tick += x_step) {
        double x = to_x(axes, tick);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\"/>"
                     "<text class=\"tick\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n",
                x, PLOT_TOP, x, PLOT_BOTTOM, x, PLOT_BOTTOM + 16, tick);
    }
    fprintf(out, "<text class=\"axis-title\" x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">", (PLOT_LEFT + PLOT_RIGHT) / 2,
            HEIGHT - 14);
    gm_html_escape(out, unit_name);
    fprintf(out, " (in the order they happened)</text>\n</g>\n");
}

/* A series through each bucket's low, high and last reading (one point when they agree). */
static void series(FILE *out, const axes *axes, const gm_memory_curve *curve, const char *id, int reserved)
{
    fprintf(out, "<path id=\"%s\" class=\"line %s\" d=\"", id, reserved ? "reserved" : "allocated");
    for (size_t i = 0; i < curve->bucket_count; i++) {
        const gm_curve_bucket *bucket = &curve->buckets[i];
        uint64_t low = reserved ? bucket->reserved_low : bucket->allocated_low;
        uint64_t high = reserved ? bucket->reserved_high : bucket->allocated_high;
        uint64_t last = reserved ? bucket->reserved_last : bucket->allocated_last;
        double x = bucket_x(axes, bucket);
        if (low != high)
            fprintf(out, "%s%.1f %.1f L%.1f %.1f L", i ? "" : "M", x, to_y(axes, (double)low), x,
                    to_y(axes, (double)high));
        else if (!i)
            fputs("M", out);
        fprintf(out, "%.1f %.1f%s", x, to_y(axes, (double)last), i + 1 < curve->bucket_count ? " L" : "");
    }
    fprintf(out, "\"/>\n");
}

/* The running peak as a step line. */
static void peak_series(FILE *out, const axes *axes, const gm_memory_curve *curve, const char *id, int reserved)
{
    fprintf(out, "<path id=\"%s\" class=\"peak %s\" d=\"", id, reserved ? "reserved" : "allocated");
    uint64_t peak = 0;
    for (size_t i = 0; i < curve->bucket_count; i++) {
        const gm_curve_bucket *bucket = &curve->buckets[i];
        uint64_t high = reserved ? bucket->reserved_high : bucket->allocated_high;
        double x = bucket_x(axes, bucket);
        if (!i)
            fprintf(out, "M%.1f %.1f", x, to_y(axes, (double)high));
        else if (high > peak)
            fprintf(out, " H%.1f V%.1f", x, to_y(axes, (double)high));
        peak = high > peak ? high : peak;
    }
    fprintf(out, " H%.1f\"/>\n", bucket_x(axes, &curve->buckets[curve->bucket_count - 1]));
}

static void legend(FILE *out)
{
    static const struct {
        const char *class_name, *label;
    } entries[] = {{"line allocated", "allocated (live bytes, as requested)"},
                   {"line reserved", "reserved (device memory held)"},
                   {"peak allocated", "peak allocated"},
                   {"peak reserved", "peak reserved"}};
    double x = PLOT_LEFT;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        fprintf(out, "<path class=\"%s\" d=\"M%.0f 16 H%.0f\"/><text class=\"legend\" x=\"%.0f\" y=\"20\">%s</text>\n",
                entries[i].class_name, x, x + 24, x + 30, entries[i].label);
        x += 30 + 7.0 * (double)strlen(entries[i].label) + 24;
    }
}

void gm_svg_memory_curve(FILE *out, const gm_memory_curve *curve, const char *unit)
{
    if (!curve->bucket_count)
        return;
    uint64_t top = curve->peak_reserved > curve->peak_allocated ? curve->peak_reserved : curve->peak_allocated;
    double y_unit;
    const char *y_unit_name;
    byte_unit(top ? (double)top : 1.0, &y_unit, &y_unit_name);
    double y_step = nice_step((top ? (double)top : 1.0) / y_unit / 5);
    if (y_unit == 1 && y_step < 1) /* whole bytes */
        y_step = 1;
    axes axes = {.x_low = (double)curve->buckets[0].first_x,
                 .x_high = (double)curve->buckets[curve->bucket_count - 1].last_x,
                 .y_high = ceil((top ? (double)top : 1.0) / y_unit / y_step) * y_step * y_unit};
    if (axes.x_high <= axes.x_low)
        axes.x_high = axes.x_low + 1;
    fprintf(out,
            "<svg id=\"memory-curve\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"memory over time\" "
            "data-plot-left=\"%.0f\" data-plot-right=\"%.0f\" data-x-low=\"%.0f\" data-x-high=\"%.0f\" data-unit=\"",
            WIDTH, HEIGHT, PLOT_LEFT, PLOT_RIGHT, axes.x_low, axes.x_high);
    gm_html_escape(out, unit);
    fputs("\">\n", out);
    grid(out, &axes, unit, y_step, y_unit, y_unit_name);
    legend(out);
    peak_series(out, &axes, curve, "curve-peak-reserved", 1); /* under the curves they follow */
    peak_series(out, &axes, curve, "curve-peak-allocated", 0);
    series(out, &axes, curve, "curve-reserved", 1);
    series(out, &axes, curve, "curve-allocated", 0);
    double peak_x = to_x(&axes, (double)curve->peak_reserved_x), peak_y = to_y(&axes, (double)curve->peak_reserved);
    char bytes[32];
    bool right_half = peak_x > (PLOT_LEFT + PLOT_RIGHT) / 2;
    fprintf(out,
            "<line id=\"peak-mark\" x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\"/>"
            "<circle class=\"peak-dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\"/>"
            "<text class=\"peak-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">peak reserved %s at ",
            peak_x, PLOT_TOP, peak_x, PLOT_BOTTOM, peak_x, peak_y, peak_x + (right_half ? -8 : 8), PLOT_TOP + 12,
            right_half ? "end" : "start", gm_html_bytes(bytes, sizeof bytes, curve->peak_reserved));
    gm_html_escape(out, unit);
    fprintf(out, " %" PRIu64 "</text>\n", curve->peak_reserved_x);
    fprintf(out, "<line id=\"hover-line\" x1=\"0\" y1=\"%.0f\" x2=\"0\" y2=\"%.0f\" visibility=\"hidden\"/>\n"
                 "<rect id=\"hover-area\" x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\"/>\n</svg>\n",
            PLOT_TOP, PLOT_BOTTOM, PLOT_LEFT, PLOT_TOP, PLOT_RIGHT - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP);
}

void gm_svg_curve_data(FILE *out, const gm_memory_curve *curve)
{
    static const char *const names[] = {"x", "allocated", "reserved"};
    fputs("{", out);
    for (int series = 0; series < 3; series++) {
        fprintf(out, "%s\"%s\": [", series ? ", " : "", names[series]);
        for (size_t i = 0; i < curve->bucket_count; i++) {
            const gm_curve_bucket *bucket = &curve->buckets[i];
            uint64_t value = series == 0 ? bucket->first_x : series == 1 ? bucket->allocated_high : bucket->reserved_high;
            fprintf(out, "%s%" PRIu64, i ? "," : "", value);
        }
        fputs("]", out);
    }
    fputs("}", out);
}
