/*
 * growth.c -- backing a window with pages: idle chunks moved, or new memory made.
 *
 * The pages a window needs come from idle chunks -- unmapped where they lie and mapped here -- when new
 * memory would raise reserved memory above its peak: GMLake's stitching, free memory in the wrong place
 * or in pieces too small gathered into one contiguous range. Only what the idle chunks cannot cover is
 * made new.
 *
 * Chunk size trades device calls against flexibility: a big chunk costs one cuMemCreate for many pages
 * but stays pinned while any byte of it is live (so no chunk exceeds max_chunk_size); page-sized chunks
 * can each move the moment they are free. Every allocation earns the engine a little device-call credit
 * (device_credit_ns); a growth of a few pages is made of page-sized chunks while the credit covers
 * their cost, anything else of as few chunks as max_chunk_size allows -- and, so that a program that
 * nearly fills the device is not undone by pinned chunks, of none larger than a chunk_room_share-th of
 * the room for new memory: chunks shrink as the device fills. A training loop that grows its memory
 * once gets it in few large chunks; a workload whose tensors keep changing size gets fine-grained
 * chunks as it goes; device-call time stays a small share of the work either way. A memory limit below
 * the device's capacity (GPUMEM_CONF memory_limit, or torch's memory fraction) is a smaller device: the
 * room for new memory is what it leaves, and every rule is the device's. (Every chunk under a limit was
 * once page-sized, and idle chunks moved by choice only near it: a limit set as a precaution cost a
 * device call per page made, and one a little above the need took new room where idle chunks could
 * serve. A program that needs every free page to move can ask for page-sized chunks, max_chunk_size at
 * a page.) Where the room share keeps chunks small (such a device or limit), idle chunks move by choice
 * only above a slack over the allocated peak, new memory made below it: small chunks without one never
 * let a repeating step settle. Nor does memory bounce: a place (a stream's heap and pool) that gave
 * idle chunks away within the last PING_PONG_ALLOCATIONS allocations and needs no more than it gave
 * gets new memory instead of taking chunks back once such bounces have spent their budget
 * (BOUNCE_CREDIT_NS per allocation) -- a page or a stream's working set more reserved, rather than a
 * page move at every operation (alternating 1 MiB and 64 MiB requests, streams freeing each other's
 * memory: bench/adversarial.py). An option (tail_chunk, off by default: one more chunk per growth)
 * makes the last page of a growth a chunk of its own when the request ends inside it, so that a block
 * placed after the request pins one page, not the whole growth. After an empty_cache, a growth in a
 * step that repeats an earlier one may find its pages already made, waiting (refill.c): it takes them
 * as they are.
 */
#include "core/pages/pages.h"

#include "base/error.h"

#include <inttypes.h>

/* Whether `chunk`, idle in `from`, may move to `to` without a wait for its stream (aliases.c): the
 * same stream's work will use it there, after the work still using it where it is, which has not
 * finished as far as the marks tell. Not for a private pool's memory on either side (a captured
 * graph's replays need not follow the stream's order), nor while the stream is being captured, nor for
 * a chunk exported to another process or not reachable where it lies, nor once MAX_ALIASES are kept. */
static bool may_move_ahead(gm_arena *arena, const gm_region *from, const gm_region *to, const page_chunk *chunk)
{
    return engine_of(arena)->alias_count < MAX_ALIASES && from->heap->stream == to->heap->stream &&
           !from->heap->private_pool && !to->heap->private_pool &&
           !chunk->exported && !chunk->lost && !chunk->stray &&
           !pages_stream_capturing(arena, from->heap) &&
           !pages_free_is_done(arena, from->heap, chunk->freed_at);
}

/* Move idle chunks to `address` of the window's region, back to back, at most `room` bytes, until
 * `need` bytes are covered; chunks inside the window's run stay. Returns the bytes mapped. */
static uint64_t move_idle_chunks(gm_arena *arena, const window *where, uintptr_t address, uint64_t need,
                                 uint64_t room, gm_status *status_out)
{
    page_engine *engine = engine_of(arena);
    gm_region *target = where->region;
    *status_out = GM_OK;
    size_t count = pages_sorted_idle_chunks(arena, target, where->run_start, where->run_end);
    /* Memory moved into the small pool stays there (small blocks pin it), and a lane takes pages, not
     * large chunks: move only what is needed. */
    uint64_t limit = target->pool == GM_POOL_SMALL || engine->placing_lane || room < need ? need : room;
    uint64_t mapped = 0;
    size_t first = 0; /* entries before it are taken: with page-sized chunks each pick is the first */
    ptrdiff_t pick;
    while (mapped < need && (pick = pages_pick_idle_chunk(engine->idle, first, count, need - mapped, limit - mapped)) >= 0) {
        idle_chunk *candidate = &engine->idle[pick];
        page_chunk *chunk = candidate->chunk;
        gm_status status = GM_OK;
        if (may_move_ahead(arena, candidate->region, target, chunk)) {
            status = pages_move_chunk_ahead(arena, candidate->region, chunk, target, address + mapped);
        } else if ((status = pages_evict_chunk(arena, candidate->region, chunk)) == GM_OK &&
                   (status = pages_map_chunk(arena, target, chunk, address + mapped)) != GM_OK) {
            pages_release_chunk(arena, candidate->region, chunk); /* out of its old place, not in the new one */
        }
        if (status != GM_OK) {
            *status_out = status;
            return mapped;
        }
        chunk->moved = true; /* its memory was made elsewhere: no group takes it in (refill.c) */
        if (candidate->region != target && !engine->placing_lane) {
            page_region *donor = data_of(candidate->region);
            if (engine->allocations - donor->donated_at >= PING_PONG_ALLOCATIONS)
                donor->donated_bytes = 0;
            donor->donated_at = engine->allocations;
            donor->donated_bytes += chunk->size;
        }
        if (candidate->region->pool != target->pool)
            gm_move_reserved(arena, candidate->region->pool, target->pool, chunk->size);
        pages_take_idle_chunk(engine, pick, &first, &count);
        mapped += chunk->size;
    }
    return mapped;
}

/* Give back idle chunks (outside the window's run) until `need` new bytes no longer lift reserved
 * memory above its peak: for a lane, which takes only what it needs (page-sized chunks, not a large
 * chunk that its blocks would pin in part), idle memory in larger chunks is made anew there in
 * pages. Smallest chunks first. */
static void release_idle_for(gm_arena *arena, const window *where, uint64_t need)
{
    page_engine *engine = engine_of(arena);
    const gm_stat *reserved = arena->stats->reserved_bytes;
    int64_t excess = gm_stat_total(reserved) + (int64_t)need - gm_arena_reserved_peak(arena);
    if (excess <= 0)
        return;
    size_t count = pages_sorted_idle_chunks(arena, where->region, where->run_start, where->run_end), first = 0;
    ptrdiff_t pick;
    uint64_t released = 0;
    while (released < (uint64_t)excess &&
           (pick = pages_pick_idle_chunk(engine->idle, first, count, (uint64_t)excess - released, UINT64_MAX)) >= 0) {
        idle_chunk *candidate = &engine->idle[pick];
        if (pages_evict_chunk(arena, candidate->region, candidate->chunk) != GM_OK)
            return;
        released += candidate->chunk->size;
        pages_release_chunk(arena, candidate->region, candidate->chunk);
        pages_take_idle_chunk(engine, pick, &first, &count);
    }
}

/* Bytes of new physical memory that may be made now, whole pages: what the memory limit leaves, and
 * no more than the device reports free (other processes and the CUDA context use it too). A growth
 * that does not fit is refused as a whole before any cuMemCreate, so that a full device is found out
 * here, not by a failing driver call (which tools such as compute-sanitizer report as errors). */
uint64_t pages_room_for_new_memory(gm_arena *arena)
{
    uint64_t room = 0;
    gm_room_to_reserve(arena, 0, &room); /* a device that cannot say leaves the limit's room */
    return room;
}

/* The largest chunk new memory may be made of: max_chunk_size, and no more than 1/chunk_room_share of
 * `room`, the room for new memory (at least a page). A chunk that live blocks pin in part wastes up to
 * its size, and near the device's capacity that waste is what makes the next growth fail: chunks
 * shrink with the room left, so their number grows with the logarithm of the room used up rather
 * than with the memory made, and a device with room to spare keeps its large chunks. */
uint64_t pages_largest_chunk(gm_arena *arena, uint64_t room)
{
    const page_engine *engine = engine_of(arena);
    uint64_t largest = engine->max_chunk_size;
    int share = arena->options->chunk_room_share;
    if (share > 0 && room / (uint64_t)share < largest)
        largest = room / (uint64_t)share / engine->page_size * engine->page_size;
    return largest < engine->page_size ? engine->page_size : largest;
}

/* New memory for [address, address + need): page-sized chunks in the small pool, in a growth lane,
 * and for a growth of a few pages while the credit covers them; else chunks of pages_largest_chunk() (the
 * last one smaller), so that a live block left in memory made for a big tensor (logits, say) pins at
 * most a chunk, not all of it. With tail_chunk, when the request (ending at `request_end`) ends inside the last
 * page, that page is a chunk of its own: the next block placed after the request starts there, and
 * if it outlives the request it pins that page, not the whole growth.
 * `room` is pages_room_for_new_memory(); a growth beyond it is refused before any device call.
 * *created_out: the bytes made, also on failure. */
static gm_status create_memory(gm_arena *arena, gm_region *region, uintptr_t address, uint64_t need,
                               uintptr_t request_end, uint64_t room, uint64_t *created_out)
{
    page_engine *engine = engine_of(arena);
    uint64_t page_size = engine->page_size, pages = need / page_size;
    bool fine = region->pool == GM_POOL_SMALL || engine->placing_lane ||
                (pages <= FINE_GROWTH_PAGES && engine->credit_ns >= (int64_t)pages * engine->page_chunk_cost_ns);
    uint64_t largest = pages_largest_chunk(arena, room);
    uint64_t piece = fine ? page_size : need < largest ? need : largest;
    uintptr_t end = address + need;
    bool own_tail = arena->options->tail_chunk && !fine && pages >= 2 && request_end > end - page_size &&
                    request_end < end;
    *created_out = 0;
    if (need > room)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no room for %" PRIu64 " bytes of new memory: the memory limit or "
                       "the device's free memory is reached", need);
    gm_status status = GM_OK;
    while (*created_out < need && status == GM_OK) {
        uint64_t size = need - *created_out < piece ? need - *created_out : piece;
        if (own_tail && *created_out + size == need && size > page_size)
            size -= page_size;
        status = pages_create_chunk(arena, region, address + *created_out, size);
        if (status == GM_OK)
            *created_out += size;
    }
    return status;
}


/* The slack of should_recycle: move_slack when set; else SMALL_ROOM_SLACK where the room share keeps
 * chunks small (a device a few times the program's need, or such a limit), since small chunks keep
 * reserved memory so close to the live peak that a step whose fits differ a little from the last
 * one's needs moves, each move leaves an unmapped hole that makes the next step's fits differ again,
 * and the pages never stop moving; with large chunks (the rest of max_chunk_size: a device with room
 * to spare, or page-sized chunks asked for by name) none, nor without a max_chunk_size to be small
 * against (max_chunk_size:0). */
static double move_slack_now(gm_arena *arena, uint64_t new_room)
{
    if (arena->options->move_slack > 0)
        return arena->options->move_slack;
    uint64_t most = engine_of(arena)->max_chunk_size;
    if (most == UINT64_MAX)
        return 0;
    uint64_t largest = pages_largest_chunk(arena, new_room);
    return largest < most / SMALL_ROOM_CHUNK_DIVISOR ? SMALL_ROOM_SLACK : 0;
}

/* Whether a growth of `need` bytes should take idle chunks from elsewhere rather than new memory:
 * when new memory would lift reserved memory above its peak, and above the slack (move_slack_now)
 * over the allocated peak: a little room lets the layout settle. `new_room` is the caller's reading of
 * pages_room_for_new_memory (on CUDA a driver query, so read once per growth). Moves that no new memory
 * could replace happen whatever the slack (the callers check the room). */
static bool should_recycle(gm_arena *arena, uint64_t need, uint64_t new_room)
{
    const gm_stat *reserved = arena->stats->reserved_bytes;
    int64_t after = gm_stat_total(reserved) + (int64_t)need;
    if (after <= gm_arena_reserved_peak(arena))
        return false;
    double slack = move_slack_now(arena, new_room);
    return slack <= 0 || (double)after > (double)gm_arena_allocated_peak(arena) * (1 + slack);
}

/* Whether moving idle chunks to `region` for `need` bytes would bounce: it gave at least as much to
 * another place (not a lane: the lane and its stream's heap trade chunks by design) within the last
 * PING_PONG_ALLOCATIONS allocations, so the move would take back what it gave. */
static bool is_bounce(const gm_arena *arena, const gm_region *region, uint64_t need)
{
    const page_region *data = data_of(region);
    return data->donated_at && engine_of((gm_arena *)arena)->allocations - data->donated_at < PING_PONG_ALLOCATIONS &&
           need <= data->donated_bytes;
}

/* Whether pages for `region` should be new memory although idle chunks could be moved there: the move
 * would bounce, the bounce budget is spent (such moves cost more than BOUNCE_CREDIT_NS per
 * allocation), and new memory fits under the limit. */
static bool is_ping_pong(const gm_arena *arena, const gm_region *region, uint64_t need, uint64_t new_room)
{
    return is_bounce(arena, region, need) && engine_of((gm_arena *)arena)->bounce_credit_ns < 0 &&
           need <= new_room;
}

/* Compaction (compact_min) for `short_of` bytes that idle chunks did not cover: when new memory would
 * lift reserved memory well above its peak, or, whatever the peak, when no new memory can be had for
 * them (then it is that or out of memory). */
static gm_status compact_for_growth(gm_arena *arena, const window *where, uint64_t short_of, uint64_t new_room)
{
    if (short_of > new_room)
        return pages_compact_for(arena, where, short_of - new_room, true);
    if (!should_recycle(arena, short_of, new_room))
        return GM_OK;
    const gm_stat *reserved = arena->stats->reserved_bytes;
    int64_t peak = gm_arena_reserved_peak(arena);
    int64_t excess = gm_stat_total(reserved) + (int64_t)short_of - peak;
    if (excess <= peak / COMPACT_ABOVE_PEAK_DIVISOR)
        return GM_OK;
    return pages_compact_for(arena, where, (uint64_t)excess, false);
}

/* Idle chunks moved to [from, from + need) (room: how far they may reach), when recycling is due or no
 * new memory can be had; the bytes so mapped. */
static uint64_t recycle_idle_into(gm_arena *arena, const window *where, uintptr_t from, uint64_t need,
                                  uint64_t room, uint64_t new_room, gm_status *status)
{
    page_engine *engine = engine_of(arena);
    gm_region *region = where->region;
    if (!(should_recycle(arena, need, new_room) && !is_ping_pong(arena, region, need, new_room)) && need <= new_room)
        return 0;
    int64_t moving_since = arena->backend->modelled_ns;
    engine->moving_by_choice = need <= new_room; /* else no new memory can be had */
    uint64_t mapped = move_idle_chunks(arena, where, from, need, room, status);
    /* Pages made ahead of need that still wait when new memory would lift the peak: the step
     * did not repeat the last one. They become free memory, and chunks no growth took move. */
    if (*status == GM_OK && mapped < need && engine->waiting_bytes && should_recycle(arena, need - mapped, new_room) &&
        (*status = pages_settle_waiting(arena, NULL)) == GM_OK)
        mapped += move_idle_chunks(arena, where, from + mapped, need - mapped, room - mapped, status);
    engine->moving_by_choice = false;
    if (is_bounce(arena, region, need))
        engine->bounce_credit_ns -= arena->backend->modelled_ns - moving_since;
    return mapped;
}

/* New memory for [from, from + need); on a full device any idle memory will do. The bytes mapped. */
static uint64_t create_or_take_idle(gm_arena *arena, const window *where, uintptr_t from, uint64_t need,
                                    uint64_t new_room, gm_status *status)
{
    uint64_t created = 0;
    *status = create_memory(arena, where->region, from, need, where->request_end, new_room, &created);
    if (*status != GM_ERROR_OUT_OF_MEMORY)
        return created;
    uint64_t moved = move_idle_chunks(arena, where, from + created, need - created, need - created, status);
    if (*status == GM_OK && created + moved < need)
        *status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "the device has no room for %" PRIu64 " more bytes",
                          need - created - moved);
    return created + moved;
}

/* The free block over [from, from + mapped), whose pages are now backed, merged with free neighbours. */
static gm_status open_backed(gm_arena *arena, gm_region *region, uintptr_t from, uint64_t mapped,
                             gm_block **opened_out)
{
    gm_block *hole = pages_unmapped_at(region, from); /* evictions may have merged unmapped blocks */
    pages_unmapped_remove(region, hole);
    gm_block *opened = pages_carve(arena, hole, from, from + mapped, GM_BLOCK_FREE);
    if (!opened) {
        pages_unmapped_insert(region, hole);
        pages_leave_waiting(arena, region, from, from + mapped);
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory for block metadata");
    }
    *opened_out = pages_merge_alike(arena, opened);
    return GM_OK;
}

/* Back [from, to), inside an unmapped block, with physical memory: idle chunks first when new memory
 * would raise reserved memory past its peak (or the device is full), then new memory. The mapped
 * part is made accessible and turned into free space merged with its neighbours: *opened_out, the
 * merged free block, detached (NULL if nothing could be mapped). */
static gm_status back_part(gm_arena *arena, const window *where, uintptr_t from, uintptr_t to,
                           gm_block **opened_out)
{
    page_engine *engine = engine_of(arena);
    gm_region *region = where->region;
    gm_block *hole = pages_unmapped_at(region, from);
    uint64_t need = to - from, room = hole->address + hole->size - from;
    if (engine->waiting_bytes) { /* moved chunks stop short of the hole's waiting pages (refill.c) */
        bool waiting = false;
        room = pages_waiting_part_end(region, from, hole->address + hole->size, engine->page_size, &waiting) - from;
    }
    int64_t spent_before = arena->backend->modelled_ns;
    pages_retire_passed_aliases(arena);
    /* Moving idle chunks changes neither reserved memory nor the device's free memory: one reading. */
    uint64_t new_room = pages_room_for_new_memory(arena);
    gm_status status = GM_OK;
    uint64_t mapped = recycle_idle_into(arena, where, from, need, room, new_room, &status);
    if (status == GM_OK && mapped < need && arena->options->compact_min && !engine->placing_lane) {
        int64_t reserved_before = gm_stat_total(arena->stats->reserved_bytes);
        status = compact_for_growth(arena, where, need - mapped, new_room);
        if (gm_stat_total(arena->stats->reserved_bytes) != reserved_before) /* compaction gave memory back */
            new_room = pages_room_for_new_memory(arena);
    }
    if (status == GM_OK && mapped < need && engine->placing_lane && should_recycle(arena, need - mapped, new_room)) {
        engine->moving_by_choice = true;
        release_idle_for(arena, where, need - mapped);
        engine->moving_by_choice = false;
        if (engine->keep_peak && should_recycle(arena, need - mapped, pages_room_for_new_memory(arena)))
            status = GM_ERROR_OUT_OF_MEMORY; /* quietly: the caller has another place (lane_place) */
    }
    if (status == GM_OK && mapped < need)
        mapped += create_or_take_idle(arena, where, from + mapped, need - mapped, new_room, &status);
    engine->credit_ns -= arena->backend->modelled_ns - spent_before;
    *opened_out = NULL;
    if (mapped == 0)
        return status;
    gm_status opened = open_backed(arena, region, from, mapped, opened_out);
    return opened != GM_OK ? opened : status;
}

/* The free block that holds the window [start, end) of the run from `run_first`, detached; NULL if
 * no one free block holds it. */
static gm_block *take_free_block_holding(gm_arena *arena, gm_block *run_first, uintptr_t start, uintptr_t end)
{
    gm_block *block = run_first;
    while (block->address + block->size <= start)
        block = block->next;
    if (block->state != GM_BLOCK_FREE || block->address + block->size < end)
        return NULL;
    gm_unindex_free_block(arena, block);
    return block;
}

/* Map what the window `where` needs for `size` bytes (perhaps nothing: a window inside one free
 * block); *block_out is the free block (detached) that starts at or before the window and covers it. */
gm_status pages_open_window(gm_arena *arena, window where, uint64_t size, gm_block **block_out)
{
    page_engine *engine = engine_of(arena);
    uint64_t page_size = engine->page_size;
    where.request_end = where.start + size;
    uintptr_t end = where.start + size, last_page_end = page_ceiling(end, page_size);
    if (!pages_needed(where.run_first, where.start, end, page_size)) {
        *block_out = take_free_block_holding(arena, where.run_first, where.start, end);
        return *block_out ? GM_OK : gm_fail(GM_ERROR_CORRUPT, "a window needing no page is not one free block");
    }
    pages_follow_growth(arena, &where, size);
    gm_block *opened = NULL;
    /* The unmapped blocks of the run that the window needs, in address order. Backing one turns it
     * into free space merged with its neighbours (`opened`); the walk goes on after that. */
    for (gm_block *block = where.run_first; block && block->address < last_page_end;) {
        uintptr_t from = 0, to = 0;
        if (!pages_part_to_back(block, where.start, end, page_size, &from, &to)) {
            block = block->next;
            continue;
        }
        /* After an empty_cache, the groups this part reaches are made whole first; their pages wait
         * under the unmapped block, and the part is taken in pieces: waiting pages as they are, the
         * others backed (refill.c). */
        bool waiting = false;
        if (engine->plan.count)
            pages_prepare_groups(arena, &where, from, to);
        if (engine->waiting_bytes)
            to = pages_waiting_part_end(where.region, from, to, page_size, &waiting);
        if (opened) /* the previous part: indexed; the next part merges it back */
            gm_index_free_block(arena, opened);
        gm_status status = waiting ? pages_take_waiting(arena, where.region, from, to, &opened)
                                   : back_part(arena, &where, from, to, &opened);
        if (status != GM_OK) {
            if (opened)
                gm_index_free_block(arena, opened);
            return status;
        }
        block = opened->next;
    }
    if (!opened || opened->address > where.start || opened->address + opened->size < end) {
        if (opened)
            gm_index_free_block(arena, opened);
        return gm_fail(GM_ERROR_CORRUPT, "growth did not open the window it chose");
    }
    *block_out = opened;
    return GM_OK;
}


/* Map the window `where` for `size` bytes of `heap`'s `pool` -- a new region's first addresses when
 * it has none (no region had room); *block_out as for open_window. */
gm_status pages_grow(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, window where, gm_block **block_out)
{
    if (!where.region) {
        gm_region *region = NULL;
        gm_status status = pages_add_region(arena, heap, pool, size, &region);
        if (status != GM_OK)
            return status;
        where = (window){region, region->first_block, region->base, region->base + region->size, region->base, 0, 0};
    }
    return pages_open_window(arena, where, size, block_out);
}
