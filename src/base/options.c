/*
 * options.c -- the one place where configuration strings are parsed.
 *
 * A configuration is "key:value,key:value" (PyTorch's PYTORCH_CUDA_ALLOC_CONF style). Each key
 * is described once in the table below: its name, its kind (text choice, size, count, fraction,
 * boolean), where it lands in gm_options and its help line; parsing and help text are
 * all driven by that table. Keys are parsed into a copy, which replaces the caller's options only
 * when the whole string was valid.
 */
#include "base/options.h"

#include "base/error.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum option_kind {
    KIND_CHOICE,
    KIND_SIZE,
    KIND_INTEGER,
    KIND_BOOLEAN,
    KIND_FRACTION, /* a double in (0, 1] */
    KIND_PERCENT,  /* a double in (0, 100] */
    KIND_SIGNALS   /* pressure signal names joined by '+' */
} option_kind;

typedef struct option_descriptor {
    const char *key;
    option_kind kind;
    size_t offset;
    const char *choices; /* KIND_CHOICE: "|"-separated values; stored as an index or a string */
    const char *help;
} option_descriptor;

#define FIELD(name) offsetof(gm_options, name)

static const option_descriptor descriptors[] = {
    {"backend", KIND_CHOICE, FIELD(backend), "sim|host|cuda",
     "where memory comes from: a simulated device, host memory, or the CUDA driver (default sim)"},
    {"device", KIND_INTEGER, FIELD(device), NULL, "device index (default 0)"},
    {"engine", KIND_CHOICE, FIELD(engine), "pages|segments",
     "allocation engine: page-mapped virtual ranges, or PyTorch-style segments (default pages)"},
    {"capacity", KIND_SIZE, FIELD(capacity), NULL,
     "sim/host: device memory size, at most 1TiB (default 143771MiB for sim, as an H200; 1GiB for host)"},
    {"page_size", KIND_SIZE, FIELD(page_size), NULL,
     "sim/host: mapping granularity, a power of two from 4KiB to 1GiB (default 2MiB)"},
    {"memory_limit", KIND_SIZE, FIELD(memory_limit), NULL,
     "never reserve more than this many bytes (default 0: the whole device)"},
    {"host_limit", KIND_SIZE, FIELD(host_limit), NULL,
     "never hold more than this many bytes of pinned host memory (gm_host_malloc; default 0: no limit)"},
    {"small_size", KIND_SIZE, FIELD(small_size), NULL,
     "requests up to this size are served from the small pool (default 1MiB)"},
    {"small_segment_size", KIND_SIZE, FIELD(small_segment_size), NULL,
     "segments engine: segment size of the small pool (default 2MiB)"},
    {"large_segment_size", KIND_SIZE, FIELD(large_segment_size), NULL,
     "segments engine: segment size for large requests below min_large_alloc (default 20MiB)"},
    {"min_large_alloc", KIND_SIZE, FIELD(min_large_alloc), NULL,
     "segments engine: requests from this size get a segment of their own size (default 10MiB)"},
    {"release_before_growth", KIND_BOOLEAN, FIELD(release_before_growth), NULL,
     "segments engine: free cached segments before reserving beyond the previous peak, within a budget "
     "of device time (default true)"},
    {"split_blocks", KIND_BOOLEAN, FIELD(split_blocks), NULL,
     "segments engine: a request takes as much of a free block or new segment as it needs, the rest "
     "staying free (default true); false gives each request a whole free block or segment, as PyTorch's "
     "MemPool(no_split=True) keeps each tensor in a segment of its own"},
    {"cost_model", KIND_BOOLEAN, FIELD(cost_model), NULL,
     "sim: charge every device call its cost measured on an H200 (default true)"},
    {"device_credit_ns", KIND_INTEGER, FIELD(device_credit_ns), NULL,
     "pages engine: device-call time each allocation earns; new memory is made of page-sized chunks "
     "while the credit covers them (default 250)"},
    {"max_chunk_size", KIND_SIZE, FIELD(max_chunk_size), NULL,
     "pages engine: largest piece of physical memory made at once (rounded down to whole pages, at "
     "least one); a live block pins at most a few such pieces (default 128MiB, 0: no limit but "
     "chunk_room_share's)"},
    {"chunk_room_share", KIND_INTEGER, FIELD(chunk_room_share), NULL,
     "pages engine: no chunk is larger than 1/N of the room for new memory (the device's free memory, or "
     "what memory_limit leaves), so that as the device fills chunks shrink and a live block pins less of "
     "the memory a program near the capacity needs; with room to spare max_chunk_size decides (default "
     "1000: on an empty H200 from about 15 GiB reserved on, on an 80 GB device from the first growth "
     "(chunks of about 80 MiB: more device calls as memory is first made); 0: off)"},
    {"growth_lane", KIND_BOOLEAN, FIELD(growth_lane), NULL,
     "pages engine: once tensors are seen replaced by slightly larger ones (a growing KV cache), "
     "requests of those sizes go to an address range of their own, kept in one run (default true)"},
    {"tail_chunk", KIND_BOOLEAN, FIELD(tail_chunk), NULL,
     "pages engine: when a request ends inside the last page of new memory, that page is a chunk of "
     "its own, so the next block placed there pins one page, not the whole growth; costs a device "
     "call per growth (default false)"},
    {"stitch", KIND_BOOLEAN, FIELD(stitch), NULL,
     "pages engine: a request that would lift reserved memory above its peak may lie across a second "
     "mapping of the free end of one chunk that live blocks pin, idle or new memory, and a second mapping "
     "of the free start of another, so those free pages serve it without copies (default true)"},
    {"refill_groups", KIND_BOOLEAN, FIELD(refill_groups), NULL,
     "pages engine: after an empty_cache, while a step grows as one of the last two did, memory that the "
     "last two empty_caches released as the same run of adjacent chunks is made again in chunks of up to 8 "
     "x max_chunk_size (less as the device fills: chunk_room_share), when the first growth reaches it "
     "(default true)"},
    {"rechunk_min", KIND_SIZE, FIELD(rechunk_min), NULL,
     "pages engine: when a block placed in free memory covers part of an idle chunk and leaves at least "
     "this many bytes of it, that chunk is made anew in two, the block's pages and the rest, so the block "
     "pins only its own pages; costs a release and two chunks each time (default 0: off)"},
    {"compact_min", KIND_SIZE, FIELD(compact_min), NULL,
     "pages engine: when a growth would lift reserved memory above its peak, chunks that live blocks pin "
     "and that hold at least this many bytes of whole free pages are split around their live pages (copied "
     "after a device-wide wait, pointers unchanged) and the free pages given back; only for programs in "
     "which one thread at a time launches work on the device (default 0: off)"},
    {"move_slack", KIND_FRACTION, FIELD(move_slack), NULL,
     "pages engine: idle chunks move by choice (to keep reserved memory at its peak) only once reserved "
     "memory would pass this fraction above the peak of allocated memory; with small chunks "
     "(max_chunk_size:8MiB, move_slack:0.01) the layout settles instead of moving pages at every step "
     "(default 0: 0.02 where the room share keeps chunks under half of max_chunk_size -- a device a few "
     "times the program's need, or such a memory_limit -- and none elsewhere)"},
    {"history", KIND_INTEGER, FIELD(history), NULL,
     "keep the newest N allocator events (alloc, free, map, unmap, oom) for gm_history_read and "
     "snapshots' timelines, at most 1048576 (default 0: none, no cost)"},
    {"publish", KIND_BOOLEAN, FIELD(publish), NULL,
     "keep the statistics in /dev/shm/gpumem.<uid>.<pid>.<device> (or GPUMEM_SHM_DIR) for other "
     "processes to read: gpumem stats PID (default false)"},
    {"pressure_high", KIND_FRACTION, FIELD(pressure_high), NULL,
     "watch memory pressure: when a signal reaches this fraction (of the memory limit, or the device), "
     "release cached memory and call the gm_on_pressure callbacks (default: no policy)"},
    {"pressure_low", KIND_FRACTION, FIELD(pressure_low), NULL,
     "pressure ends when every signal is below this fraction, less than pressure_high (default "
     "pressure_high - 0.1)"},
    {"pressure_signals", KIND_SIGNALS, FIELD(pressure_signals), NULL,
     "what is watched, joined by '+': reserved, allocated (bytes of gpumem), device (the driver's used "
     "memory, other processes too), host (host memory used), psi (host memory stalls), cgroup (this "
     "process's memory cgroup: its usage of the lower of memory.max and memory.high; never high without "
     "such a limit) (default reserved+allocated)"},
    {"pressure_interval_ms", KIND_INTEGER, FIELD(pressure_interval_ms), NULL,
     "how often a thread reads the device, host, psi and cgroup signals, at least 1 (default 100)"},
    {"pressure_psi_high", KIND_PERCENT, FIELD(pressure_psi_high), NULL,
     "host memory PSI (some avg10, percent) that raises pressure (default 10)"},
    {"pressure_psi_low", KIND_PERCENT, FIELD(pressure_psi_low), NULL,
     "PSI under which pressure may end, less than pressure_psi_high (default half of it)"},
    {"fault_rate", KIND_FRACTION, FIELD(fault_rate), NULL,
     "for tests of failure paths: this share of device calls fail, drawn at random (default none)"},
    {"fault_seed", KIND_INTEGER, FIELD(fault_seed), NULL, "the seed of fault_rate's draws (default 0)"},
};

/* Sizes with bounds beyond the parser's: 0 refused where it would silently mean a default, and a maximum
 * where larger values would make the engines fail on every allocation (GM_MAX_* in options.h). */
static const struct {
    size_t offset;
    bool positive;
    uint64_t maximum;
    const char *maximum_reason;
} size_bounds[] = {
    {FIELD(capacity), true, GM_MAX_CAPACITY, "the pages engine reserves twice the capacity of addresses for each "
                                             "stream and pool, and the simulated device has 95 TiB of addresses"},
    {FIELD(page_size), false, GM_MAX_PAGE_SIZE, "a page is the smallest piece of memory mapped, and GPUs map 2 MiB "
                                                "pages"},
};

static const struct {
    const char *name;
    uint32_t bit;
} signal_names[] = {{"reserved", GM_PRESSURE_SIGNAL_RESERVED}, {"allocated", GM_PRESSURE_SIGNAL_ALLOCATED},
                    {"device", GM_PRESSURE_SIGNAL_DEVICE},     {"host", GM_PRESSURE_SIGNAL_HOST},
                    {"psi", GM_PRESSURE_SIGNAL_PSI},           {"cgroup", GM_PRESSURE_SIGNAL_CGROUP}};

#define DESCRIPTOR_COUNT (sizeof descriptors / sizeof descriptors[0])

void gm_options_default(gm_options *options)
{
    memset(options, 0, sizeof *options);
    strcpy(options->backend, "sim");
    options->engine = GM_ENGINE_PAGES;
    options->page_size = 2ull << 20;
    options->small_size = 1ull << 20;
    options->small_segment_size = 2ull << 20;
    options->large_segment_size = 20ull << 20;
    options->min_large_alloc = 10ull << 20;
    options->release_before_growth = true;
    options->split_blocks = true;
    options->cost_model = true;
    options->device_credit_ns = 250;
    options->max_chunk_size = 128ull << 20;
    options->chunk_room_share = 1000;
    options->growth_lane = true;
    options->tail_chunk = false;
    options->stitch = true;
    options->refill_groups = true;
    options->rechunk_min = 0;
    options->compact_min = 0;
    options->publish = false;
    options->pressure_signals = GM_PRESSURE_SIGNAL_RESERVED | GM_PRESSURE_SIGNAL_ALLOCATED;
    options->pressure_interval_ms = 100;
    options->pressure_psi_high = 10.0;
    options->pressure_psi_low = 0; /* not given: half of pressure_psi_high */
}

gm_status gm_parse_size(const char *text, uint64_t *bytes_out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } suffixes[] = {{"", 0},  {"b", 0},   {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},
                    {"mb", 20}, {"mib", 20}, {"g", 30},  {"gb", 30}, {"gib", 30}, {"t", 40},
                    {"tb", 40}, {"tib", 40}};
    if (!text || !isdigit((unsigned char)text[0]))
        return gm_fail(GM_ERROR_PARSE, "'%s' is not a size (expected a number with an optional "
                       "suffix such as 512, 64KiB, 2MiB, 16GiB)", text ? text : "(null)");
    errno = 0;
    char *end = NULL;
    unsigned long long number = strtoull(text, &end, 10);
    if (errno == ERANGE)
        return gm_fail(GM_ERROR_PARSE, "size '%s' is too large", text);
    char suffix[8] = {0};
    size_t length = strlen(end);
    if (length >= sizeof suffix)
        return gm_fail(GM_ERROR_PARSE, "size '%s' has an unknown suffix '%s'", text, end);
    for (size_t i = 0; i < length && i < sizeof suffix - 1; i++)
        suffix[i] = (char)tolower((unsigned char)end[i]);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        if (strcmp(suffix, suffixes[i].suffix) != 0)
            continue;
        unsigned shift = suffixes[i].shift;
        if (shift && number > (UINT64_MAX >> shift))
            return gm_fail(GM_ERROR_PARSE, "size '%s' is too large", text);
        *bytes_out = (uint64_t)number << shift;
        return GM_OK;
    }
    return gm_fail(GM_ERROR_PARSE, "size '%s' has an unknown suffix '%s' (use B, KiB, MiB, GiB or TiB; K, KB, M, MB, "
                   "G, GB, T and TB mean the same powers of 1024, as in PyTorch's *_mb settings)", text, end);
}

/* A size in the largest binary unit that divides it ("1TiB", "1GiB", "3000"), as the parser reads it. */
static const char *exact_size_text(char *buffer, size_t size, uint64_t bytes)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (unsigned i = 0; i < sizeof units / sizeof units[0]; i++) {
        unsigned shift = 40 - 10 * i;
        if (bytes && bytes % (1ull << shift) == 0) {
            snprintf(buffer, size, "%" PRIu64 "%s", bytes >> shift, units[i]);
            return buffer;
        }
    }
    snprintf(buffer, size, "%" PRIu64, bytes);
    return buffer;
}

static gm_status parse_boolean(const char *text, bool *value_out)
{
    if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "1")) {
        *value_out = true;
        return GM_OK;
    }
    if (!strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "0")) {
        *value_out = false;
        return GM_OK;
    }
    return gm_fail(GM_ERROR_PARSE, "'%s' is not a boolean (use true or false)", text);
}

/* A number in (0, maximum]: a fraction (maximum 1) or a percentage (maximum 100). */
static gm_status parse_bounded(const char *text, double maximum, double *value_out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno || end == text || *end || !(value > 0 && value <= maximum))
        return gm_fail(GM_ERROR_PARSE, "'%s' is not a number in (0, %g]%s", text, maximum,
                       maximum == 1 ? " (a fraction such as 0.9)" : " (a percentage)");
    *value_out = value;
    return GM_OK;
}

/* Signal names joined by '+', into GM_PRESSURE_SIGNAL_* bits. */
static gm_status parse_signals(const char *text, uint32_t *signals_out)
{
    uint32_t signals = 0;
    for (const char *start = text;;) {
        const char *plus = strchr(start, '+');
        size_t length = plus ? (size_t)(plus - start) : strlen(start);
        size_t i = 0;
        while (i < sizeof signal_names / sizeof signal_names[0] &&
               (strlen(signal_names[i].name) != length || strncmp(signal_names[i].name, start, length)))
            i++;
        if (i == sizeof signal_names / sizeof signal_names[0])
            return gm_fail(GM_ERROR_PARSE, "'%.*s' is not a pressure signal (use reserved, allocated, device, "
                           "host, psi or cgroup, joined by '+')", (int)length, start);
        signals |= signal_names[i].bit;
        if (!plus)
            break;
        start = plus + 1;
    }
    *signals_out = signals;
    return GM_OK;
}

/* The index of `value` among the "|"-separated `choices`, or -1. */
static int choice_index(const char *choices, const char *value)
{
    size_t value_length = strlen(value);
    int index = 0;
    for (const char *start = choices;; index++) {
        const char *bar = strchr(start, '|');
        size_t length = bar ? (size_t)(bar - start) : strlen(start);
        if (length == value_length && strncmp(start, value, length) == 0)
            return index;
        if (!bar)
            return -1;
        start = bar + 1;
    }
}

/* KIND_CHOICE: the backend's name, or the index of the choice (an engine). */
static gm_status apply_choice(gm_options *options, const option_descriptor *descriptor, const char *value)
{
    int index = choice_index(descriptor->choices, value);
    if (index < 0)
        return gm_fail(GM_ERROR_BAD_CONFIG, "bad value '%s' for key '%s' (expected one of %s)", value,
                       descriptor->key, descriptor->choices);
    if (descriptor->offset == FIELD(backend))
        snprintf(options->backend, sizeof options->backend, "%.15s", value);
    else
        *(gm_engine_kind *)((char *)options + descriptor->offset) = (gm_engine_kind)index;
    return GM_OK;
}

/* KIND_SIZE: a size within the key's bounds (size_bounds), into *bytes_out (left as it was on failure). A
 * bad size is GM_ERROR_PARSE (apply_value names the key); a size out of bounds is GM_ERROR_BAD_CONFIG with
 * the reason. */
static gm_status parse_bounded_size(const option_descriptor *descriptor, const char *value, uint64_t *bytes_out)
{
    uint64_t bytes = 0;
    gm_status status = gm_parse_size(value, &bytes);
    if (status != GM_OK)
        return status;
    for (size_t i = 0; i < sizeof size_bounds / sizeof size_bounds[0]; i++) {
        if (size_bounds[i].offset != descriptor->offset)
            continue;
        if (size_bounds[i].positive && bytes == 0)
            return gm_fail(GM_ERROR_BAD_CONFIG, "bad value for key '%s': it must be positive (leave the key out "
                           "for the backend's default)", descriptor->key);
        if (bytes > size_bounds[i].maximum) {
            char maximum[32];
            return gm_fail(GM_ERROR_BAD_CONFIG, "bad value for key '%s': %s is more than the %s supported (%s)",
                           descriptor->key, value, exact_size_text(maximum, sizeof maximum, size_bounds[i].maximum),
                           size_bounds[i].maximum_reason);
        }
    }
    *bytes_out = bytes;
    return GM_OK;
}

/* KIND_INTEGER: a whole number from 0 to 1048576. */
static gm_status parse_integer(const char *value, int *number_out)
{
    char *end = NULL;
    errno = 0;
    long number = strtol(value, &end, 10);
    if (errno || end == value || *end || number < 0)
        return gm_fail(GM_ERROR_PARSE, "'%s' is not a non-negative integer", value);
    if (number > 1 << 20)
        return gm_fail(GM_ERROR_PARSE, "'%s' is larger than 1048576, the largest integer a key takes", value);
    *number_out = (int)number;
    return GM_OK;
}

static gm_status apply_value(gm_options *options, const option_descriptor *descriptor, const char *value)
{
    char *field = (char *)options + descriptor->offset;
    gm_status status = GM_OK;
    switch (descriptor->kind) {
    case KIND_CHOICE:
        return apply_choice(options, descriptor, value);
    case KIND_SIZE:
        status = parse_bounded_size(descriptor, value, (uint64_t *)field);
        if (status == GM_ERROR_BAD_CONFIG)
            return status; /* out of bounds: the message names the key already */
        break;
    case KIND_INTEGER:
        status = parse_integer(value, (int *)field);
        break;
    case KIND_BOOLEAN:
        status = parse_boolean(value, (bool *)field);
        break;
    case KIND_FRACTION:
        status = parse_bounded(value, 1.0, (double *)field);
        break;
    case KIND_PERCENT:
        status = parse_bounded(value, 100.0, (double *)field);
        break;
    case KIND_SIGNALS:
        status = parse_signals(value, (uint32_t *)field);
        break;
    }
    if (status != GM_OK) {
        char reason[512];
        snprintf(reason, sizeof reason, "%s", gm_last_error());
        return gm_fail(GM_ERROR_BAD_CONFIG, "bad value for key '%s': %s", descriptor->key, reason);
    }
    return GM_OK;
}

double gm_options_pressure_low(const gm_options *options)
{
    return options->pressure_low ? options->pressure_low : options->pressure_high - 0.1;
}

/* The pressure keys: any of them needs pressure_high; the watermarks must be ordered. */
static gm_status check_pressure(const gm_options *options)
{
    gm_options defaults;
    gm_options_default(&defaults);
    if (options->pressure_high == 0) {
        static const char *const dependent[] = {"pressure_low", "pressure_signals", "pressure_interval_ms",
                                                "pressure_psi_high", "pressure_psi_low"};
        bool changed[] = {options->pressure_low != 0, options->pressure_signals != defaults.pressure_signals,
                          options->pressure_interval_ms != defaults.pressure_interval_ms,
                          options->pressure_psi_high != defaults.pressure_psi_high,
                          options->pressure_psi_low != defaults.pressure_psi_low};
        for (size_t i = 0; i < sizeof changed / sizeof changed[0]; i++)
            if (changed[i])
                return gm_fail(GM_ERROR_BAD_CONFIG, "key '%s' needs 'pressure_high' (the pressure policy is on only "
                               "with a high watermark)", dependent[i]);
        return GM_OK;
    }
    if (options->pressure_low == 0 && options->pressure_high <= 0.1)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'pressure_low' is needed when 'pressure_high' is %g (its default, "
                       "pressure_high - 0.1, would not be above 0)", options->pressure_high);
    if (options->pressure_low >= options->pressure_high)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'pressure_low' (%g) must be below 'pressure_high' (%g)",
                       options->pressure_low, options->pressure_high);
    if (options->pressure_interval_ms < 1)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'pressure_interval_ms' must be at least 1");
    if (options->pressure_psi_low && options->pressure_psi_low >= options->pressure_psi_high)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'pressure_psi_low' (%g) must be below 'pressure_psi_high' (%g)",
                       options->pressure_psi_low, options->pressure_psi_high);
    return GM_OK;
}

static gm_status check_consistency(const gm_options *options)
{
    if (options->page_size < 4096 || (options->page_size & (options->page_size - 1)))
        return gm_fail(GM_ERROR_BAD_CONFIG, "bad value for key 'page_size': %" PRIu64
                       " is not a power of two of at least 4KiB", options->page_size);
    if (options->small_size < 512 || options->small_size >= options->small_segment_size)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'small_size' must be at least 512 and below "
                       "'small_segment_size'");
    if (options->large_segment_size < options->small_segment_size ||
        options->min_large_alloc > options->large_segment_size)
        return gm_fail(GM_ERROR_BAD_CONFIG, "keys must satisfy small_segment_size <= large_segment_size "
                       "and min_large_alloc <= large_segment_size");
    if (options->compact_min && options->engine != GM_ENGINE_PAGES)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'compact_min' splits chunks of the pages engine, which "
                       "engine:segments does not have");
    if (options->move_slack > 0 && options->engine != GM_ENGINE_PAGES)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'move_slack' is about moving chunks of the pages engine, which "
                       "engine:segments does not have");
    if (!options->split_blocks && options->engine != GM_ENGINE_SEGMENTS)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key 'split_blocks' is false, which only the segments engine "
                       "knows: add engine:segments");
    return check_pressure(options);
}

static gm_status apply_pair(gm_options *options, const char *pair)
{
    const char *colon = strchr(pair, ':');
    if (!colon)
        return gm_fail(GM_ERROR_BAD_CONFIG, "'%s' is not a key:value pair", pair);
    char key[64];
    size_t key_length = (size_t)(colon - pair);
    if (key_length == 0 || key_length >= sizeof key)
        return gm_fail(GM_ERROR_BAD_CONFIG, "'%s' has no valid key", pair);
    memcpy(key, pair, key_length);
    key[key_length] = '\0';
    const char *value = colon + 1;
    if (!*value)
        return gm_fail(GM_ERROR_BAD_CONFIG, "key '%s' has no value", key);
    for (size_t i = 0; i < DESCRIPTOR_COUNT; i++)
        if (!strcmp(descriptors[i].key, key))
            return apply_value(options, &descriptors[i], value);
    char known[1024] = "";
    for (size_t i = 0, used = 0; i < DESCRIPTOR_COUNT && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", descriptors[i].key);
    return gm_fail(GM_ERROR_BAD_CONFIG, "unknown key '%s' (known keys: %s)", key, known);
}

gm_status gm_options_parse(gm_options *options, const char *text)
{
    if (!text)
        return GM_OK;
    gm_options parsed = *options;
    char pair[256];
    const char *cursor = text;
    while (*cursor) {
        const char *comma = strchr(cursor, ',');
        size_t length = comma ? (size_t)(comma - cursor) : strlen(cursor);
        while (length && isspace((unsigned char)*cursor)) {
            cursor++;
            length--;
        }
        while (length && isspace((unsigned char)cursor[length - 1]))
            length--;
        if (length >= sizeof pair)
            return gm_fail(GM_ERROR_BAD_CONFIG, "configuration entry too long near '%.40s'", cursor);
        if (length > 0) {
            memcpy(pair, cursor, length);
            pair[length] = '\0';
            gm_status status = apply_pair(&parsed, pair);
            if (status != GM_OK)
                return status;
        }
        if (!comma)
            break;
        cursor = comma + 1;
    }
    gm_status status = check_consistency(&parsed);
    if (status != GM_OK)
        return status;
    *options = parsed;
    return GM_OK;
}

static char help_text[8192];
static pthread_once_t help_once = PTHREAD_ONCE_INIT;

static void write_help(void)
{
    size_t used = (size_t)snprintf(help_text, sizeof help_text,
                                   "GPUMEM_CONF keys (key:value,key:value; sizes in B, KiB, MiB, GiB or TiB, and K, KB, "
                                   "M, MB, G, GB, T, TB as the same powers of 1024):\n");
    for (size_t i = 0; i < DESCRIPTOR_COUNT && used < sizeof help_text; i++)
        used += (size_t)snprintf(help_text + used, sizeof help_text - used, "  %-22s %s\n", descriptors[i].key,
                                 descriptors[i].help);
}

const char *gm_option_help(const char *key)
{
    for (size_t i = 0; i < DESCRIPTOR_COUNT; i++)
        if (!strcmp(descriptors[i].key, key))
            return descriptors[i].help;
    return NULL;
}

const char *gm_config_help(void)
{
    pthread_once(&help_once, write_help);
    return help_text;
}
