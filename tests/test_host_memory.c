/*
 * test_host_memory.c -- the host-memory readers against fixture /proc trees made here: meminfo and
 * memory pressure; a process with a child and a grandchild (counted in its tree) and an unrelated
 * process (not counted); a process whose smaps_rollup is missing (RSS from status, PSS unknown); a
 * machine without PSI; a root with no meminfo; a process that is gone.
 */
#include "monitor/host_memory.h"

#include "test.h"

#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void write_file(const char *relative, const char *format, ...)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s", root, relative);
    for (char *slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(path, 0700);
        *slash = '/';
    }
    FILE *file = fopen(path, "w");
    REQUIRE(file);
    va_list arguments;
    va_start(arguments, format);
    vfprintf(file, format, arguments);
    va_end(arguments);
    fclose(file);
}

static void write_process(long pid, long parent, long rss_kb, long pss_kb, long swap_kb)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    write_file(path, "%ld (odd ) name) S %ld 1 1 0 -1\n", pid, parent); /* a ')' in the name, as Linux allows */
    snprintf(path, sizeof path, "/proc/%ld/smaps_rollup", pid);
    write_file(path, "00400000-7ffd0000 ---p 00000000 00:00 0 [rollup]\nRss: %ld kB\nPss: %ld kB\n"
               "Pss_Anon: 1 kB\nSwap: %ld kB\nSwapPss: 0 kB\n", rss_kb, pss_kb, swap_kb);
}

static void make_machine(void)
{
    snprintf(root, sizeof root, "/tmp/gpumem_host_memory_XXXXXX");
    REQUIRE(mkdtemp(root));
    write_file("/proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    4000000 kB\n"
               "SwapTotal:       2000000 kB\nSwapFree:        500000 kB\n");
    write_file("/proc/pressure/memory", "some avg10=12.50 avg60=3.25 avg300=1.00 total=12345\n"
               "full avg10=4.00 avg60=1.50 avg300=0.50 total=678\n");
    write_process(100, 1, 1000, 800, 10);
    write_process(101, 100, 500, 300, 0);
    write_process(102, 101, 200, 100, 5);
    write_process(103, 1, 9999, 9999, 9999);
    write_file("/proc/104/stat", "104 (nosmaps) S 100 1 1\n");
    write_file("/proc/104/status", "Name: nosmaps\nVmRSS:      64 kB\nVmSwap:       2 kB\n");
}

static void test_host(void)
{
    gm_host_memory host;
    CHECK_OK(gm_host_memory_read(root, &host));
    CHECK_EQ_INT(host.total_bytes, 16000000LL * 1024);
    CHECK_EQ_INT(host.available_bytes, 4000000LL * 1024);
    CHECK_EQ_INT(host.swap_total_bytes, 2000000LL * 1024);
    CHECK_EQ_INT(host.swap_free_bytes, 500000LL * 1024);
    CHECK(host.pressure_some_avg10 == 12.5 && host.pressure_some_avg60 == 3.25);
    CHECK(host.pressure_full_avg10 == 4.0 && host.pressure_full_avg60 == 1.5);
}

static void test_process_tree(void)
{
    gm_process_memory memory;
    CHECK_OK(gm_process_memory_read(root, 100, &memory));
    CHECK_EQ_INT(memory.rss_bytes, 1000 * 1024);
    CHECK_EQ_INT(memory.pss_bytes, 800 * 1024);
    CHECK_EQ_INT(memory.swap_bytes, 10 * 1024);
    CHECK_EQ_INT(memory.descendants, 3); /* 101, its child 102, and 104; not 103 */
    CHECK_EQ_INT(memory.tree_rss_bytes, (1000 + 500 + 200 + 64) * 1024);
    CHECK_EQ_INT(memory.tree_pss_bytes, -1); /* 104's PSS is unknown, so the sum is */
    CHECK_EQ_INT(memory.tree_swap_bytes, (10 + 0 + 5 + 2) * 1024);

    CHECK_OK(gm_process_memory_read(root, 101, &memory));
    CHECK_EQ_INT(memory.descendants, 1);
    CHECK_EQ_INT(memory.tree_pss_bytes, (300 + 100) * 1024);

    CHECK_OK(gm_process_memory_read(root, 104, &memory));
    CHECK_EQ_INT(memory.rss_bytes, 64 * 1024);
    CHECK_EQ_INT(memory.pss_bytes, -1);
    CHECK_EQ_INT(memory.descendants, 0);
}

static void test_missing(void)
{
    gm_process_memory memory;
    CHECK_STATUS(gm_process_memory_read(root, 4242, &memory), GM_ERROR_IO);
    CHECK_MESSAGE("process 4242 is gone");
    CHECK_STATUS(gm_process_memory_read(root, 0, &memory), GM_ERROR_INVALID_ARGUMENT);

    char pressure[512];
    snprintf(pressure, sizeof pressure, "%s/proc/pressure/memory", root);
    REQUIRE(unlink(pressure) == 0);
    gm_host_memory host;
    CHECK_OK(gm_host_memory_read(root, &host)); /* a kernel without PSI */
    CHECK(host.pressure_some_avg10 == -1 && host.pressure_full_avg60 == -1);

    char meminfo[512];
    snprintf(meminfo, sizeof meminfo, "%s/proc/meminfo", root);
    REQUIRE(unlink(meminfo) == 0);
    CHECK_STATUS(gm_host_memory_read(root, &host), GM_ERROR_IO);
    CHECK_MESSAGE("/proc/meminfo");
    write_file("/proc/meminfo", "MemFree: 1 kB\n");
    CHECK_STATUS(gm_host_memory_read(root, &host), GM_ERROR_IO);
    CHECK_MESSAGE("no MemTotal");
}

static void test_this_machine(void)
{
    gm_host_memory host;
    CHECK_OK(gm_host_memory_read(NULL, &host));
    CHECK(host.total_bytes > 0 && host.available_bytes > 0 && host.available_bytes <= host.total_bytes);
    gm_process_memory memory;
    CHECK_OK(gm_process_memory_read("/", (long)getpid(), &memory));
    CHECK(memory.rss_bytes > 0 && memory.tree_rss_bytes >= memory.rss_bytes);
}

static void remove_machine(void)
{
    char command[512];
    snprintf(command, sizeof command, "rm -rf '%s'", root);
    CHECK(system(command) == 0);
}

static void test_all(void)
{
    make_machine();
    test_host();
    test_process_tree();
    test_missing();
    remove_machine();
    test_this_machine();
}

RUN_TESTS(TEST_CASE(test_all))
