/*
 * system_memory.c -- see system_memory.h.
 */
#include "base/system_memory.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

static _Atomic uint64_t allocations_made;
static _Atomic uint64_t successes_before_failing; /* counted down while failures are armed */
static _Atomic uint64_t failures_armed;

/* Whether this allocation is one to fail. Several threads may race for the last failure: at worst one
 * more or one fewer fails, which a test of one thread never sees. */
static bool fails_now(void)
{
    atomic_fetch_add_explicit(&allocations_made, 1, memory_order_relaxed);
    if (!atomic_load_explicit(&failures_armed, memory_order_relaxed))
        return false;
    if (atomic_load_explicit(&successes_before_failing, memory_order_relaxed)) {
        atomic_fetch_sub_explicit(&successes_before_failing, 1, memory_order_relaxed);
        return false;
    }
    atomic_fetch_sub_explicit(&failures_armed, 1, memory_order_relaxed);
    return true;
}

void *gm_system_malloc(size_t size)
{
    return fails_now() ? NULL : malloc(size);
}

void *gm_system_calloc(size_t count, size_t size)
{
    return fails_now() ? NULL : calloc(count, size);
}

void *gm_system_realloc(void *pointer, size_t size)
{
    return fails_now() ? NULL : realloc(pointer, size);
}

void gm_fail_system_allocations(uint64_t after, uint64_t failures)
{
    atomic_store(&failures_armed, 0);
    atomic_store(&successes_before_failing, after);
    atomic_store(&failures_armed, failures);
}

uint64_t gm_system_allocations_made(void)
{
    return atomic_load(&allocations_made);
}
