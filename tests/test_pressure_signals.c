/*
 * test_pressure_signals.c -- the sampled pressure signals, with exact expectations: host MemAvailable and
 * memory PSI read from fixture /proc trees (gm_check_pressure, and the sampling thread on its own), this
 * process's memory cgroup from a fixture /proc and /sys/fs/cgroup tree (its usage of the lower of
 * memory.max and memory.high, hysteresis, the thread; a cgroup without a limit never raising the level),
 * the driver's used memory with memory used elsewhere on the sim device, a host-only rise that releases
 * no GPU memory, the sampling thread stopping on policy changes and at destruction, and policy changes
 * from callbacks (refused on the sampling thread, which would wait for itself).
 */
#include "pressure_test.h"

#include "base/error.h"

#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- sampled signals */

static char root[256];

/* Write a fixture file whole, then rename it in place: the sampling thread never sees half of one. */
static void write_fixture(const char *relative, const char *format, ...)
{
    char path[512], temporary[520];
    snprintf(path, sizeof path, "%s%s", root, relative);
    for (char *slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(path, 0700);
        *slash = '/';
    }
    snprintf(temporary, sizeof temporary, "%s.new", path);
    FILE *file = fopen(temporary, "w");
    REQUIRE(file);
    va_list arguments;
    va_start(arguments, format);
    vfprintf(file, format, arguments);
    va_end(arguments);
    fclose(file);
    REQUIRE(rename(temporary, path) == 0);
}

static void write_meminfo(long available_kb)
{
    write_fixture("/proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:   %ld kB\n"
                  "SwapTotal:       0 kB\nSwapFree:        0 kB\n", available_kb);
}

static void write_psi(double some_avg10)
{
    write_fixture("/proc/pressure/memory", "some avg10=%.2f avg60=1.00 avg300=0.50 total=12345\n"
                  "full avg10=0.00 avg60=0.00 avg300=0.00 total=678\n", some_avg10);
}

/* The previous test's tree (its allocator, and so its sampling thread, is gone by then) and, at exit,
 * the last one are removed. */
static void remove_root(void)
{
    if (!root[0])
        return;
    char command[300];
    snprintf(command, sizeof command, "rm -rf '%s'", root);
    CHECK(system(command) == 0);
    root[0] = '\0';
}

static void make_root(void)
{
    static bool registered;
    if (!registered)
        registered = atexit(remove_root) == 0;
    remove_root();
    snprintf(root, sizeof root, "/tmp/gpumem_pressure_root_XXXXXX");
    REQUIRE(mkdtemp(root));
}

static void host_memory_signal_from_a_fixture_tree(void)
{
    make_root();
    write_meminfo(8000000); /* half the host used */
    gm_allocator *allocator = make(segments);
    CHECK_OK(gm_free(allocator, take(allocator, 100 * MiB, 0))); /* cache that host pressure must not touch */
    recorder calls;
    recorder_init(&calls);
    CHECK_OK(gm_on_pressure(allocator, record, &calls));
    gm_pressure_policy policy = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_HOST,
                                 .interval_ms = 3600000, .host_root = root}; /* the thread waits an hour */
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_NORMAL);
    CHECK(!allocator->pressure.watching); /* no byte signal: gm_malloc and gm_free compare nothing */
    write_meminfo(1000000); /* 93.75% used */
    gm_pressure_readings readings;
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    CHECK_EQ_INT(readings.host_available_bytes, 1000000LL * 1024);
    CHECK_EQ_INT(readings.host_total_bytes, 16000000LL * 1024);
    CHECK_EQ_INT(readings.signals_high, GM_PRESSURE_SIGNAL_HOST);
    CHECK_EQ_INT(calls_of(&calls), 1);
    CHECK_EQ_INT(calls.levels[0], GM_PRESSURE_HIGH);
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_pressure_rises, 1);
    CHECK_EQ_INT(stats.num_pressure_releases, 0); /* GPU memory given back would not help the host */
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 100 * MiB);
    write_meminfo(3000000); /* 81.25%: between the watermarks */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    write_meminfo(4000000); /* 75% */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(calls_of(&calls), 2);
    gm_destroy(allocator, NULL);
}

static void psi_signal_from_a_fixture_tree(void)
{
    make_root();
    write_meminfo(8000000);
    write_psi(2.0);
    gm_allocator *allocator = make(segments);
    gm_pressure_policy policy = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_PSI, .psi_high = 10,
                                 .psi_low = 5, .interval_ms = 3600000, .host_root = root};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    gm_pressure_readings readings;
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK(readings.host_psi_avg10 == 2.0);
    write_psi(12.5);
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    CHECK_EQ_INT(readings.signals_high, GM_PRESSURE_SIGNAL_PSI);
    write_psi(7.0); /* below 10, not below 5 */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    write_psi(4.99);
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    gm_destroy(allocator, NULL);
}

/* This process's cgroup in the fixture tree: /proc/PID/cgroup naming /job, and its memory files. */
static void write_cgroup(const char *max, const char *high, uint64_t current_bytes)
{
    char relative[64];
    snprintf(relative, sizeof relative, "/proc/%ld/cgroup", (long)getpid());
    write_fixture(relative, "0::/job\n");
    write_fixture("/sys/fs/cgroup/job/memory.max", "%s\n", max);
    write_fixture("/sys/fs/cgroup/job/memory.high", "%s\n", high);
    write_fixture("/sys/fs/cgroup/job/memory.current", "%llu\n", (unsigned long long)current_bytes);
}

static void cgroup_signal_from_a_fixture_tree(void)
{
    make_root();
    /* memory.high (1 GiB) is below memory.max (2 GiB): the limit is 1 GiB, high at 0.9 of it is
     * 966367642 bytes (rounded), low at 0.8 is 858993459. */
    write_cgroup("2147483648", "1073741824", 512 * MiB);
    gm_allocator *allocator = make(segments);
    CHECK_OK(gm_free(allocator, take(allocator, 100 * MiB, 0))); /* GPU cache giving back would not help */
    recorder calls;
    recorder_init(&calls);
    CHECK_OK(gm_on_pressure(allocator, record, &calls));
    gm_pressure_policy policy = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_CGROUP,
                                 .interval_ms = 3600000, .host_root = root}; /* the thread waits an hour */
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    CHECK(allocator->pressure.sampler_running); /* a sampled signal: file reads, not on the hot path */
    CHECK(!allocator->pressure.watching);
    gm_pressure_readings readings;
    CHECK_OK(gm_get_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(readings.cgroup_current_bytes, 512 * MiB);
    CHECK_EQ_INT(readings.cgroup_limit_bytes, GiB);
    CHECK_EQ_INT(readings.host_total_bytes, -1); /* the host signal is not watched: meminfo is not read */

    write_cgroup("2147483648", "1073741824", 1020054733); /* 95% of memory.high, 47.5% of memory.max */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    CHECK_EQ_INT(readings.signals_high, GM_PRESSURE_SIGNAL_CGROUP);
    CHECK_EQ_INT(readings.cgroup_current_bytes, 1020054733);
    CHECK_EQ_INT(readings.cgroup_limit_bytes, GiB);
    CHECK_EQ_INT(calls_of(&calls), 1);
    CHECK_EQ_INT(calls.levels[0], GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls.readings[0].signals_high, GM_PRESSURE_SIGNAL_CGROUP);
    CHECK_EQ_INT(calls.readings[0].cgroup_current_bytes, 1020054733);
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_pressure_rises, 1);
    CHECK_EQ_INT(stats.num_pressure_releases, 0); /* a host signal: the GPU cache stays */
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 100 * MiB);

    write_cgroup("2147483648", "1073741824", 858993459); /* exactly the low watermark: still at or above it */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    CHECK_EQ_INT(readings.signals_high, 0);
    write_cgroup("2147483648", "1073741824", 858993458); /* one byte below it */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(calls_of(&calls), 2);
    CHECK_EQ_INT(calls.levels[1], GM_PRESSURE_NORMAL);

    /* memory.high unset: memory.max is the limit; 966367642 bytes is 45% of it. */
    write_cgroup("2147483648", "max", 966367642);
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(readings.cgroup_limit_bytes, 2 * GiB);

    /* The sampling thread reads it on its own. */
    write_cgroup("1073741824", "max", 966367642);
    policy.interval_ms = 2;
    CHECK_OK(gm_set_pressure_policy(allocator, &policy)); /* evaluates at once: exactly the high watermark */
    CHECK_EQ_INT(level_of(allocator), GM_PRESSURE_HIGH);
    write_cgroup("1073741824", "max", 100 * MiB);
    for (int i = 0; i < 5000 && calls_of(&calls) < 4; i++)
        usleep(1000);
    REQUIRE(calls_of(&calls) >= 4);
    CHECK_EQ_INT(calls.levels[2], GM_PRESSURE_HIGH);
    CHECK_EQ_INT(calls.levels[3], GM_PRESSURE_NORMAL);
    CHECK(!pthread_equal(calls.threads[3], pthread_self()));

    /* The bit after the last signal is refused. */
    policy.signals = GM_PRESSURE_SIGNAL_CGROUP << 1;
    CHECK_STATUS(gm_set_pressure_policy(allocator, &policy), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("unknown signal bits 0x40");
    gm_destroy(allocator, NULL);
}

static void cgroup_without_limit_never_raises(void)
{
    make_root();
    write_cgroup("max", "max", 64 * GiB); /* any amount in use: there is no limit to be near */
    gm_allocator *allocator = make(segments);
    gm_pressure_policy policy = {.high = 0.01, .low = 0.005, .signals = GM_PRESSURE_SIGNAL_CGROUP,
                                 .interval_ms = 3600000, .host_root = root};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    gm_fail(GM_OK, "no error yet");
    gm_pressure_readings readings;
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(readings.signals_high, 0);
    CHECK_EQ_INT(readings.cgroup_current_bytes, 64 * GiB);
    CHECK_EQ_INT(readings.cgroup_limit_bytes, -1);
    CHECK(!strcmp(gm_last_error(), "no error yet")); /* no limit is not an error */

    /* The v2 root cgroup (no memory.max file): nothing known, nothing raised. */
    char relative[64];
    snprintf(relative, sizeof relative, "/proc/%ld/cgroup", (long)getpid());
    write_fixture(relative, "0::/\n");
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(readings.cgroup_current_bytes, -1);
    CHECK_EQ_INT(readings.cgroup_limit_bytes, -1);
    CHECK(!strcmp(gm_last_error(), "no error yet"));
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.num_pressure_rises, 0);
    gm_destroy(allocator, NULL);
}

static void device_signal_counts_memory_used_elsewhere(void)
{
    gm_allocator *allocator = make(segments);
    void *live = take(allocator, 50 * MiB, 0);
    CHECK_OK(gm_free(allocator, take(allocator, 100 * MiB, 0))); /* 150 MiB reserved, 100 of it cached */
    gm_pressure_policy policy = {.high = 0.5, .low = 0.25, .signals = GM_PRESSURE_SIGNAL_DEVICE,
                                 .interval_ms = 3600000};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    gm_pressure_readings readings;
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_EQ_INT(readings.device_used_bytes, 150 * MiB);
    CHECK_EQ_INT(readings.device_total_bytes, GiB);
    CHECK_OK(gm_sim_set_used_elsewhere(allocator, 400 * MiB)); /* another process: 550 MiB used */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    /* Step 1 aims at 256 MiB used, 294 MiB less: all 100 MiB of cache go; 450 MiB is below high. */
    CHECK_EQ_INT(readings.level, GM_PRESSURE_HIGH);
    CHECK_EQ_INT(readings.device_used_bytes, 450 * MiB);
    CHECK_EQ_INT(readings.reserved_bytes, 50 * MiB);
    gm_stats stats = stats_of(allocator);
    CHECK_EQ_INT(stats.pressure_released_bytes, 100 * MiB);
    CHECK_EQ_INT(stats.num_pressure_releases, 1);
    CHECK_OK(gm_validate(allocator)); /* the memory used elsewhere is not counted as gpumem's */
    CHECK_OK(gm_sim_set_used_elsewhere(allocator, 100 * MiB)); /* 150 MiB used: below 256 MiB */
    CHECK_OK(gm_check_pressure(allocator, &readings));
    CHECK_EQ_INT(readings.level, GM_PRESSURE_NORMAL);
    CHECK_STATUS(gm_sim_set_used_elsewhere(allocator, GiB), GM_ERROR_OUT_OF_MEMORY);
    CHECK_OK(gm_free(allocator, live));
    gm_destroy(allocator, NULL);
}

static bool wait_for_calls(recorder *calls, int count)
{
    for (int i = 0; i < 5000 && calls_of(calls) < count; i++)
        usleep(1000);
    return calls_of(calls) >= count;
}

static void sampling_thread_acts_and_stops(void)
{
    make_root();
    write_meminfo(8000000);
    gm_allocator *allocator = make(segments);
    recorder calls;
    recorder_init(&calls);
    CHECK_OK(gm_on_pressure(allocator, record, &calls));
    gm_pressure_policy policy = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_HOST, .interval_ms = 2,
                                 .host_root = root};
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    CHECK(allocator->pressure.sampler_running);
    write_meminfo(500000);
    REQUIRE(wait_for_calls(&calls, 1)); /* the thread saw it without any call of ours */
    CHECK_EQ_INT(calls.levels[0], GM_PRESSURE_HIGH);
    CHECK(!pthread_equal(calls.threads[0], pthread_self()));
    write_meminfo(8000000);
    REQUIRE(wait_for_calls(&calls, 2));
    CHECK_EQ_INT(calls.levels[1], GM_PRESSURE_NORMAL);
    /* A policy without sampled signals stops the thread. */
    CHECK_OK(set_policy(allocator, 0.9, 0.8, GM_PRESSURE_SIGNAL_RESERVED, NULL));
    CHECK(!allocator->pressure.sampler_running);
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    CHECK(allocator->pressure.sampler_running);
    CHECK_OK(gm_set_pressure_policy(allocator, NULL));
    CHECK(!allocator->pressure.sampler_running);
    /* Destroying an allocator whose thread runs, and is acting at that moment, joins it. */
    CHECK_OK(gm_set_pressure_policy(allocator, &policy));
    write_meminfo(500000);
    usleep(5000);
    gm_destroy(allocator, NULL);
}

typedef struct policy_changer {
    recorder record;
    gm_status set_status;   /* what gm_set_pressure_policy returned inside the callback */
    gm_status check_status; /* and gm_check_pressure */
    char message[256];
} policy_changer;

/* On HIGH, turn the policy off (allowed on the program's threads, refused on the sampling thread). */
static void turn_policy_off(gm_allocator *allocator, gm_pressure_level level, const gm_pressure_readings *readings,
                            void *context)
{
    policy_changer *self = context;
    if (level == GM_PRESSURE_HIGH) {
        self->check_status = gm_check_pressure(allocator, NULL);
        self->set_status = gm_set_pressure_policy(allocator, NULL);
        snprintf(self->message, sizeof self->message, "%s", gm_last_error());
    }
    record_call(&self->record, level, readings); /* last: what the test reads after seeing the call is written */
}

static void policy_changes_from_callbacks(void)
{
    /* On the thread whose call raised the level: allowed; the fall it causes follows. */
    gm_allocator *allocator = make(segments);
    policy_changer self = {.set_status = GM_ERROR_DEVICE};
    recorder_init(&self.record);
    CHECK_OK(gm_on_pressure(allocator, turn_policy_off, &self));
    CHECK_OK(set_policy(allocator, 0.5, 0.25, 0, NULL));
    void *block = take(allocator, 600 * MiB, 0);
    CHECK_EQ_INT(self.set_status, GM_OK);
    CHECK_EQ_INT(calls_of(&self.record), 2);
    CHECK_EQ_INT(self.record.levels[1], GM_PRESSURE_NORMAL);
    gm_pressure_policy policy;
    CHECK_OK(gm_get_pressure_policy(allocator, &policy));
    CHECK(policy.high == 0);
    CHECK_OK(gm_free(allocator, block));
    gm_destroy(allocator, NULL);
    /* On the sampling thread: refused (it would wait for itself); checking the signals is allowed. */
    make_root();
    write_meminfo(8000000);
    allocator = make(segments);
    recorder_init(&self.record);
    self.set_status = GM_OK;
    CHECK_OK(gm_on_pressure(allocator, turn_policy_off, &self));
    gm_pressure_policy sampled = {.high = 0.9, .low = 0.8, .signals = GM_PRESSURE_SIGNAL_HOST, .interval_ms = 2,
                                  .host_root = root};
    CHECK_OK(gm_set_pressure_policy(allocator, &sampled));
    write_meminfo(500000);
    for (int i = 0; i < 5000 && calls_of(&self.record) < 1; i++)
        usleep(1000);
    REQUIRE(calls_of(&self.record) >= 1);
    CHECK(!pthread_equal(self.record.threads[0], pthread_self()));
    CHECK_EQ_INT(self.set_status, GM_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(self.message, "not from a callback on the sampling thread") != NULL);
    CHECK_EQ_INT(self.check_status, GM_OK);
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(host_memory_signal_from_a_fixture_tree), TEST_CASE(psi_signal_from_a_fixture_tree),
          TEST_CASE(cgroup_signal_from_a_fixture_tree), TEST_CASE(cgroup_without_limit_never_raises),
          TEST_CASE(device_signal_counts_memory_used_elsewhere), TEST_CASE(sampling_thread_acts_and_stops),
          TEST_CASE(policy_changes_from_callbacks))
