/*
 * host_pending.c -- the pinned host cache's freed blocks that may not be reused yet, and the looks that
 * move them to their free lists (host_cache.c has the cache's design and its calls).
 *
 * Why a block waits unchecked
 *   Asking a stream whether it is busy is a driver call (cuStreamQuery), as dear as the rest of a small
 *   alloc/free together. A free whose streams are all the legacy default stream therefore asks nothing:
 *   the block joins the pending list unchecked, and the question is put later, by a look, once for many
 *   blocks: a look asks each distinct stream once, whatever the number of blocks freed on it, and
 *   host_cache.c's rotation lets a small class's loop free several blocks between looks.
 *   Only the legacy stream (0 or CU_STREAM_LEGACY) may be left for later, for two reasons. Any other
 *   stream may be destroyed by its owner as soon as the free returns (a CuPy stream whose last
 *   reference goes, an external stream), and asking a destroyed stream is undefined (a crash in the
 *   driver). And any other stream, the per-thread default stream included, may be being captured into a
 *   CUDA graph at the free: a copy of the block captured into the graph runs again at every replay, so
 *   the block must never be reused, and only the free can tell (a look after the capture would find the
 *   stream idle). The legacy stream is never destroyed and cannot be captured (while another stream's
 *   capture makes it unusable, the backend reads it as capturing: a look then leaves it for later, which
 *   is safe, since no copy on it can have joined that graph). So a block with any other stream is checked
 *   at its free (gm_host_pending_check_at_free): if one of its streams is being captured, the block is
 *   held for the graph, pending until gm_destroy (the graph's lifetime is not the allocator's to know);
 *   otherwise its idle streams are done with, an event is recorded on each busy one, and it joins the
 *   pending list waiting for them (or its free list, if none was busy); events outlive their streams.
 *
 * A look (gm_host_look_at_pending) goes through the pending list oldest first:
 *   unchecked block   each of its streams is asked whether it still runs work, each stream once per look
 *                     (the answer serves the look's later blocks: all of them were freed before the look
 *                     began, under the same lock, so a stream idle now has finished all that any of them
 *                     waits for). A block whose streams are all idle goes to its free list. On each busy
 *                     one an event is recorded now, which follows every copy queued before the free (and
 *                     perhaps some after: conservative); the block then waits for its events. If an event
 *                     cannot be made or recorded, none stays recorded and the block stays unchecked, not
 *                     reusable: the next look tries again. A stream that reads as capturing is not asked
 *                     (cuStreamQuery would invalidate the capture, and an event recorded on it would be a
 *                     node of the graph, never done): the block stays unchecked until a later look.
 *   waiting block     its events are asked, newest first; the block goes to its free list once all are
 *                     done. A stream runs its work in order: once one of its events is not done, the later
 *                     ones on it are not asked in this look (busy_streams). The events just recorded
 *                     are not asked in the look that recorded them (their streams were just found busy);
 *                     with `wait` (gm_destroy) every event is waited for.
 *   held block        left alone; gm_destroy releases it.
 * Invariant: a block reaches a free list only after each of its streams was seen idle after its free,
 * or an event recorded on it after the free was done. The free lists are never filled otherwise (a
 * block without streams goes there at its free: nothing may use it).
 *
 * The per-class counts (cache->unchecked, cache->waiting) let gm_host_malloc decide without walking the
 * list whether a look could give its class a block; held blocks are in neither. stats.pending_blocks
 * counts all three kinds.
 *
 * Locking: the allocator's lock, held by every caller (host_cache.c).
 */
#include "core/allocator.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <stdlib.h>

typedef enum stream_state { stream_idle, stream_busy, stream_capturing } stream_state;

/* Streams with an event found not done in one look; beyond BUSY_STREAMS_KEPT, events are simply asked
 * about. */
enum { BUSY_STREAMS_KEPT = 16 };
typedef struct busy_streams {
    gm_stream streams[BUSY_STREAMS_KEPT];
    size_t count;
} busy_streams;

static bool is_busy(const busy_streams *busy, gm_stream stream)
{
    for (size_t i = 0; i < busy->count; i++)
        if (busy->streams[i] == stream)
            return true;
    return false;
}

/* Whether `event`, recorded on `stream`, is done: waited for with `wait`; else asked, unless an earlier
 * event of its stream was found not done in this look (a stream runs its work in order, so neither is
 * this one). */
static bool event_done(gm_allocator *allocator, uint64_t event, gm_stream stream, bool wait, busy_streams *busy)
{
    gm_backend *backend = allocator->arena.backend;
    if (wait)
        return gm_backend_event_synchronize(backend, event) == GM_OK;
    if (is_busy(busy, stream))
        return false;
    bool done = false;
    if (gm_backend_event_query(backend, event, &done) != GM_OK)
        done = false;
    if (!done && busy->count < BUSY_STREAMS_KEPT)
        busy->streams[busy->count++] = stream;
    return done;
}

/* Streams asked in one look and their answers; beyond the first few, streams are simply asked again. */
enum { streams_remembered = 16 };
typedef struct look {
    gm_stream asked[streams_remembered];
    stream_state states[streams_remembered];
    size_t asked_count;
    busy_streams busy_events; /* streams with an event found not done in this look */
    bool wait;
} look;

/* The count a pending block of this kind is in, or NULL for a held one. */
static uint32_t *count_of(gm_host_cache *cache, const gm_host_block *block)
{
    if (block->held_for_graph)
        return NULL;
    int size_class = gm_host_size_class_of(block->size);
    return block->event_count ? &cache->waiting[size_class] : &cache->unchecked[size_class];
}

void gm_host_pending_add(gm_host_cache *cache, gm_host_block *block)
{
    block->next = NULL;
    if (cache->pending_tail)
        cache->pending_tail->next = block;
    else
        cache->pending = block;
    cache->pending_tail = block;
    uint32_t *count = count_of(cache, block);
    if (count)
        (*count)++;
    cache->stats.pending_blocks++;
}

static stream_state state_of(gm_backend *backend, look *look, gm_stream stream)
{
    for (size_t i = 0; i < look->asked_count; i++)
        if (look->asked[i] == stream)
            return look->states[i];
    stream_state state = gm_backend_stream_is_capturing(backend, stream) ? stream_capturing
                         : gm_backend_stream_is_busy(backend, stream)    ? stream_busy
                                                                         : stream_idle;
    if (look->asked_count < streams_remembered) {
        look->asked[look->asked_count] = stream;
        look->states[look->asked_count++] = state;
    }
    return state;
}

/* Record an event on each of the block's streams (all busy). On failure none stays recorded. */
static gm_status record_events(gm_allocator *allocator, gm_host_block *block)
{
    gm_backend *backend = allocator->arena.backend;
    uint64_t *events = gm_system_realloc(block->events, block->stream_count * sizeof *events);
    if (!events)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "pinned host cache: no host memory for a block's events");
    block->events = events;
    for (size_t i = 0; i < block->stream_count; i++) {
        gm_status status = gm_take_event_locked(allocator, &events[i]);
        if (status == GM_OK) {
            status = gm_backend_event_record(backend, events[i], block->streams[i]);
            if (status != GM_OK)
                gm_backend_event_destroy(backend, events[i]); /* not pooled: it may be unusable */
        }
        if (status != GM_OK) {
            while (i)
                gm_return_event_locked(allocator, events[--i]);
            return status;
        }
    }
    block->event_count = block->stream_count;
    return GM_OK;
}

/* Ask the block's streams (each at most once per look) and keep those not idle: the idle ones were seen
 * idle after the free, done with. What the kept ones are: busy, or one of them capturing. */
static stream_state keep_unfinished_streams(gm_allocator *allocator, gm_host_block *block, look *look)
{
    size_t kept = 0;
    stream_state worst = stream_idle;
    for (size_t i = 0; i < block->stream_count; i++) {
        stream_state state = state_of(allocator->arena.backend, look, block->streams[i]);
        if (state == stream_idle)
            continue;
        block->streams[kept++] = block->streams[i];
        if (worst != stream_capturing)
            worst = state;
    }
    block->stream_count = kept;
    return worst;
}

gm_status gm_host_pending_check_at_free(gm_allocator *allocator, gm_host_block *block)
{
    look look = {.asked_count = 0};
    stream_state state = keep_unfinished_streams(allocator, block, &look);
    if (state == stream_capturing) {
        block->held_for_graph = true;
        return GM_OK;
    }
    return state == stream_busy ? record_events(allocator, block) : GM_OK;
}

/* Ask an unchecked block's streams: keep the busy ones, with an event recorded on each, unless one of
 * them reads as capturing (asked again at a later look). Whether none was busy. */
static bool check_streams(gm_allocator *allocator, gm_host_block *block, look *look)
{
    stream_state state = keep_unfinished_streams(allocator, block, look);
    if (state == stream_busy)
        (void)record_events(allocator, block); /* failed: still unchecked, asked again at the next look */
    return state == stream_idle;
}

/* Whether the waiting block's events are all done (with `wait`, after waiting for them); the done ones
 * go back to the allocator's pool. */
static bool events_done(gm_allocator *allocator, gm_host_block *block, look *look)
{
    while (block->event_count) {
        size_t last = block->event_count - 1;
        if (!event_done(allocator, block->events[last], block->streams[last], look->wait, &look->busy_events))
            return false;
        gm_return_event_locked(allocator, block->events[last]);
        block->event_count = last;
    }
    return true;
}

/* Whether a pending block is reusable now; its class's counts follow what it became. */
static bool reusable(gm_allocator *allocator, gm_host_block *block, look *look)
{
    gm_host_cache *cache = &allocator->host_cache;
    int size_class = gm_host_size_class_of(block->size);
    if (block->held_for_graph)
        return false;
    if (!block->event_count) {
        if (check_streams(allocator, block, look)) {
            cache->unchecked[size_class]--;
            return true;
        }
        if (!block->event_count)
            return false;
        cache->unchecked[size_class]--;
        cache->waiting[size_class]++;
        if (!look->wait)
            return false;
    }
    if (!events_done(allocator, block, look))
        return false;
    cache->waiting[size_class]--;
    return true;
}

void gm_host_look_at_pending(gm_allocator *allocator, bool wait)
{
    gm_host_cache *cache = &allocator->host_cache;
    look look = {.asked_count = 0, .busy_events = {.count = 0}, .wait = wait};
    gm_host_block **link = &cache->pending, *previous = NULL;
    while (*link) {
        gm_host_block *block = *link;
        if (!reusable(allocator, block, &look)) {
            previous = block;
            link = &block->next;
            continue;
        }
        *link = block->next;
        if (cache->pending_tail == block)
            cache->pending_tail = previous;
        cache->stats.pending_blocks--;
        gm_host_push_free(cache, block);
    }
}

gm_host_block *gm_host_pending_abandon(gm_allocator *allocator)
{
    gm_host_cache *cache = &allocator->host_cache;
    gm_host_block *block = cache->pending;
    if (!block)
        return NULL;
    cache->pending = block->next;
    if (!cache->pending)
        cache->pending_tail = NULL;
    uint32_t *count = count_of(cache, block);
    if (count)
        (*count)--;
    while (block->event_count)
        gm_backend_event_destroy(allocator->arena.backend, block->events[--block->event_count]);
    cache->stats.pending_blocks--;
    return block;
}
