/*
 * options.h -- every tunable of gpumem in one struct, parsed from one string.
 *
 * The string has PyTorch's PYTORCH_CUDA_ALLOC_CONF form, "key:value,key:value". gm_options_parse
 * is the only place that knows the keys; an unknown key or a bad value is an error that names
 * both. Sizes take binary suffixes (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB: all powers of 1024).
 */
#ifndef GM_OPTIONS_H
#define GM_OPTIONS_H

#include "gpumem.h"

#include <stdbool.h>
#include <stdint.h>

/* The largest device the sim and host backends make: the pages engine reserves an address range of twice
 * the capacity for each stream and pool, and these ranges must fit the simulated device's fake addresses
 * (95 TiB) and the host's (128 TiB) for a few dozen streams. */
#define GM_MAX_CAPACITY (1ull << 40)
/* The largest page: a page is the smallest piece of memory mapped (GPUs map 2 MiB pages). */
#define GM_MAX_PAGE_SIZE (1ull << 30)
/* The most pages a device may have: the pages engine keeps a table with an entry for each page of each
 * address range (twice the device), so this bounds each table at 64 MiB of host memory. */
#define GM_MAX_DEVICE_PAGES (1ull << 22)

typedef enum gm_engine_kind { GM_ENGINE_PAGES = 0, GM_ENGINE_SEGMENTS = 1 } gm_engine_kind;

typedef struct gm_options {
    /* Read by every request: first, in one cache line. */
    uint64_t small_size;         /* requests up to this size use the small pool */
    uint64_t rechunk_min;        /* pages engine: an idle chunk a fit leaves this much of is made anew; 0: off */
    bool growth_lane;            /* pages engine: regrowing tensors get an address range of their own */

    char backend[16];            /* "sim", "host" or "cuda" */
    int device;                  /* device index */
    gm_engine_kind engine;       /* "pages" (default) or "segments" */
    uint64_t capacity;           /* sim/host: device memory in bytes */
    uint64_t page_size;          /* sim/host: mapping granularity */
    uint64_t memory_limit;       /* cap on reserved bytes, 0 = the device's memory */
    uint64_t host_limit;         /* cap on the pinned host cache's held bytes, 0 = none */
    uint64_t small_segment_size; /* segments engine: segment size of the small pool */
    uint64_t large_segment_size; /* segments engine: segment size for requests below min_large_alloc */
    uint64_t min_large_alloc;    /* segments engine: from here on a segment is sized to the request */
    bool release_before_growth;  /* segments engine: free cached segments before reserving beyond the peak */
    bool split_blocks;           /* segments engine: a request may take part of a free block (false: all of it) */
    bool cost_model;             /* sim: charge each device call its measured H200 cost */
    int device_credit_ns;        /* pages engine: device-call time each allocation earns */
    uint64_t max_chunk_size;     /* pages engine: largest chunk of physical memory made at once */
    int chunk_room_share;        /* pages engine: no chunk above 1/N of the room for new memory; 0: off */
    bool tail_chunk;             /* pages engine: a growth's last, partly used page is a chunk of its own */
    bool stitch;                 /* pages engine: pinned chunks' free ends and starts mapped again, stitched
                                    around a request (stitching.c) */
    bool refill_groups;          /* pages engine: after an empty_cache, a repeating step's memory made again in
                                    few chunks (refill.c) */
    uint64_t compact_min;        /* pages engine: pinned chunks split before the peak rises; 0: off */
    double move_slack;           /* pages engine: no moves by choice within (1 + this) x the allocated peak */
    int history;                 /* events kept in the history ring (0: none) */
    bool publish;                /* keep the statistics in a shared-memory region for other processes */
    double pressure_high;        /* a pressure policy's high watermark, a fraction; 0: no policy */
    double pressure_low;         /* its low watermark; 0: not given (gm_options_pressure_low) */
    uint32_t pressure_signals;   /* GM_PRESSURE_SIGNAL_* bits */
    int pressure_interval_ms;    /* how often the sampled signals are read */
    double pressure_psi_high;    /* host memory PSI percent that raises the level */
    double pressure_psi_low;     /* and under which it may fall; 0: not given (half of pressure_psi_high) */
    double fault_rate;           /* tests: the share of device calls made to fail; 0: none */
    int fault_seed;              /* and the seed of the draws */
} gm_options;

/* The defaults. */
void gm_options_default(gm_options *options);

/* Apply the keys of `text` (may be NULL or empty) on top of *options. On error returns
 * GM_ERROR_BAD_CONFIG, sets gm_last_error() and leaves *options unchanged. */
gm_status gm_options_parse(gm_options *options, const char *text);

/* One key's line of gm_config_help() (what it does and its default), or NULL for an unknown key. */
const char *gm_option_help(const char *key);

/* The pressure policy's low watermark: pressure_low, or pressure_high - 0.1 when it was not given. */
double gm_options_pressure_low(const gm_options *options);

/* Parse a size such as "512", "2MiB", "16GB" into bytes. */
gm_status gm_parse_size(const char *text, uint64_t *bytes_out);

#endif
