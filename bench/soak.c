/*
 * soak.c -- a long randomized run of gpumem: many threads, thousands of streams, device faults, and the
 * books checked at barriers.
 *
 * Each thread allocates (sizes from 512 B to 64 MiB, most of them small) on a stream of its own or on
 * the shared ones, frees, frees across streams (record_stream on another stream, whose simulated work
 * then holds the memory until it completes), queues and completes work, empties the cache and now and
 * then changes the memory limit. A thread's own stream is abandoned from time to time for a new one,
 * and its old streams serve as other streams for a while, then are completed and never named again:
 * the run makes thousands of streams. With fault_rate a share of device calls fail: an allocation
 * must then fail cleanly (GM_ERROR_DEVICE, no pointer) and leave the books exact.
 *
 * Every so many operations all threads stop at a barrier and one checks: gm_validate; allocated bytes,
 * allocations and requested bytes equal what the threads' live sets add up to; every live block's
 * size is what gm_allocation_size said at its allocation; the device's used memory equals reserved
 * bytes; on the host backend every live block still holds the pattern written into it. At the end
 * everything is freed, all work completed and the cache emptied: nothing may stay allocated or
 * reserved. Any difference is a violation; the exit status is 1 if there was one, 2 for a bad argument.
 *
 *   gpumem_soak [--backend sim|host] [--engine pages|segments] [--operations N] [--threads N]
 *               [--seed N] [--fault-rate R] [--capacity BYTES] [--barriers N] [--conf KEYS] [--trace FILE]
 *               [--json] [--verbose]
 *
 * --trace: every thread replays a trace's allocations and frees again and again, and does nothing else
 * (soak_trace.c): the steps of real programs, whose repeated layouts the engine's rules for them
 * (stitching and its lingering mappings, the growth lane, moves ahead) serve, on threads that share one
 * allocator, with the device faults and the same checks at the barriers.
 * --conf adds GPUMEM_CONF keys. With compact_min on the host backend, run one thread: a thread that
 * writes its block while another thread's allocation compacts the chunk under it loses the write, as
 * docs/engine.md says of threads that launch concurrently.
 *
 * Output: a markdown table (header and one row), or with --json one JSON line. soak_check.c holds the
 * checks, this file the options, the threads' operations and the report.
 */
#include "soak.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NEW_STREAM_PER_MILLE 4 /* operations that abandon the thread's stream for a new one */

/* ---------------------------------------------------------------- violations */

void soak_violation(soak_run *run, const char *format, ...)
{
    uint64_t count = atomic_fetch_add(&run->violations, 1);
    if (count >= 20)
        return; /* the first ones say enough */
    va_list arguments;
    va_start(arguments, format);
    fprintf(stderr, "violation: ");
    vfprintf(stderr, format, arguments);
    fprintf(stderr, "\n");
    va_end(arguments);
}

/* ---------------------------------------------------------------- randomness */

uint64_t soak_random(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

/* 512 B .. 64 MiB, skewed to small: three in four under 64 KiB, one in thirty-three above 4 MiB. */
static size_t random_size(uint64_t *state)
{
    uint64_t draw = soak_random(state) % 100;
    unsigned low_bit = draw < 75 ? 9 : draw < 97 ? 16 : 22;
    unsigned high_bit = draw < 75 ? 16 : draw < 97 ? 22 : 26;
    unsigned bit = low_bit + (unsigned)(soak_random(state) % (high_bit - low_bit));
    size_t power = (size_t)1 << bit;
    return power + (size_t)(soak_random(state) % power);
}

/* ---------------------------------------------------------------- streams */

static gm_stream new_own_stream(soak_worker *self)
{
    self->counts.streams_created++;
    return ((gm_stream)(self->index + 1) << 32) | ++self->stream_serial;
}

/* Abandon the thread's stream for a new one; the old one serves as another stream for a while, and
 * the oldest of those has its work completed and is never named again. */
static void renew_own_stream(soak_worker *self)
{
    soak_run *run = self->run;
    if (self->recent_count == SOAK_RECENT_STREAMS) {
        soak_check_status(run, gm_sim_stream_complete(run->allocator, self->recent[0]), GM_OK, "complete");
        memmove(&self->recent[0], &self->recent[1], (SOAK_RECENT_STREAMS - 1) * sizeof self->recent[0]);
        self->recent_count--;
    }
    self->recent[self->recent_count++] = self->own_stream;
    self->own_stream = new_own_stream(self);
}

/* Any stream this thread may name: its own, a recent one, a shared one, or the default stream. */
static gm_stream some_stream(soak_worker *self)
{
    uint64_t draw = soak_random(&self->random) % 10;
    if (draw < 4)
        return self->own_stream;
    if (draw < 7 && self->recent_count)
        return self->recent[soak_random(&self->random) % self->recent_count];
    return (gm_stream)(soak_random(&self->random) % (SOAK_SHARED_STREAMS + 1));
}

/* ---------------------------------------------------------------- operations */

void soak_check_status(soak_run *run, gm_status status, gm_status expected, const char *call)
{
    if (status != expected)
        soak_violation(run, "%s returned %s (%s), expected %s", call, gm_strerror(status), gm_last_error(),
                       gm_strerror(expected));
}

static void allocate(soak_worker *self)
{
    size_t requested = random_size(&self->random);
    gm_stream stream = soak_random(&self->random) % 10 < 7 ? self->own_stream
                                                           : (gm_stream)(soak_random(&self->random) % (SOAK_SHARED_STREAMS + 1));
    soak_allocate(self, requested, stream);
}

uint64_t soak_allocate(soak_worker *self, size_t requested, gm_stream stream)
{
    soak_run *run = self->run;
    void *pointer = (void *)1;
    gm_status status = gm_malloc(run->allocator, requested, stream, &pointer);
    self->counts.mallocs++;
    if (status == GM_ERROR_OUT_OF_MEMORY || status == GM_ERROR_DEVICE) {
        if (status == GM_ERROR_DEVICE)
            self->counts.device_errors++;
        else
            self->counts.ooms++;
        if (pointer != NULL)
            soak_violation(run, "a failed gm_malloc (%s) left a pointer", gm_strerror(status));
        return 0;
    }
    soak_check_status(run, status, GM_OK, "gm_malloc");
    if (status != GM_OK)
        return 0;
    soak_block *block = &self->live[self->live_count++];
    *block = (soak_block){.pointer = pointer, .requested = requested, .identity = ((uint64_t)(self->index + 1) << 48) | ++self->identity,
                          .slot = SOAK_NO_SLOT};
    soak_check_status(run, gm_allocation_size(run->allocator, pointer, &block->size), GM_OK, "gm_allocation_size");
    if (block->size < requested || block->size % 512)
        soak_violation(run, "a block of %zu bytes for a request of %zu", block->size, requested);
    if (run->options.check_data)
        soak_stamp(pointer, requested, block->identity);
    return block->identity;
}

/* Free the live block at `index`; with `cross_stream`, first mark it used on another stream that has
 * work queued, so the memory waits for that work. */
void soak_release(soak_worker *self, size_t index, bool cross_stream)
{
    soak_run *run = self->run;
    soak_block block = self->live[index];
    self->live[index] = self->live[--self->live_count];
    if (index < self->live_count && self->live[index].slot != SOAK_NO_SLOT)
        self->slot_positions[self->live[index].slot] = index + 1;
    if (run->options.check_data && !soak_intact(block.pointer, block.requested, block.identity))
        soak_violation(run, "the data of block %p (%zu bytes) changed before its free", block.pointer, block.requested);
    if (cross_stream) {
        gm_stream other = some_stream(self);
        soak_check_status(run, gm_record_stream(run->allocator, block.pointer, other), GM_OK, "gm_record_stream");
        soak_check_status(run, gm_sim_stream_enqueue(run->allocator, other, 1), GM_OK, "gm_sim_stream_enqueue");
        self->counts.cross_stream_frees++;
    }
    soak_check_status(run, gm_free(run->allocator, block.pointer), GM_OK, "gm_free");
    self->counts.frees++;
}

static void change_memory_limit(soak_worker *self)
{
    static const unsigned sixteenths[] = {0, 8, 2, 1}; /* the last about what the threads hold on sim */
    unsigned choice = sixteenths[soak_random(&self->random) % 4];
    uint64_t limit = choice ? self->run->options.capacity / 16 * choice : 0;
    soak_check_status(self->run, gm_set_memory_limit(self->run->allocator, limit), GM_OK, "gm_set_memory_limit");
    self->counts.limit_changes++;
}

static void one_operation(soak_worker *self)
{
    soak_run *run = self->run;
    if (run->options.trace_path) {
        soak_trace_operation(self);
        return;
    }
    uint64_t draw = soak_random(&self->random) % 1000;
    bool full = self->live_count == run->options.live_per_thread;
    if ((draw < 430 && !full) || (draw < 800 && self->live_count == 0))
        allocate(self);
    else if (draw < 800)
        soak_release(self, soak_random(&self->random) % self->live_count, draw >= 680);
    else if (draw < 880)
        soak_check_status(run, gm_sim_stream_enqueue(run->allocator, some_stream(self), 1), GM_OK, "gm_sim_stream_enqueue");
    else if (draw < 990)
        soak_check_status(run, gm_sim_stream_complete(run->allocator, some_stream(self)), GM_OK, "gm_sim_stream_complete");
    else if (draw < 990 + NEW_STREAM_PER_MILLE)
        renew_own_stream(self);
    else if (draw < 998) {
        soak_check_status(run, gm_empty_cache(run->allocator), GM_OK, "gm_empty_cache");
        self->counts.empty_caches++;
    } else if (soak_random(&self->random) % 8 == 0)
        change_memory_limit(self);
}

static void *work(void *argument)
{
    soak_worker *self = argument;
    soak_run *run = self->run;
    for (uint64_t done = 0; done < run->operations_per_thread; done++) {
        one_operation(self);
        if ((done + 1) % run->operations_per_barrier == 0)
            soak_barrier(self);
    }
    return NULL;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *out)
{
    fprintf(out, "usage: gpumem_soak [--backend sim|host] [--engine pages|segments] [--operations N] [--threads N]\n"
                 "                   [--seed N] [--fault-rate R] [--capacity BYTES] [--barriers N] [--conf KEYS]\n"
                 "                   [--trace FILE]\n"
                 "                   [--json] [--verbose]\n"
                 "defaults: sim, pages, 10000000 operations on sim (1000000 on host), 8 threads, seed 1,\n"
                 "fault rate 0.002 (0: none), capacity 16GiB on sim (2GiB on host), 50 barriers;\n"
                 "--conf: more GPUMEM_CONF keys (not backend, engine, capacity, fault_rate or fault_seed: the flags set them)\n");
}

static bool parse_unsigned(const char *text, uint64_t low, uint64_t high, uint64_t *value_out)
{
    if (!text || !*text || *text == '-' || *text == '+')
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    uint64_t multiplier = 1;
    if (end && (!strcmp(end, "KiB") || !strcmp(end, "MiB") || !strcmp(end, "GiB")))
        multiplier = 1ull << (end[0] == 'K' ? 10 : end[0] == 'M' ? 20 : 30), end += 3;
    if (errno || !end || *end || value > high / multiplier || value * multiplier < low)
        return false;
    *value_out = value * multiplier;
    return true;
}

static bool parse_rate(const char *text, double *rate_out)
{
    if (!text || !*text)
        return false;
    char *end = NULL;
    errno = 0;
    double rate = strtod(text, &end);
    if (errno || !end || *end || !(rate >= 0 && rate < 1))
        return false;
    *rate_out = rate;
    return true;
}

static int bad_argument(const char *option, const char *value, const char *expected)
{
    fprintf(stderr, "gpumem_soak: bad value '%s' for %s: expected %s\n", value ? value : "(missing)", option, expected);
    usage(stderr);
    return 2;
}

/* The flag that owns a GPUMEM_CONF key of --conf, or NULL. The soak builds its configuration from its
 * flags and reports them in its table and JSON; a --conf key that overrode one would run something other
 * than what the report says (and the data checks follow --backend), so such keys are refused. */
static const char *key_owned_by_a_flag(const char *conf)
{
    static const char *const owned[][2] = {{"backend", "--backend"}, {"engine", "--engine"}, {"capacity", "--capacity"},
                                           {"fault_rate", "--fault-rate"}, {"fault_seed", "--seed"}};
    for (const char *key = conf;; key++) {
        while (isspace((unsigned char)*key)) /* as the GPUMEM_CONF parser skips it before a key */
            key++;
        size_t length = strcspn(key, ":,");
        for (size_t k = 0; k < sizeof owned / sizeof owned[0]; k++)
            if (length == strlen(owned[k][0]) && !strncmp(key, owned[k][0], length))
                return owned[k][1];
        if (!(key = strchr(key, ',')))
            return NULL;
    }
}

/* The value of an option given as "--name value" or "--name=value"; NULL if absent. */
static const char *option_value(int argc, char **argv, int *index, const char *name, bool *matched)
{
    size_t length = strlen(name);
    *matched = strncmp(argv[*index], name, length) == 0 && (argv[*index][length] == '\0' || argv[*index][length] == '=');
    if (!*matched)
        return NULL;
    if (argv[*index][length] == '=')
        return argv[*index] + length + 1;
    return *index + 1 < argc ? argv[++*index] : NULL;
}

static int parse_value(soak_options *options, const char *name, const char *value)
{
    uint64_t number = 0;
    if (!strcmp(name, "--backend")) {
        if (!value || (strcmp(value, "sim") && strcmp(value, "host")))
            return bad_argument(name, value, "sim or host");
        options->backend = value;
    } else if (!strcmp(name, "--engine")) {
        if (!value || (strcmp(value, "pages") && strcmp(value, "segments")))
            return bad_argument(name, value, "pages or segments");
        options->engine = value;
    } else if (!strcmp(name, "--operations")) {
        if (!parse_unsigned(value, 1, 1000000000000ull, &options->operations))
            return bad_argument(name, value, "a whole number from 1 to 10^12");
    } else if (!strcmp(name, "--threads")) {
        if (!parse_unsigned(value, 1, SOAK_MAX_THREADS, &number))
            return bad_argument(name, value, "a whole number from 1 to 256");
        options->threads = (unsigned)number;
    } else if (!strcmp(name, "--seed")) {
        if (!parse_unsigned(value, 0, UINT64_MAX, &options->seed))
            return bad_argument(name, value, "a whole number");
    } else if (!strcmp(name, "--fault-rate")) {
        if (!parse_rate(value, &options->fault_rate))
            return bad_argument(name, value, "a number from 0 (no faults) up to, not including, 1");
    } else if (!strcmp(name, "--capacity")) {
        if (!parse_unsigned(value, 64ull << 20, 1ull << 40, &options->capacity))
            return bad_argument(name, value, "bytes from 64MiB to 1024GiB (a number, or with KiB, MiB or GiB)");
    } else if (!strcmp(name, "--barriers")) {
        if (!parse_unsigned(value, 1, 1000000, &number))
            return bad_argument(name, value, "a whole number from 1 to 1000000");
        options->barriers = number;
    } else if (!strcmp(name, "--trace")) {
        if (!value || !*value)
            return bad_argument(name, value, "a trace file (plain or .gz)");
        options->trace_path = value;
    } else if (!strcmp(name, "--conf")) {
        if (!value || !*value || strlen(value) > 128)
            return bad_argument(name, value, "GPUMEM_CONF keys (key:value,...), at most 128 characters");
        const char *flag = key_owned_by_a_flag(value);
        if (flag) {
            fprintf(stderr, "gpumem_soak: --conf '%s' sets a key that %s sets: give it with %s\n", value, flag, flag);
            return 2;
        }
        options->conf = value;
    }
    return 0;
}

static int parse_options(int argc, char **argv, soak_options *options)
{
    static const char *const valued[] = {"--backend", "--engine", "--operations", "--threads", "--seed",
                                         "--fault-rate", "--capacity", "--barriers", "--conf", "--trace"};
    *options = (soak_options){.backend = "sim", .engine = "pages", .threads = 8, .seed = 1, .fault_rate = 0.002,
                              .barriers = 50};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") || !strcmp(argv[i], "--verbose")) {
            *(argv[i][2] == 'j' ? &options->json : &options->verbose) = true;
            continue;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            exit(0);
        }
        bool matched = false;
        for (size_t v = 0; v < sizeof valued / sizeof valued[0] && !matched; v++) {
            const char *value = option_value(argc, argv, &i, valued[v], &matched);
            int status = matched ? parse_value(options, valued[v], value) : 0;
            if (status)
                return status;
        }
        if (!matched) {
            fprintf(stderr, "gpumem_soak: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    bool host = !strcmp(options->backend, "host");
    if (!options->operations)
        options->operations = host ? 1000000 : 10000000;
    if (!options->capacity)
        options->capacity = host ? 2ull << 30 : 16ull << 30;
    options->check_data = host;
    options->live_per_thread = host ? 24 : 128;
    return 0;
}

/* ---------------------------------------------------------------- the run */

static double seconds_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

static int load_trace(soak_run *run)
{
    gm_status status = gm_trace_load(run->options.trace_path, &run->trace);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem_soak: %s (%s)\n", gm_last_error(), gm_strerror(status));
        return 2;
    }
    run->options.live_per_thread = run->trace.slot_count;
    return 0;
}

static int create_allocator(soak_run *run)
{
    const soak_options *options = &run->options;
    char config[256];
    int length = snprintf(config, sizeof config, "backend:%s,engine:%s,capacity:%" PRIu64, options->backend,
                          options->engine, options->capacity);
    if (options->fault_rate > 0)
        length += snprintf(config + length, sizeof config - (size_t)length, ",fault_rate:%.17g,fault_seed:%d",
                           options->fault_rate, (int)(options->seed % 2147483647u));
    if (options->conf)
        snprintf(config + length, sizeof config - (size_t)length, ",%s", options->conf);
    gm_status status = gm_create(config, &run->allocator);
    if (status != GM_OK) {
        fprintf(stderr, "gpumem_soak: gm_create(\"%s\"): %s (%s)\n", config, gm_strerror(status), gm_last_error());
        return 2;
    }
    return 0;
}

static int run_threads(soak_run *run)
{
    unsigned threads = run->options.threads;
    run->workers = calloc(threads, sizeof *run->workers);
    pthread_t *handles = calloc(threads, sizeof *handles);
    if (!run->workers || !handles || pthread_barrier_init(&run->barrier, NULL, threads) != 0) {
        fprintf(stderr, "gpumem_soak: no memory for %u threads\n", threads);
        free(handles);
        return 2;
    }
    unsigned started = 0;
    for (; started < threads; started++) {
        soak_worker *worker = &run->workers[started];
        worker->run = run;
        worker->index = started;
        worker->random = (run->options.seed + 1) * 0x9E3779B97F4A7C15ull + started * 7919 + 1;
        worker->live = calloc(run->options.live_per_thread, sizeof *worker->live);
        worker->slot_positions = calloc(run->trace.slot_count + 1, sizeof *worker->slot_positions);
        worker->own_stream = new_own_stream(worker);
        if (!worker->live || !worker->slot_positions || pthread_create(&handles[started], NULL, work, worker) != 0)
            break;
    }
    if (started < threads) { /* the barrier counts on every thread: none can be spared */
        fprintf(stderr, "gpumem_soak: could not start thread %u of %u\n", started + 1, threads);
        exit(2);
    }
    for (unsigned i = 0; i < threads; i++)
        pthread_join(handles[i], NULL);
    free(handles);
    pthread_barrier_destroy(&run->barrier);
    return 0;
}

static soak_counts total_counts(const soak_run *run)
{
    soak_counts total = {0};
    for (unsigned i = 0; i < run->options.threads; i++) {
        const soak_counts *counts = &run->workers[i].counts;
        total.mallocs += counts->mallocs;
        total.frees += counts->frees;
        total.cross_stream_frees += counts->cross_stream_frees;
        total.empty_caches += counts->empty_caches;
        total.limit_changes += counts->limit_changes;
        total.ooms += counts->ooms;
        total.device_errors += counts->device_errors;
        total.streams_created += counts->streams_created;
    }
    return total;
}

static void report(const soak_run *run, double seconds)
{
    const soak_options *options = &run->options;
    soak_counts total = total_counts(run);
    uint64_t operations = run->operations_per_thread * options->threads;
    uint64_t violations = atomic_load(&run->violations);
    if (options->json) {
        printf("{\"benchmark\":\"soak\",\"backend\":\"%s\",\"engine\":\"%s\",\"operations\":%" PRIu64 ",\"threads\":%u,"
               "\"seed\":%" PRIu64 ",\"fault_rate\":%g,\"capacity\":%" PRIu64 ",\"streams_created\":%" PRIu64
               ",\"mallocs\":%" PRIu64 ",\"frees\":%" PRIu64 ",\"cross_stream_frees\":%" PRIu64 ",\"empty_caches\":%" PRIu64
               ",\"limit_changes\":%" PRIu64 ",\"ooms\":%" PRIu64 ",\"malloc_device_errors\":%" PRIu64
               ",\"faults_injected\":%" PRId64 ",\"copies\":%" PRId64 ",\"stitches\":%" PRId64 ",\"barriers\":%" PRIu64 ",\"max_heaps\":%zu,\"max_model_streams\":%zu"
               ",\"peak_rss_mib\":%.1f,\"violations\":%" PRIu64 ",\"seconds\":%.1f}\n",
               options->backend, options->engine, operations, options->threads, options->seed, options->fault_rate,
               options->capacity, total.streams_created, total.mallocs, total.frees, total.cross_stream_frees,
               total.empty_caches, total.limit_changes, total.ooms, total.device_errors, run->faults_injected,
               run->copies, run->stitches, run->barriers_checked, run->max_heaps, run->max_model_streams, run->peak_rss_mib, violations, seconds);
        return;
    }
    printf("| backend | engine | operations | threads | streams created | faults injected | malloc device errors "
           "| OOMs | barriers | violations | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %s | %s | %" PRIu64 " | %u | %" PRIu64 " | %" PRId64 " | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %" PRIu64
           " | %.1f |\n", options->backend, options->engine, operations, options->threads, total.streams_created,
           run->faults_injected, total.device_errors, total.ooms, run->barriers_checked, violations, seconds);
}

int main(int argc, char **argv)
{
    soak_run run = {0};
    int status = parse_options(argc, argv, &run.options);
    if (status)
        return status;
    uint64_t threads = run.options.threads;
    run.operations_per_thread = (run.options.operations + threads - 1) / threads;
    run.operations_per_barrier = run.operations_per_thread / run.options.barriers;
    if (run.operations_per_barrier == 0)
        run.operations_per_barrier = 1;
    if (run.options.trace_path && (status = load_trace(&run)) != 0)
        return status;
    if ((status = create_allocator(&run)) != 0) {
        gm_trace_free(&run.trace);
        return status;
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if ((status = run_threads(&run)) != 0)
        return status;
    soak_drain(&run);
    double seconds = seconds_since(&start);
    report(&run, seconds);
    for (unsigned i = 0; i < run.options.threads; i++) {
        free(run.workers[i].live);
        free(run.workers[i].slot_positions);
    }
    free(run.workers);
    gm_trace_free(&run.trace);
    return atomic_load(&run.violations) ? 1 : 0;
}
