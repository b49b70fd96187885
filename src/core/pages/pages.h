/*
 * pages.h -- the pages engine's shared state and the operations its files offer one another.
 *
 * The engine is these files, each using only those before it:
 *   block_states.c  the four block states and the moves between them (carving, merging)
 *   progress.c      how far a stream's work has come, known without waiting (progress marks)
 *   aliases.c       old mappings of chunks moved ahead of their stream, unmapped once it has passed
 *   chunks.c        regions, chunks of physical memory (made, mapped, unmapped, released) and
 *                   finding idle ones
 *   windows.c       where a request could go in free address space, and what that needs backed
 *   growth.c        backing a window with pages: idle chunks moved, new memory made
 *   lane.c          the growth lane for tensors that keep being replaced by larger copies
 *   lane_sharing.c  a stream's heap and its lane sharing one range: the stream's requests beside the ring
 *   small_borrowing.c  small requests in the stream's large-pool memory while its lane is empty
 *   rechunk.c       an idle chunk that a fit covers in part made anew in two (rechunk_min, off by default)
 *   compaction.c    pinned chunks split around their live pages before a growth lifts the peak
 *                   (compact_min, off by default)
 *   stitching.c     a request laid across second mappings of pinned chunks' free ends and starts
 *                   (stitch, on by default)
 *   refill.c        after an empty_cache, when the step repeats the last one, the memory the
 *                   empty_cache released made again in few chunks (at most 8 x the largest chunk a
 *                   growth may make then: pages_largest_chunk)
 *   engine.c        the engine operations the front end calls
 *
 * Invariants (checked by pages_validate): the blocks of a region tile it; a block's pages are mapped
 * when it is not unmapped, and an unmapped block's pages are not, except those of a chunk made ahead of
 * need after an empty_cache (refill.c: its `waiting` bytes); every chunk is mapped at one place (its old
 * mapping after a move ahead of its stream is not in the books: aliases.c) and the page table points at it
 * from each of its pages, and each group of PAGE_GROUP pages counts those of its pages that point at a
 * chunk (an empty group's count stands for its pages: the one writer of the page table keeps both); a
 * free or unmapped block belongs to its region's heap, an allocated or pending one to the heap that asked
 * for it (a lane's blocks lie in its stream's large-pool region: lane_sharing.c);
 * every free block is in its heap's size index and every unmapped block in its region's unmapped list;
 * a lane lists exactly its allocated and pending blocks, oldest first.
 */
#ifndef GM_PAGES_H
#define GM_PAGES_H

#include "core/arena.h"

#include <stddef.h>
#include <stdint.h>

/* Growths up to this many pages (the size of a tensor that a workload replaces over and over, such
 * as a KV cache) may be made of page-sized chunks; larger ones (activations, logits) are made of
 * chunks as large as max_chunk_size allows, each costing about what one page-sized chunk does. */
#define FINE_GROWTH_PAGES 16
/* Credit never accumulates beyond this, so a burst after a long calm stays bounded. */
#define CREDIT_LIMIT_NS 200000000

/* A place that gave idle chunks away within this many allocations and needs no more again takes new
 * memory rather than moving chunks back, once such moves have spent their budget (growth.c). */
#define PING_PONG_ALLOCATIONS 256
/* What each allocation adds to the budget of such moves (modelled device time): a pattern that keeps
 * moving memory back and forth spends at most about this per allocation before it gets new memory. */
#define BOUNCE_CREDIT_NS 250

/* Where the room share keeps chunks under 1/SMALL_ROOM_CHUNK_DIVISOR of max_chunk_size (a device a few
 * times the program's need, or such a memory limit), moves by choice wait until reserved memory would
 * pass (1 + SMALL_ROOM_SLACK) times the allocated peak, as move_slack asks; below that, new memory
 * (growth.c, should_recycle). */
#define SMALL_ROOM_CHUNK_DIVISOR 2
#define SMALL_ROOM_SLACK 0.02

/* A regrowth: a request at most 1/REGROWTH_FRACTION larger than the block freed right after it (a
 * tensor replaced by a slightly longer copy, as torch.cat grows a KV cache). */
#define REGROWTH_FRACTION 16
#define REGROWTH_SIZES 64       /* recent regrowth sizes remembered per stream */
#define LANE_AFTER_REGROWTHS 48 /* regrowths seen on a stream before its lane opens */

/* A lane copy that would need new pages where the ring goes on moves instead to a free block of the
 * lane's own mapped memory holding at least this many copies (lane.c): fewer would scatter the ring
 * over slivers it cannot reuse. */
#define RING_JUMP_COPIES 5

/* A stream's request fits into a free block bordering a live lane block only if the block leaves this
 * much beside it: less is the ring's next room, which its next copies (a KV cache's tensors, tens of
 * MiB each) need; a free block that large is the stream's free memory as much as the ring's
 * (lane_sharing.c). */
#define RING_FIT_ROOM (256ull << 20)

/* Physical memory made by one cuMemCreate, mapped at exactly one place in the books (the driver may
 * still hold its old mapping for a while after a move ahead of its stream: aliases.c). */
typedef struct page_chunk {
    uintptr_t address; /* where it is mapped */
    uint64_t size;
    uint64_t handle;
    gm_link link; /* in the region's list of chunks, or in the engine's unreleased list */
    uint8_t pool; /* unreleased: the pool its reserved bytes are counted in */
    bool stray;   /* still mapped at `address` though no region holds it (an unmap that failed in
                     the cleanup of a failed map): unmapped before it is released */
    bool lost;    /* held by its region at `address` but its blocks cannot be reached there: compaction
                     could map neither it back nor its copies (pages_keep_unreachable). Not mapped at all
                     unless also stray (mapped without access): unmapping it then makes no device call */
    uint64_t freed_at; /* the engine's free count when a block over it was last freed here; 0: no block
                          has used it since it was mapped here */
    uint64_t waiting;  /* bytes of it made ahead of need (refill.c) that no growth has taken yet: they lie
                          under unmapped blocks, as if not there, until one does */
    bool moved;        /* moved here from elsewhere (growth.c): it joins no group (refill.c) */
    int exported;      /* 1 + the file descriptor exported for gm_share, closed when the chunk goes back
                          to the device; 0: none */
    struct page_chunk *clone_of; /* a second mapping of that chunk (stitching.c): its handle, not counted
                                    as reserved memory, unmapped but never released */
    uint32_t clones;             /* second mappings of it that stitches hold: it neither moves nor goes */
} page_chunk;

#define PAGE_GROUP 64
_Static_assert(PAGE_GROUP <= UINT8_MAX, "a group's count of mapped pages is a uint8_t");

/* The engine's part of a region (region->engine_data). */
typedef struct page_region {
    page_chunk **pages; /* page index -> chunk mapped there, or NULL */
    uint64_t page_count;
    /* How many of each PAGE_GROUP pages are mapped (kept beside `pages` by the one place that writes
     * it): validation walks an unmapped block a group at a time and looks only into groups that hold
     * a mapped page, instead of every page of a region twice the device's size. */
    uint8_t *mapped_in_group;
    uint64_t mapped_bytes;  /* the chunks mapped in it */
    uint64_t donated_at;    /* allocation number when an idle chunk last moved from here elsewhere; 0: never */
    uint64_t donated_bytes; /* bytes moved elsewhere since donated_at's window began */
    gm_list chunks;
    gm_list unmapped; /* unmapped blocks, through gm_block.link */
} page_region;

/* A range of a region: a group, memory an empty_cache released as adjacent chunks, made again in few
 * chunks (refill.c); or the window of a growth, in refill.c's log. */
typedef struct refill_group {
    gm_region *region;
    uintptr_t start;
    uintptr_t end;
} refill_group;

/* A step may repeat the last step or one of the few before it (a loop whose steps alternate between
 * two layouts): how many earlier steps' growths a step is compared with. */
#define REPEAT_PERIODS 2

/* Groups in order of region and address, or a step's growths in the order they came. */
typedef struct refill_list {
    refill_group *items;
    size_t count;
    size_t capacity;
    bool overflowed; /* a log that lost growths (too many, or no host memory): no step to compare with */
} refill_list;

typedef struct idle_chunk {
    page_chunk *chunk; /* NULL once taken */
    gm_region *region;
    uint64_t size;     /* the chunk's, kept once it is taken: the list stays sorted for a binary search */
} idle_chunk;

/* An event recorded on a heap's stream after the free numbered `frees` (progress.c). */
typedef struct progress_mark {
    uint64_t event;
    uint64_t frees;
    bool made; /* the event exists (made on the slot's first use, kept for the next marks) */
} progress_mark;

#define MARKS 4 /* a heap's marks at most */
/* A mark is recorded every this many frees of a heap's memory: one event per 256 frees costs the
 * free path nothing worth counting, and is fine enough that a chunk freed a step ago is covered. */
#ifndef MARK_EVERY_FREES /* a build may set another, to measure what the marks cost */
#define MARK_EVERY_FREES 256
#endif

/* The engine's state for one heap (heap->engine_data). A stream's heap watches for regrowths and,
 * once LANE_AFTER_REGROWTHS were seen, owns a lane: an engine-private heap of the same stream whose
 * live blocks are kept in allocation order and placed as a ring below its top, in the upper part of the
 * stream's large-pool range (lane.c); the lane has no region of its own. */
typedef struct page_heap {
    uint64_t waited_at;          /* the engine's free count up to which this heap's stream's work is known
                                    to have finished (a wait, or a completed mark) */
    uint64_t frees_since_mark;   /* frees of this heap's memory since a mark was last due (progress.c) */
    progress_mark marks[MARKS];  /* a ring: mark_count marks from marks[mark_first], oldest first */
    unsigned mark_first;
    unsigned mark_count;
    gm_heap *owner;              /* lane: the stream's heap it serves; NULL for a stream's heap */
    gm_heap *lane;               /* stream's heap: its lane, once made */
    gm_block *last_large;        /* stream's heap: the last large allocation, until the next free */
    uint64_t regrowth_sizes[REGROWTH_SIZES];
    uint64_t regrowths;
    gm_queue order; /* lane: live (allocated or pending) blocks, oldest first, through gm_block.order */
    uint64_t live;
    uint64_t live_bytes; /* lane: the bytes of those blocks */
    uintptr_t top;       /* lane: the ring's upper end, 0 until its first request */
} page_heap;

/* Old mappings kept at most: every mapping and every growth looks through them, so a stream that keeps
 * work queued while many page-sized chunks move (near the capacity) would make each growth slower;
 * beyond this many a move waits for its stream, as before, and that wait lets them all go. */
#define MAX_ALIASES 128

/* Undone stitches' second mappings kept past their stream's passing, at most (aliases.c). */
#define MAX_LINGERING_ALIASES 16

/* The old mapping of a chunk moved ahead of its stream (aliases.c): the chunk is mapped elsewhere too,
 * and these addresses, unmapped in the books, stay mapped until the stream has passed its free. */
typedef struct page_alias {
    uintptr_t address;
    uint64_t size;
    uint64_t handle;   /* the chunk's physical memory */
    gm_heap *heap;     /* the heap whose stream's work may still use the old addresses */
    uint64_t freed_at; /* the engine's free count at the chunk's last free there */
    bool without_access; /* a second mapping the driver refused access to (chunks.c): never reused */
    bool lingering;      /* an undone stitch's second mapping: kept once its stream has passed it too */
} page_alias;

/* A stitched range (stitching.c): [inner_start, inner_end) of `region` lies across a second mapping of
 * the free end of `end_chunk` (its first bytes, outside the range, held), memory of the region's own, and a
 * second mapping of the free start of `start_chunk` (its last bytes held). Each side is optional. The
 * free end and start are held where they lie (`end_lent`, `start_lent`) while the stitch lasts. */
typedef struct page_stitch {
    gm_region *region;
    uintptr_t inner_start;
    uintptr_t inner_end;
    page_chunk *end_chunk, *end_clone;
    gm_block *end_lent, *end_outside;
    page_chunk *start_chunk, *start_clone;
    gm_block *start_lent, *start_outside;
} page_stitch;

typedef struct page_engine {
    /* Read or counted by every allocation and free: first, in one cache line. */
    uint64_t page_size;
    int64_t credit_ns;
    int64_t credit_per_allocation;
    int64_t bounce_credit_ns;    /* BOUNCE_CREDIT_NS per allocation, spent on moves that bounce, and on
                                    every move by choice under a memory limit (growth.c) */
    uint64_t frees;              /* blocks freed so far: the clock of freed_at and waited_at */
    uint64_t allocations;        /* allocations served so far */
    uint64_t lost_chunks;        /* chunks kept in the books though their blocks cannot be reached
                                    (pages_keep_unreachable): no allocation until they are idle and
                                    given back (pages_allocate) */
    size_t stitch_count;         /* stitched ranges (stitching.c): every free asks whether one is in it */

    uint64_t region_size;
    int64_t page_chunk_cost_ns;  /* what one page-sized chunk costs (create, map, set access) */
    uint64_t max_chunk_size;     /* whole pages; UINT64_MAX: no limit */
    idle_chunk *idle;            /* scratch list for the growth path */
    size_t idle_capacity;
    bool placing_lane;           /* the window being backed is a lane's: page-sized chunks, only what it needs */
    bool keep_peak;              /* placing in a lane: refuse new memory above the peak (lane_place) */
    bool moving_by_choice;       /* idle chunks are looked for to keep reserved memory at its peak, not
                                    because new memory cannot be had: those of another stream than the
                                    asking region's that is still at work stay where they are
                                    (pages_find_idle_chunks) */
    gm_list unreleased;          /* chunks unmapped whose release failed: still reserved, released later */
    page_alias *aliases;         /* old mappings of chunks moved ahead of their stream (aliases.c) */
    size_t alias_count;
    size_t alias_capacity;
    refill_list released;        /* the groups the last empty_cache released (refill.c) */
    refill_list plan;            /* those of them the empty_cache before released too, not made again yet */
    refill_list growths;         /* the windows grown since the last empty_cache, in order (refill.c) */
    refill_list earlier_growths[REPEAT_PERIODS]; /* those of the steps before: [0] the last one, [1] the one
                                                     before it, ... */
    bool repeating[REPEAT_PERIODS]; /* whether this step has grown as that earlier one so far */
    bool logging_growths;        /* from the first empty_cache on */
    uint64_t waiting_bytes;      /* the chunks' waiting bytes, all together */
    page_stitch *stitches;       /* stitch_count stitched ranges (stitching.c) */
    size_t stitch_capacity;
} page_engine;

static inline page_engine *engine_of(gm_arena *arena)
{
    return (page_engine *)arena->engine_state;
}

static inline page_region *data_of(const gm_region *region)
{
    return (page_region *)region->engine_data;
}

static inline page_heap *state_of(const gm_heap *heap)
{
    return (page_heap *)heap->engine_data;
}

/* Count one free of `heap`'s memory; whether a progress mark is due (every MARK_EVERY_FREES frees).
 * Inline: the free path pays an increment, and a call only when a mark is due. */
static inline bool pages_mark_due(const gm_heap *heap)
{
    page_heap *state = state_of(heap);
    if (!state || ++state->frees_since_mark < MARK_EVERY_FREES)
        return false;
    state->frees_since_mark = 0;
    return true;
}

static inline uint64_t page_index(const gm_region *region, uintptr_t address, uint64_t page_size)
{
    return (address - region->base) / page_size;
}

static inline uintptr_t page_floor(uintptr_t address, uint64_t page_size)
{
    return address / page_size * page_size;
}

static inline uintptr_t page_ceiling(uintptr_t address, uint64_t page_size)
{
    return (address + page_size - 1) / page_size * page_size;
}

/* ---------------------------------------------------------------- block_states.c */

void pages_unmapped_insert(gm_region *region, gm_block *block);
void pages_unmapped_remove(gm_region *region, gm_block *block);
/* The unmapped block of `region` that contains `address`. */
gm_block *pages_unmapped_at(gm_region *region, uintptr_t address);
/* Put a detached free or unmapped block where it belongs. */
void pages_attach(gm_arena *arena, gm_block *block);
/* Merge the detached `block` with neighbours of its own state (free or unmapped), which are
 * detached and absorbed; the merged block is returned, still detached. */
gm_block *pages_merge_alike(gm_arena *arena, gm_block *block);
/* Carve [start, end) out of the detached block `block` (which contains it): the pieces before and
 * after keep the old state and are attached; the middle gets `state` and is returned detached.
 * NULL if block metadata ran out (nothing changed then). */
gm_block *pages_carve(gm_arena *arena, gm_block *block, uintptr_t start, uintptr_t end, int state);

/* ---------------------------------------------------------------- chunks.c */

/* A new region of `heap`'s `pool` for a request of `size` bytes. */
gm_status pages_add_region(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, gm_region **region_out);
/* Map `chunk` at `address` of `region` and make it accessible. */
gm_status pages_map_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk, uintptr_t address);
gm_status pages_unmap_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk);
/* Keep `chunk` in `region`'s books at its address though it could not be mapped there (lost): its
 * blocks stay allocated and every book consistent, but the device cannot reach their memory. */
void pages_keep_unreachable(gm_arena *arena, gm_region *region, page_chunk *chunk);
/* Give back every lost chunk that no live block uses any more; GM_ERROR_DEVICE while one still holds a
 * live block: its free memory is not mapped, so nothing may be placed anywhere until then. */
gm_status pages_give_back_lost_chunks(gm_arena *arena);
/* Make a chunk of `size` bytes and map it at `address` (the caller has checked the room for it). */
gm_status pages_create_chunk(gm_arena *arena, gm_region *region, uintptr_t address, uint64_t size);
/* Bytes of new physical memory that may be made now, whole pages: what the memory limit leaves, and no
 * more than the device reports free (growth.c). */
uint64_t pages_room_for_new_memory(gm_arena *arena);
/* The largest chunk new memory may be made of when `room` bytes of new memory can be had: max_chunk_size,
 * and at most 1/chunk_room_share of the room, at least a page (growth.c). */
uint64_t pages_largest_chunk(gm_arena *arena, uint64_t room);
/* A chunk of `size` bytes of new physical memory, counted in `region`'s pool, not mapped anywhere. */
gm_status pages_make_chunk(gm_arena *arena, const gm_region *region, uint64_t size, page_chunk **chunk_out);
/* Give an unmapped chunk (no longer in a region) back to the device. If the device refuses, the chunk
 * waits in the engine's unreleased list, still counted as reserved, for pages_retry_releases. */
void pages_release_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk);
/* Try again to release the chunks whose release failed (before memory is given back or made). */
void pages_retry_releases(gm_arena *arena);
/* The free block of `region` that contains [address, address + size), or NULL. */
gm_block *pages_free_block_containing(gm_region *region, uintptr_t address, uint64_t size);
/* Turn [from, to) of the free block `around` (indexed), whose pages are no longer mapped, into unmapped
 * addresses. On failure (no block metadata) nothing changed. */
gm_status pages_vacate(gm_arena *arena, gm_block *around, uintptr_t from, uintptr_t to);
/* progress.c: record a mark on `heap`'s stream (called when pages_mark_due says one is due). */
void pages_mark_progress(gm_arena *arena, gm_heap *heap);
/* Return once the work queued on `heap`'s stream before the free numbered `freed_at` has finished:
 * at once if a wait or a completed mark covers it, else after waiting for the oldest mark after it, or
 * for a new event. */
gm_status pages_wait_for_free(gm_arena *arena, gm_heap *heap, uint64_t freed_at);
/* Whether the work queued on `heap`'s stream before the free numbered `freed_at` is known to have
 * finished: a wait or a completed mark covers it (the marks are asked, never waited for). */
bool pages_free_is_done(gm_arena *arena, gm_heap *heap, uint64_t freed_at);
/* Whether a mark recorded after the free numbered `freed_at` is kept (a wait for it records no event). */
bool pages_has_mark_after(const gm_heap *heap, uint64_t freed_at);
/* Whether pages_wait_for_free may be asked for the free numbered `freed_at` while `heap`'s stream is
 * being captured into a graph: only when it records no event (the free is done, or a mark recorded
 * before the capture covers it); an event recorded now would join the graph, and a wait for it fail. */
bool pages_wait_is_capturable(gm_arena *arena, gm_heap *heap, uint64_t freed_at);
/* Record a mark on `heap`'s stream unless one recorded after the free numbered `freed_at` is kept, so
 * that asking the marks will tell when that free's work has finished (none during a graph capture). */
void pages_mark_after(gm_arena *arena, gm_heap *heap, uint64_t freed_at);
/* Destroy `heap`'s marks (the heap goes). */
void pages_forget_marks(gm_arena *arena, gm_heap *heap);
/* What the engine asks of a heap's stream, through these only. A borrowed stream (the heap's, or that of
 * the heap an engine-private one serves) is never asked: never captured, always busy. */
bool pages_stream_borrowed(const gm_heap *heap);
bool pages_stream_capturing(gm_arena *arena, const gm_heap *heap);
bool pages_stream_busy(gm_arena *arena, const gm_heap *heap);
/* Whether a stream of the engine's heaps that may be asked is being captured into a CUDA graph. */
bool pages_any_stream_capturing(gm_arena *arena);
/* aliases.c: room for `more` more aliases (host memory); false if there is none. */
bool pages_alias_room(gm_arena *arena, size_t more);
/* Keep `alias` until its stream has passed its free (pages_alias_room made the room). */
void pages_add_alias(gm_arena *arena, const page_alias *alias);
/* Unmap the aliases whose stream has passed their free, asking without waiting. */
void pages_retire_passed_aliases(gm_arena *arena);
/* Unmap the aliases that overlap [start, end), waiting for their stream where it has not passed their
 * free: before anything is mapped there, or the addresses go back. */
gm_status pages_retire_aliases_in(gm_arena *arena, uintptr_t start, uintptr_t end);
/* Unmap the aliases of the physical memory `handle`, waiting as above: before it goes back. */
gm_status pages_retire_aliases_of(gm_arena *arena, uint64_t handle);
/* Whether an alias of `handle` mapped exactly at [address, address + size), with access, was there: it
 * leaves the list still mapped, for the caller to use as a mapping of its own (no device call, no wait:
 * the work that used it is queued on the same stream as the work that will). */
bool pages_adopt_alias(gm_arena *arena, uintptr_t address, uint64_t size, uint64_t handle);
/* The allocator goes: unmap every alias without waiting, as its chunks are. */
void pages_drop_aliases(gm_arena *arena);

/* Unmap an idle chunk from the free block around it; its addresses become unmapped. The chunk keeps
 * its handle and leaves the region. */
gm_status pages_evict_chunk(gm_arena *arena, gm_region *region, page_chunk *chunk);
/* Move the idle chunk `chunk` of `from` to `address` of `to` without waiting for its stream: mapped
 * there first, its old mapping kept as an alias until the stream has passed its free (aliases.c); in
 * the books its old addresses become unmapped. Only for a move within one stream (the caller checks).
 * On failure the chunk stays where it was, or (mapped there without access) goes back to the device. */
gm_status pages_move_chunk_ahead(gm_arena *arena, gm_region *from, page_chunk *chunk, gm_region *to,
                                 uintptr_t address);
/* The chunks under `block` for another process (engine operation share_block, gm_share). */
gm_status pages_share_block(gm_arena *arena, const gm_block *block, uint64_t *offset_out, gm_shared_piece *pieces,
                            size_t capacity, size_t *count_out);
/* Give physical memory back to the device, closing the descriptor exported for it. */
void pages_release_physical(gm_arena *arena, page_chunk *chunk);
/* Let device `peer` reach every chunk mapped in a region now (engine operation grant_peer_access). */
gm_status pages_grant_peer_access(gm_arena *arena, int peer);
/* Collect into engine->idle every chunk that lies wholly inside a free block, in every heap and
 * pool, except in [keep_start, keep_end) of `keep_region`: their count. */
size_t pages_find_idle_chunks(gm_arena *arena, const gm_region *keep_region, uintptr_t keep_start,
                              uintptr_t keep_end);
/* The same, smallest first. */
size_t pages_sorted_idle_chunks(gm_arena *arena, const gm_region *keep_region, uintptr_t keep_start,
                                uintptr_t keep_end);
/* The next idle chunk to move for `remaining` bytes with at most `room` bytes of space: the smallest
 * that covers what remains, else the largest that does not. -1 if none fits the room. */
ptrdiff_t pages_pick_idle_chunk(const idle_chunk *idle, size_t first, size_t count, uint64_t remaining,
                                uint64_t room);
/* Mark engine->idle[pick] taken; *first moves past the taken entries at the front, *count before those
 * at the end. */
void pages_take_idle_chunk(page_engine *engine, ptrdiff_t pick, size_t *first, size_t *count);

/* ---------------------------------------------------------------- windows.c */

/* Free address space is free whether mapped or not: a run is a maximal sequence of free and
 * unmapped blocks. A window is where a request could go inside a run; its cost is the number of
 * unmapped pages it needs backed. */
typedef struct window {
    gm_region *region;
    gm_block *run_first; /* the run's first block */
    uintptr_t run_start;
    uintptr_t run_end;
    uintptr_t start;
    uint64_t pages;
    uintptr_t request_end; /* start + the request's size, once chosen */
} window;

/* The first block of the run of vacant blocks that ends with `last`. */
gm_block *pages_run_start_of(gm_block *last);
/* The last block of the run of vacant blocks that begins with `first`. */
gm_block *pages_run_end_of(gm_block *first);
/* The part of the unmapped block `block` that [start, end) needs backed, as [from, to). */
bool pages_part_to_back(const gm_block *block, uintptr_t start, uintptr_t end, uint64_t page_size, uintptr_t *from,
                        uintptr_t *to);
/* The unmapped pages that [start, end) needs backed, in the run from `first`. */
uint64_t pages_needed(const gm_block *first, uintptr_t start, uintptr_t end, uint64_t page_size);
/* Whether a run (first to last block) may take a request; NULL accepts every run. */
typedef bool (*run_filter)(const gm_block *first, const gm_block *last);
/* The window for `size` bytes needing the fewest new pages, over every run of the heap's pool that
 * `accept` accepts; region NULL if none has room. */
window pages_choose_window(gm_heap *heap, int pool, uint64_t size, uint64_t page_size, run_filter accept);

/* ---------------------------------------------------------------- growth.c */

/* Map what the window `where` needs for `size` bytes (perhaps nothing: a window inside one free
 * block); *block_out is the free block (detached) that starts at or before the window and covers it. */
gm_status pages_open_window(gm_arena *arena, window where, uint64_t size, gm_block **block_out);
/* Map the window `where` for `size` bytes of `heap`'s `pool` -- a new region's first addresses when
 * it has none (no region had room); *block_out as for pages_open_window. */
gm_status pages_grow(gm_arena *arena, gm_heap *heap, int pool, uint64_t size, window where, gm_block **block_out);
/* Cut the detached free block `block` to `size` bytes; the rest goes back to the index. */
static inline void pages_trim_to_size(gm_arena *arena, gm_block *block, uint64_t size)
{
    if (block->size == size) /* an exact fit (a training loop's usual one) calls nothing */
        return;
    gm_block *rest = gm_split_block(&arena->block_pool, block, size);
    if (rest)
        gm_index_free_block(arena, rest);
}


/* ---------------------------------------------------------------- lane.c */

/* The engine's state of a heap, made on its first request. */
gm_status pages_new_heap_state(gm_heap *heap);
/* Whether `size` is within 1/REGROWTH_FRACTION of a recent regrowth of the stream `state` watches. */
static inline bool pages_is_regrowing_size(const page_heap *state, uint64_t size)
{
    uint64_t margin = size / REGROWTH_FRACTION;
    for (size_t i = 0; i < REGROWTH_SIZES; i++)
        if (state->regrowth_sizes[i] && state->regrowth_sizes[i] <= size + margin &&
            state->regrowth_sizes[i] + margin >= size)
            return true;
    return false;
}

/* A free of `block` on the stream `state` watches: a regrowth when it follows the allocation of a
 * block slightly larger (the replacement allocated, then the old one freed). */
static inline void pages_watch_free(page_heap *state, const gm_block *block, uint64_t page_size)
{
    const gm_block *last = state->last_large;
    state->last_large = NULL;
    if (!last || last == block || block->pool != GM_POOL_LARGE || block->size < page_size ||
        last->size <= block->size || last->size > block->size + block->size / REGROWTH_FRACTION)
        return;
    state->regrowth_sizes[state->regrowths++ % REGROWTH_SIZES] = last->size;
}

/* Whether a request of `size` bytes in `pool`, on the stream `state` watches, goes to its lane. */
static inline bool pages_goes_to_lane(gm_arena *arena, const page_heap *state, int pool, uint64_t size)
{
    return arena->options->growth_lane && pool == GM_POOL_LARGE && size >= engine_of(arena)->page_size &&
           state->regrowths >= LANE_AFTER_REGROWTHS && pages_is_regrowing_size(state, size);
}

/* The lane of the stream's heap `heap`, made on first use; NULL without host memory. */
gm_heap *pages_lane_of(gm_arena *arena, gm_heap *heap);
/* Place a request in the stream's lane; GM_ERROR_OUT_OF_MEMORY when it should go to the stream's own
 * heap instead. The block is appended to the lane's order. */
gm_status pages_lane_place(gm_arena *arena, gm_heap *heap, gm_heap *lane, uint64_t size, gm_block **block_out);
/* A lane block leaves the lane's order (it is freed). */
void pages_lane_remove(page_heap *lane, gm_block *block);
/* A lane's allocation-order list holds exactly its allocated and pending blocks. */
gm_status pages_validate_lane(const gm_heap *heap);

/* ---------------------------------------------------------------- lane_sharing.c */

/* The ring's part of a stream's large-pool region: its addresses from here up (lane.c keeps the ring
 * there; the stream's own blocks start at the region's base). */
static inline uintptr_t pages_ring_floor(const gm_region *region)
{
    return region->base + region->size / 4;
}
/* A fit for a request of the stream's heap `heap`: the size index's, unless it lies in the way of
 * the stream's lane (a free block bordering a live lane block without RING_FIT_ROOM beside the
 * request): then the first other block that fits, or NULL. */
gm_block *pages_fit_among_lane(gm_heap *heap, gm_block *fit, uint64_t size);
static inline gm_block *pages_fit_beside_lane(gm_heap *heap, int pool, uint64_t size)
{
    gm_block *block = gm_size_index_find(gm_heap_index(heap, pool), size);
    gm_heap *lane = heap->engine_data ? state_of(heap)->lane : NULL;
    if (!block || !lane || !state_of(lane)->live || pool != GM_POOL_LARGE)
        return block; /* no live ring beside: the size index's fit (inline: the common case) */
    return pages_fit_among_lane(heap, block, size);
}
/* A run filter (pages_choose_window) for the stream's growth: not a run between two live lane blocks. */
bool pages_run_outside_lane(const gm_block *first, const gm_block *last);

/* ---------------------------------------------------------------- small_borrowing.c */

/* Small requests of at least 1/SMALL_BORROW_PAGE_FRACTION of a page may borrow the stream's large-pool
 * memory (small_borrowing.c); smaller ones, temporaries for the most part, stay in the small pool. */
#define SMALL_BORROW_PAGE_FRACTION 32

/* For a small request of `size` bytes of the stream's heap `heap` that no free block of its small pool
 * fits: a free block (indexed) of the stream's own part of its large-pool range, when the stream's lane
 * exists but holds no block and a new small-pool page would lift reserved memory above its peak; else
 * NULL (the small pool grows). */
gm_block *pages_borrow_for_small(gm_arena *arena, gm_heap *heap, uint64_t size);

/* ---------------------------------------------------------------- rechunk.c */

/* Called only with rechunk_min set (engine.c asks first, so the default path makes no call): when a
 * block of `size` bytes at the start of the free block `block` (a fit, still indexed) would leave at
 * least rechunk_min bytes of an idle chunk uncovered, that chunk is made anew in two and *block_out is
 * the detached free block, starting where `block` did, that holds the block's pages. *block_out NULL:
 * nothing was done (the fit proceeds as usual). */
gm_status pages_rechunk_fit(gm_arena *arena, gm_block *block, uint64_t size, gm_block **block_out);

/* ---------------------------------------------------------------- refill.c */

/* An empty_cache is about to release the idle chunks engine->idle[0, count): the groups it releases are
 * their runs of adjacent chunks (but those moved in); those that the empty_cache before released too
 * (the step repeated that part of the last one) are the plan. */
void pages_plan_refill(gm_arena *arena, size_t count);
/* A growth into the window `where` for `size` bytes. After an empty_cache it is logged, and when it is
 * not the growth that any of the last REPEAT_PERIODS steps made at this point, the step repeats none of
 * them: no group is made from then on. (Nor in a step after one that did not repeat an earlier one all
 * through: pages_plan_refill.) */
void pages_follow_growth(gm_arena *arena, const window *where, uint64_t size);
/* No more groups: memory is wanted back (a release that keeps some). */
void pages_drop_plan(page_engine *engine);
/* The engine's lists freed (the engine goes). */
void pages_free_refill(page_engine *engine);
/* The groups and logged growths of `region` go with it. */
void pages_forget_region_plan(page_engine *engine, const gm_region *region);
/* Before [from, to) of an unmapped block of the window's region is backed: each planned group it
 * touches is made over the group's part of that block, in chunks of at most 8 x pages_largest_chunk, if
 * reserved memory stays within its peak; its pages stay under the unmapped block (waiting) until a
 * growth takes them. */
void pages_prepare_groups(gm_arena *arena, const window *where, uintptr_t from, uintptr_t to);
/* The end of the part of [from, to) (in an unmapped block) whose pages are all waiting, or all not
 * backed, as the page at `from` is (*waiting_out). */
uintptr_t pages_waiting_part_end(const gm_region *region, uintptr_t from, uintptr_t to, uint64_t page_size,
                                 bool *waiting_out);
/* Turn [from, to) of an unmapped block, whose pages are all waiting, into free space merged with its
 * neighbours: *opened_out, detached. */
gm_status pages_take_waiting(gm_arena *arena, gm_region *region, uintptr_t from, uintptr_t to,
                             gm_block **opened_out);
/* Every waiting page of `region` (NULL: of every region) taken into free space, so that its chunks
 * can be released or moved like any other. */
gm_status pages_settle_waiting(gm_arena *arena, gm_region *region);
/* The chunks mapped over [from, to) of an unmapped block (whole chunks, none waiting) left waiting there,
 * when no metadata could be had to mark the part free: counted as reserved, and taken or settled later
 * like memory made ahead, so the books stay exact. */
void pages_leave_waiting(gm_arena *arena, gm_region *region, uintptr_t from, uintptr_t to);

/* ---------------------------------------------------------------- stitching.c */

/* With the stitch option: when the window `where` would need new pages above the peak, a free block of
 * at least `size` bytes (detached) laid across second mappings of pinned chunks' free end and start, if
 * that needs fewer new pages; *block_out NULL otherwise (the caller grows as usual). */
gm_status pages_stitch(gm_arena *arena, gm_heap *heap, uint64_t size, const window *where, gm_block **block_out);
/* What a stitch could take in `region`: the largest free end and the largest free start of a chunk that
 * live blocks pin and that may lend them (not necessarily two chunks), and the bytes of its idle chunks
 * (for gpumem_peak_excess --stitch). */
void pages_stitch_reach(const gm_region *region, uint64_t page_size, uint64_t *free_end, uint64_t *free_start,
                        uint64_t *idle);
/* After a free merged into `block` (indexed): undo the stitch whose range no live block holds any more. */
void pages_unstitch_around(gm_arena *arena, gm_block *block);
/* Undo every stitch whose range holds no live block (one that an undo without host memory left): at an
 * empty_cache. */
void pages_undo_unused_stitches(gm_arena *arena);
/* Before `region` goes: undo its stitches (none may hold a live block). */
gm_status pages_undo_stitches_in(gm_arena *arena, const gm_region *region);
/* The allocator goes: every second mapping unmapped, the stitches forgotten. */
void pages_drop_stitches(gm_arena *arena);
/* chunks.c: map `clone` (a second mapping of clone->clone_of) at `address` of `region`, with access; in
 * the region's books as a chunk, without history event or reserved bytes. */
gm_status pages_map_clone(gm_arena *arena, gm_region *region, page_chunk *clone, uintptr_t address);
/* chunks.c: `clone` out of `region`'s books and freed; its mapping goes once the region's stream has
 * passed its last use (an old mapping, aliases.c), or, while the stream is being captured, now after a
 * wait (an old mapping should that fail). The caller makes room for one alias first (pages_alias_room),
 * so that the mapping is never lost. */
void pages_unmap_clone(gm_arena *arena, gm_region *region, page_chunk *clone);
/* chunks.c, the allocator going: `clone` out of `region`'s list of chunks, unmapped now, its exported
 * descriptor closed, freed. */
void pages_drop_clone(gm_arena *arena, gm_region *region, page_chunk *clone);

/* ---------------------------------------------------------------- compaction.c */

/* A growth lifting the peak by at most 1/COMPACT_ABOVE_PEAK_DIVISOR of it lifts it: compacting for
 * every page above the peak keeps reserved memory at the peak's edge, and each later pass compacts
 * again; small rises let the layout settle. */
#define COMPACT_ABOVE_PEAK_DIVISOR 200

/* Called only with compact_min set, when a growth into `where` would lift reserved memory `need` bytes
 * above its peak (more than COMPACT_ABOVE_PEAK_DIVISOR allows), or, as a `rescue`, when the device or
 * the memory limit lacks `need` bytes for it: chunks that live blocks pin are split around their live
 * pages, which are copied, their whole free pages given back, until `need` bytes are (or no chunk has
 * compact_min free bytes). */
gm_status pages_compact_for(gm_arena *arena, const window *where, uint64_t need, bool rescue);

/* gm_defragment: every pinned chunk with at least `least_free` bytes of whole free pages split (the
 * engine operation `defragment`). GM_ERROR_NOT_SUPPORTED while a stream is being captured. */
gm_status pages_defragment(gm_arena *arena, uint64_t least_free, uint64_t *released_out);

/* The whole free pages of the chunks pages_defragment would split, in *bytes_out. False where host
 * memory ran out during the search: *bytes_out then counts only the chunks found before. */
bool pages_pinned_free_bytes(gm_arena *arena, uint64_t *bytes_out);

#endif
