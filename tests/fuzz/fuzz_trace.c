/*
 * fuzz_trace.c -- libFuzzer harness for the trace reader (src/tools/trace.c), in two variants.
 *
 * gm_trace_load reads only paths, so each input is written to a memory file (memfd) and loaded
 * through /proc/self/fd/N, the way a user's file is read: zlib's reader, its line splitting and every
 * check of a line.
 *
 *   fuzz_trace       the bytes as they are: text, binary, and (starting with gzip's magic bytes) gzip
 *                    data straight into zlib's decoder, corrupt or truncated as the fuzzer makes it.
 *   fuzz_trace_gzip  (FUZZ_TRACE_GZIP) the bytes after the first, gzip-compressed by the harness, so
 *                    that mutations reach the parser through valid gzip; the first byte's low bit
 *                    asks for the compressed file to be cut short (by up to 128 bytes, its other bits).
 *
 * What must hold, else abort() (a finding):
 *   - the status is GM_OK, GM_ERROR_PARSE, GM_ERROR_IO or GM_ERROR_OUT_OF_MEMORY, with a message;
 *   - a loaded trace is consistent: every operation's stream and slot in range, an allocation only
 *     into a free slot, a free only of a live slot with that slot's size, the counts and
 *     peak_live_bytes (the true peak, computed here without overflow) as the operations say;
 *   - gzip variant: the compressed file loads exactly as the plain one (same status, message and
 *     operations); cut short, it is an I/O error, or the plain file's own parse error (a malformed
 *     line before the cut), never GM_OK;
 *   - plain variant: a loaded trace with few streams replays on the simulated device (either engine,
 *     by the input's length) and the allocator validates afterwards; loaded again with one of its host
 *     allocations failing (which one, by the input's length: gm_fail_system_allocations), the load says
 *     out of memory and leaves nothing behind.
 */
#include "base/system_memory.h"
#include "tools/trace.h"
#include "fuzz_support.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FUZZ_TRACE_GZIP
#include <zlib.h>
#endif

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_trace: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* The result of one load: its status, its message and (on GM_OK) the trace. */
typedef struct load_result {
    gm_status status;
    char message[1024];
    gm_trace trace;
} load_result;

static void load(const uint8_t *data, size_t size, load_result *result)
{
    result->status = gm_trace_load(fuzz_memory_file(data, size, fail), &result->trace);
    snprintf(result->message, sizeof result->message, "%s", result->status == GM_OK ? "" : gm_last_error());
    if (result->status != GM_OK && result->status != GM_ERROR_PARSE && result->status != GM_ERROR_IO &&
        result->status != GM_ERROR_OUT_OF_MEMORY)
        fail("gm_trace_load returned an unexpected status", gm_strerror(result->status));
    if (result->status != GM_OK && result->message[0] == '\0')
        fail("gm_trace_load failed without a message", gm_strerror(result->status));
    if (result->status != GM_OK && (result->trace.operations || result->trace.streams || result->trace.count))
        fail("gm_trace_load failed but left a trace behind", result->message);
}

/* Everything the loader promises about a trace it returns. */
static void check_trace(const gm_trace *trace)
{
    fuzz_check_trace(trace, fail);
}

#ifdef FUZZ_TRACE_GZIP

static bool same_trace(const gm_trace *a, const gm_trace *b)
{
    if (a->count != b->count || a->allocation_count != b->allocation_count || a->slot_count != b->slot_count ||
        a->stream_count != b->stream_count || a->peak_live_bytes != b->peak_live_bytes)
        return false;
    for (size_t i = 0; i < a->count; i++) {
        const gm_trace_operation *x = &a->operations[i], *y = &b->operations[i];
        if (x->size != y->size || x->slot != y->slot || x->stream_index != y->stream_index || x->kind != y->kind)
            return false;
    }
    return a->stream_count == 0 || memcmp(a->streams, b->streams, a->stream_count * sizeof *a->streams) == 0;
}

/* `size` bytes gzip-compressed (with gzip's header and trailer) into a new buffer. */
static uint8_t *gzip_compress(const uint8_t *data, size_t size, size_t *compressed_size_out)
{
    z_stream stream;
    memset(&stream, 0, sizeof stream);
    if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        fail("deflateInit2 failed", NULL);
    size_t capacity = deflateBound(&stream, (uLong)size) + 32;
    uint8_t *compressed = malloc(capacity);
    if (!compressed)
        fail("no memory for the compressed input", NULL);
    stream.next_in = (Bytef *)(uintptr_t)data;
    stream.avail_in = (uInt)size;
    stream.next_out = compressed;
    stream.avail_out = (uInt)capacity;
    if (deflate(&stream, Z_FINISH) != Z_STREAM_END)
        fail("deflate did not finish", NULL);
    *compressed_size_out = stream.total_out;
    deflateEnd(&stream);
    return compressed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t control = data[0];
    data++;
    size--;
    size_t compressed_size = 0;
    uint8_t *compressed = gzip_compress(data, size, &compressed_size);
    size_t cut = control & 1 ? 1 + (size_t)(control >> 1) : 0;
    if (cut > compressed_size)
        cut = compressed_size;
    load_result *packed = calloc(1, sizeof *packed), *plain = calloc(1, sizeof *plain);
    if (!packed || !plain)
        fail("no memory for the results", NULL);
    load(compressed, compressed_size - cut, packed);
    free(compressed);
    if (packed->status == GM_OK)
        check_trace(&packed->trace);
    /* Plain bytes that start with gzip's magic are read as gzip, not as the text the harness compressed. */
    bool comparable = !(size >= 2 && data[0] == 0x1f && data[1] == 0x8b);
    if (comparable) {
        load(data, size, plain);
        if (cut == 0) {
            if (packed->status != plain->status || strcmp(packed->message, plain->message) != 0)
                fail("the gzip file loads differently from the plain one", packed->message);
            if (packed->status == GM_OK && !same_trace(&packed->trace, &plain->trace))
                fail("the gzip file gives other operations than the plain one", NULL);
        } else if (compressed_size - cut >= 2) { /* gzip's magic is there: zlib decodes, and finds the cut */
            bool cut_reported = packed->status == GM_ERROR_IO;
            bool earlier_parse_error = packed->status == GM_ERROR_PARSE && plain->status == GM_ERROR_PARSE &&
                                       strcmp(packed->message, plain->message) == 0;
            if (!cut_reported && !earlier_parse_error && packed->status != GM_ERROR_OUT_OF_MEMORY)
                fail("a gzip file cut short was not reported as such", packed->message);
        }
    }
    gm_trace_free(&packed->trace);
    gm_trace_free(&plain->trace);
    free(packed);
    free(plain);
    return 0;
}

#else

/* The load of a trace that loaded, again with the host allocation at `position` of its `made` failing. */
static void load_short_of_memory(const uint8_t *data, size_t size, uint64_t made)
{
    load_result *failing = calloc(1, sizeof *failing);
    if (!failing)
        fail("no memory for the result", NULL);
    gm_fail_system_allocations(size % made, 1);
    load(data, size, failing);
    gm_fail_system_allocations(0, 0);
    if (failing->status != GM_ERROR_OUT_OF_MEMORY)
        fail("a load short of host memory did not say so", failing->status == GM_OK ? "it succeeded" : failing->message);
    free(failing);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load_result *result = calloc(1, sizeof *result);
    if (!result)
        fail("no memory for the result", NULL);
    uint64_t before = gm_system_allocations_made();
    load(data, size, result);
    uint64_t made = gm_system_allocations_made() - before;
    if (result->status == GM_OK) {
        check_trace(&result->trace);
        if (made)
            load_short_of_memory(data, size, made);
        fuzz_replay_trace(&result->trace, size % 2 == 1, fail);
    }
    gm_trace_free(&result->trace);
    free(result);
    return 0;
}

#endif
