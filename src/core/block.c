/*
 * block.c -- block metadata and the operations every engine shares: splitting, coalescing and
 * counting reserved memory ((un)indexing free blocks with their inactive-split accounting is inline,
 * in arena.h: every malloc and free runs it).
 *
 * Block structs come from a pool that grows by chunks of 1024 and recycles through a spare list,
 * so the steady state allocates nothing. Inactive-split statistics follow PyTorch: a free block
 * that shares its segment with a block in use counts as one inactive split block of its size. The
 * count is kept by indexing and unindexing alone (unindexing takes back what indexing counted), so
 * a free block's neighbours should change only while it is out of the index; gm_validate checks it.
 */
#include "core/arena.h"

#include "base/error.h"
#include "base/system_memory.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Blocks are taken from the C library a chunk at a time; tests of host memory failures take them one at
 * a time, so that every block made is an allocation that can fail. */
static _Atomic size_t blocks_per_chunk = 1024;

void gm_block_pool_set_chunk_blocks(size_t blocks)
{
    blocks_per_chunk = blocks ? blocks : 1024;
}

/* The cold path of gm_block_new: a chunk of fresh blocks onto the spare list. */
__attribute__((noinline)) static bool add_chunk(gm_block_pool *pool)
{
    void **chunks = gm_system_realloc(pool->chunks, (pool->chunk_count + 1) * sizeof *chunks);
    if (!chunks)
        return false;
    pool->chunks = chunks;
    size_t blocks = blocks_per_chunk;
    gm_block *chunk = gm_system_calloc(blocks, sizeof *chunk);
    if (!chunk)
        return false;
    chunks[pool->chunk_count++] = chunk;
    for (size_t i = 0; i < blocks; i++)
        gm_list_push_front(&pool->spare, &chunk[i].link);
    pool->spare_count += blocks;
    return true;
}

gm_block *gm_block_new(gm_block_pool *pool)
{
    if (!pool->spare.first && !add_chunk(pool))
        return NULL;
    gm_block *block = gm_block_of(pool->spare.first);
    gm_list_remove(&pool->spare, &block->link);
    pool->spare_count--;
    memset(block, 0, sizeof *block);
    return block;
}

void gm_block_delete(gm_block_pool *pool, gm_block *block)
{
    gm_block_forget_streams(block);
    gm_list_push_front(&pool->spare, &block->link);
    pool->spare_count++;
}

bool gm_block_pool_reserve(gm_block_pool *pool, size_t count)
{
    while (pool->spare_count < count)
        if (!add_chunk(pool))
            return false;
    return true;
}

void gm_block_pool_free_all(gm_block_pool *pool)
{
    for (size_t i = 0; i < pool->chunk_count; i++)
        free(pool->chunks[i]);
    free(pool->chunks);
    memset(pool, 0, sizeof *pool);
}

gm_block *gm_split_block(gm_block_pool *pool, gm_block *block, uint64_t size)
{
    if (block->size == size)
        return NULL;
    gm_block *rest = gm_block_new(pool);
    if (!rest)
        return NULL;
    rest->address = block->address + size;
    rest->size = block->size - size;
    rest->region = block->region;
    rest->heap = block->heap;
    rest->pool = block->pool;
    rest->state = block->state;
    rest->previous = block;
    rest->next = block->next;
    if (block->next)
        block->next->previous = rest;
    block->next = rest;
    block->size = size;
    return rest;
}

void gm_absorb_next(gm_block_pool *pool, gm_block *block)
{
    gm_block *next = block->next;
    block->size += next->size;
    block->next = next->next;
    if (next->next)
        next->next->previous = block;
    gm_block_delete(pool, next);
}

gm_status gm_validate_region_blocks(const gm_region *region, gm_stats *recomputed,
                                    gm_status (*check)(const gm_region *region, const gm_block *block, void *context),
                                    void *context)
{
    uintptr_t expected = region->base;
    const gm_block *previous = NULL;
    for (const gm_block *block = region->first_block; block; previous = block, block = block->next) {
        if (block->address != expected || block->previous != previous || block->region != region)
            return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR ": block 0x%" PRIxPTR " out of place", region->base,
                           block->address);
        if (gm_block_is_vacant(block) && previous && previous->state == block->state)
            return gm_fail(GM_ERROR_CORRUPT, "two adjacent blocks of state %d at 0x%" PRIxPTR, block->state,
                           block->address);
        if (block->state == GM_BLOCK_FREE) {
            if (!block->indexed)
                return gm_fail(GM_ERROR_CORRUPT, "free block 0x%" PRIxPTR " is not indexed", block->address);
            if (gm_block_is_split(block)) {
                gm_stat_change(recomputed->inactive_split, region->pool, 1);
                gm_stat_change(recomputed->inactive_split_bytes, region->pool, (int64_t)block->size);
            }
        }
        if (check) {
            gm_status status = check(region, block, context);
            if (status != GM_OK)
                return status;
        }
        expected += block->size;
    }
    if (expected != region->base + region->size)
        return gm_fail(GM_ERROR_CORRUPT, "region 0x%" PRIxPTR ": blocks cover %" PRIu64 " of %" PRIu64 " bytes",
                       region->base, (uint64_t)(expected - region->base), region->size);
    return GM_OK;
}

bool gm_may_reserve(const gm_arena *arena, uint64_t size)
{
    uint64_t reserved = (uint64_t)gm_stat_total(arena->stats->reserved_bytes);
    return size <= arena->memory_limit && reserved <= arena->memory_limit - size;
}

gm_status gm_room_to_reserve(gm_arena *arena, uint64_t releasable, uint64_t *room_out)
{
    uint64_t reserved = (uint64_t)gm_stat_total(arena->stats->reserved_bytes);
    uint64_t kept = reserved > releasable ? reserved - releasable : 0;
    uint64_t room = arena->memory_limit > kept ? arena->memory_limit - kept : 0;
    uint64_t device_free = 0, device_total = 0;
    gm_status status = gm_backend_memory_info(arena->backend, &device_free, &device_total);
    if (status == GM_OK && device_free + releasable < room)
        room = device_free + releasable;
    uint64_t page_size = arena->backend->page_size;
    *room_out = page_size ? room / page_size * page_size : room;
    return status;
}

void gm_count_reserved(gm_arena *arena, int pool, int64_t bytes, int64_t segments)
{
    gm_stat_change(arena->stats->reserved_bytes, pool, bytes);
    if (segments)
        gm_stat_change(arena->stats->segment, pool, segments);
}

void gm_move_reserved(gm_arena *arena, int from_pool, int to_pool, uint64_t bytes)
{
    gm_stat_add(&arena->stats->reserved_bytes[from_pool], -(int64_t)bytes);
    gm_stat_add(&arena->stats->reserved_bytes[to_pool], (int64_t)bytes);
    gm_stat_add(&arena->stats->segment[from_pool], -1);
    gm_stat_add(&arena->stats->segment[to_pool], 1);
}

uint64_t gm_region_reserved_bytes(const gm_region *region)
{
    uint64_t bytes = 0;
    for (const gm_block *block = region->first_block; block; block = block->next)
        if (block->state != GM_BLOCK_UNMAPPED)
            bytes += block->size;
    return bytes;
}

void gm_delete_region_blocks(gm_arena *arena, gm_region *region)
{
    for (gm_block *block = region->first_block; block;) {
        gm_block *next = block->next;
        if (block->indexed)
            gm_unindex_free_block(arena, block);
        gm_block_delete(&arena->block_pool, block);
        block = next;
    }
    region->first_block = NULL;
}
