/*
 * test_options.c -- the configuration string: every key, sizes with suffixes, and a clear error
 * for every unknown key or bad value, which leaves the options unchanged.
 */
#include "test.h"

#include "base/options.h"

static void defaults_are_documented_values(void)
{
    gm_options options;
    gm_options_default(&options);
    CHECK(!strcmp(options.backend, "sim"));
    CHECK_EQ_INT(options.engine, GM_ENGINE_PAGES);
    CHECK_EQ_INT(options.page_size, 2 << 20);
    CHECK_EQ_INT(options.small_size, 1 << 20);
    CHECK_EQ_INT(options.large_segment_size, 20 << 20);
    CHECK(options.release_before_growth);
    CHECK(options.cost_model);
    CHECK_EQ_INT(options.device_credit_ns, 250);
    CHECK_EQ_INT(options.max_chunk_size, 128 << 20);
    CHECK_EQ_INT(options.chunk_room_share, 1000);
    CHECK(options.growth_lane);
    CHECK(!options.tail_chunk);
    CHECK(options.refill_groups);
    CHECK_EQ_INT(options.rechunk_min, 0);
    CHECK(options.move_slack == 0); /* off: idle chunks move as soon as the peak would rise */
}

static void every_key_is_parsed(void)
{
    gm_options options;
    gm_options_default(&options);
    CHECK_OK(gm_options_parse(&options, "backend:host,device:3,engine:segments,capacity:16GiB,page_size:64KiB,"
                                        "memory_limit:1g,small_size:512KiB,small_segment_size:4MiB,"
                                        "large_segment_size:32MiB,min_large_alloc:16MiB,"
                                        "release_before_growth:false,cost_model:False,device_credit_ns:900,"
                                        "max_chunk_size:64MiB,growth_lane:false,tail_chunk:0,refill_groups:false,"
                                        "rechunk_min:8MiB,chunk_room_share:0"));
    CHECK(!strcmp(options.backend, "host"));
    CHECK_EQ_INT(options.device, 3);
    CHECK_EQ_INT(options.engine, GM_ENGINE_SEGMENTS);
    CHECK_EQ_INT(options.capacity, 16ull << 30);
    CHECK_EQ_INT(options.page_size, 64 << 10);
    CHECK_EQ_INT(options.memory_limit, 1ull << 30);
    CHECK_EQ_INT(options.small_size, 512 << 10);
    CHECK_EQ_INT(options.small_segment_size, 4 << 20);
    CHECK_EQ_INT(options.large_segment_size, 32 << 20);
    CHECK_EQ_INT(options.min_large_alloc, 16 << 20);
    CHECK(!options.release_before_growth);
    CHECK(!options.cost_model);
    CHECK_EQ_INT(options.device_credit_ns, 900);
    CHECK_EQ_INT(options.max_chunk_size, 64 << 20);
    CHECK(!options.growth_lane);
    CHECK(!options.tail_chunk);
    CHECK(!options.refill_groups);
    CHECK_EQ_INT(options.rechunk_min, 8 << 20);
    CHECK_EQ_INT(options.chunk_room_share, 0);
    gm_options_default(&options); /* move_slack is the pages engine's */
    CHECK_OK(gm_options_parse(&options, "move_slack:0.01"));
    CHECK(options.move_slack == 0.01);
}

static void sizes_take_suffixes(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {{"0", 0},         {"512", 512},      {"4k", 4096},       {"4KB", 4096},
                 {"4KiB", 4096},   {"2MiB", 2 << 20}, {"3mb", 3 << 20},   {"1GiB", 1ull << 30},
                 {"5G", 5ull << 30}, {"2TiB", 2ull << 40}, {"7B", 7}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t bytes = 1;
        CHECK_OK(gm_parse_size(cases[i].text, &bytes));
        CHECK_EQ_INT(bytes, cases[i].bytes);
    }
    uint64_t bytes = 0;
    CHECK_STATUS(gm_parse_size("", &bytes), GM_ERROR_PARSE);
    CHECK_STATUS(gm_parse_size("MiB", &bytes), GM_ERROR_PARSE);
    CHECK_STATUS(gm_parse_size("-5", &bytes), GM_ERROR_PARSE);
    CHECK_STATUS(gm_parse_size("12XB", &bytes), GM_ERROR_PARSE);
    CHECK_MESSAGE("unknown suffix");
    CHECK_STATUS(gm_parse_size("99999999999999999999", &bytes), GM_ERROR_PARSE);
    CHECK_MESSAGE("too large");
    CHECK_STATUS(gm_parse_size("20000000TiB", &bytes), GM_ERROR_PARSE);
    CHECK_STATUS(gm_parse_size(NULL, &bytes), GM_ERROR_PARSE);
}

static void bad_strings_are_refused_with_clear_errors(void)
{
    static const struct {
        const char *text;
        const char *message;
    } cases[] = {
        {"colour:blue", "unknown key 'colour'"},
        {"colour:blue", "max_chunk_size, chunk_room_share, growth_lane, tail_chunk, stitch, refill_groups, rechunk_min, compact_min, move_slack, history, publish"}, /* the known keys */
        {"colour:blue", "pressure_psi_high, pressure_psi_low, fault_rate, fault_seed)"},                                  /* from the table */
        {"max_chunk_size:big", "bad value for key 'max_chunk_size'"},
        {"chunk_room_share:-5", "bad value for key 'chunk_room_share': '-5' is not a non-negative integer"},
        {"chunk_room_share:2000000", "bad value for key 'chunk_room_share': '2000000' is larger than 1048576"},
        {"engine:fast", "bad value 'fast' for key 'engine'"},
        {"backend:opencl", "bad value 'opencl' for key 'backend'"},
        {"capacity:lots", "bad value for key 'capacity'"},
        {"device:-1", "bad value for key 'device'"},
        {"device:x", "bad value for key 'device'"},
        {"cost_model:maybe", "bad value for key 'cost_model'"},
        {"capacity", "not a key:value pair"},
        {"capacity:", "has no value"},
        {":5", "no valid key"},
        {"page_size:3000", "power of two"},
        {"page_size:1KiB", "power of two"},
        {"small_size:4MiB", "small_size"},
        {"min_large_alloc:64MiB", "min_large_alloc"},
        /* capacity 0 once meant the backend's default; sizes beyond what the engines can address once made
         * every allocation fail, or wrapped the address range to 0 bytes */
        {"capacity:0", "bad value for key 'capacity': it must be positive (leave the key out for the backend's "
                       "default)"},
        {"capacity:1025GiB", "bad value for key 'capacity': 1025GiB is more than the 1TiB supported"},
        {"capacity:24TiB", "is more than the 1TiB supported"},
        {"capacity:9223372036854775808", "is more than the 1TiB supported"},
        {"capacity:999999900MiB", "is more than the 1TiB supported"},
        {"page_size:1TiB", "bad value for key 'page_size': 1TiB is more than the 1GiB supported"},
        {"page_size:2GiB", "is more than the 1GiB supported"},
        /* the pressure keys: fractions in (0, 1], low below high, each needs pressure_high */
        {"pressure_high:0", "bad value for key 'pressure_high': '0' is not a number in (0, 1]"},
        {"pressure_high:1.5", "bad value for key 'pressure_high': '1.5' is not a number in (0, 1]"},
        {"pressure_high:-0.5", "bad value for key 'pressure_high'"},
        {"pressure_high:ninety", "'ninety' is not a number in (0, 1] (a fraction such as 0.9)"},
        {"pressure_high:0.9x", "bad value for key 'pressure_high'"},
        {"pressure_high:0.8,pressure_low:0.8", "key 'pressure_low' (0.8) must be below 'pressure_high' (0.8)"},
        {"pressure_high:0.8,pressure_low:0.9", "key 'pressure_low' (0.9) must be below 'pressure_high' (0.8)"},
        {"pressure_high:0.05", "key 'pressure_low' is needed when 'pressure_high' is 0.05"},
        {"pressure_low:0.5", "key 'pressure_low' needs 'pressure_high'"},
        {"pressure_signals:device", "key 'pressure_signals' needs 'pressure_high'"},
        {"pressure_interval_ms:50", "key 'pressure_interval_ms' needs 'pressure_high'"},
        {"pressure_psi_high:20", "key 'pressure_psi_high' needs 'pressure_high'"},
        {"pressure_high:0.9,pressure_signals:reserved+gpu", "'gpu' is not a pressure signal (use reserved, allocated"},
        {"pressure_high:0.9,pressure_signals:cgroups", "'cgroups' is not a pressure signal (use reserved, allocated, "
                                                       "device, host, psi or cgroup, joined by '+')"},
        {"pressure_high:0.9,pressure_signals:", "key 'pressure_signals' has no value"},
        {"pressure_high:0.9,pressure_signals:reserved+", "'' is not a pressure signal"},
        {"move_slack:0", "bad value for key 'move_slack': '0' is not a number in (0, 1]"},
        {"move_slack:1%", "bad value for key 'move_slack': '1%' is not a number in (0, 1] (a fraction such as 0.9)"},
        {"move_slack:2", "bad value for key 'move_slack'"},
        {"engine:segments,move_slack:0.01", "key 'move_slack' is about moving chunks of the pages engine, which "
                                            "engine:segments does not have"},
        {"pressure_high:0.9,pressure_interval_ms:0", "key 'pressure_interval_ms' must be at least 1"},
        {"pressure_high:0.9,pressure_interval_ms:-5", "bad value for key 'pressure_interval_ms'"},
        {"pressure_high:0.9,pressure_psi_high:101", "'101' is not a number in (0, 100] (a percentage)"},
        {"pressure_high:0.9,pressure_psi_high:20,pressure_psi_low:20", "must be below 'pressure_psi_high'"},
        {"pressure_high:0.9,pressure_psi_high:20,pressure_psi_low:30",
         "key 'pressure_psi_low' (30) must be below 'pressure_psi_high' (20)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gm_options options, before;
        gm_options_default(&options);
        before = options;
        gm_status status = gm_options_parse(&options, cases[i].text);
        if (status != GM_ERROR_BAD_CONFIG) {
            fprintf(stderr, "'%s' gave %s\n", cases[i].text, gm_strerror(status));
            test_failures++;
        }
        CHECK_MESSAGE(cases[i].message);
        CHECK(!memcmp(&options, &before, sizeof options));
    }
}

static void size_bounds_are_inclusive(void)
{
    gm_options options;
    gm_options_default(&options);
    CHECK_OK(gm_options_parse(&options, "capacity:1TiB,page_size:1GiB"));
    CHECK_EQ_INT(options.capacity, 1ull << 40);
    CHECK_EQ_INT(options.page_size, 1ull << 30);
    CHECK_OK(gm_options_parse(&options, "capacity:1,page_size:4KiB"));
    CHECK_EQ_INT(options.capacity, 1);
}

static void whitespace_and_empty_entries_are_tolerated(void)
{
    gm_options options;
    gm_options_default(&options);
    CHECK_OK(gm_options_parse(&options, " engine:segments , ,capacity:1GiB,"));
    CHECK_EQ_INT(options.engine, GM_ENGINE_SEGMENTS);
    CHECK_EQ_INT(options.capacity, 1ull << 30);
    CHECK_OK(gm_options_parse(&options, ""));
    CHECK_OK(gm_options_parse(&options, NULL));
}

static void environment_variable_is_read(void)
{
    setenv("GPUMEM_CONF", "engine:segments,capacity:1GiB", 1);
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create_from_environment("capacity:2GiB", &allocator));
    gm_device_info info;
    CHECK_OK(gm_get_device_info(allocator, &info));
    CHECK(!strcmp(info.engine, "segments"));
    CHECK_EQ_INT(info.total_bytes, 2ull << 30); /* the override wins */
    gm_destroy(allocator, NULL);
    setenv("GPUMEM_CONF", "engine:warp", 1);
    allocator = NULL;
    CHECK_STATUS(gm_create_from_environment(NULL, &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("GPUMEM_CONF: bad value 'warp'");
    CHECK(allocator == NULL);
    unsetenv("GPUMEM_CONF");
}

/* gm_check_configuration parses what gm_create_from_environment would, with the same answers and
 * messages, and creates nothing (no device calls: it works with a backend no machine here has). */
static void a_configuration_is_checked_without_an_allocator(void)
{
    unsetenv("GPUMEM_CONF");
    CHECK_OK(gm_check_configuration(NULL));
    CHECK_OK(gm_check_configuration("backend:cuda,device:7,max_chunk_size:8MiB,move_slack:0.01"));
    CHECK_STATUS(gm_check_configuration("max_chunk_size:8XB"), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("bad value for key 'max_chunk_size': size '8XB' has an unknown suffix 'XB'");
    setenv("GPUMEM_CONF", "pressure_high:0.9", 1);
    CHECK_OK(gm_check_configuration("pressure_low:0.5"));
    CHECK_STATUS(gm_check_configuration("pressure_low:0.95"), GM_ERROR_BAD_CONFIG); /* over GPUMEM_CONF's keys */
    CHECK_MESSAGE("key 'pressure_low' (0.95) must be below 'pressure_high' (0.9)");
    setenv("GPUMEM_CONF", "history:10,bogus:1", 1);
    CHECK_STATUS(gm_check_configuration("history:20"), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("GPUMEM_CONF: unknown key 'bogus'");
    gm_allocator *allocator = NULL;
    CHECK_STATUS(gm_create_from_environment("history:20", &allocator), GM_ERROR_BAD_CONFIG);
    CHECK_MESSAGE("GPUMEM_CONF: unknown key 'bogus'");
    unsetenv("GPUMEM_CONF");
}

static void pressure_keys_are_parsed(void)
{
    gm_options options;
    gm_options_default(&options);
    CHECK(options.pressure_high == 0); /* no policy by default */
    CHECK_EQ_INT(options.pressure_signals, GM_PRESSURE_SIGNAL_RESERVED | GM_PRESSURE_SIGNAL_ALLOCATED);
    CHECK_EQ_INT(options.pressure_interval_ms, 100);
    CHECK(options.pressure_psi_high == 10 && options.pressure_psi_low == 0); /* 0: half of psi_high */
    CHECK_OK(gm_options_parse(&options, "pressure_high:0.9"));
    CHECK(options.pressure_high == 0.9 && options.pressure_low == 0);
    CHECK(gm_options_pressure_low(&options) == 0.9 - 0.1); /* the default low watermark */
    CHECK_OK(gm_options_parse(&options, "pressure_high:0.95,pressure_low:0.5,pressure_interval_ms:25,"
                                        "pressure_signals:device+host+psi+reserved,pressure_psi_high:40,"
                                        "pressure_psi_low:12.5"));
    CHECK(options.pressure_high == 0.95 && gm_options_pressure_low(&options) == 0.5);
    CHECK_EQ_INT(options.pressure_interval_ms, 25);
    CHECK_EQ_INT(options.pressure_signals, GM_PRESSURE_SIGNAL_DEVICE | GM_PRESSURE_SIGNAL_HOST |
                                               GM_PRESSURE_SIGNAL_PSI | GM_PRESSURE_SIGNAL_RESERVED);
    CHECK(options.pressure_psi_high == 40 && options.pressure_psi_low == 12.5);
    CHECK_OK(gm_options_parse(&options, "pressure_high:1,pressure_signals:allocated,pressure_psi_low:0.5,"
                                        "pressure_psi_high:3"));
    CHECK(options.pressure_psi_high == 3 && options.pressure_psi_low == 0.5);
    CHECK(options.pressure_high == 1.0);
    CHECK_EQ_INT(options.pressure_signals, GM_PRESSURE_SIGNAL_ALLOCATED);
    CHECK_OK(gm_options_parse(&options, "pressure_signals:cgroup+host"));
    CHECK_EQ_INT(options.pressure_signals, GM_PRESSURE_SIGNAL_CGROUP | GM_PRESSURE_SIGNAL_HOST);
    /* An allocator made with them has the policy, with the default low watermark filled in. */
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create("capacity:1GiB,pressure_high:0.75,pressure_interval_ms:30", &allocator));
    REQUIRE(allocator != NULL);
    gm_pressure_policy policy;
    CHECK_OK(gm_get_pressure_policy(allocator, &policy));
    CHECK(policy.high == 0.75 && policy.low == 0.75 - 0.1);
    CHECK(policy.psi_high == 10 && policy.psi_low == 5);
    CHECK_EQ_INT(policy.interval_ms, 30);
    CHECK_EQ_INT(policy.signals, GM_PRESSURE_SIGNAL_RESERVED | GM_PRESSURE_SIGNAL_ALLOCATED);
    gm_destroy(allocator, NULL);
}

static void help_lists_every_key(void)
{
    const char *help = gm_config_help();
    static const char *const keys[] = {"backend", "device", "engine", "capacity", "page_size", "memory_limit",
                                       "small_size", "small_segment_size", "large_segment_size",
                                       "min_large_alloc", "release_before_growth", "cost_model",
                                       "device_credit_ns", "max_chunk_size", "chunk_room_share", "pressure_high", "pressure_low",
                                       "pressure_signals", "pressure_interval_ms", "pressure_psi_high",
                                       "pressure_psi_low"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK(strstr(help, keys[i]) != NULL);
}

RUN_TESTS(TEST_CASE(defaults_are_documented_values), TEST_CASE(every_key_is_parsed), TEST_CASE(sizes_take_suffixes),
          TEST_CASE(bad_strings_are_refused_with_clear_errors), TEST_CASE(size_bounds_are_inclusive),
          TEST_CASE(whitespace_and_empty_entries_are_tolerated),
          TEST_CASE(environment_variable_is_read), TEST_CASE(a_configuration_is_checked_without_an_allocator),
          TEST_CASE(pressure_keys_are_parsed),
          TEST_CASE(help_lists_every_key))
