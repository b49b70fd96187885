/*
 * system_memory.h -- the library's own host memory (blocks' metadata, chunk lists, reports), taken from
 * the C library in one place.
 *
 * Every "no host memory" path must lose nothing: the call that needed the memory fails cleanly and
 * every book stays exact. Such paths are rare in practice, so tests make them happen: like SQLite's
 * malloc-failure tests, gm_fail_system_allocations makes the allocations after the next `after` ones
 * fail, and tests/test_host_failures.c runs a workload once for every allocation it makes, that one
 * failing. The check is an atomic increment (the count tests read) and an atomic load, on paths that
 * already call malloc: never on a hot path.
 */
#ifndef GPUMEM_BASE_SYSTEM_MEMORY_H
#define GPUMEM_BASE_SYSTEM_MEMORY_H

#include <stddef.h>
#include <stdint.h>

void *gm_system_malloc(size_t size);
void *gm_system_calloc(size_t count, size_t size);
void *gm_system_realloc(void *pointer, size_t size);

/* For tests, process-wide: after `after` more successful allocations, the next `failures` fail (NULL).
 * 0 failures cancels. */
void gm_fail_system_allocations(uint64_t after, uint64_t failures);
/* Allocations made (successful or not) since the process started: what a test counts to know how many
 * positions a workload has. */
uint64_t gm_system_allocations_made(void);

#endif
