/*
 * soak.h -- the soak benchmark's shared parts (soak.c runs the threads' operations and reports,
 * soak_check.c checks the books at barriers and at the end).
 */
#ifndef GM_SOAK_H
#define GM_SOAK_H

#include "gpumem.h"
#include "pattern.h"
#include "tools/trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SOAK_MAX_THREADS 256
#define SOAK_RECENT_STREAMS 8 /* a thread's abandoned streams still named as other streams */
#define SOAK_SHARED_STREAMS 4 /* streams 1..4 that every thread uses, besides the default stream 0 */

typedef struct soak_options {
    const char *backend;
    const char *engine;
    uint64_t operations;
    unsigned threads;
    uint64_t seed;
    double fault_rate;
    uint64_t capacity;
    uint64_t barriers;
    const char *conf;       /* more GPUMEM_CONF keys, appended (for instance compact_min:2MiB) */
    bool json;
    bool verbose;
    bool check_data;        /* host: a pattern in every block, checked before its free */
    size_t live_per_thread; /* blocks a thread holds at most */
    const char *trace_path; /* --trace: every thread replays this trace's allocations (soak_trace.c) */
} soak_options;

typedef struct soak_block {
    char *pointer;
    size_t requested;
    size_t size; /* gm_allocation_size at its allocation */
    uint64_t identity;
    uint32_t slot; /* --trace: the trace's slot it fills (SOAK_NO_SLOT: none) */
} soak_block;

#define SOAK_NO_SLOT UINT32_MAX

typedef struct soak_counts {
    uint64_t mallocs;
    uint64_t frees;
    uint64_t cross_stream_frees;
    uint64_t empty_caches;
    uint64_t limit_changes;
    uint64_t ooms;
    uint64_t device_errors; /* gm_malloc failing with GM_ERROR_DEVICE: an injected fault it could not avoid */
    uint64_t streams_created;
} soak_counts;

typedef struct soak_run soak_run;

typedef struct soak_worker {
    soak_run *run;
    unsigned index;
    uint64_t random;
    soak_block *live;
    size_t live_count;
    uint64_t identity;
    gm_stream own_stream;
    gm_stream recent[SOAK_RECENT_STREAMS];
    size_t recent_count;
    uint64_t stream_serial;
    soak_counts counts;
    size_t *slot_positions; /* --trace: 1 + the index in `live` of each of the trace's slots' block (0: none) */
    size_t trace_position;     /* --trace: the next operation of the trace */
} soak_worker;

struct soak_run {
    soak_options options;
    gm_trace trace; /* --trace: loaded once, read by every thread */
    gm_allocator *allocator;
    soak_worker *workers;
    pthread_barrier_t barrier;
    uint64_t operations_per_thread;
    uint64_t operations_per_barrier;
    _Atomic uint64_t violations;
    /* Read at the barriers (by the checking thread only). */
    uint64_t barriers_checked;
    int64_t faults_injected;
    int64_t copies;          /* compaction's copies (compact_min), counted with failed ones */
    int64_t stitches;        /* requests stitched (num_stitches) by the last barrier */
    size_t max_heaps;
    size_t max_model_streams;
    double peak_rss_mib;
};

/* The host backend's data check. A block's pattern is a word every 512 bytes (blocks start on 512-byte
 * boundaries, so two overlapping blocks stamp a shared word, and the later stamp breaks the earlier
 * block's pattern), except in the middle of a large block, where only the 64 KiB-aligned words are
 * stamped: touching every page of every large block would make the soak run an order of magnitude
 * slower. A block handed out twice is then still caught unless it is small and lies wholly between two
 * such words of a large block. */
/* soak.c: a block of `requested` bytes on `stream` kept live by the thread (its identity; 0 if the
 * allocation failed cleanly), and a live block freed (after a use on another stream with `cross_stream`). */
uint64_t soak_allocate(soak_worker *self, size_t requested, gm_stream stream);
void soak_release(soak_worker *self, size_t index, bool cross_stream);
uint64_t soak_random(uint64_t *state);

/* soak_trace.c: the thread's next operation of the trace, from its start again after its end. */
void soak_trace_operation(soak_worker *self);

#define SOAK_DENSE_BYTES (64u * 1024)

static inline bool soak_stamped_offset(uintptr_t base, size_t size, size_t offset)
{
    return size <= 16 * SOAK_DENSE_BYTES || offset < SOAK_DENSE_BYTES || size - offset <= SOAK_DENSE_BYTES ||
           (base + offset) % SOAK_DENSE_BYTES == 0;
}

/* The next stamped offset after `offset`. */
static inline size_t soak_next_offset(uintptr_t base, size_t size, size_t offset)
{
    size_t next = offset + 512;
    if (soak_stamped_offset(base, size, next) || next >= size)
        return next;
    size_t aligned = (size_t)((base + next + SOAK_DENSE_BYTES - 1) / SOAK_DENSE_BYTES * SOAK_DENSE_BYTES - base);
    size_t tail = size > SOAK_DENSE_BYTES ? (size - SOAK_DENSE_BYTES + 511) / 512 * 512 : 0;
    return aligned < tail ? aligned : tail;
}

static inline void soak_stamp(char *pointer, size_t size, uint64_t identity)
{
    for (size_t offset = 0; offset + 8 <= size; offset = soak_next_offset((uintptr_t)pointer, size, offset)) {
        uint64_t word = pattern_word(identity, offset);
        memcpy(pointer + offset, &word, 8);
    }
}

static inline bool soak_intact(const char *pointer, size_t size, uint64_t identity)
{
    for (size_t offset = 0; offset + 8 <= size; offset = soak_next_offset((uintptr_t)pointer, size, offset)) {
        uint64_t word;
        memcpy(&word, pointer + offset, 8);
        if (word != pattern_word(identity, offset))
            return false;
    }
    return true;
}

/* Count a violation and print the first few. */
void soak_violation(soak_run *run, const char *format, ...) __attribute__((format(printf, 2, 3)));
/* A violation unless `status` is `expected`. */
void soak_check_status(soak_run *run, gm_status status, gm_status expected, const char *call);
/* Wait for every thread; one checks the books; then all go on. */
void soak_barrier(soak_worker *self);
/* After the threads: check, free everything, complete all work, empty the cache until nothing is
 * reserved, check that nothing is left, destroy the allocator. */
void soak_drain(soak_run *run);

#endif
