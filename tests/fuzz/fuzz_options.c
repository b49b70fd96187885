/*
 * fuzz_options.c -- libFuzzer harness for the configuration parser (GPUMEM_CONF: src/base/options.c)
 * and for creating an allocator from whatever configuration it accepts.
 *
 * The input, NUL-terminated (bytes after an embedded NUL are simply not part of the string), goes to
 * gm_options_parse over the defaults, to gm_parse_size, and -- when it parses and names no CUDA
 * device -- to gm_create, which then runs a short fixed workload. Published regions (publish:true) go
 * to a temporary folder (GPUMEM_SHM_DIR), not /dev/shm.
 *
 * What must hold, else abort() (a finding):
 *   - gm_options_parse returns GM_OK or GM_ERROR_BAD_CONFIG; on an error the options are unchanged and
 *     gm_last_error() says why; parsing the same string again over its own result changes nothing;
 *   - gm_parse_size returns GM_OK or GM_ERROR_PARSE;
 *   - gm_create of an accepted configuration succeeds, or refuses it (bad config, no such device, no
 *     memory; a device error where fault_rate makes device calls fail) with a message; a created
 *     allocator serves and frees a few allocations, device and pinned host (each may run out of memory
 *     or meet a device error), validates (gm_validate) after each stage and is destroyed with nothing
 *     live; created again with one of its host allocations failing (which one, by the input's length:
 *     gm_fail_system_allocations), gm_create says out of memory and leaves nothing behind, or (the
 *     published region's allocation) creates an allocator that says why it does not publish.
 */
#include "base/options.h"
#include "base/system_memory.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1ull << 20)

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_options: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

static void check_valid(gm_allocator *allocator, const char *after)
{
    if (gm_validate(allocator) != GM_OK) {
        fprintf(stderr, "fuzz_options: gm_validate failed after %s\n", after);
        fail("the allocator is inconsistent", gm_last_error());
    }
}

/* Field by field, so that padding bytes do not count (every field of gm_options: keep it so). */
static bool same_options(const gm_options *a, const gm_options *b)
{
    return !strcmp(a->backend, b->backend) && a->device == b->device && a->engine == b->engine &&
           a->capacity == b->capacity && a->page_size == b->page_size && a->memory_limit == b->memory_limit &&
           a->host_limit == b->host_limit && a->small_size == b->small_size &&
           a->small_segment_size == b->small_segment_size && a->large_segment_size == b->large_segment_size &&
           a->min_large_alloc == b->min_large_alloc && a->release_before_growth == b->release_before_growth &&
           a->cost_model == b->cost_model && a->device_credit_ns == b->device_credit_ns &&
           a->max_chunk_size == b->max_chunk_size && a->growth_lane == b->growth_lane &&
           a->tail_chunk == b->tail_chunk && a->rechunk_min == b->rechunk_min && a->compact_min == b->compact_min &&
           a->move_slack == b->move_slack && a->history == b->history && a->publish == b->publish &&
           a->pressure_high == b->pressure_high && a->pressure_low == b->pressure_low &&
           a->pressure_signals == b->pressure_signals && a->pressure_interval_ms == b->pressure_interval_ms &&
           a->pressure_psi_high == b->pressure_psi_high && a->pressure_psi_low == b->pressure_psi_low &&
           a->fault_rate == b->fault_rate && a->fault_seed == b->fault_seed;
}

/* Published regions land in a folder of this process's own, removed at exit. */
static char shm_directory[] = "/tmp/fuzz_options.XXXXXX";

static void remove_shm_directory(void)
{
    rmdir(shm_directory);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (!mkdtemp(shm_directory))
        fail("mkdtemp failed", NULL);
    setenv("GPUMEM_SHM_DIR", shm_directory, 1);
    atexit(remove_shm_directory);
    return 0;
}

/* A few allocations of either pool on two streams, one used on a second stream, a pinned host block,
 * the cache emptied: each status one that the API documents, the allocator valid after each stage
 * (gm_validate walks every page of the address ranges: with the default capacity, the costliest part). */
static void run_workload(gm_allocator *allocator)
{
    static const size_t sizes[] = {1, 512, MIB + 1, 3 * MIB, 64 * MIB};
    void *pointers[sizeof sizes / sizeof sizes[0]] = {0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        gm_status status = gm_malloc(allocator, sizes[i], (gm_stream)(i % 2), &pointers[i]);
        if (status != GM_OK && status != GM_ERROR_OUT_OF_MEMORY && status != GM_ERROR_DEVICE)
            fail("gm_malloc returned an unexpected status", gm_last_error());
        if ((status == GM_OK) != (pointers[i] != NULL))
            fail("gm_malloc's pointer disagrees with its status", NULL);
    }
    check_valid(allocator, "the allocations");
    if (pointers[2] && gm_record_stream(allocator, pointers[2], 7) != GM_OK)
        fail("gm_record_stream failed on a live block", gm_last_error());
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (gm_free(allocator, pointers[i]) != GM_OK)
            fail("gm_free failed on a live block", gm_last_error());
    }
    check_valid(allocator, "the frees");
    void *host = NULL;
    gm_status status = gm_host_malloc(allocator, 4096, &host);
    if (status != GM_OK && status != GM_ERROR_OUT_OF_MEMORY && status != GM_ERROR_DEVICE)
        fail("gm_host_malloc returned an unexpected status", gm_last_error());
    if (gm_host_free(allocator, host) != GM_OK)
        fail("gm_host_free failed on a live block", gm_last_error());
    if (gm_empty_cache(allocator) != GM_OK || gm_host_empty_cache(allocator) != GM_OK)
        fail("emptying the caches failed", gm_last_error());
    check_valid(allocator, "gm_empty_cache");
}

/* gm_create of a configuration it accepted, again with its host allocation at `position` failing (with
 * fault_rate, a device call may fail too). */
static void create_short_of_memory(const char *text, uint64_t position, bool device_faults)
{
    gm_allocator *allocator = NULL;
    gm_fail_system_allocations(position, 1);
    gm_status status = gm_create(text, &allocator);
    gm_fail_system_allocations(0, 0);
    if (status == GM_OK) {
        char path[512];
        if (gm_publish_status(allocator, path, sizeof path) != GM_ERROR_OUT_OF_MEMORY)
            fail("gm_create short of host memory succeeded (not for want of a published region)", text);
        gm_destroy(allocator, NULL);
    } else if ((status != GM_ERROR_OUT_OF_MEMORY && !(status == GM_ERROR_DEVICE && device_faults)) || allocator) {
        fail("gm_create short of host memory did not say so", gm_last_error());
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        fail("no memory for the string", NULL);
    memcpy(text, data, size);
    text[size] = '\0';

    uint64_t bytes = 0;
    gm_status size_status = gm_parse_size(text, &bytes);
    if (size_status != GM_OK && size_status != GM_ERROR_PARSE)
        fail("gm_parse_size returned an unexpected status", gm_strerror(size_status));

    gm_options defaults, options;
    gm_options_default(&defaults);
    options = defaults;
    gm_status status = gm_options_parse(&options, text);
    if (status != GM_OK) {
        if (status != GM_ERROR_BAD_CONFIG)
            fail("gm_options_parse returned an unexpected status", gm_strerror(status));
        if (!same_options(&options, &defaults))
            fail("a refused configuration changed the options", text);
        if (gm_last_error()[0] == '\0')
            fail("a refused configuration has no message", text);
        free(text);
        return 0;
    }
    gm_options again = options;
    if (gm_options_parse(&again, text) != GM_OK || !same_options(&again, &options))
        fail("parsing an accepted configuration again changed it", text);

    if (strcmp(options.backend, "cuda") != 0) {
        gm_allocator *allocator = NULL;
        uint64_t before = gm_system_allocations_made();
        status = gm_create(text, &allocator);
        uint64_t made = gm_system_allocations_made() - before;
        if (status == GM_OK) {
            if (!allocator)
                fail("gm_create succeeded without an allocator", text);
            check_valid(allocator, "gm_create");
            run_workload(allocator);
            size_t live = 1;
            gm_destroy(allocator, &live);
            if (live != 0)
                fail("allocations were left live at gm_destroy", text);
            if (made)
                create_short_of_memory(text, size % made, options.fault_rate > 0);
        } else if (status != GM_ERROR_BAD_CONFIG && status != GM_ERROR_NO_DEVICE &&
                   status != GM_ERROR_OUT_OF_MEMORY && !(status == GM_ERROR_DEVICE && options.fault_rate > 0)) {
            fail("gm_create returned an unexpected status", gm_last_error());
        } else if (gm_last_error()[0] == '\0') {
            fail("gm_create failed without a message", text);
        }
    }
    free(text);
    return 0;
}
