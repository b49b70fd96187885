/*
 * stitching.c -- a request laid across second mappings of pinned chunks' free ends and starts
 * (the stitch option, on by default).
 *
 * A chunk that live blocks pin keeps its free pages: they serve only requests that fit between its
 * blocks, and the chunk cannot be split or moved without copies (compaction.c). But the driver maps
 * one physical allocation at two addresses at once, whole and from its first byte. So a pinned chunk
 * whose last bytes are free, mapped a second time in unused addresses, puts those bytes right before
 * whatever is mapped after it there, and one whose first bytes are free puts them right after what is
 * mapped before it. When a request would lift reserved memory above its peak, it may go across
 *
 *     [second mapping of chunk E: held | E's free end][new or idle memory][chunk S's free start | held]
 *
 * in the highest unused addresses of its region, needing new pages only for the middle. While the
 * stitch lasts, E's free end and S's free start are held where they lie (GM_BLOCK_HELD: no fit takes
 * them), and so are the parts of the second mappings outside the range. A second mapping is a chunk in
 * the region's books (its pages, its mapped bytes) but not reserved memory, and is never released:
 * its memory is E's or S's, which stay where they are (neither moves nor goes while a stitch holds it:
 * `clones`). Once no live block lies in the range, the stitch is undone: the second mappings go (after
 * the stream has passed their last use: aliases.c), their addresses are unmapped again, the free end
 * and start are free where they lie, and the middle stays, free memory like any other.
 *
 * A stitch lies around the middle that an undone stitch left (a free block of idle chunks between the
 * unmapped addresses of its second mappings), where one is large enough, else at the top of the highest
 * hole: the books decide, however far the device is behind its host, so that where memory goes does not
 * depend on the device's progress. A step that repeats stitches there again, over the last stitch's
 * second mappings, with no page made or moved for the middle: where those mappings are of the same
 * chunks, still mapped (they linger once the stream has passed them: aliases.c), they serve again as
 * they are (chunks.c, pages_map_clone), with no call and no wait; others are unmapped first, after a
 * wait if need be.
 *
 * Only for memory the program has held live before (within a thousandth of the allocated peak: new
 * memory for a new peak is what it needs), and only where the stitch at least halves the window's new
 * pages: stitches that spare less, or that come while live memory climbs, move the layout of later
 * steps for little (docs/engine.md, "Stitching", has what each rule was measured against).
 */
#include "core/pages/pages.h"

#include "base/array.h"
#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

/* The fewest new pages a stitch must spare: one page is not worth two mappings and two set-access calls. */
#define MIN_PAGES_SPARED 2

/* The best free end and free start of the region's pinned chunks: two of each, so that the end and the
 * start can come from different chunks. */
typedef struct edge_choice {
    page_chunk *chunk[2];
    uint64_t bytes[2];
} edge_choice;

typedef struct chunk_walk {
    page_chunk *chunk;
    uint64_t free_start;
    uintptr_t live_end; /* where the last block that is not free ends; 0: none yet */
} chunk_walk;

static void offer(edge_choice *choice, page_chunk *chunk, uint64_t bytes)
{
    if (bytes > choice->bytes[0]) {
        choice->chunk[1] = choice->chunk[0];
        choice->bytes[1] = choice->bytes[0];
        choice->chunk[0] = chunk;
        choice->bytes[0] = bytes;
    } else if (bytes > choice->bytes[1]) {
        choice->chunk[1] = chunk;
        choice->bytes[1] = bytes;
    }
}

/* A chunk may lend its free end or start: mapped here as made (not a second mapping, not lent already),
 * not shared with another process, reachable, with no page made ahead of need. */
static bool may_lend(const page_chunk *chunk)
{
    return !chunk->clone_of && !chunk->clones && !chunk->exported && !chunk->lost && !chunk->stray &&
           !chunk->waiting;
}

static void finish_chunk(const chunk_walk *walk, edge_choice *ends, edge_choice *starts, uint64_t *idle)
{
    if (idle && walk->chunk && !walk->live_end)
        *idle += walk->chunk->size; /* an idle chunk moves whole (growth.c) */
    if (!walk->chunk || !walk->live_end || !may_lend(walk->chunk))
        return;
    offer(ends, walk->chunk, walk->chunk->address + walk->chunk->size - walk->live_end);
    offer(starts, walk->chunk, walk->free_start);
}

/* One walk over the region's blocks in address order, chunk by chunk through the page table; *idle
 * (unless NULL) adds the bytes of the chunks that no block holds. */
static void find_edges(const gm_region *region, uint64_t page_size, edge_choice *ends, edge_choice *starts,
                       uint64_t *idle)
{
    page_chunk **pages = data_of(region)->pages;
    chunk_walk walk = {0};
    for (const gm_block *block = region->first_block; block; block = block->next) {
        if (block->state == GM_BLOCK_UNMAPPED)
            continue;
        uintptr_t end = block->address + block->size;
        for (uintptr_t cursor = block->address; cursor < end;) {
            page_chunk *chunk = pages[page_index(region, cursor, page_size)];
            if (chunk != walk.chunk) {
                finish_chunk(&walk, ends, starts, idle);
                walk = (chunk_walk){chunk, 0, 0};
            }
            uintptr_t piece_end = end < chunk->address + chunk->size ? end : chunk->address + chunk->size;
            if (block->state == GM_BLOCK_FREE && !walk.live_end)
                walk.free_start += piece_end - cursor;
            else if (block->state != GM_BLOCK_FREE)
                walk.live_end = piece_end;
            cursor = piece_end;
        }
    }
    finish_chunk(&walk, ends, starts, idle);
}

void pages_stitch_reach(const gm_region *region, uint64_t page_size, uint64_t *free_end, uint64_t *free_start,
                        uint64_t *idle)
{
    edge_choice ends = {0}, starts = {0};
    *idle = 0;
    find_edges(region, page_size, &ends, &starts, idle);
    *free_end = ends.bytes[0];
    *free_start = starts.bytes[0];
}

/* The plan: which free end and start to use, and the middle's bytes (whole pages). */
typedef struct stitch_plan {
    page_chunk *end_chunk;
    uint64_t end_bytes;
    page_chunk *start_chunk;
    uint64_t start_bytes;
    uint64_t middle;
} stitch_plan;

static uint64_t middle_for(uint64_t size, uint64_t covered, uint64_t page_size)
{
    return size > covered ? gm_round_up(size - covered, page_size) : 0;
}

/* Of end only, start only, and both: the one needing the fewest new pages, ties to fewer mappings. */
static stitch_plan choose_plan(const edge_choice *ends, const edge_choice *starts, uint64_t size, uint64_t page_size)
{
    stitch_plan best = {.middle = UINT64_MAX};
    uint64_t end_bytes = ends->bytes[0], start_bytes = starts->bytes[0];
    page_chunk *start_chunk = starts->chunk[0];
    if (start_chunk && start_chunk == ends->chunk[0]) { /* two different chunks: the better pair */
        if (ends->bytes[0] + starts->bytes[1] >= ends->bytes[1] + starts->bytes[0]) {
            start_chunk = starts->chunk[1];
            start_bytes = starts->bytes[1];
        } else {
            end_bytes = ends->bytes[1];
        }
    }
    page_chunk *end_chunk = end_bytes == ends->bytes[0] ? ends->chunk[0] : ends->chunk[1];
    stitch_plan plans[3] = {
        {end_chunk, end_bytes, NULL, 0, middle_for(size, end_bytes, page_size)},
        {NULL, 0, start_chunk, start_bytes, middle_for(size, start_bytes, page_size)},
        {end_chunk, end_bytes, start_chunk, start_bytes, middle_for(size, end_bytes + start_bytes, page_size)},
    };
    for (int i = 0; i < 3; i++) {
        const stitch_plan *plan = &plans[i];
        if ((plan->end_chunk || !plan->end_bytes) && (plan->start_chunk || !plan->start_bytes) &&
            (plan->end_bytes || plan->start_bytes) && plan->middle < best.middle)
            best = *plan;
    }
    if (best.middle == UINT64_MAX)
        return (stitch_plan){0};
    /* The middle must end inside the free start: a start that does not spare a whole page is left out. */
    if (best.start_chunk && best.middle == middle_for(size, best.end_bytes, page_size))
        best.start_chunk = NULL, best.start_bytes = 0;
    if (best.end_chunk && best.middle == middle_for(size, best.start_bytes, page_size) && best.start_chunk)
        best.end_chunk = NULL, best.end_bytes = 0;
    return best;
}

/* When the idle chunks that fit the middle's hole do not fill it but a larger idle chunk smaller than the
 * request exists, the middle becomes that chunk's size: it moves there whole, beside the free end alone,
 * the free start alone or both (whichever covers the rest of the request first), and no new memory is
 * made. Otherwise the middle's pages would be new memory while the larger chunk stayed idle, and a step
 * that repeats the request would make them again: a long run crept by a middle every step. */
static void widen_to_idle_chunk(gm_arena *arena, stitch_plan *plan, const edge_choice *ends,
                                const edge_choice *starts, uint64_t size)
{
    page_engine *engine = engine_of(arena);
    size_t count = pages_find_idle_chunks(arena, NULL, 0, 0);
    uint64_t fitting = 0, larger = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t chunk_size = engine->idle[i].chunk->size;
        if (chunk_size <= plan->middle)
            fitting += chunk_size;
        else if (chunk_size < size && chunk_size > larger)
            larger = chunk_size;
    }
    if (!larger || fitting >= plan->middle)
        return;
    uint64_t rest = size - larger;
    if (ends->chunk[0] && ends->bytes[0] >= rest)
        *plan = (stitch_plan){ends->chunk[0], ends->bytes[0], NULL, 0, larger};
    else if (starts->chunk[0] && starts->bytes[0] >= rest)
        *plan = (stitch_plan){NULL, 0, starts->chunk[0], starts->bytes[0], larger};
    else if (plan->end_chunk && plan->start_chunk && plan->end_bytes + plan->start_bytes >= rest)
        plan->middle = larger;
}

/* The highest unmapped block of `region` with room for `bytes` (page-aligned from its end), or NULL. */
static gm_block *highest_hole(gm_region *region, uint64_t bytes)
{
    gm_block *best = NULL;
    for (gm_link *link = data_of(region)->unmapped.first; link; link = link->next) {
        gm_block *hole = gm_block_of(link);
        if (hole->size >= bytes && (!best || hole->address > best->address))
            best = hole;
    }
    return best;
}

/* Where an undone stitch left its middle: a free block of idle chunks between two unmapped blocks with
 * room for the plan's second mappings beside it, at least the middle's size but short of the request (else
 * it would have been fitted). The smallest, the highest among equals; NULL if none. A step that repeats a
 * request stitches it there again: no idle chunk moves into a new middle, and the second mappings, at the
 * same addresses, are the last stitch's where they still linger (aliases.c). */
static gm_block *middle_left_in_place(gm_region *region, const stitch_plan *plan, uint64_t size)
{
    uint64_t end_size = plan->end_chunk ? plan->end_chunk->size : 0;
    uint64_t start_size = plan->start_chunk ? plan->start_chunk->size : 0;
    gm_block *best = NULL;
    for (gm_link *link = data_of(region)->unmapped.first; link; link = link->next) {
        gm_block *hole = gm_block_of(link), *middle = hole->next;
        if (!middle || middle->state != GM_BLOCK_FREE || middle->size < plan->middle || middle->size >= size ||
            hole->size < end_size || !middle->next || middle->next->state != GM_BLOCK_UNMAPPED ||
            middle->next->size < start_size)
            continue;
        if (!best || middle->size < best->size || (middle->size == best->size && middle->address > best->address))
            best = middle;
    }
    return best;
}

/* The plan laid around `middle`: the middle its size, a side the request no longer reaches left out. */
static void fit_around(stitch_plan *plan, const gm_block *middle, uint64_t size)
{
    plan->middle = middle->size;
    if (plan->end_chunk && plan->start_chunk && plan->end_bytes + middle->size >= size)
        plan->start_chunk = NULL, plan->start_bytes = 0;
    else if (plan->end_chunk && plan->start_chunk && middle->size + plan->start_bytes >= size)
        plan->end_chunk = NULL, plan->end_bytes = 0;
}

/* A free block counts as inactive split by its neighbours when it is indexed (gm_index_free_block):
 * free neighbours of a block whose state changed are indexed again. */
static void refresh_neighbours(gm_arena *arena, gm_block *block)
{
    gm_block *neighbours[2] = {block->previous, block->next};
    for (int side = 0; side < 2; side++)
        if (neighbours[side] && neighbours[side]->state == GM_BLOCK_FREE && neighbours[side]->indexed) {
            gm_unindex_free_block(arena, neighbours[side]);
            gm_index_free_block(arena, neighbours[side]);
        }
}

/* Out of the unmapped addresses at [start, end): a detached block of `state`. */
static gm_block *carve_unmapped(gm_arena *arena, gm_region *region, uintptr_t start, uintptr_t end, int state)
{
    gm_block *hole = pages_unmapped_at(region, start);
    pages_unmapped_remove(region, hole);
    return pages_carve(arena, hole, start, end, state);
}

/* Hold [start, end) of the free block around it: a detached held block. */
static gm_block *hold_free(gm_arena *arena, gm_region *region, uintptr_t start, uintptr_t end)
{
    gm_block *around = pages_free_block_containing(region, start, end - start);
    gm_unindex_free_block(arena, around);
    return pages_carve(arena, around, start, end, GM_BLOCK_HELD);
}

/* Map a second mapping of `chunk` at `at` whose part [at + offset, at + offset + bytes) is free (its
 * free end or start), the rest held; the free part is held where it lies. */
static gm_status lend(gm_arena *arena, gm_region *region, page_chunk *chunk, uintptr_t at, uint64_t offset,
                      uint64_t bytes, page_chunk **clone_out, gm_block **lent_out, gm_block **outside_out)
{
    page_chunk *clone = gm_system_calloc(1, sizeof *clone);
    if (!clone)
        return GM_ERROR_OUT_OF_MEMORY;
    *clone = (page_chunk){.size = chunk->size, .handle = chunk->handle, .clone_of = chunk};
    gm_status status = pages_map_clone(arena, region, clone, at);
    if (status != GM_OK) {
        free(clone);
        return status;
    }
    uintptr_t free_start = at + offset, free_end = free_start + bytes;
    uintptr_t held_start = offset ? at : free_end, held_end = offset ? free_start : at + chunk->size;
    *outside_out = carve_unmapped(arena, region, held_start, held_end, GM_BLOCK_HELD);
    refresh_neighbours(arena, *outside_out);
    pages_attach(arena, pages_merge_alike(arena, carve_unmapped(arena, region, free_start, free_end, GM_BLOCK_FREE)));
    *lent_out = hold_free(arena, region, chunk->address + offset, chunk->address + offset + bytes);
    refresh_neighbours(arena, *lent_out);
    *clone_out = clone;
    chunk->clones++;
    return GM_OK;
}

/* Whether new memory for `need` bytes, after the idle chunks, would lift reserved memory above its peak. */
static bool lifts_peak(gm_arena *arena, uint64_t need)
{
    uint64_t idle = arena->engine->idle_bytes(arena);
    const gm_stat *reserved = arena->stats->reserved_bytes;
    return need > idle && gm_stat_total(reserved) + (int64_t)(need - idle) > gm_arena_reserved_peak(arena);
}

static bool may_stitch(gm_arena *arena, gm_heap *heap, const window *where)
{
    return arena->options->stitch && where->region && where->region->pool == GM_POOL_LARGE && where->pages &&
           !heap->private_pool && !state_of(heap)->lane &&
           !pages_stream_capturing(arena, heap);
}

/* Lay the plan out around `middle`, a middle left in place, or else at the top of the highest hole with
 * room; record the stitch. */
static gm_status lay_out(gm_arena *arena, gm_region *region, const stitch_plan *plan, const gm_block *middle,
                         page_stitch *stitch)
{
    uint64_t page_size = engine_of(arena)->page_size;
    uint64_t end_size = plan->end_chunk ? plan->end_chunk->size : 0;
    uint64_t total = end_size + plan->middle + (plan->start_chunk ? plan->start_chunk->size : 0);
    *stitch = (page_stitch){.region = region};
    gm_block *hole = middle ? NULL : highest_hole(region, total + page_size);
    /* Host memory first: the blocks it carves, and the old mappings that a refused set-access leaves */
    if ((!middle && !hole) || !gm_block_pool_reserve(&arena->block_pool, 12) || !pages_alias_room(arena, 2))
        return GM_ERROR_OUT_OF_MEMORY;
    uintptr_t at = middle ? middle->address - end_size : page_floor(hole->address + hole->size - total, page_size);
    *stitch = (page_stitch){.region = region, .inner_start = at + end_size - plan->end_bytes,
                            .inner_end = at + end_size + plan->middle + plan->start_bytes};
    gm_status status = GM_OK;
    if (plan->end_chunk)
        status = lend(arena, region, plan->end_chunk, at, end_size - plan->end_bytes, plan->end_bytes,
                      &stitch->end_clone, &stitch->end_lent, &stitch->end_outside);
    if (status == GM_OK && plan->end_chunk)
        stitch->end_chunk = plan->end_chunk;
    if (status == GM_OK && plan->start_chunk) {
        status = lend(arena, region, plan->start_chunk, at + end_size + plan->middle, 0, plan->start_bytes,
                      &stitch->start_clone, &stitch->start_lent, &stitch->start_outside);
        if (status == GM_OK)
            stitch->start_chunk = plan->start_chunk;
    }
    return status;
}

static bool undo(gm_arena *arena, page_stitch *stitch);

gm_status pages_stitch(gm_arena *arena, gm_heap *heap, uint64_t size, const window *where, gm_block **block_out)
{
    page_engine *engine = engine_of(arena);
    uint64_t page_size = engine->page_size;
    *block_out = NULL;
    /* Only for memory the program has held live before: new memory for it is what the layout wastes
     * (while live memory climbs to a new peak, new memory is what it needs). A step that repeats the
     * peak with a few small tensors more passes it by a hair: within a thousandth, it is the same peak. */
    int64_t peak = gm_arena_allocated_peak(arena);
    if (!may_stitch(arena, heap, where) || gm_arena_allocated_bytes(arena) + (int64_t)size > peak + peak / 1000 ||
        !lifts_peak(arena, where->pages * page_size))
        return GM_OK;
    edge_choice ends = {0}, starts = {0};
    find_edges(where->region, page_size, &ends, &starts, NULL);
    stitch_plan plan = choose_plan(&ends, &starts, size, page_size);
    if ((!plan.end_chunk && !plan.start_chunk) || plan.middle / page_size >= where->pages)
        return GM_OK;
    /* A stitch that spares less than half the window's new pages moves the layout for little, and one
     * that spares a single page costs four device calls for it; near the device's capacity, where chunks
     * are small, such stitches of small requests move the layout enough to leave a later request short
     * (docs/engine.md, "Stitching"). */
    uint64_t spared = where->pages - plan.middle / page_size;
    if (plan.middle / page_size * 2 > where->pages || spared < MIN_PAGES_SPARED)
        return GM_OK;
    gm_block *middle = plan.middle ? middle_left_in_place(where->region, &plan, size) : NULL;
    if (middle)
        fit_around(&plan, middle, size);
    else if (plan.middle)
        widen_to_idle_chunk(arena, &plan, &ends, &starts, size);
    page_stitch *grown = gm_array_room_for_one(engine->stitches, engine->stitch_count, &engine->stitch_capacity,
                                                sizeof *grown, 8);
    if (!grown)
        return GM_OK;
    engine->stitches = grown;
    page_stitch stitch;
    gm_status status = lay_out(arena, where->region, &plan, middle, &stitch);
    if (!stitch.end_chunk && !stitch.start_chunk)
        return GM_OK; /* nothing mapped: grow as usual */
    engine->stitches[engine->stitch_count++] = stitch;
    gm_region *region = where->region;
    if (status == GM_OK) {
        gm_block *first = stitch.end_chunk || middle ? pages_free_block_containing(region, stitch.inner_start, 1)
                                                     : pages_unmapped_at(region, stitch.inner_start);
        gm_block *run_first = pages_run_start_of(first), *run_last = pages_run_end_of(first);
        window stitched = {region, run_first, run_first->address, run_last->address + run_last->size,
                           stitch.inner_start, middle ? 0 : plan.middle / page_size, 0};
        status = pages_open_window(arena, stitched, size, block_out);
    }
    if (status == GM_OK) {
        arena->stats->num_stitches++;
        arena->stats->stitch_lent_bytes += (int64_t)(plan.end_bytes + plan.start_bytes);
    } else { /* grow as usual; the stitch, holding no live block, goes */
        *block_out = NULL;
        undo(arena, &engine->stitches[engine->stitch_count - 1]);
    }
    return GM_OK;
}

/* ---------------------------------------------------------------- undoing */

/* Whether no live block lies in [start, end), seen from `inside`, a block of the range. */
static bool holds_nothing(gm_block *inside, uintptr_t start, uintptr_t end)
{
    gm_block *block = inside;
    while (block->previous && block->address > start)
        block = block->previous;
    for (; block && block->address < end; block = block->next)
        if (block->address + block->size > start && !gm_block_is_vacant(block))
            return false;
    return true;
}

/* One side: the second mapping's free part and held part unmapped in the books, the mapping gone, the
 * lent bytes free where they lie. */
static void give_back_side(gm_arena *arena, gm_region *region, page_chunk *chunk, page_chunk *clone,
                           gm_block *lent, gm_block *outside)
{
    uintptr_t free_start = outside->address == clone->address ? outside->address + outside->size : clone->address;
    uintptr_t free_end = outside->address == clone->address ? clone->address + clone->size : outside->address;
    if (free_end > free_start) {
        gm_block *around = pages_free_block_containing(region, free_start, free_end - free_start);
        if (around)
            pages_vacate(arena, around, free_start, free_end);
    }
    outside->state = GM_BLOCK_UNMAPPED;
    gm_block *unmapped = pages_merge_alike(arena, outside);
    pages_attach(arena, unmapped);
    refresh_neighbours(arena, unmapped);
    pages_unmap_clone(arena, region, clone);
    chunk->clones--;
    chunk->freed_at = engine_of(arena)->frees; /* the stitched range's work used these bytes */
    lent->state = GM_BLOCK_FREE;
    lent->heap = region->heap;
    pages_attach(arena, pages_merge_alike(arena, lent));
}

/* Undo `stitch`, whose range holds no live block; false, with nothing changed, without host memory for
 * the blocks it needs or for its second mappings' entries as old mappings (the stitch stays, consistent,
 * until a later free in its range, an empty_cache or its region going). */
static bool undo(gm_arena *arena, page_stitch *stitch)
{
    page_engine *engine = engine_of(arena);
    /* pages_vacate carves two blocks at most a side; each second mapping becomes an old mapping */
    if (!gm_block_pool_reserve(&arena->block_pool, 4) || !pages_alias_room(arena, 2))
        return false;
    if (stitch->end_clone)
        give_back_side(arena, stitch->region, stitch->end_chunk, stitch->end_clone, stitch->end_lent,
                       stitch->end_outside);
    if (stitch->start_clone)
        give_back_side(arena, stitch->region, stitch->start_chunk, stitch->start_clone, stitch->start_lent,
                       stitch->start_outside);
    *stitch = engine->stitches[--engine->stitch_count];
    return true;
}

void pages_unstitch_around(gm_arena *arena, gm_block *block)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->stitch_count; i++) {
        page_stitch *stitch = &engine->stitches[i];
        if (stitch->region == block->region && block->address < stitch->inner_end &&
            block->address + block->size > stitch->inner_start &&
            holds_nothing(block, stitch->inner_start, stitch->inner_end)) {
            undo(arena, stitch);
            return;
        }
    }
}

/* Whether no live block lies in the stitch's range, seen from one of its held blocks (they keep their place). */
static bool is_unused(const page_stitch *stitch)
{
    return holds_nothing(stitch->end_outside ? stitch->end_outside : stitch->start_outside, stitch->inner_start,
                         stitch->inner_end);
}

void pages_undo_unused_stitches(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->stitch_count;) {
        page_stitch *stitch = &engine->stitches[i];
        if (!is_unused(stitch) || !undo(arena, stitch))
            i++; /* else entry i is another stitch now */
    }
}

gm_status pages_undo_stitches_in(gm_arena *arena, const gm_region *region)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->stitch_count;) {
        page_stitch *stitch = &engine->stitches[i];
        if (stitch->region != region) {
            i++;
            continue;
        }
        if (!is_unused(stitch))
            return gm_fail(GM_ERROR_CORRUPT, "a stitched range at 0x%" PRIxPTR " still holds a live block",
                           stitch->inner_start);
        if (!undo(arena, stitch)) /* entry i is another stitch once undone */
            return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    return GM_OK;
}

void pages_drop_stitches(gm_arena *arena)
{
    page_engine *engine = engine_of(arena);
    for (size_t i = 0; i < engine->stitch_count; i++) {
        page_stitch *stitch = &engine->stitches[i];
        page_chunk *clones[2] = {stitch->end_clone, stitch->start_clone};
        for (int side = 0; side < 2; side++)
            if (clones[side])
                pages_drop_clone(arena, stitch->region, clones[side]);
    }
    free(engine->stitches);
    engine->stitches = NULL;
    engine->stitch_count = engine->stitch_capacity = 0;
}
