/*
 * refill.c -- after an empty_cache, the memory it released made again in few chunks, when the step
 * repeats the last one.
 *
 * A training loop that empties the cache at the end of every step makes its memory again in the next
 * step, growth by growth, each growth cut into chunks of at most max_chunk_size (growth.c: so that a
 * live block left in memory made for a big tensor pins one chunk, not all of it), and each chunk costs
 * a cuMemCreate, cuMemMap and cuMemSetAccess, then a cuMemUnmap and cuMemRelease at the next
 * empty_cache. When the step repeats the last one, the engine knows more than a growth does: which
 * memory the last step held at its end, and that no part of it was ever wanted elsewhere on its own.
 *
 * An empty_cache records the runs of adjacent idle chunks it releases (large pool, outside a lane's
 * ring) as groups. A chunk moved in from elsewhere during the step joins none: its memory was made
 * where it came from, and the next step will move it again; a group holding it would make that memory
 * twice. The plan is the groups the empty_cache before released too, as they were -- the step repeated
 * that part of the last one. Every growth's window is logged; once a step has grown exactly as one of
 * the REPEAT_PERIODS steps before it, and while the next one grows as one of them did
 * (pages_follow_growth), the first growth that reaches a group makes all of it -- its part of that
 * growth's unmapped block -- in chunks of at most group_chunk_limit, if reserved memory stays within
 * its peak with it. At the
 * first growth that differs the plan is dropped: a step of other shapes (other lengths, another batch
 * size) grows as the first one did, and so do the steps until the loop has settled (the first steps
 * after a cold one each grow a little differently).
 *
 * The pages that growth does not need are waiting: mapped, counted as reserved, but left under the
 * unmapped block as if they were not there yet. Fits do not see them and windows price them as new
 * pages, so the step places every block where the last step placed it, and the growth that reaches
 * them later takes them without a device call; were they free memory at once, the step's requests
 * would fit into them earlier and elsewhere, and the layout -- and with it the peak -- would drift.
 * A snapshot shows waiting pages as free blocks where they lie (engine.c, unmapped_part_end): mapped
 * memory that no allocation holds, which is what they are to anyone looking, so that its mapped bytes
 * add up to reserved_bytes; the engine's own blocks stay as they are.
 * Waiting pages become free memory (pages_settle_waiting) at an empty_cache and before a region is
 * given back, so that their chunk is released like any other, and when a growth would make new memory
 * above the peak while pages wait (growth.c): the step did not repeat the last one after all, and a
 * group whose block was freed can then move. A program that never empties its cache never has a plan.
 */
#include "core/pages/pages.h"

#include "base/array.h"
#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdlib.h>

/* A step that grows more often than this is not followed: its log would grow without bound. */
#define GROWTH_LOG_LIMIT 16384

/* ---------------------------------------------------------------- lists of ranges */

/* Append [start, end) of `region` to `list`. False without host memory. */
static bool append(refill_list *list, gm_region *region, uintptr_t start, uintptr_t end)
{
    refill_group *grown = gm_array_room_for_one(list->items, list->count, &list->capacity, sizeof *grown, 64);
    if (!grown)
        return false;
    list->items = grown;
    list->items[list->count++] = (refill_group){region, start, end};
    return true;
}

static void free_list(refill_list *list)
{
    free(list->items);
    *list = (refill_list){0};
}

static void forget_region(refill_list *list, const gm_region *region)
{
    size_t kept = 0;
    for (size_t i = 0; i < list->count; i++)
        if (list->items[i].region != region)
            list->items[kept++] = list->items[i];
    list->count = kept;
}

/* Order of region, then start, then end. */
static int compare_ranges(const refill_group *a, const refill_group *b)
{
    if (a->region != b->region)
        return (uintptr_t)a->region < (uintptr_t)b->region ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return a->end < b->end ? -1 : a->end > b->end;
}

void pages_drop_plan(page_engine *engine)
{
    free_list(&engine->plan);
    free_list(&engine->released);
}

void pages_free_refill(page_engine *engine)
{
    pages_drop_plan(engine);
    free_list(&engine->growths);
    for (size_t period = 0; period < REPEAT_PERIODS; period++)
        free_list(&engine->earlier_growths[period]);
}

void pages_forget_region_plan(page_engine *engine, const gm_region *region)
{
    forget_region(&engine->plan, region);
    forget_region(&engine->released, region);
    forget_region(&engine->growths, region);
    for (size_t period = 0; period < REPEAT_PERIODS; period++)
        forget_region(&engine->earlier_growths[period], region);
}

/* ---------------------------------------------------------------- the plan */

static int by_region_and_address(const void *left, const void *right)
{
    const idle_chunk *a = left, *b = right;
    if (a->region != b->region)
        return (uintptr_t)a->region < (uintptr_t)b->region ? -1 : 1;
    return a->chunk->address < b->chunk->address ? -1 : a->chunk->address > b->chunk->address;
}

/* Whether an idle chunk may join a group: large-pool memory made where it lies (not moved in), outside
 * the ring of the stream's lane (a lane takes page-sized chunks, and its ring moves every step). */
static bool may_join_group(const gm_region *region, const page_chunk *chunk)
{
    if (region->pool != GM_POOL_LARGE || chunk->moved)
        return false;
    const page_heap *state = state_of(region->heap);
    return !state || !state->lane || chunk->address + chunk->size <= pages_ring_floor(region);
}

/* The released groups: the runs of adjacent chunks among engine->idle[0, count) that may join one. */
static void record_released(gm_arena *arena, size_t count)
{
    page_engine *engine = engine_of(arena);
    idle_chunk *sorted = count ? gm_system_malloc(count * sizeof *sorted) : NULL;
    if (!sorted)
        return; /* none: the next step grows as the first one did */
    for (size_t i = 0; i < count; i++)
        sorted[i] = engine->idle[i];
    qsort(sorted, count, sizeof *sorted, by_region_and_address);
    refill_list *released = &engine->released;
    for (size_t i = 0; i < count; i++) {
        gm_region *region = sorted[i].region;
        const page_chunk *chunk = sorted[i].chunk;
        if (!may_join_group(region, chunk))
            continue;
        refill_group *last = released->count ? &released->items[released->count - 1] : NULL;
        if (last && last->region == region && last->end == chunk->address)
            last->end += chunk->size;
        else if (!append(released, region, chunk->address, chunk->address + chunk->size))
            break;
    }
    free(sorted);
}

/* Start a step's log: the step just ended becomes the last one, the others move back by one; a log
 * that overflowed is no step to compare with. */
static void start_growth_log(page_engine *engine)
{
    /* Did the step just ended grow as an earlier one did, all through? Only then is the next one
     * followed: a step that repeats the last one for a while and then differs (the first after a cold
     * step, say) would have groups made for a layout it leaves. */
    bool repeated = false;
    for (size_t period = 0; period < REPEAT_PERIODS; period++)
        repeated = repeated || (engine->repeating[period] && !engine->growths.overflowed &&
                                engine->growths.count == engine->earlier_growths[period].count);
    refill_list oldest = engine->earlier_growths[REPEAT_PERIODS - 1];
    for (size_t period = REPEAT_PERIODS - 1; period > 0; period--)
        engine->earlier_growths[period] = engine->earlier_growths[period - 1];
    engine->earlier_growths[0] = engine->growths;
    engine->growths = oldest;
    engine->growths.count = 0;
    engine->growths.overflowed = false;
    bool any = false;
    for (size_t period = 0; period < REPEAT_PERIODS; period++) {
        engine->repeating[period] = engine->logging_growths && !engine->earlier_growths[period].overflowed;
        any = any || engine->repeating[period];
    }
    if (!any || !repeated)
        engine->plan.count = 0;
    engine->logging_growths = true;
}

void pages_plan_refill(gm_arena *arena, size_t count)
{
    page_engine *engine = engine_of(arena);
    refill_list before = engine->released;
    engine->released = (refill_list){0};
    engine->plan.count = 0;
    /* compact_min and rechunk_min remake pinned chunks in parts, which waiting pages would confuse */
    if (!arena->options->refill_groups || arena->options->compact_min || arena->options->rechunk_min) {
        free(before.items);
        return;
    }
    record_released(arena, count);
    /* Both lists are in order: the groups released twice in a row, as they were, are the plan. */
    for (size_t i = 0, j = 0; i < engine->released.count && j < before.count;) {
        const refill_group *group = &engine->released.items[i];
        int order = compare_ranges(group, &before.items[j]);
        if (order == 0 && !append(&engine->plan, group->region, group->start, group->end))
            break;
        i += order <= 0;
        j += order >= 0;
    }
    free(before.items);
    start_growth_log(engine);
}

void pages_follow_growth(gm_arena *arena, const window *where, uint64_t size)
{
    page_engine *engine = engine_of(arena);
    if (!engine->logging_growths || engine->growths.overflowed)
        return;
    refill_group growth = {where->region, where->start, where->start + size};
    size_t index = engine->growths.count;
    bool any = false;
    for (size_t period = 0; period < REPEAT_PERIODS; period++) {
        const refill_list *earlier = &engine->earlier_growths[period];
        engine->repeating[period] = engine->repeating[period] && index < earlier->count &&
                                    compare_ranges(&growth, &earlier->items[index]) == 0;
        any = any || engine->repeating[period];
    }
    if (!any)
        engine->plan.count = 0;
    if (engine->growths.count >= GROWTH_LOG_LIMIT || !append(&engine->growths, growth.region, growth.start, growth.end)) {
        engine->growths.overflowed = true; /* the rest of the step cannot be compared: followed no more */
        engine->plan.count = 0;
    }
}

/* ---------------------------------------------------------------- making a group */

/* Whether every page of [start, end) of `region` is without a chunk. */
static bool all_unbacked(const gm_region *region, uintptr_t start, uintptr_t end, uint64_t page_size)
{
    page_chunk *const *pages = data_of(region)->pages;
    for (uintptr_t page = start; page < end; page += page_size)
        if (pages[page_index(region, page, page_size)])
            return false;
    return true;
}

/* Whether [start, end) may be made now: within the peak of reserved memory, and on a device that has
 * the room. */
static bool may_make(gm_arena *arena, uint64_t size)
{
    const gm_stat *reserved = arena->stats->reserved_bytes;
    uint64_t device_free = 0, device_total = 0;
    return gm_stat_total(reserved) + (int64_t)size <= gm_arena_reserved_peak(arena) &&
           (gm_backend_memory_info(arena->backend, &device_free, &device_total) != GM_OK || device_free >= size);
}

/* The largest chunk a group is made of. A group is memory the last steps released whole, but a step
 * that keeps one block of it past its end (a tensor saved for later) pins the chunk that block lies in
 * through every empty_cache until it is freed: GROUP_CHUNKS_PER_LARGEST_CHUNK chunks of the largest a growth
 * may make now (max_chunk_size, and less as the device fills: chunk_room_share) bound what one such
 * block can keep, where one chunk per group could keep gigabytes. */
#define GROUP_CHUNKS_PER_LARGEST_CHUNK 8
static uint64_t group_chunk_limit(gm_arena *arena)
{
    uint64_t limit = pages_largest_chunk(arena, pages_room_for_new_memory(arena));
    return limit > UINT64_MAX / GROUP_CHUNKS_PER_LARGEST_CHUNK ? UINT64_MAX : limit * GROUP_CHUNKS_PER_LARGEST_CHUNK;
}

/* Make [start, end) of `region` one chunk whose pages all wait. */
static gm_status make_waiting_chunk(gm_arena *arena, gm_region *region, uintptr_t start, uintptr_t end)
{
    page_chunk *chunk = NULL;
    gm_status status = pages_make_chunk(arena, region, end - start, &chunk);
    if (status != GM_OK)
        return status;
    status = pages_map_chunk(arena, region, chunk, start);
    if (status != GM_OK) {
        pages_release_chunk(arena, region, chunk);
        return status;
    }
    chunk->waiting = chunk->size;
    engine_of(arena)->waiting_bytes += chunk->size;
    return GM_OK;
}

void pages_prepare_groups(gm_arena *arena, const window *where, uintptr_t from, uintptr_t to)
{
    page_engine *engine = engine_of(arena);
    gm_region *region = where->region;
    const gm_block *hole = pages_unmapped_at(region, from);
    if (engine->placing_lane || !hole)
        return; /* a lane takes pages */
    uintptr_t hole_end = hole->address + hole->size;
    int64_t spent_before = arena->backend->modelled_ns;
    size_t kept = 0;
    for (size_t i = 0; i < engine->plan.count; i++) {
        refill_group group = engine->plan.items[i];
        if (group.region != region || group.end <= from || group.start >= to) {
            engine->plan.items[kept++] = group;
            continue;
        }
        /* Reached: made now or never (a growth that cannot have it backs its pages as usual). */
        uintptr_t start = group.start > hole->address ? group.start : hole->address;
        uintptr_t end = group.end < hole_end ? group.end : hole_end;
        if (!may_make(arena, end - start) || !all_unbacked(region, start, end, engine->page_size))
            continue;
        uint64_t limit = group_chunk_limit(arena);
        for (uintptr_t piece = start, piece_end; piece < end; piece = piece_end) {
            piece_end = end - piece > limit ? piece + limit : end;
            if (make_waiting_chunk(arena, region, piece, piece_end) != GM_OK)
                break; /* the rest backed as usual */
        }
    }
    engine->plan.count = kept;
    engine->credit_ns -= arena->backend->modelled_ns - spent_before;
}

/* ---------------------------------------------------------------- taking waiting pages */

uintptr_t pages_waiting_part_end(const gm_region *region, uintptr_t from, uintptr_t to, uint64_t page_size,
                                 bool *waiting_out)
{
    page_chunk *const *pages = data_of(region)->pages;
    bool waiting = pages[page_index(region, from, page_size)] != NULL;
    uintptr_t end = from + page_size;
    while (end < to && (pages[page_index(region, end, page_size)] != NULL) == waiting)
        end += page_size;
    *waiting_out = waiting;
    return end;
}

gm_status pages_take_waiting(gm_arena *arena, gm_region *region, uintptr_t from, uintptr_t to,
                             gm_block **opened_out)
{
    page_engine *engine = engine_of(arena);
    gm_block *hole = pages_unmapped_at(region, from);
    *opened_out = NULL;
    if (!hole || hole->address + hole->size < to)
        return gm_fail(GM_ERROR_CORRUPT, "waiting pages at 0x%" PRIxPTR " are not inside one unmapped block", from);
    pages_unmapped_remove(region, hole);
    gm_block *opened = pages_carve(arena, hole, from, to, GM_BLOCK_FREE);
    if (!opened) {
        pages_unmapped_insert(region, hole);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    page_chunk **pages = data_of(region)->pages;
    for (uintptr_t cursor = from; cursor < to;) {
        page_chunk *chunk = pages[page_index(region, cursor, engine->page_size)];
        uintptr_t chunk_end = chunk->address + chunk->size, part_end = chunk_end < to ? chunk_end : to;
        chunk->waiting -= part_end - cursor;
        engine->waiting_bytes -= part_end - cursor;
        cursor = part_end;
    }
    *opened_out = pages_merge_alike(arena, opened);
    return GM_OK;
}

/* The lowest unmapped block of `region` that reaches past `address` and starts before `end`; NULL if
 * none. */
static gm_block *unmapped_from(gm_region *region, uintptr_t address, uintptr_t end)
{
    gm_block *lowest = NULL;
    for (gm_block *block = gm_block_of(data_of(region)->unmapped.first); block; block = gm_block_of(block->link.next))
        if (block->address + block->size > address && block->address < end &&
            (!lowest || block->address < lowest->address))
            lowest = block;
    return lowest;
}

/* Take every waiting page of `chunk` (of `region`) into free space. */
static gm_status settle_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk)
{
    uintptr_t cursor = chunk->address, end = chunk->address + chunk->size;
    while (chunk->waiting) {
        gm_block *hole = unmapped_from(region, cursor, end);
        if (!hole)
            return gm_fail(GM_ERROR_CORRUPT, "chunk 0x%" PRIxPTR " waits with no unmapped block over it", chunk->address);
        uintptr_t from = hole->address > cursor ? hole->address : cursor;
        uintptr_t to = hole->address + hole->size < end ? hole->address + hole->size : end;
        gm_block *opened = NULL;
        gm_status status = pages_take_waiting(arena, region, from, to, &opened);
        if (status != GM_OK)
            return status;
        gm_index_free_block(arena, opened);
        cursor = to;
    }
    return GM_OK;
}

static gm_status settle_region(gm_arena *arena, gm_region *region)
{
    for (gm_link *link = data_of(region)->chunks.first; link; link = link->next) {
        page_chunk *chunk = gm_list_item(link, page_chunk, link);
        gm_status status = chunk->waiting ? settle_chunk(arena, region, chunk) : GM_OK;
        if (status != GM_OK)
            return status;
    }
    return GM_OK;
}

void pages_leave_waiting(gm_arena *arena, gm_region *region, uintptr_t from, uintptr_t to)
{
    page_engine *engine = engine_of(arena);
    page_chunk **pages = data_of(region)->pages;
    for (uintptr_t cursor = from; cursor < to;) {
        page_chunk *chunk = pages[page_index(region, cursor, engine->page_size)];
        chunk->waiting = chunk->size;
        engine->waiting_bytes += chunk->size;
        cursor = chunk->address + chunk->size;
    }
}

gm_status pages_settle_waiting(gm_arena *arena, gm_region *region)
{
    if (!engine_of(arena)->waiting_bytes)
        return GM_OK;
    if (region)
        return settle_region(arena, region);
    for (size_t h = 0; h < arena->heap_count; h++)
        for (gm_region *each = gm_first_region(arena->heaps[h]); each; each = gm_next_region(each)) {
            gm_status status = settle_region(arena, each);
            if (status != GM_OK)
                return status;
        }
    return GM_OK;
}
