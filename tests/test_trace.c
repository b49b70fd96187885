/*
 * test_trace.c -- loading traces: plain and gzip files, comments, and a clear "FILE:LINE: reason"
 * for each kind of malformed line; an unreadable file is an I/O error. Nothing is loaded from a bad
 * trace.
 */
#include "test.h"

#include "tools/trace.h"

#include <sys/stat.h>
#include <unistd.h>

static char directory[256];

static const char *write_file(const char *name, const char *text, int compressed)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", directory, name);
    if (compressed) {
        char command[600];
        snprintf(command, sizeof command, "gzip -c > '%s'", path);
        FILE *pipe = popen(command, "w");
        REQUIRE(pipe);
        fputs(text, pipe);
        REQUIRE(pclose(pipe) == 0);
    } else {
        FILE *file = fopen(path, "w");
        REQUIRE(file);
        fputs(text, file);
        fclose(file);
    }
    return path;
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
}

static void unreadable_files_are_io_errors(void)
{
    gm_trace trace;
    CHECK_STATUS(gm_trace_load("/nonexistent/trace.csv.gz", &trace), GM_ERROR_IO);
    CHECK_MESSAGE("/nonexistent/trace.csv.gz: cannot open");
    CHECK_STATUS(gm_trace_load(directory, &trace), GM_ERROR_IO); /* a directory */
    CHECK_STATUS(gm_trace_load(NULL, &trace), GM_ERROR_INVALID_ARGUMENT);
    /* A truncated gzip stream: the header promises more than there is. */
    const char *path = write_file("cut.csv.gz", "a,0,100,0\nf,0,100,0\n", 1);
    FILE *file = fopen(path, "r+b");
    REQUIRE(file);
    REQUIRE(ftruncate(fileno(file), 15) == 0);
    fclose(file);
    gm_status status = gm_trace_load(path, &trace);
    CHECK(status == GM_ERROR_IO || status == GM_ERROR_PARSE);
    CHECK_MESSAGE(path);
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

int main(void)
{
    snprintf(directory, sizeof directory, "/tmp/gpumem-test-trace-%d", (int)getpid());
    REQUIRE(mkdir(directory, 0700) == 0);
    static const test_case cases[] = {TEST_CASE(good_trace_loads), TEST_CASE(malformed_lines_are_located),
                                      TEST_CASE(unreadable_files_are_io_errors),
                                      TEST_CASE(replay_reports_what_it_measured)};
    int result = run_tests(cases, sizeof cases / sizeof cases[0]);
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    if (system(command) != 0)
        fprintf(stderr, "could not remove %s\n", directory);
    return result;
}
