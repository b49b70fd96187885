/*
 * aliases.c -- chunks moved ahead of their stream: the old mapping stays until the stream has passed.
 *
 * An idle chunk may still be used by work queued on its stream before its last free. Moving it by
 * unmapping it first means waiting for that work, and on a GPU the wait stalls the host until the
 * device has caught up: the step loses the lead its host had, and the device then idles while the
 * host launches the next kernels. Progress marks (progress.c) spare the wait for chunks freed long
 * before, not for those freed moments before, which are the ones a step's next growth finds.
 *
 * When the chunk moves within its own stream, no wait is needed. The driver lets one physical
 * allocation be mapped at two addresses at once, and the stream runs the work that will use the new
 * addresses after the work still using the old ones, as it does for any freed block that a caching
 * allocator hands out again on the same stream. So the chunk is mapped at its new place at once
 * (chunks.c, pages_move_chunk_ahead), and its old mapping, an alias, is kept here until the stream has
 * passed the chunk's free: asked without waiting at every growth, through the marks, one of which is
 * recorded after the free for that. In the books the old addresses are unmapped at once; before
 * anything is mapped over them, before the chunk goes back to the device and before the addresses go
 * back, the alias is unmapped, after a wait if the stream has not passed its free by then (the wait a
 * move made before). An alias holds no memory of its own: its chunk is counted where it now lies.
 * A stitch's second mapping (stitching.c) becomes an alias when the stitch is undone; the next stitch,
 * laid out at the same addresses, takes it back as it is where it maps the same chunk there
 * (pages_adopt_alias). A step that repeats a request stitches it again at the same addresses, over the
 * same chunks, so such an alias lingers once its stream has passed it: not unmapped at the next
 * growth, but when something is mapped over its addresses, when its chunk goes back to the device, or
 * when more than MAX_LINGERING_ALIASES linger (the oldest that the stream has passed go first). It holds
 * no memory (its chunk is held where it lies), and where memory goes does not depend on it: the books
 * count its addresses unmapped either way. Each stitch made again over a lingering mapping spares a map
 * and a set-access call now and an unmap later.
 */
#include "core/pages/pages.h"

#include "base/array.h"
#include "base/error.h"

#include <inttypes.h>
#include <stdlib.h>

/* Unmap alias `index` (after waiting for its stream if `wait`); it leaves the list, whose last entry
 * takes its place. */
static gm_status retire(gm_arena *arena, size_t index, bool wait)
{
    page_engine *engine = engine_of(arena);
    page_alias *alias = &engine->aliases[index];
    if (wait && pages_stream_capturing(arena, alias->heap) &&
        !pages_wait_is_capturable(arena, alias->heap, alias->freed_at))
        return gm_fail(GM_ERROR_DEVICE, "the old mapping at 0x%" PRIxPTR " of a chunk moved ahead of its stream "
                       "cannot be waited for: the stream is being captured into a CUDA graph and no event recorded "
                       "before the capture covers it", alias->address);
    gm_status status = wait ? pages_wait_for_free(arena, alias->heap, alias->freed_at) : GM_OK;
    if (status == GM_OK)
        status = gm_backend_unmap(arena->backend, alias->address, alias->size);
    if (status != GM_OK)
        return status;
    arena->stats->num_page_unmaps += (int64_t)(alias->size / engine->page_size);
    *alias = engine->aliases[--engine->alias_count];
    return GM_OK;
}

bool pages_alias_room(gm_arena *arena, size_t more)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < more; i++) { /* room for one more past count + i: room for i + 1 */
        page_alias *grown = gm_array_room_for_one(engine->aliases, engine->alias_count + i, &engine->alias_capacity,
                                                  sizeof *grown, 16);
        if (!grown)
            return false;
        engine->aliases = grown;
    }
    return true;
}

void pages_add_alias(gm_arena *arena, const page_alias *alias)
{
    page_engine *engine = engine_of(arena);
    engine->aliases[engine->alias_count++] = *alias;
}

/* Whether alias `index` goes now that its stream has passed it: lingering ones while there are more
 * than MAX_LINGERING_ALIASES, the oldest (the lowest free count) first. */
static bool goes_once_passed(const page_engine *engine, size_t index, size_t lingering)
{
    const page_alias *alias = &engine->aliases[index];
    if (!alias->lingering)
        return true;
    if (lingering <= MAX_LINGERING_ALIASES)
        return false;
    size_t older = 0;
    for (size_t i = 0; i < engine->alias_count; i++)
        older += engine->aliases[i].lingering && engine->aliases[i].freed_at < alias->freed_at;
    return older < lingering - MAX_LINGERING_ALIASES;
}

void pages_retire_passed_aliases(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    size_t lingering = 0;
    for (size_t i = 0; i < engine->alias_count; i++)
        lingering += engine->aliases[i].lingering;
    for (size_t i = 0; i < engine->alias_count;) {
        page_alias *alias = &engine->aliases[i];
        bool was_lingering = alias->lingering;
        if (!pages_free_is_done(arena, alias->heap, alias->freed_at) || !goes_once_passed(engine, i, lingering) ||
            retire(arena, i, false) != GM_OK)
            i++; /* else entry i is another alias now */
        else
            lingering -= was_lingering;
    }
}

bool pages_adopt_alias(gm_arena *arena, uintptr_t address, uint64_t size, uint64_t handle)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->alias_count; i++) {
        const page_alias *alias = &engine->aliases[i];
        if (alias->address == address && alias->size == size && alias->handle == handle && !alias->without_access) {
            engine->aliases[i] = engine->aliases[--engine->alias_count];
            return true;
        }
    }
    return false;
}

/* Unmap every alias that `concerned` picks, waiting for its stream where it has not passed the free. */
static gm_status retire_concerned(gm_arena *arena, bool (*concerned)(const page_alias *, const void *),
                                  const void *what)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->alias_count;) {
        if (!concerned(&engine->aliases[i], what)) {
            i++;
            continue;
        }
        gm_status status = retire(arena, i, true);
        if (status != GM_OK)
            return status;
    }
    return GM_OK;
}

static bool overlaps(const page_alias *alias, const void *range)
{
    const uintptr_t *bounds = range;
    return alias->address < bounds[1] && alias->address + alias->size > bounds[0];
}

static bool of_handle(const page_alias *alias, const void *handle)
{
    return alias->handle == *(const uint64_t *)handle;
}

gm_status pages_retire_aliases_in(gm_arena *arena, uintptr_t start, uintptr_t end)
{
    uintptr_t bounds[2] = {start, end};
    return retire_concerned(arena, overlaps, bounds);
}

gm_status pages_retire_aliases_of(gm_arena *arena, uint64_t handle)
{
    return retire_concerned(arena, of_handle, &handle);
}

void pages_drop_aliases(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->alias_count; i++)
        gm_backend_unmap(arena->backend, engine->aliases[i].address, engine->aliases[i].size);
    free(engine->aliases);
    engine->aliases = NULL;
    engine->alias_count = engine->alias_capacity = 0;
}
