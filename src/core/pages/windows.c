/*
 * windows.c -- where a request could go in free address space, and what it would cost.
 *
 * A request that no mapped free block fits goes into a window of free addresses: extending a free
 * block that borders unmapped addresses (as expandable segments grow), bridging two free blocks over
 * a hole, or fresh addresses. Of all windows that fit, the one needing the fewest unmapped pages
 * backed wins; then the smaller run (a better fit); then the lower address.
 */
#include "core/pages/pages.h"

/* The first block of the run of vacant blocks that ends with `last`. */
gm_block *pages_run_start_of(gm_block *last)
{
    while (last->previous && gm_block_is_vacant(last->previous))
        last = last->previous;
    return last;
}

/* The last block of the run of vacant blocks that begins with `first`. */
gm_block *pages_run_end_of(gm_block *first)
{
    while (first->next && gm_block_is_vacant(first->next))
        first = first->next;
    return first;
}

/* The part of the unmapped block `block` that [start, end) needs backed, as [from, to). */
bool pages_part_to_back(const gm_block *block, uintptr_t start, uintptr_t end, uint64_t page_size, uintptr_t *from,
                         uintptr_t *to)
{
    if (block->state != GM_BLOCK_UNMAPPED || block->address >= end || block->address + block->size <= start)
        return false;
    uintptr_t low = page_floor(start, page_size), high = page_ceiling(end, page_size);
    *from = block->address > low ? block->address : low;
    *to = block->address + block->size < high ? block->address + block->size : high;
    return *to > *from;
}

uint64_t pages_needed(const gm_block *first, uintptr_t start, uintptr_t end, uint64_t page_size)
{
    uint64_t pages = 0;
    uintptr_t from = 0, to = 0;
    for (const gm_block *block = first; block && block->address < end; block = block->next)
        if (pages_part_to_back(block, start, end, page_size, &from, &to))
            pages += (to - from) / page_size;
    return pages;
}

/* Fewer pages first; then the smaller run (a better fit); then the lower address. */
static void consider_window(window *best, const window *candidate)
{
    uint64_t run = candidate->run_end - candidate->run_start, best_run = best->run_end - best->run_start;
    if (!best->region || candidate->pages < best->pages ||
        (candidate->pages == best->pages &&
         (run < best_run || (run == best_run && candidate->start < best->start))))
        *best = *candidate;
}

/* Every window of `size` bytes in the run [first, last] that starts at a block of it, and the one
 * that ends at the run's end. */
static void consider_run(gm_region *region, gm_block *first, gm_block *last, uint64_t size, uint64_t page_size,
                         window *best)
{
    uintptr_t run_end = last->address + last->size;
    if (run_end - first->address < size)
        return;
    window candidate = {region, first, first->address, run_end, 0, 0, 0};
    for (gm_block *block = first; block->address + size <= run_end; block = block->next) {
        candidate.start = block->address;
        candidate.pages = pages_needed(first, candidate.start, candidate.start + size, page_size);
        consider_window(best, &candidate);
        if (block == last)
            break;
    }
    candidate.start = run_end - size;
    candidate.pages = pages_needed(first, candidate.start, run_end, page_size);
    consider_window(best, &candidate);
}

/* The window for `size` bytes needing the fewest new pages, over every run of the heap's pool that
 * `accept` accepts (NULL: every run). */
window pages_choose_window(gm_heap *heap, int pool, uint64_t size, uint64_t page_size, run_filter accept)
{
    window best = {0};
    for (gm_region *region = gm_first_region(heap); region; region = gm_next_region(region)) {
        if (region->pool != pool)
            continue;
        for (gm_block *hole = gm_block_of(data_of(region)->unmapped.first); hole; hole = gm_block_of(hole->link.next)) {
            /* Each run is visited once, from its lowest unmapped block. */
            gm_block *first = hole;
            bool lowest = true;
            while (first->previous && gm_block_is_vacant(first->previous)) {
                first = first->previous;
                lowest = lowest && first->state != GM_BLOCK_UNMAPPED;
            }
            if (!lowest)
                continue;
            gm_block *last = pages_run_end_of(hole);
            if (!accept || accept(first, last))
                consider_run(region, first, last, size, page_size, &best);
        }
    }
    return best;
}
