/*
 * prometheus.h -- gpumem's readings as Prometheus metrics (text exposition format 0.0.4).
 *
 * The renderer is pure: it takes what `gpumem exporter` read (the published regions, the host's and
 * each process tree's memory from /proc, the GPUs from NVML) as plain structs and writes text into a
 * growable buffer; it reads nothing itself, so tests give it fixed readings. The metric families and
 * their labels are listed in docs/formats.md ("Prometheus metrics").
 */
#ifndef GM_PROMETHEUS_H
#define GM_PROMETHEUS_H

#include "gpumem.h"
#include "monitor/host_memory.h"
#include "monitor/nvml.h"
#include "monitor/published.h"

#include <stdbool.h>
#include <stddef.h>

/* Text that grows as it is appended to; `failed` once an allocation failed (the text is then
 * incomplete). Start from {0}; gm_text_buffer_free releases it. */
typedef struct gm_text_buffer {
    char *text; /* NUL-terminated when not NULL */
    size_t length;
    size_t capacity;
    bool failed;
} gm_text_buffer;

void gm_text_buffer_append(gm_text_buffer *buffer, const char *format, ...) __attribute__((format(printf, 2, 3)));
void gm_text_buffer_free(gm_text_buffer *buffer);

/* The host memory of one process with its descendants (its DataLoader workers, for example). */
typedef struct gm_prometheus_process {
    long pid;
    gm_process_memory memory; /* the tree_* readings are exported; tree_pss_bytes -1 is left out */
} gm_prometheus_process;

/* Everything one scrape read. */
typedef struct gm_prometheus_readings {
    const gm_published *regions; /* the regions read, one per process and device */
    size_t region_count;
    const gm_prometheus_process *processes; /* one per process whose memory could be read */
    size_t process_count;
    const gm_host_memory *host; /* NULL when /proc/meminfo could not be read */
    const gm_gpu_reading *gpus;
    size_t gpu_count;
    bool gpus_available;  /* NVML loaded and answered */
    size_t stale_regions;   /* left out: their process is gone */
    size_t refused_regions; /* left out: the reader refused them (another owner, a link, bad layout) */
    double collection_seconds; /* how long reading all of the above took */
} gm_prometheus_readings;

/* Append the metrics of `readings` to `buffer`. GM_ERROR_OUT_OF_MEMORY if the buffer could not grow. */
gm_status gm_prometheus_render(const gm_prometheus_readings *readings, gm_text_buffer *buffer);

/* The content type of what gm_prometheus_render writes. */
#define GM_PROMETHEUS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
