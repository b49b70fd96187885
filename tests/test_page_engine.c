/*
 * test_page_engine.c -- placement rules of the pages engine that the statistics alone do not show:
 * the growth lane (tensors replaced again and again by slightly larger copies, as a KV cache grows,
 * are kept in few runs -- a ring -- in the upper part of their stream's range, once enough such replacements
 * were seen), the tail chunk (the partly used last page of a growth is a chunk of its own) and
 * rechunking (an idle chunk that a fit covers in part is made anew in two). Each rule is checked
 * against the same workload with the rule switched off in GPUMEM_CONF. Also the waits for a stream
 * before its idle chunks are unmapped: one per growth however many of its heaps (its own, its lane)
 * give chunks, none for chunks freed before its last wait; and small requests borrowing the stream's
 * large-pool memory while its lane is empty. And the room share: chunks no larger than a thousandth of
 * the room for new memory, so that they shrink as the device fills.
 */
#include "test.h"

#include <stdbool.h>
#include <stdlib.h>

#define TENSORS 48
#define MIB (1ull << 20)

static uintptr_t address_of(const void *pointer)
{
    return (uintptr_t)pointer;
}

/* A generation loop: TENSORS cached tensors, each replaced by a copy `growth` bytes larger at every
 * step (the copy allocated first, then the old one freed), with a short-lived temporary between
 * replacements and a logits buffer per step. Returns peak reserved / peak live. */
typedef struct generation {
    void *tensors[TENSORS];
    uint64_t size;
    uint64_t live;
    uint64_t peak_live;
} generation;

static void replace_tensor(gm_allocator *allocator, generation *run, int index, uint64_t growth)
{
    void *copy = NULL, *temporary = NULL;
    CHECK_OK(gm_malloc(allocator, run->size + growth, 0, &copy));
    run->live += run->size + growth;
    if (run->live > run->peak_live)
        run->peak_live = run->live;
    if (run->tensors[index]) {
        CHECK_OK(gm_free(allocator, run->tensors[index]));
        run->live -= run->size;
    }
    run->tensors[index] = copy;
    const uint64_t activation = 2 * MIB + 300 * 1024;
    CHECK_OK(gm_malloc(allocator, activation, 0, &temporary));
    if (run->live + activation > run->peak_live)
        run->peak_live = run->live + activation;
    CHECK_OK(gm_free(allocator, temporary));
}

static double run_generation(gm_allocator *allocator, int steps, generation *run)
{
    const uint64_t growth = 64 << 10, logits_size = 6 * MIB + 300 * 1024;
    void *logits = NULL;
    *run = (generation){.size = 13 * MIB + 200 * 1024};
    for (int index = 0; index < TENSORS; index++)
        replace_tensor(allocator, run, index, 0);
    for (int step = 0; step < steps; step++) {
        for (int index = 0; index < TENSORS; index++)
            replace_tensor(allocator, run, index, growth);
        run->size += growth;
        void *next_logits = NULL;
        CHECK_OK(gm_malloc(allocator, logits_size, 0, &next_logits));
        run->live += logits_size;
        if (run->live > run->peak_live)
            run->peak_live = run->live;
        if (logits) {
            CHECK_OK(gm_free(allocator, logits));
            run->live -= logits_size;
        }
        logits = next_logits;
    }
    CHECK_OK(gm_validate(allocator));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return (double)stats.reserved_bytes[GM_POOL_ALL].peak / (double)run->peak_live;
}

static int by_address(const void *left, const void *right)
{
    uintptr_t a = address_of(*(void *const *)left), b = address_of(*(void *const *)right);
    return a < b ? -1 : a > b ? 1 : 0;
}

/* How the live tensors lie: *runs_out, the runs they form (tensors less than two tensors' size apart
 * are in one run); the result, the room between the tensors of a run over their total size. */
static double tensor_gaps(const generation *run, int *runs_out)
{
    void *sorted[TENSORS];
    for (int index = 0; index < TENSORS; index++)
        sorted[index] = run->tensors[index];
    qsort(sorted, TENSORS, sizeof *sorted, by_address);
    uint64_t gaps = 0;
    *runs_out = 1;
    for (int index = 1; index < TENSORS; index++) {
        uintptr_t end = address_of(sorted[index - 1]) + run->size, start = address_of(sorted[index]);
        if (start > end + 2 * run->size)
            ++*runs_out;
        else
            gaps += start - end;
    }
    return (double)gaps / (double)(run->size * TENSORS);
}

static void regrowing_tensors_stay_in_few_runs(void)
{
    generation with_lane, without_lane;
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    double ratio = run_generation(allocator, 200, &with_lane);
    int runs = 0, runs_without = 0;
    double gaps = tensor_gaps(&with_lane, &runs);
    gm_destroy(allocator, NULL);
    allocator = make_allocator("engine:pages,capacity:140GiB,growth_lane:false");
    double ratio_without = run_generation(allocator, 200, &without_lane);
    double gaps_without = tensor_gaps(&without_lane, &runs_without);
    gm_destroy(allocator, NULL);
    printf("     lane: ratio %.4f, tensors in %d runs, room between them %.3f of their size; without: ratio %.4f, "
           "%d runs, %.3f\n", ratio, runs, gaps, ratio_without, runs_without, gaps_without);
    CHECK(runs <= 3);    /* the ring: one run, two while it wraps, three right after its head jumped */
    CHECK(gaps < 0.05); /* with the room their growth needs */
    CHECK(ratio < 1.02);
    CHECK(ratio < ratio_without);
}

static void lane_opens_after_enough_regrowths(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *anchor = NULL, *tensor = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &anchor));
    uint64_t size = 8 * MIB;
    CHECK_OK(gm_malloc(allocator, size, 0, &tensor));
    for (int regrowth = 1; regrowth <= 48; regrowth++) {
        void *copy = NULL;
        CHECK_OK(gm_malloc(allocator, size + (64 << 10), 0, &copy));
        /* Before the 48th regrowth has been seen, copies stay in the stream's own range. */
        uintptr_t distance = address_of(copy) > address_of(anchor) ? address_of(copy) - address_of(anchor)
                                                                   : address_of(anchor) - address_of(copy);
        CHECK(distance < (1ull << 30));
        CHECK_OK(gm_free(allocator, tensor));
        tensor = copy;
        size += 64 << 10;
    }
    void *copy = NULL, *other = NULL;
    CHECK_OK(gm_malloc(allocator, size + (64 << 10), 0, &copy));
    CHECK(address_of(copy) - address_of(anchor) > (8ull << 30)); /* in the lane: the upper part of the stream's range */
    CHECK_OK(gm_malloc(allocator, 3 * MIB, 0, &other));               /* another size: not in the lane */
    CHECK(address_of(other) - address_of(anchor) < (1ull << 30));
    CHECK_OK(gm_free(allocator, tensor));
    void *next_stream = NULL; /* the lane is engine-private: another stream gets a heap of its own */
    CHECK_OK(gm_malloc(allocator, 3 * MIB, (gm_stream)7, &next_stream));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, copy));
    CHECK_OK(gm_free(allocator, other));
    CHECK_OK(gm_free(allocator, next_stream));
    CHECK_OK(gm_free(allocator, anchor));
    CHECK_OK(gm_empty_cache(allocator)); /* the lane's memory is given back too */
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* A lane block used on another stream (record_stream) and then freed is not handed out again, nor
 * its pages moved, until that stream's work has finished. */
static void lane_blocks_wait_for_recorded_streams(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *tensor = NULL;
    uint64_t size = 8 * MIB;
    CHECK_OK(gm_malloc(allocator, size, 1, &tensor));
    uintptr_t first = address_of(tensor);
    for (int regrowth = 0; regrowth < 60; regrowth++) { /* the lane opens after 48 */
        void *copy = NULL;
        CHECK_OK(gm_malloc(allocator, size + (64 << 10), 1, &copy));
        CHECK_OK(gm_free(allocator, tensor));
        tensor = copy;
        size += 64 << 10;
    }
    CHECK(address_of(tensor) - first > (8ull << 30)); /* in the lane */
    CHECK_OK(gm_record_stream(allocator, tensor, 2));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 2, 1)); /* a kernel on stream 2 still reads it */
    uintptr_t used_start = address_of(tensor), used_end = used_start + size;
    void *copy = NULL;
    CHECK_OK(gm_malloc(allocator, size + (64 << 10), 1, &copy));
    CHECK_OK(gm_free(allocator, tensor)); /* pending until stream 2 finishes */
    CHECK_OK(gm_validate(allocator));
    for (int regrowth = 0; regrowth < 20; regrowth++) {
        void *next = NULL;
        size += 64 << 10;
        CHECK_OK(gm_malloc(allocator, size + (64 << 10), 1, &next));
        CHECK(address_of(next) + size + (64 << 10) <= used_start || address_of(next) >= used_end);
        CHECK_OK(gm_free(allocator, copy));
        copy = next;
    }
    CHECK_OK(gm_empty_cache(allocator)); /* may not unmap the pending block's pages */
    CHECK_OK(gm_validate(allocator));
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK(stats.active_bytes[GM_POOL_ALL].current > (int64_t)(size + (64 << 10))); /* the pending one counts */
    CHECK_OK(gm_sim_stream_complete(allocator, 2));
    CHECK_OK(gm_free(allocator, copy));
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.active_bytes[GM_POOL_ALL].current, 0);
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 0);
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

/* Opens the lane of stream 0 with a tensor regrowing from 8 MiB; returns it (in the lane) and its size. */
static void *open_lane(gm_allocator *allocator, uint64_t *size_out)
{
    void *tensor = NULL;
    uint64_t size = 8 * MIB;
    CHECK_OK(gm_malloc(allocator, size, 0, &tensor));
    for (int regrowth = 0; regrowth < 50; regrowth++) {
        void *copy = NULL;
        CHECK_OK(gm_malloc(allocator, size + (64 << 10), 0, &copy));
        CHECK_OK(gm_free(allocator, tensor));
        tensor = copy;
        size += 64 << 10;
    }
    *size_out = size;
    return tensor;
}

/* gm_malloc of `size` bytes on stream 0, which must map and create nothing. */
static void *malloc_without_device_call(gm_allocator *allocator, uint64_t size)
{
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    void *pointer = NULL;
    CHECK_OK(gm_malloc(allocator, size, 0, &pointer));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK_EQ_INT(after.device_calls[GM_CALL_MAP], before.device_calls[GM_CALL_MAP]);
    CHECK_EQ_INT(after.device_calls[GM_CALL_PHYSICAL_CREATE], before.device_calls[GM_CALL_PHYSICAL_CREATE]);
    return pointer;
}

/* A lane with no live block left (between two generate calls) places the next request in its own
 * free memory, with no device call: neither end of the conveyor exists then. */
static void empty_lane_reuses_its_free_memory(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *anchor = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &anchor));
    uint64_t size = 0;
    void *tensor = open_lane(allocator, &size);
    CHECK(address_of(tensor) - address_of(anchor) > (8ull << 30)); /* in the lane */
    CHECK_OK(gm_free(allocator, tensor));                           /* the lane is empty */
    void *next = malloc_without_device_call(allocator, size - (64 << 10));
    CHECK(address_of(next) - address_of(anchor) > (8ull << 30)); /* the lane again */
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, next));
    CHECK_OK(gm_free(allocator, anchor));
    gm_destroy(allocator, NULL);
}

/* A stream's heap and its lane share one range: once the lane is empty (between two generate calls),
 * a request of the stream's own (the next prefill's temporaries) fits into the memory the ring used,
 * with no device call -- with a range of its own, the lane's pages would have moved to the stream. */
static void stream_reuses_the_rings_memory(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:16GiB");
    void *anchor = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &anchor));
    uint64_t size = 0;
    void *tensor = open_lane(allocator, &size);
    uintptr_t ring = address_of(tensor);
    /* In the lane: the upper part of the stream's own range (32 GiB, twice the capacity; the ring's top
     * starts at its middle), not a range of its own. */
    CHECK(ring - address_of(anchor) > (8ull << 30) && ring - address_of(anchor) < (24ull << 30));
    CHECK_OK(gm_free(allocator, tensor)); /* the lane is empty */
    void *temporary = malloc_without_device_call(allocator, 20 * MIB); /* not a regrowing size: the stream's */
    CHECK(address_of(temporary) - address_of(anchor) > (8ull << 30)); /* where the ring was */
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, temporary));
    CHECK_OK(gm_free(allocator, anchor));
    gm_destroy(allocator, NULL);
}

/* A lane request that would need new memory above the peak goes to a free block of the stream's own
 * heap that fits it: here 36.5 MiB freed inside a chunk that a small block still pins. */
static void lane_request_fits_elsewhere_before_new_memory(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    uint64_t size = 0;
    void *tensor = open_lane(allocator, &size), *prefill = NULL, *pin = NULL;
    CHECK_OK(gm_empty_cache(allocator));
    CHECK_OK(gm_malloc(allocator, 73 * MIB / 2, 0, &prefill)); /* one new chunk of 19 pages */
    CHECK_OK(gm_malloc(allocator, 5 * MIB / 4, 0, &pin));      /* in its last page */
    CHECK(address_of(pin) == address_of(prefill) + 73 * MIB / 2);
    CHECK_OK(gm_free(allocator, prefill));
    CHECK_OK(gm_empty_cache(allocator)); /* no idle chunk left anywhere; the pinned one stays */
    CHECK_OK(gm_reset_peak_stats(allocator));
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    void *copy = NULL;
    CHECK_OK(gm_malloc(allocator, size + (64 << 10), 0, &copy));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK(address_of(copy) >= address_of(prefill) && address_of(copy) + size <= address_of(pin));
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].peak, before.reserved_bytes[GM_POOL_ALL].current);
    CHECK_OK(gm_free(allocator, tensor)); /* the conveyor goes on: the next copy is the lane's */
    tensor = copy;
    size += 64 << 10;
    CHECK_OK(gm_malloc(allocator, size + (64 << 10), 0, &copy));
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, tensor));
    CHECK_OK(gm_free(allocator, copy));
    CHECK_OK(gm_free(allocator, pin));
    gm_destroy(allocator, NULL);
}

/* While the stream's lane is empty, a small request that no small-pool block fits, and for which the
 * small pool would grow above the peak, takes a free block of the stream's own part of its large-pool
 * range: no page moves into the small pool (to move back when the next ring needs it). A tiny request
 * (under a 32nd of a page) still grows the small pool. */
static void small_request_borrows_while_lane_is_empty(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *anchor = NULL, *scratch = NULL;
    CHECK_OK(gm_malloc(allocator, 4 * MIB, 0, &anchor));
    CHECK_OK(gm_malloc(allocator, 6 * MIB, 0, &scratch)); /* a prefill's temporary: the stream's own part */
    uint64_t size = 0;
    void *tensor = open_lane(allocator, &size);
    CHECK_OK(gm_free(allocator, tensor)); /* the lane is empty */
    CHECK_OK(gm_free(allocator, scratch));
    CHECK_OK(gm_reset_peak_stats(allocator)); /* at the peak: a new small-pool page would lift it */
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    void *cached = NULL; /* a cached tensor under 1 MiB */
    CHECK_OK(gm_malloc(allocator, 640 << 10, 0, &cached));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK(address_of(cached) >= address_of(anchor) && address_of(cached) - address_of(anchor) < (8ull << 30));
    CHECK_EQ_INT(after.device_calls[GM_CALL_MAP], before.device_calls[GM_CALL_MAP]);
    CHECK_EQ_INT(after.device_calls[GM_CALL_PHYSICAL_CREATE], before.device_calls[GM_CALL_PHYSICAL_CREATE]);
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_SMALL].current, before.reserved_bytes[GM_POOL_SMALL].current);
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].peak, before.reserved_bytes[GM_POOL_ALL].peak);
    void *temporary = NULL;
    CHECK_OK(gm_malloc(allocator, 16 << 10, 0, &temporary));
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK(after.reserved_bytes[GM_POOL_SMALL].current > before.reserved_bytes[GM_POOL_SMALL].current);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, temporary));
    CHECK_OK(gm_free(allocator, cached));
    CHECK_OK(gm_free(allocator, anchor));
    CHECK_OK(gm_validate(allocator));
    gm_destroy(allocator, NULL);
}

static void growth_tail_page_is_its_own_chunk(void)
{
    for (int tail_chunk = 0; tail_chunk <= 1; tail_chunk++) {
        gm_allocator *allocator = make_allocator(tail_chunk ? "engine:pages,capacity:140GiB,tail_chunk:true"
                                                  : "engine:pages,capacity:140GiB");
        void *big = NULL, *neighbour = NULL;
        CHECK_OK(gm_malloc(allocator, 9 * MIB, 0, &big)); /* 4.5 pages: 5 new pages */
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], tail_chunk ? 2 : 1);
        CHECK_OK(gm_malloc(allocator, 2 * MIB, 0, &neighbour)); /* starts in big's last page */
        CHECK(address_of(neighbour) == address_of(big) + 9 * MIB);
        CHECK_OK(gm_free(allocator, big));
        CHECK_OK(gm_empty_cache(allocator));
        CHECK_OK(gm_get_stats(allocator, &stats));
        /* With its own tail chunk, `big`'s first 4 pages go back; without, the neighbour pins all 5. */
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, (int64_t)(tail_chunk ? 2 : 6) * 2 * (int64_t)MIB);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, neighbour));
        gm_destroy(allocator, NULL);
    }
}

/* A small block placed where a freed 64 MiB tensor was: without rechunk_min it pins the tensor's whole
 * chunk, and another stream's request needs new memory; with it the rest of that chunk is a chunk of its
 * own, idle, and moves to the other stream instead. */
static void fit_in_part_of_idle_chunk_remakes_it(void)
{
    for (int rechunk = 0; rechunk <= 1; rechunk++) {
        gm_allocator *allocator = make_allocator(rechunk ? "engine:pages,capacity:140GiB,rechunk_min:8MiB"
                                               : "engine:pages,capacity:140GiB");
        void *tensor = NULL, *small = NULL, *other = NULL;
        CHECK_OK(gm_malloc(allocator, 64 * MIB, 1, &tensor)); /* one chunk */
        uintptr_t start = address_of(tensor);
        CHECK_OK(gm_free(allocator, tensor));
        CHECK_OK(gm_malloc(allocator, 7 * MIB, 1, &small)); /* a fit at the chunk's start: 4 of its 32 pages */
        CHECK(address_of(small) == start);
        CHECK_OK(gm_validate(allocator));
        gm_stats stats;
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_CREATE], rechunk ? 3 : 1);
        CHECK_EQ_INT(stats.device_calls[GM_CALL_PHYSICAL_RELEASE], rechunk ? 1 : 0);
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 64 * (int64_t)MIB);
        CHECK_OK(gm_malloc(allocator, 48 * MIB, 2, &other));
        CHECK_OK(gm_get_stats(allocator, &stats));
        CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].peak, (int64_t)(rechunk ? 64 : 112) * (int64_t)MIB);
        CHECK_OK(gm_validate(allocator));
        CHECK_OK(gm_free(allocator, other));
        CHECK_OK(gm_free(allocator, small));
        gm_destroy(allocator, NULL);
    }
}

/* A growth that moves idle chunks out of both the lane and the stream's own heap waits for their one
 * stream once: a wait covers all work queued on the stream, whichever heap's memory it used. */
static void one_wait_per_stream_and_growth(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    uint64_t size = 0;
    void *tensor = open_lane(allocator, &size), *other = NULL;
    CHECK_OK(gm_free(allocator, tensor)); /* idle: the lane's memory and the stream's own, where it grew first */
    gm_stats before, after;
    CHECK_OK(gm_get_stats(allocator, &before));
    CHECK_OK(gm_malloc(allocator, 20 * MIB, 1, &other)); /* another stream takes it: 3 idle chunks move */
    CHECK_OK(gm_get_stats(allocator, &after));
    CHECK_EQ_INT(after.reserved_bytes[GM_POOL_ALL].current, before.reserved_bytes[GM_POOL_ALL].current);
    CHECK_EQ_INT(after.device_calls[GM_CALL_MAP] - before.device_calls[GM_CALL_MAP], 3);
    CHECK_EQ_INT(after.device_calls[GM_CALL_EVENT_SYNCHRONIZE] - before.device_calls[GM_CALL_EVENT_SYNCHRONIZE], 1);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, other));
    gm_destroy(allocator, NULL);
}

static int64_t waits(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[GM_CALL_EVENT_SYNCHRONIZE];
}

/* Only work queued before a chunk's last free can still use it, so once its stream was waited for
 * after that free, the chunk moves without another wait: stream 0 frees two blocks, stream 1 takes
 * their memory in two growths and waits once; a block freed after that wait costs a wait again. */
static void a_wait_covers_chunks_freed_before_it(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *first = NULL, *second = NULL, *later = NULL, *taken[3] = {NULL, NULL, NULL};
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &first));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &second));
    CHECK_OK(gm_free(allocator, first));
    CHECK_OK(gm_free(allocator, second));
    int64_t before = waits(allocator);
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 1, &taken[0])); /* moves one block's chunks: a wait */
    CHECK_EQ_INT(waits(allocator) - before, 1);
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 1, &taken[1])); /* the other's, freed before that wait */
    CHECK_EQ_INT(waits(allocator) - before, 1);
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &later)); /* new memory */
    CHECK_OK(gm_free(allocator, later));                /* freed after the wait */
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 1, &taken[2]));
    CHECK_EQ_INT(waits(allocator) - before, 2);
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    CHECK_EQ_INT(stats.reserved_bytes[GM_POOL_ALL].current, 24 * (int64_t)MIB); /* every take moved memory */
    CHECK_OK(gm_validate(allocator));
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(allocator, taken[i]));
    gm_destroy(allocator, NULL);
}

static int64_t calls_of(gm_allocator *allocator, int kind)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[kind];
}

/* `count` small blocks of `stream` allocated and freed, one at a time. */
static void free_small_blocks(gm_allocator *allocator, gm_stream stream, int count)
{
    for (int i = 0; i < count; i++) {
        void *small = NULL;
        CHECK_OK(gm_malloc(allocator, 512, stream, &small));
        CHECK_OK(gm_free(allocator, small));
    }
}

/* On stream 0: an 8 MiB block freed while work that may use it is queued (`idle`), a block after it
 * kept live, then `frees` small frees (with the idle block's, 256 frees of the heap's memory record a
 * progress mark; a small block kept live keeps the small pool's page from going too), then
 * `finished` the work queued so far finishes, and newer work is queued. An empty_cache then gives the
 * idle chunk back, which unmaps it: its work must have finished. (A move within the stream does not
 * wait at all: test_moves_ahead.c.) The device calls of that empty_cache: *waits_out event waits,
 * *records_out events recorded. */
static void release_after_frees(int frees, bool finished, bool capturing, int64_t *waits_out, int64_t *records_out)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *idle = NULL, *kept = NULL, *pin = NULL;
    CHECK_OK(gm_malloc(allocator, 512, 0, &pin));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &idle));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &kept));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1));
    CHECK_OK(gm_free(allocator, idle));
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, capturing));
    free_small_blocks(allocator, 0, frees);
    CHECK_OK(gm_sim_stream_set_capturing(allocator, 0, 0));
    if (finished)
        CHECK_OK(gm_sim_stream_complete(allocator, 0));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1));
    int64_t waits_before = waits(allocator), records_before = calls_of(allocator, GM_CALL_EVENT_RECORD);
    int64_t unmaps_before = calls_of(allocator, GM_CALL_UNMAP);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK(calls_of(allocator, GM_CALL_UNMAP) > unmaps_before); /* the idle chunk went back */
    *waits_out = waits(allocator) - waits_before;
    *records_out = calls_of(allocator, GM_CALL_EVENT_RECORD) - records_before;
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, kept));
    CHECK_OK(gm_free(allocator, pin));
    gm_destroy(allocator, NULL);
}

/* Events recorded as a stream's blocks are freed (progress marks, progress.c) tell how far its work
 * has come: a chunk freed before a mark whose work has finished goes back with no wait, though newer
 * work is still queued; before one whose work has not, the wait is for that mark, not a new event (which
 * would wait for the newer work too). Without a mark after the free (too few frees, or frees during a
 * graph capture, where no mark is recorded), a new event is recorded and waited for, as before. */
static void progress_marks_spare_waits(void)
{
    int64_t waits_seen = 0, records = 0;
    release_after_frees(255, true, false, &waits_seen, &records);
    CHECK_EQ_INT(waits_seen, 0);
    CHECK_EQ_INT(records, 0);
    release_after_frees(255, false, false, &waits_seen, &records);
    CHECK_EQ_INT(waits_seen, 1);
    CHECK_EQ_INT(records, 0); /* the mark's own event */
    release_after_frees(200, true, false, &waits_seen, &records);
    CHECK_EQ_INT(waits_seen, 1);
    CHECK_EQ_INT(records, 1);
    release_after_frees(255, true, true, &waits_seen, &records);
    CHECK_EQ_INT(waits_seen, 1);
    CHECK_EQ_INT(records, 1);
}

/* While a stream's work stays queued its marks stay running: a heap keeps four, and later ones record
 * the newest again. A chunk freed between two of them then waits for the first mark after its free --
 * not the older one, which its work may not have reached yet, nor a new event. */
static void a_running_mark_after_the_free_is_waited_for(void)
{
    gm_allocator *allocator = make_allocator("engine:pages,capacity:140GiB");
    void *pin = NULL, *idle = NULL, *kept = NULL;
    CHECK_OK(gm_malloc(allocator, 512, 0, &pin));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &idle));
    CHECK_OK(gm_malloc(allocator, 8 * MIB, 0, &kept));
    CHECK_OK(gm_sim_stream_enqueue(allocator, 0, 1)); /* never completed but by a wait */
    int64_t records = calls_of(allocator, GM_CALL_EVENT_RECORD);
    free_small_blocks(allocator, 0, 256);              /* the first mark, before the chunk's free */
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_RECORD) - records, 1);
    CHECK_OK(gm_free(allocator, idle));
    free_small_blocks(allocator, 0, 255 + 3 * 256);    /* the second mark, after it; two more; a fifth */
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_RECORD) - records, 5);
    int64_t waits_before = waits(allocator), unmaps_before = calls_of(allocator, GM_CALL_UNMAP);
    records = calls_of(allocator, GM_CALL_EVENT_RECORD);
    CHECK_OK(gm_empty_cache(allocator));
    CHECK(calls_of(allocator, GM_CALL_UNMAP) > unmaps_before); /* the idle chunk went back */
    CHECK_EQ_INT(waits(allocator) - waits_before, 1);
    CHECK_EQ_INT(calls_of(allocator, GM_CALL_EVENT_RECORD) - records, 0);
    CHECK_OK(gm_validate(allocator));
    CHECK_OK(gm_free(allocator, kept));
    CHECK_OK(gm_free(allocator, pin));
    gm_destroy(allocator, NULL);
}

static int64_t chunks_made(gm_allocator *allocator)
{
    gm_stats stats;
    CHECK_OK(gm_get_stats(allocator, &stats));
    return stats.device_calls[GM_CALL_PHYSICAL_CREATE];
}

/* chunk_room_share: on a 64 GiB device a 1 GiB growth is made of chunks of at most 64 MiB (a thousandth
 * of 64 GiB, rounded down to pages); once 60 GiB are taken, of 4 MiB ones (a thousandth of the 4 GiB
 * left). With chunk_room_share:0 both are 128 MiB chunks (max_chunk_size), and so are the first growth's
 * with a share of 250 (256 MiB, above max_chunk_size). */
static void chunks_shrink_with_the_room_left(void)
{
    static const struct {
        const char *config;
        int64_t first, later;
    } cases[] = {{"engine:pages,capacity:64GiB", 16, 256},
                 {"engine:pages,capacity:64GiB,chunk_room_share:0", 8, 8},
                 {"engine:pages,capacity:64GiB,chunk_room_share:250", 8, 64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gm_allocator *allocator = make_allocator(cases[c].config);
        void *first = NULL, *filler = NULL, *later = NULL;
        CHECK_OK(gm_malloc(allocator, 1024 * MIB, 0, &first));
        CHECK_EQ_INT(chunks_made(allocator), cases[c].first);
        CHECK_OK(gm_malloc(allocator, 59 * 1024 * MIB, 0, &filler));
        int64_t before = chunks_made(allocator);
        CHECK_OK(gm_malloc(allocator, 1024 * MIB, 0, &later));
        CHECK_EQ_INT(chunks_made(allocator) - before, cases[c].later);
        CHECK_OK(gm_validate(allocator));
        gm_destroy(allocator, NULL);
    }
}

RUN_TESTS(TEST_CASE(regrowing_tensors_stay_in_few_runs), TEST_CASE(lane_opens_after_enough_regrowths),
          TEST_CASE(lane_blocks_wait_for_recorded_streams), TEST_CASE(empty_lane_reuses_its_free_memory),
          TEST_CASE(stream_reuses_the_rings_memory), TEST_CASE(lane_request_fits_elsewhere_before_new_memory),
          TEST_CASE(small_request_borrows_while_lane_is_empty), TEST_CASE(growth_tail_page_is_its_own_chunk),
          TEST_CASE(fit_in_part_of_idle_chunk_remakes_it), TEST_CASE(one_wait_per_stream_and_growth),
          TEST_CASE(a_wait_covers_chunks_freed_before_it),
          TEST_CASE(progress_marks_spare_waits), TEST_CASE(a_running_mark_after_the_free_is_waited_for),
          TEST_CASE(chunks_shrink_with_the_room_left))
