/*
 * progress.c -- how far a stream's work has come, known without waiting for it.
 *
 * Before an idle chunk is unmapped, the work queued on its stream before the chunk's last free must
 * have finished (chunks.c). Waiting for an event recorded at that moment waits for everything queued
 * since too: on a GPU the host stalls until the device has caught up, and the step loses the lead its
 * host had. Yet a chunk freed long before has usually had its work finish long ago. So, as a heap's
 * blocks are freed, an event is recorded on its stream every MARK_EVERY_FREES frees of its memory: a
 * mark, holding the engine's free count at that moment. Only work queued before a free can use the
 * memory it frees, and a mark recorded after that free comes after that work in the stream's order,
 * so:
 *   - a mark that has completed (asked without waiting) covers every chunk freed before it: such a
 *     chunk is unmapped with no wait at all;
 *   - else the oldest mark after the chunk's free is waited for: the work queued up to that mark,
 *     not everything queued since;
 *   - only a chunk freed after the newest mark costs a new event and a wait, as before.
 * A heap keeps at most MARKS marks, oldest first, each with an event made once and recorded again for
 * later marks; when full, the oldest are asked and dropped if done, else the newest is recorded
 * again. No mark is recorded on a stream being captured into a CUDA graph (an event recorded there
 * could never be asked), and a mark that cannot be made or recorded is simply not there: the wait
 * falls back to a new event.
 *
 * A borrowed stream (gm_malloc_on_borrowed_stream: PyTorch's external streams) may be destroyed by its
 * owner at any moment, and a driver call naming a destroyed stream may crash. So the engine never
 * names it: no marks, no queries (it reads as never captured and always busy, so its memory moves
 * only when a growth needs it, not by choice), and the wait for one of its frees is a wait for the
 * whole device -- what PyTorch's own allocator does before it frees cached memory. That wait covers
 * every heap's frees so far. It is refused while a stream that may be asked is being captured.
 */
#include "core/pages/pages.h"

#include "base/error.h"

#include <string.h>

/* Every heap of `heap`'s stream has had its stream's work up to the free numbered `frees` finish. */
static void covered_up_to(gm_arena *arena, const gm_heap *heap, uint64_t frees)
{
    for (size_t h = 0; h < arena->heap_count; h++)
        if (arena->heaps[h]->stream == heap->stream && arena->heaps[h]->engine_data &&
            state_of(arena->heaps[h])->waited_at < frees)
            state_of(arena->heaps[h])->waited_at = frees;
}

/* The `index`-th mark of `state`, oldest first. */
static progress_mark *mark_at(page_heap *state, unsigned index)
{
    return &state->marks[(state->mark_first + index) % MARKS];
}

/* Drop the oldest `count` marks of `state`; their events stay for the next marks. */
static void drop_oldest(page_heap *state, unsigned count)
{
    state->mark_first = (state->mark_first + count) % MARKS;
    state->mark_count -= count;
}

/* Ask the oldest marks, without waiting, whether their work finished; those that did cover their
 * frees and go. Stops at the first that has not (the later ones cannot have either). */
static void harvest(gm_arena *arena, gm_heap *heap)
{
    page_heap *state = state_of(heap);
    unsigned done = 0;
    uint64_t covered = 0;
    while (done < state->mark_count) {
        bool finished = false;
        if (gm_backend_event_query(arena->backend, mark_at(state, done)->event, &finished) != GM_OK || !finished)
            break;
        covered = mark_at(state, done++)->frees;
    }
    if (done) {
        drop_oldest(state, done);
        covered_up_to(arena, heap, covered);
    }
}

bool pages_stream_borrowed(const gm_heap *heap)
{
    return heap->borrowed || (heap->serves && heap->serves->borrowed);
}

bool pages_stream_capturing(gm_arena *arena, const gm_heap *heap)
{
    return !pages_stream_borrowed(heap) && gm_backend_stream_is_capturing(arena->backend, heap->stream);
}

bool pages_stream_busy(gm_arena *arena, const gm_heap *heap)
{
    return pages_stream_borrowed(heap) || gm_backend_stream_is_busy(arena->backend, heap->stream);
}

bool pages_any_stream_capturing(gm_arena *arena)
{
    for (size_t h = 0; h < arena->heap_count; h++)
        if (pages_stream_capturing(arena, arena->heaps[h]))
            return true;
    return false;
}

/* The wait for a borrowed stream's free: the whole device; every heap's frees so far are covered. */
static gm_status wait_for_device(gm_arena *arena)
{
    if (pages_any_stream_capturing(arena))
        return gm_fail(GM_ERROR_DEVICE, "memory freed on a borrowed stream must wait for the whole device, which "
                       "would break the capture of a stream into a CUDA graph");
    gm_status status = gm_backend_synchronize(arena->backend);
    if (status != GM_OK)
        return status;
    for (size_t h = 0; h < arena->heap_count; h++)
        if (arena->heaps[h]->engine_data)
            state_of(arena->heaps[h])->waited_at = engine_of(arena)->frees;
    return GM_OK;
}

void pages_mark_progress(gm_arena *arena, gm_heap *heap)
{
    page_engine *engine = engine_of(arena);
    page_heap *state = state_of(heap);
    if (pages_stream_borrowed(heap) || pages_stream_capturing(arena, heap))
        return;
    if (state->mark_count == MARKS)
        harvest(arena, heap);
    bool full = state->mark_count == MARKS; /* the newest is recorded again */
    progress_mark *mark = mark_at(state, full ? MARKS - 1 : state->mark_count);
    if (!mark->made) {
        if (gm_backend_event_create(arena->backend, &mark->event) != GM_OK)
            return;
        mark->made = true;
    }
    if (gm_backend_event_record(arena->backend, mark->event, heap->stream) != GM_OK) {
        if (full)
            state->mark_count--; /* the newest mark no longer says what it did */
        return;
    }
    mark->frees = engine->frees;
    if (!full)
        state->mark_count++;
}

bool pages_free_is_done(gm_arena *arena, gm_heap *heap, uint64_t freed_at)
{
    page_heap *state = state_of(heap);
    if (freed_at > state->waited_at)
        harvest(arena, heap);
    return freed_at <= state->waited_at;
}

bool pages_has_mark_after(const gm_heap *heap, uint64_t freed_at)
{
    page_heap *state = state_of(heap);
    return state->mark_count && mark_at(state, state->mark_count - 1)->frees >= freed_at;
}

bool pages_wait_is_capturable(gm_arena *arena, gm_heap *heap, uint64_t freed_at)
{
    return pages_free_is_done(arena, heap, freed_at) || pages_has_mark_after(heap, freed_at);
}

void pages_mark_after(gm_arena *arena, gm_heap *heap, uint64_t freed_at)
{
    if (!pages_has_mark_after(heap, freed_at))
        pages_mark_progress(arena, heap);
}

gm_status pages_wait_for_free(gm_arena *arena, gm_heap *heap, uint64_t freed_at)
{
    if (pages_free_is_done(arena, heap, freed_at))
        return GM_OK; /* a wait, or a mark after the free that has completed: no wait */
    if (pages_stream_borrowed(heap))
        return wait_for_device(arena);
    page_heap *state = state_of(heap);
    for (unsigned i = 0; i < state->mark_count; i++) {
        if (mark_at(state, i)->frees < freed_at)
            continue;
        uint64_t frees = mark_at(state, i)->frees;
        gm_status status = gm_backend_event_synchronize(arena->backend, mark_at(state, i)->event);
        if (status != GM_OK)
            break; /* a new event below */
        drop_oldest(state, i + 1);
        covered_up_to(arena, heap, frees);
        return GM_OK;
    }
    uint64_t event = 0;
    gm_status status = gm_backend_event_create(arena->backend, &event);
    if (status != GM_OK)
        return status;
    status = gm_backend_event_record(arena->backend, event, heap->stream);
    if (status == GM_OK)
        status = gm_backend_event_synchronize(arena->backend, event);
    gm_backend_event_destroy(arena->backend, event);
    if (status == GM_OK)
        covered_up_to(arena, heap, engine_of(arena)->frees);
    return status;
}

void pages_forget_marks(gm_arena *arena, gm_heap *heap)
{
    page_heap *state = state_of(heap);
    if (!state)
        return;
    for (unsigned i = 0; i < MARKS; i++)
        if (state->marks[i].made)
            gm_backend_event_destroy(arena->backend, state->marks[i].event);
    memset(state->marks, 0, sizeof state->marks);
    state->mark_first = state->mark_count = 0;
}
