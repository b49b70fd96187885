/*
 * test_host_memory.c -- the host-memory readers against fixture /proc and /sys trees made here: meminfo
 * and memory pressure; a process with a child and a grandchild (counted in its tree) and an unrelated
 * process (not counted); a process whose smaps_rollup is missing (RSS from status, PSS unknown); a
 * zombie (nothing held, the sums still known); a machine without PSI; a root with no meminfo; a process
 * that is gone. The memory cgroup: v2 with memory.max and memory.high, v2 with only memory.high, the v2
 * root cgroup (no limit), v1 with a limit and without one (its huge number), a hybrid host, files that
 * do not hold a number, a process whose cgroup file is missing, and bad arguments.
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
    write_file("/proc/105/stat", "105 (zombie) Z 101 1 1\n"); /* exited, not waited for: no smaps_rollup */
    write_file("/proc/105/status", "Name: zombie\nState:\tZ (zombie)\n");
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
    CHECK_EQ_INT(memory.descendants, 4); /* 101, its children 102 and 105 (a zombie), and 104; not 103 */
    CHECK_EQ_INT(memory.tree_rss_bytes, (1000 + 500 + 200 + 64) * 1024);
    CHECK_EQ_INT(memory.tree_pss_bytes, -1); /* 104's PSS is unknown, so the sum is */
    CHECK_EQ_INT(memory.tree_swap_bytes, (10 + 0 + 5 + 2) * 1024);

    CHECK_OK(gm_process_memory_read(root, 101, &memory));
    CHECK_EQ_INT(memory.descendants, 2); /* 102, and the zombie 105, which holds nothing */
    CHECK_EQ_INT(memory.tree_rss_bytes, (500 + 200) * 1024);
    CHECK_EQ_INT(memory.tree_pss_bytes, (300 + 100) * 1024);
    CHECK_EQ_INT(memory.tree_swap_bytes, 5 * 1024);

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
    gm_cgroup_memory cgroup;
    CHECK_OK(gm_cgroup_memory_read(NULL, (long)getpid(), &cgroup));
    CHECK(cgroup.path[0] == '/');
    CHECK(cgroup.version == GM_CGROUP_NONE || cgroup.max_known);
}

/* ---------------------------------------------------------------- the memory cgroup */

static void write_cgroup_process(long pid, const char *cgroup_lines)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/cgroup", pid);
    write_file(path, "%s", cgroup_lines);
}

static void test_cgroup_v2_with_max_and_high(void)
{
    write_cgroup_process(200, "0::/user.slice/job\n");
    write_file("/sys/fs/cgroup/user.slice/job/memory.max", "17179869184\n");
    write_file("/sys/fs/cgroup/user.slice/job/memory.high", "15032385536\n");
    write_file("/sys/fs/cgroup/user.slice/job/memory.current", "16106127360\n");
    write_file("/sys/fs/cgroup/user.slice/job/memory.swap.max", "0\n");
    gm_cgroup_memory cgroup;
    CHECK_OK(gm_cgroup_memory_read(root, 200, &cgroup));
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_V2);
    CHECK(cgroup.v2_listed);
    CHECK(!strcmp(cgroup.path, "/user.slice/job"));
    CHECK(!strcmp(cgroup.max_file, "/sys/fs/cgroup/user.slice/job/memory.max"));
    CHECK(!strcmp(cgroup.current_file, "/sys/fs/cgroup/user.slice/job/memory.current"));
    CHECK(cgroup.max_known && cgroup.high_known && cgroup.current_known && cgroup.swap_max_known);
    CHECK_EQ_INT(cgroup.max_bytes, 16LL << 30);
    CHECK_EQ_INT(cgroup.high_bytes, 14LL << 30);
    CHECK_EQ_INT(cgroup.current_bytes, 15LL << 30);
    CHECK_EQ_INT(cgroup.swap_max_bytes, 0);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), 14LL << 30); /* memory.high comes first */

    /* memory.max "max": the limit is memory.high alone; memory.high "max" too: no limit at all. */
    write_file("/sys/fs/cgroup/user.slice/job/memory.max", "max\n");
    CHECK_OK(gm_cgroup_memory_read(root, 200, &cgroup));
    CHECK(cgroup.max_known);
    CHECK_EQ_INT(cgroup.max_bytes, -1);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), 14LL << 30);
    write_file("/sys/fs/cgroup/user.slice/job/memory.high", "max\n");
    write_file("/sys/fs/cgroup/user.slice/job/memory.swap.max", "max\n");
    CHECK_OK(gm_cgroup_memory_read(root, 200, &cgroup));
    CHECK(cgroup.high_known && cgroup.swap_max_known);
    CHECK_EQ_INT(cgroup.high_bytes, -1);
    CHECK_EQ_INT(cgroup.swap_max_bytes, -1);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), -1);
    CHECK_EQ_INT(cgroup.current_bytes, 15LL << 30); /* usage is read whether or not there is a limit */

    /* Files that do not hold a number are not known; the readings stay -1. */
    write_file("/sys/fs/cgroup/user.slice/job/memory.high", "lots\n");
    write_file("/sys/fs/cgroup/user.slice/job/memory.current", "\n");
    CHECK_OK(gm_cgroup_memory_read(root, 200, &cgroup));
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_V2);
    CHECK(!cgroup.high_known && !cgroup.current_known);
    CHECK_EQ_INT(cgroup.high_bytes, -1);
    CHECK_EQ_INT(cgroup.current_bytes, -1);
}

static void test_cgroup_v2_root_without_limit(void)
{
    write_cgroup_process(201, "0::/\n");
    gm_cgroup_memory cgroup;
    CHECK_OK(gm_cgroup_memory_read(root, 201, &cgroup)); /* not an error: the usual case on a host */
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_NONE);
    CHECK(cgroup.v2_listed);
    CHECK(!strcmp(cgroup.path, "/"));
    CHECK(!strcmp(cgroup.max_file, "/sys/fs/cgroup/memory.max"));
    CHECK(!cgroup.max_known && !cgroup.high_known && !cgroup.current_known && !cgroup.swap_max_known);
    CHECK_EQ_INT(cgroup.max_bytes, -1);
    CHECK_EQ_INT(cgroup.high_bytes, -1);
    CHECK_EQ_INT(cgroup.current_bytes, -1);
    CHECK_EQ_INT(cgroup.swap_max_bytes, -1);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), -1);

    /* No memory cgroup listed at all (only other v1 controllers, lines without two colons). */
    write_cgroup_process(205, "junk\n3:cpu,cpuacct:/x\n");
    CHECK_OK(gm_cgroup_memory_read(root, 205, &cgroup));
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_NONE);
    CHECK(!cgroup.v2_listed);
    CHECK(!strcmp(cgroup.path, "/"));
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), -1);
}

static void test_cgroup_v1(void)
{
    /* The memory controller shares its line with others; the v2 line of a hybrid host has no memory.max. */
    write_cgroup_process(202, "5:cpu,memory,blkio:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n");
    write_file("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "8589934592\n");
    write_file("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "1073741824\n");
    gm_cgroup_memory cgroup;
    CHECK_OK(gm_cgroup_memory_read(root, 202, &cgroup));
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_V1);
    CHECK(cgroup.v2_listed);
    CHECK(!strcmp(cgroup.path, "/docker/abc"));
    CHECK(!strcmp(cgroup.max_file, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"));
    CHECK(!strcmp(cgroup.current_file, "/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes"));
    CHECK(cgroup.max_known && cgroup.current_known);
    CHECK(!cgroup.high_known && !cgroup.swap_max_known); /* v1 has neither file */
    CHECK_EQ_INT(cgroup.max_bytes, 8LL << 30);
    CHECK_EQ_INT(cgroup.current_bytes, 1LL << 30);
    CHECK_EQ_INT(cgroup.high_bytes, -1);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), 8LL << 30);

    /* v1 without a limit shows the largest page multiple below 2^63. */
    write_file("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK_OK(gm_cgroup_memory_read(root, 202, &cgroup));
    CHECK(cgroup.max_known);
    CHECK_EQ_INT(cgroup.max_bytes, -1);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), -1);

    /* A hybrid host whose memory controller is on v2: v2 is taken. */
    write_cgroup_process(203, "4:memory:/docker/abc\n0::/kubepods/pod1\n");
    write_file("/sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n");
    CHECK_OK(gm_cgroup_memory_read(root, 203, &cgroup));
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_V2);
    CHECK(!strcmp(cgroup.path, "/kubepods/pod1"));
    CHECK_EQ_INT(cgroup.max_bytes, 2LL << 30);
    CHECK(!cgroup.current_known); /* no memory.current in this fixture */
    CHECK_EQ_INT(cgroup.current_bytes, -1);
}

static void test_cgroup_unreadable(void)
{
    gm_cgroup_memory cgroup;
    char expected[512];
    snprintf(expected, sizeof expected, "cannot read %s/proc/4242/cgroup", root);
    CHECK_STATUS(gm_cgroup_memory_read(root, 4242, &cgroup), GM_ERROR_IO);
    CHECK_MESSAGE(expected);
    snprintf(expected, sizeof expected, "cannot read %s/proc/self/cgroup", root);
    CHECK_STATUS(gm_cgroup_memory_read(root, 0, &cgroup), GM_ERROR_IO); /* 0: /proc/self */
    CHECK_MESSAGE(expected);
    write_file("/proc/self/cgroup", "0::/user.slice/job\n");
    CHECK_OK(gm_cgroup_memory_read(root, 0, &cgroup));
    CHECK(!strcmp(cgroup.path, "/user.slice/job"));
    /* A v1 memory cgroup whose files are missing: v1, nothing known. */
    write_cgroup_process(204, "4:memory:/gone\n");
    CHECK_OK(gm_cgroup_memory_read(root, 204, &cgroup));
    CHECK_EQ_INT(cgroup.version, GM_CGROUP_V1);
    CHECK(!cgroup.max_known && !cgroup.current_known);
    CHECK_EQ_INT(gm_cgroup_memory_limit(&cgroup), -1);

    CHECK_STATUS(gm_cgroup_memory_read(root, -1, &cgroup), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("gm_cgroup_memory_read: the pid is negative");
    CHECK_STATUS(gm_cgroup_memory_read(root, 200, NULL), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("gm_cgroup_memory_read: cgroup_out is NULL");
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
    test_cgroup_v2_with_max_and_high();
    test_cgroup_v2_root_without_limit();
    test_cgroup_v1();
    test_cgroup_unreadable();
    remove_machine();
    test_this_machine();
}

RUN_TESTS(TEST_CASE(test_all))
