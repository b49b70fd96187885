/*
 * test.h -- a minimal test framework: CHECK macros that report file, line and the failed
 * expression, and a main() helper that runs the registered test functions and exits non-zero if
 * any check failed. Each test binary is one CTest test.
 */
#ifndef GM_TEST_H
#define GM_TEST_H

#include "gpumem.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static const char *test_current = "";

#define CHECK(condition)                                                                                  \
    do {                                                                                                  \
        if (!(condition)) {                                                                               \
            fprintf(stderr, "%s:%d: [%s] check failed: %s\n", __FILE__, __LINE__, test_current, #condition); \
            test_failures++;                                                                              \
        }                                                                                                 \
    } while (0)

#define CHECK_EQ_INT(actual, expected)                                                                    \
    do {                                                                                                  \
        long long actual_ = (long long)(actual), expected_ = (long long)(expected);                       \
        if (actual_ != expected_) {                                                                       \
            fprintf(stderr, "%s:%d: [%s] %s is %lld, expected %lld\n", __FILE__, __LINE__, test_current,   \
                    #actual, actual_, expected_);                                                         \
            test_failures++;                                                                              \
        }                                                                                                 \
    } while (0)

/* A call that must return `expected`; prints gm_last_error() when it does not. */
#define CHECK_STATUS(call, expected)                                                                      \
    do {                                                                                                  \
        gm_status status_ = (call);                                                                       \
        if (status_ != (expected)) {                                                                      \
            fprintf(stderr, "%s:%d: [%s] %s returned %s (%s), expected %s\n", __FILE__, __LINE__,          \
                    test_current, #call, gm_strerror(status_), gm_last_error(), gm_strerror(expected));   \
            test_failures++;                                                                              \
        }                                                                                                 \
    } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, GM_OK)

/* The last error message must contain `text`. */
#define CHECK_MESSAGE(text)                                                                               \
    do {                                                                                                  \
        if (!strstr(gm_last_error(), (text))) {                                                           \
            fprintf(stderr, "%s:%d: [%s] last error '%s' lacks '%s'\n", __FILE__, __LINE__, test_current,  \
                    gm_last_error(), (text));                                                             \
            test_failures++;                                                                              \
        }                                                                                                 \
    } while (0)

/* A fatal precondition: stop this test binary if it does not hold. */
#define REQUIRE(condition)                                                                                \
    do {                                                                                                  \
        if (!(condition)) {                                                                               \
            fprintf(stderr, "%s:%d: [%s] required: %s (%s)\n", __FILE__, __LINE__, test_current,           \
                    #condition, gm_last_error());                                                         \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

typedef void (*test_function)(void);

typedef struct test_case {
    const char *name;
    test_function run;
} test_case;

#define TEST_CASE(function) {#function, function}

/* An allocator made from a GPUMEM_CONF string; the test stops if it cannot be made. */
static inline gm_allocator *make_allocator(const char *config)
{
    gm_allocator *allocator = NULL;
    CHECK_OK(gm_create(config, &allocator));
    REQUIRE(allocator != NULL);
    return allocator;
}

static inline int run_tests(const test_case *cases, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int before = test_failures;
        test_current = cases[i].name;
        cases[i].run();
        printf("%s %s\n", test_failures == before ? "ok  " : "FAIL", cases[i].name);
    }
    if (test_failures)
        fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}

#define RUN_TESTS(...)                                                                                    \
    int main(void)                                                                                        \
    {                                                                                                     \
        static const test_case cases[] = {__VA_ARGS__};                                                   \
        return run_tests(cases, sizeof cases / sizeof cases[0]);                                          \
    }

/* A small deterministic generator (xorshift64*), so randomized tests repeat exactly. */
static inline uint64_t test_random(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

#endif
