/*
 * block_states.c -- the pages engine's four block states and the moves between them.
 *
 * Blocks tile a region as allocated, pending, free (mapped, in the heap's size index) or unmapped
 * (addresses only, in the region's unmapped list). Free address space is free whether mapped or not,
 * so growth carves a request out of a run of free and unmapped blocks; neighbours of one state merge,
 * so no two free (or two unmapped) blocks ever touch. A detached block is in neither structure: the
 * moves below detach, reshape and attach, and a block's neighbours change only while it is detached
 * (its inactive-split count is taken when it is indexed).
 */
#include "core/pages/pages.h"

#include "base/error.h"

void pages_unmapped_insert(gm_region *region, gm_block *block)
{
    block->state = GM_BLOCK_UNMAPPED;
    gm_list_push_front(&data_of(region)->unmapped, &block->link);
}

void pages_unmapped_remove(gm_region *region, gm_block *block)
{
    gm_list_remove(&data_of(region)->unmapped, &block->link);
}

/* Take a free or unmapped block out of the structure that holds it. */
static void detach(gm_arena *arena, gm_block *block)
{
    if (block->state == GM_BLOCK_FREE)
        gm_unindex_free_block(arena, block);
    else if (block->state == GM_BLOCK_UNMAPPED)
        pages_unmapped_remove(block->region, block);
}

void pages_attach(gm_arena *arena, gm_block *block)
{
    if (block->state == GM_BLOCK_FREE)
        gm_index_free_block(arena, block);
    else
        pages_unmapped_insert(block->region, block);
}

/* Merge the detached `block` with neighbours of its own state (free or unmapped), which are
 * detached and absorbed; the merged block is returned, still detached. */
gm_block *pages_merge_alike(gm_arena *arena, gm_block *block)
{
    if (block->previous && block->previous->state == block->state) {
        gm_block *previous = block->previous;
        detach(arena, previous);
        gm_absorb_next(&arena->block_pool, previous);
        block = previous;
    }
    if (block->next && block->next->state == block->state) {
        detach(arena, block->next);
        gm_absorb_next(&arena->block_pool, block);
    }
    return block;
}

/* Carve [start, end) out of the detached block `block` (which contains it): the pieces before and
 * after keep the old state and are attached; the middle gets `state` and is returned detached.
 * NULL if block metadata ran out (nothing changed then). */
gm_block *pages_carve(gm_arena *arena, gm_block *block, uintptr_t start, uintptr_t end, int state)
{
    gm_block *middle = block, *tail = NULL;
    if (start > block->address && !(middle = gm_split_block(&arena->block_pool, block, start - block->address)))
        return NULL;
    if (end < middle->address + middle->size && !(tail = gm_split_block(&arena->block_pool, middle, end - middle->address))) {
        if (middle != block)
            gm_absorb_next(&arena->block_pool, block);
        return NULL;
    }
    /* The middle takes its state before the pieces are attached: their neighbour is final. */
    middle->state = (uint8_t)state;
    if (tail)
        pages_attach(arena, tail);
    if (middle != block)
        pages_attach(arena, block);
    return middle;
}


/* The unmapped block of `region` that contains `address`. */
gm_block *pages_unmapped_at(gm_region *region, uintptr_t address)
{
    for (gm_block *hole = gm_block_of(data_of(region)->unmapped.first); hole; hole = gm_block_of(hole->link.next))
        if (hole->address <= address && address < hole->address + hole->size)
            return hole;
    return NULL;
}
