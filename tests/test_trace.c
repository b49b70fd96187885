/*
 * test_trace.c -- loading traces: plain and gzip files, comments, and a clear "FILE:LINE: reason"
 * for each kind of malformed line, binary data (NUL bytes, no newline) and more streams than a trace
 * can name included; an unreadable or truncated file is an I/O error. Nothing is loaded from a bad
 * trace, nor when host memory runs out.
 */
#include "test.h"

#include "base/system_memory.h"
#include "tools/trace.h"

#include <sys/stat.h>
#include <unistd.h>

static char directory[256];

/* `length` bytes (NULs included) into a file of the test folder, gzip-compressed when asked. */
static const char *write_bytes(const char *name, const char *data, size_t length, int compressed)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", directory, name);
    if (compressed) {
        char command[600];
        snprintf(command, sizeof command, "gzip -c > '%s'", path);
        FILE *pipe = popen(command, "w");
        REQUIRE(pipe);
        REQUIRE(fwrite(data, 1, length, pipe) == length);
        REQUIRE(pclose(pipe) == 0);
    } else {
        FILE *file = fopen(path, "wb");
        REQUIRE(file);
        REQUIRE(fwrite(data, 1, length, file) == length);
        fclose(file);
    }
    return path;
}

static const char *write_file(const char *name, const char *text, int compressed)
{
    return write_bytes(name, text, strlen(text), compressed);
}

static void good_trace_loads(void)
{
    const char *text = "# op,id,size,stream\na,0,100,0\na,7,5000,3\nf,0,100,0\n\na,8,1,0\nf,7,5000,3\nf,8,1,0\n";
    for (int compressed = 0; compressed < 2; compressed++) {
        gm_trace trace;
        CHECK_OK(gm_trace_load(write_file(compressed ? "good.csv.gz" : "good.csv", text, compressed), &trace));
        CHECK_EQ_INT(trace.count, 6);
        CHECK_EQ_INT(trace.allocation_count, 3);
        CHECK_EQ_INT(trace.peak_live_bytes, 5100);
        CHECK_EQ_INT(trace.slot_count, 2); /* slot of id 0 is reused for id 8 */
        CHECK_EQ_INT(trace.stream_count, 2);
        CHECK_EQ_INT(trace.operations[1].size, 5000);
        CHECK_EQ_INT(trace.streams[trace.operations[1].stream_index], 3);
        CHECK_EQ_INT(trace.operations[2].kind, GM_TRACE_FREE);
        CHECK_EQ_INT(trace.operations[2].size, 100);
        gm_trace_free(&trace);
    }
}

/* Streams are indexed in the order they first appear, whatever their numbers: 2^64-1 too, the one
 * number the loader's stream map cannot hold as a key. */
static void streams_are_indexed_by_first_use(void)
{
    const char *text = "a,1,8,0\na,2,8,18446744073709551615\na,3,8,18446744073709551614\n"
                       "a,4,8,18446744073709551615\na,5,8,0\na,6,8,18446744073709551614\n";
    gm_trace trace;
    CHECK_OK(gm_trace_load(write_file("stream-numbers.csv", text, 0), &trace));
    CHECK_EQ_INT(trace.stream_count, 3);
    const int expected[] = {0, 1, 2, 1, 0, 2};
    for (size_t i = 0; i < 6; i++)
        CHECK_EQ_INT(trace.operations[i].stream_index, expected[i]);
    CHECK((uint64_t)(uintptr_t)trace.streams[1] == UINT64_MAX);
    CHECK((uint64_t)(uintptr_t)trace.streams[2] == UINT64_MAX - 1);
    CHECK(trace.streams[0] == 0);
    gm_trace_free(&trace);
}

/* A history's events as a trace (gm_trace_from_events, what gpumem tune replays): allocations and
 * free requests in order, a free of a block allocated before the events allocated first, a request
 * that ran out of memory allocated and freed at once, the other events left out; streams named 1, 2,
 * ... by first use (the default stream 0). */
static void history_events_become_a_trace(void)
{
    const gm_stream first = (gm_stream)0xa000, second = (gm_stream)0xb000;
    const gm_event events[] = {
        {.kind = GM_EVENT_SEGMENT_MAP, .address = 0x10000, .size = 2 << 20},
        {.kind = GM_EVENT_ALLOC, .address = 0x10000, .size = 100},
        {.kind = GM_EVENT_ALLOC, .address = 0x20000, .size = 5000, .stream = first},
        {.kind = GM_EVENT_FREE_REQUESTED, .address = 0x30000, .size = 700, .stream = second}, /* allocated earlier */
        {.kind = GM_EVENT_OOM, .size = 1ull << 40, .stream = first},
        {.kind = GM_EVENT_FREE_REQUESTED, .address = 0x10000, .size = 100},
        {.kind = GM_EVENT_FREE_COMPLETED, .address = 0x10000, .size = 100},
        {.kind = GM_EVENT_ALLOC, .address = 0x10000, .size = 300, .stream = second},
        {.kind = GM_EVENT_PRESSURE_HIGH, .address = 1, .size = 5},
    };
    const size_t count = sizeof events / sizeof events[0];
    gm_trace trace;
    size_t early = 0;
    CHECK_OK(gm_trace_from_events("h", events, count, &trace, &early));
    CHECK_EQ_INT(early, 1);
    CHECK_EQ_INT(trace.count, 8);
    CHECK_EQ_INT(trace.allocation_count, 5);
    CHECK_EQ_INT(trace.stream_count, 3);
    CHECK(trace.peak_live_bytes == 100 + 5000 + (1ull << 40)); /* the early block freed before the request */
    const uint64_t sizes[] = {700, 100, 5000, 700, 1ull << 40, 1ull << 40, 100, 300};
    const int kinds[] = {GM_TRACE_ALLOCATE, GM_TRACE_ALLOCATE, GM_TRACE_ALLOCATE, GM_TRACE_FREE,
                         GM_TRACE_ALLOCATE, GM_TRACE_FREE, GM_TRACE_FREE, GM_TRACE_ALLOCATE};
    const uintptr_t names[] = {1, 0, 2, 1, 2, 2, 0, 1}; /* `second` first named (by the early allocation) */
    for (size_t i = 0; i < trace.count && i < 8; i++) {
        CHECK(trace.operations[i].size == sizes[i]);
        CHECK_EQ_INT(trace.operations[i].kind, kinds[i]);
        CHECK((uintptr_t)trace.streams[trace.operations[i].stream_index] == names[i]);
    }
    CHECK_EQ_INT(trace.operations[6].slot, trace.operations[1].slot); /* a free names its allocation's slot */
    CHECK_EQ_INT(trace.operations[3].slot, trace.operations[0].slot);
    gm_trace_free(&trace);

    /* Every host allocation it makes may fail: then out of memory, with nothing left behind. */
    uint64_t before = gm_system_allocations_made();
    REQUIRE(gm_trace_from_events("h", events, count, &trace, &early) == GM_OK);
    uint64_t made = gm_system_allocations_made() - before;
    gm_trace_free(&trace);
    for (uint64_t position = 0; position < made; position++) {
        gm_fail_system_allocations(position, 1);
        gm_status status = gm_trace_from_events("h", events, count, &trace, &early);
        gm_fail_system_allocations(0, 0);
        CHECK_STATUS(status, GM_ERROR_OUT_OF_MEMORY);
        CHECK(trace.operations == NULL && trace.streams == NULL);
    }

    /* An address allocated again while live, and events with no allocation, are malformed. */
    gm_event twice[] = {events[1], events[2], events[1]};
    CHECK_STATUS(gm_trace_from_events("h", twice, 3, &trace, &early), GM_ERROR_PARSE);
    CHECK_MESSAGE("h:3: allocation id 65536 is already live (allocated at event 1)");
    CHECK_STATUS(gm_trace_from_events("h", events, 1, &trace, &early), GM_ERROR_PARSE);
    CHECK_MESSAGE("h: no allocation in its events");
    /* The last two addresses start no block (the map's key would wrap to its empty 0, the other is the
     * id of requests that ran out of memory): said, not taken for another block. */
    gm_event at_the_end[] = {events[1], events[1], events[1]};
    at_the_end[1].address = at_the_end[2].address = UINT64_MAX;
    at_the_end[2].kind = GM_EVENT_FREE_REQUESTED;
    CHECK_STATUS(gm_trace_from_events("h", at_the_end, 3, &trace, &early), GM_ERROR_PARSE);
    CHECK_MESSAGE("h:2: an address within the last two bytes of the address space");
    at_the_end[1].address = UINT64_MAX - 1;
    CHECK_STATUS(gm_trace_from_events("h", at_the_end, 2, &trace, &early), GM_ERROR_PARSE);
    CHECK_STATUS(gm_trace_from_events(NULL, events, 1, &trace, &early), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_trace_from_events("h", NULL, 1, &trace, &early), GM_ERROR_INVALID_ARGUMENT);
}

static void malformed_lines_are_located(void)
{
    static const struct {
        const char *text;
        const char *message;
    } cases[] = {
        {"a,0,100,0\nx,1,2,0\n", ":2: unknown operation 'x'"},
        {"a,0,100\n", ":1: expected 4 comma-separated fields"},
        {"a,0,100,0,9\n", ":1: expected 4 comma-separated fields"},
        {"a,zero,100,0\n", ":1: id 'zero' is not a non-negative integer"},
        {"a,0,-5,0\n", ":1: size '-5' is not a non-negative integer"},
        {"a,0,12abc,0\n", ":1: size '12abc' is not a non-negative integer"},
        {"a,0,1,s\n", ":1: stream 's' is not a non-negative integer"},
        {"# header\na,0,1,0\na,0,1,0\n", ":3: allocation id 0 is already live (allocated at line 2)"},
        {"a,0,1,0\nf,1,1,0\n", ":2: free of id 1, which is not live"},
        {"a,0,99999999999999999999999,0\n", ":1: size '99999999999999999999999' is not a non-negative integer"},
        /* Found by fuzz_trace: live sizes past 2^64 once wrapped around, and peak_live_bytes was wrong. */
        {"a,0,18446744073709551615,0\na,1,1,0\n", ":2: the live allocations add up to more than 2^64 bytes"},
        {"a,18446744073709551615,1,0\n", ":1: id too large"},
        {"# only a comment\n", ":1: the trace holds no operations"},
        {"", ":0: the trace holds no operations"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gm_trace trace;
        const char *path = write_file("bad.csv", cases[i].text, 0);
        CHECK_STATUS(gm_trace_load(path, &trace), GM_ERROR_PARSE);
        CHECK_MESSAGE(path);
        CHECK_MESSAGE(cases[i].message);
        CHECK(trace.operations == NULL && trace.count == 0);
    }
    char long_line[1000];
    memset(long_line, '1', sizeof long_line - 2);
    long_line[0] = 'a';
    long_line[sizeof long_line - 2] = '\n';
    long_line[sizeof long_line - 1] = '\0';
    gm_trace trace;
    CHECK_STATUS(gm_trace_load(write_file("long.csv", long_line, 0), &trace), GM_ERROR_PARSE);
    CHECK_MESSAGE(":1: line too long");
    /* A trace names its streams with 16-bit indexes: the 65536th stream is refused at its line. */
    size_t streams = 65536, room = streams * 32;
    char *many = malloc(room), *at = many;
    REQUIRE(many);
    for (size_t i = 0; i < streams; i++)
        at += snprintf(at, room - (size_t)(at - many), "a,%zu,1,%zu\n", i, i);
    CHECK_STATUS(gm_trace_load(write_file("streams.csv", many, 0), &trace), GM_ERROR_PARSE);
    CHECK_MESSAGE(":65536: more than 65535 streams");
    CHECK(trace.operations == NULL && trace.count == 0);
    many[strlen(many) - strlen("a,65535,1,65535\n")] = '\0'; /* one stream fewer loads */
    CHECK_OK(gm_trace_load(write_file("streams.csv", many, 0), &trace));
    CHECK_EQ_INT(trace.stream_count, 65535);
    gm_trace_free(&trace);
    free(many);
}

/* Binary data is refused at its first NUL, with the line and column, plain or gzip: a NUL once ended the
 * line early for the parser (the rest of the line was dropped or read as a line of its own), and a
 * stream of NULs without a newline (/dev/zero) was read as empty lines forever. */
static void binary_input_is_refused(void)
{
    static const char nul_inside[] = "a,0,100,0\na,1,200,0\0a,2,300,0\nf,0,100,0\n";
    for (int compressed = 0; compressed < 2; compressed++) {
        gm_trace trace;
        const char *path = write_bytes(compressed ? "nul.csv.gz" : "nul.csv", nul_inside, sizeof nul_inside - 1,
                                       compressed);
        CHECK_STATUS(gm_trace_load(path, &trace), GM_ERROR_PARSE);
        CHECK_MESSAGE(":2: a NUL byte at column 10");
        CHECK(trace.operations == NULL && trace.count == 0);
    }
    static const char nul_at_end[] = "a,0,100,0\nf,0,100,0\0";
    gm_trace trace;
    CHECK_STATUS(gm_trace_load(write_bytes("nul_end.csv", nul_at_end, sizeof nul_at_end - 1, 0), &trace),
                 GM_ERROR_PARSE);
    CHECK_MESSAGE(":2: a NUL byte at column 10");
    alarm(60); /* a loader that loops on /dev/zero ends the test here instead of hanging it */
    CHECK_STATUS(gm_trace_load("/dev/zero", &trace), GM_ERROR_PARSE);
    CHECK_MESSAGE("/dev/zero:1: a NUL byte at column 1");
    alarm(0);
    /* Text without any newline stops at the line-length limit, not at the end of the file. */
    static char no_newline[100000];
    memset(no_newline, '7', sizeof no_newline);
    CHECK_STATUS(gm_trace_load(write_bytes("no_newline.csv", no_newline, sizeof no_newline, 0), &trace),
                 GM_ERROR_PARSE);
    CHECK_MESSAGE(":1: line too long");
}

static void unreadable_files_are_io_errors(void)
{
    gm_trace trace;
    CHECK_STATUS(gm_trace_load("/nonexistent/trace.csv.gz", &trace), GM_ERROR_IO);
    CHECK_MESSAGE("/nonexistent/trace.csv.gz: cannot open");
    CHECK_STATUS(gm_trace_load(directory, &trace), GM_ERROR_IO); /* a directory */
    CHECK_STATUS(gm_trace_load(NULL, &trace), GM_ERROR_INVALID_ARGUMENT);
}

/* Cut `path` to `length` bytes. */
static void truncate_file(const char *path, off_t length)
{
    FILE *file = fopen(path, "r+b");
    REQUIRE(file);
    REQUIRE(ftruncate(fileno(file), length) == 0);
    fclose(file);
}

/* A truncated gzip file is an I/O error that says so, whether it ends inside the header or after many
 * good lines; it was reported as a malformed line one past the last line read, exit status 2. */
static void truncated_gzip_is_an_io_error(void)
{
    gm_trace trace;
    const char *path = write_file("cut.csv.gz", "a,0,100,0\nf,0,100,0\n", 1);
    truncate_file(path, 15);
    CHECK_STATUS(gm_trace_load(path, &trace), GM_ERROR_IO);
    CHECK_MESSAGE(path);
    CHECK_MESSAGE("truncated or corrupt gzip");
    CHECK(trace.operations == NULL && trace.count == 0);
    /* Many lines, cut in the middle: the partial last line is not parsed as a (malformed) line. */
    static char text[200000];
    size_t used = 0;
    uint64_t random_state = 7;
    for (int id = 0; used + 64 < sizeof text; id++)
        used += (size_t)snprintf(text + used, sizeof text - used, "a,%d,%" PRIu64 ",0\nf,%d,0,0\n", id,
                                 test_random(&random_state) % 100000000, id);
    path = write_file("cut_long.csv.gz", text, 1);
    struct stat status;
    REQUIRE(stat(path, &status) == 0);
    truncate_file(path, status.st_size / 2);
    CHECK_STATUS(gm_trace_load(path, &trace), GM_ERROR_IO);
    CHECK_MESSAGE("truncated or corrupt gzip");
    CHECK(strstr(gm_last_error(), "malformed") == NULL && strstr(gm_last_error(), "fields") == NULL);
    CHECK(trace.operations == NULL && trace.count == 0);
}

static void replay_reports_what_it_measured(void)
{
    gm_trace trace;
    CHECK_OK(gm_trace_load(write_file("replay.csv", "a,0,3145728,0\na,1,1000,0\nf,0,3145728,0\na,2,100,1\n", 0),
                           &trace));
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB", &allocator));
    gm_replay_result result;
    CHECK_OK(gm_replay(allocator, &trace, &result));
    CHECK_EQ_INT(result.operations, 4);
    CHECK_EQ_INT(result.allocations, 3);
    CHECK_EQ_INT(result.frees, 1);
    CHECK_EQ_INT(result.peak_live_bytes, 3145728 + 1000);
    CHECK(result.peak_reserved_bytes >= result.peak_live_bytes);
    CHECK(result.ratio >= 1.0);
    CHECK(result.ns_per_operation > 0);
    CHECK_STATUS(gm_replay(NULL, &trace, &result), GM_ERROR_INVALID_ARGUMENT);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.allocation[GM_POOL_ALL].current, 0); /* the replay freed what stayed live */
    gm_destroy(allocator, NULL);
    gm_trace_free(&trace);
}

/* With each host allocation of a load and a replay failing in turn (gzip's own aside), the load and the
 * replay say out of memory and leave nothing behind (ASan in CI), or succeed as without failures. */
static void host_memory_failures_are_clean(void)
{
    const char *text = "a,0,3145728,0\na,1,1000,0\nf,0,3145728,0\na,2,100,1\nf,1,1000,0\nf,2,100,1\n";
    /* 40 streams: the stream table and its map grow in the same line (the 17th stream), so a failure of
     * either comes after the other has moved. */
    char many_streams[40 * 16] = "", *at = many_streams;
    for (int stream = 0; stream < 40; stream++)
        at += sprintf(at, "a,%d,8,%d\n", stream, stream);
    for (int input = 0; input < 3; input++) {
        int compressed = input == 1;
        const char *path = input == 2 ? write_file("failing-streams.csv", many_streams, 0)
                                      : write_file(compressed ? "failing.csv.gz" : "failing.csv", text, compressed);
        uint64_t before = gm_system_allocations_made();
        gm_trace trace;
        REQUIRE(gm_trace_load(path, &trace) == GM_OK);
        uint64_t made = gm_system_allocations_made() - before;
        gm_trace_free(&trace);
        CHECK(made > 0);
        for (uint64_t position = 0; position <= made; position++) {
            gm_fail_system_allocations(position, 1);
            gm_status status = gm_trace_load(path, &trace);
            gm_fail_system_allocations(0, 0);
            CHECK(status == (position < made ? GM_ERROR_OUT_OF_MEMORY : GM_OK));
            if (status == GM_OK)
                gm_trace_free(&trace);
        }
    }
    gm_trace trace;
    REQUIRE(gm_trace_load(write_file("replayed.csv", text, 0), &trace) == GM_OK);
    for (uint64_t position = 0; position < 64; position++) {
        gm_allocator *allocator = NULL;
        REQUIRE(gm_create("backend:sim,capacity:1GiB", &allocator) == GM_OK);
        gm_fail_system_allocations(position, 1);
        gm_replay_result result;
        gm_status status = gm_replay(allocator, &trace, &result);
        gm_fail_system_allocations(0, 0);
        CHECK(status == GM_OK || status == GM_ERROR_OUT_OF_MEMORY);
        CHECK_OK(gm_validate(allocator));
        size_t live = 1;
        gm_destroy(allocator, &live);
        CHECK_EQ_INT(live, 0); /* the replay freed what stayed live, failed or not */
    }
    gm_trace_free(&trace);
}

int main(void)
{
    snprintf(directory, sizeof directory, "/tmp/gpumem-test-trace-%d", (int)getpid());
    REQUIRE(mkdir(directory, 0700) == 0);
    static const test_case cases[] = {TEST_CASE(good_trace_loads), TEST_CASE(streams_are_indexed_by_first_use),
                                      TEST_CASE(history_events_become_a_trace),
                                      TEST_CASE(malformed_lines_are_located),
                                      TEST_CASE(binary_input_is_refused), TEST_CASE(unreadable_files_are_io_errors),
                                      TEST_CASE(truncated_gzip_is_an_io_error),
                                      TEST_CASE(replay_reports_what_it_measured),
                                      TEST_CASE(host_memory_failures_are_clean)};
    int result = run_tests(cases, sizeof cases / sizeof cases[0]);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    if (system(command) != 0)
        fprintf(stderr, "could not remove %s\n", directory);
    return result;
}
