/*
 * sharing.c -- memory shared between processes: what torch.multiprocessing does with a CUDA tensor.
 *
 * The sharing process gives the other one the physical chunks under an allocation, each as a file
 * descriptor (gm_share: the engine exports each chunk once and closes the descriptor when the chunk
 * goes back to the device); the other process takes the descriptors with pidfd_getfd, reserves a range
 * of its own addresses and maps the chunks there back to back (gm_open_shared), until gm_close_shared.
 * The memory stays the sharer's: it is not counted here, and it lives while either process maps it.
 * The sharer must keep the allocation live while the other process uses it (torch counts the users).
 */
#include "core/allocator.h"
#include "base/blocking.h"

#include "base/array.h"
#include "base/error.h"

#include <inttypes.h>
#include <stdlib.h>

typedef struct gm_opened_share {
    uintptr_t address;
    uint64_t size;
} gm_opened_share;

gm_status gm_share(gm_allocator *allocator, const void *pointer, uint64_t *offset_out, gm_shared_piece *pieces,
                   size_t capacity, size_t *count_out)
{
    if (!allocator || !offset_out || !count_out || (capacity && !pieces))
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_share: %s is NULL",
                       !allocator ? "allocator" : !offset_out ? "offset_out" : !count_out ? "count_out" : "pieces");
    gm_lock_acquire(&allocator->lock);
    uint64_t value = 0;
    gm_status status;
    if (!gm_hash_map_get(&allocator->live_blocks, (uint64_t)(uintptr_t)pointer, &value))
        status = gm_fail(GM_ERROR_INVALID_POINTER, "gm_share: %p is not a live allocation of this allocator", pointer);
    else if (!allocator->arena.engine->share_block)
        status = gm_fail(GM_ERROR_NOT_SUPPORTED, "gm_share: memory of the %s engine cannot be shared with other "
                         "processes (engine:pages can)", allocator->arena.engine->name);
    else
        status = allocator->arena.engine->share_block(&allocator->arena, (const gm_block *)(uintptr_t)value, offset_out,
                                                      pieces, capacity, count_out);
    gm_lock_release(&allocator->lock);
    return status;
}

/* Pieces back to back from offset 0, each a whole number of pages: their total size, or 0. */
static uint64_t shared_size(const gm_shared_piece *pieces, size_t count, uint64_t page_size)
{
    uint64_t size = 0;
    for (size_t i = 0; i < count; i++) {
        if (pieces[i].offset != size || !pieces[i].size || pieces[i].size % page_size || pieces[i].descriptor < 0 ||
            pieces[i].size > UINT64_MAX - size)
            return 0;
        size += pieces[i].size;
    }
    return size;
}

gm_status gm_open_shared(gm_allocator *allocator, int process, const gm_shared_piece *pieces, size_t count,
                         void **pointer_out)
{
    if (!allocator || !pieces || !pointer_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_open_shared: %s is NULL",
                       !allocator ? "allocator" : !pieces ? "pieces" : "pointer_out");
    gm_backend *backend = allocator->arena.backend;
    uint64_t size = shared_size(pieces, count, backend->page_size);
    if (!size || process <= 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_open_shared: %s", process <= 0 ? "no such process" :
                       "the pieces are not whole pages back to back from offset 0, each with a descriptor");
    if (!backend->operations->open_shared)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "gm_open_shared: the %s backend cannot map memory of other processes "
                       "(the host and cuda backends can)", backend->operations->name);
    gm_lock_acquire(&allocator->lock);
    uintptr_t address = 0;
    gm_opened_share *grown = gm_array_room_for_one(allocator->opened_shares, allocator->opened_share_count,
                                                   &allocator->opened_share_capacity, sizeof *grown, 4);
    gm_status status = grown ? backend->operations->open_shared(backend, process, pieces, count, size, &address)
                             : gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to record shared memory");
    if (grown)
        allocator->opened_shares = grown;
    if (status == GM_OK) {
        allocator->opened_shares[allocator->opened_share_count++] = (gm_opened_share){address, size};
        *pointer_out = (void *)address;
    }
    gm_lock_release(&allocator->lock);
    return status;
}

gm_status gm_close_shared(gm_allocator *allocator, void *pointer)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_close_shared: allocator is NULL");
    gm_lock_acquire(&allocator->lock);
    size_t i = 0;
    while (i < allocator->opened_share_count && allocator->opened_shares[i].address != (uintptr_t)pointer)
        i++;
    bool found = i < allocator->opened_share_count;
    if (found) {
        gm_opened_share share = allocator->opened_shares[i];
        allocator->arena.backend->operations->close_shared(allocator->arena.backend, share.address, share.size);
        allocator->opened_shares[i] = allocator->opened_shares[--allocator->opened_share_count];
    }
    gm_lock_release(&allocator->lock);
    return found ? GM_OK
                 : gm_fail(GM_ERROR_INVALID_POINTER, "gm_close_shared: %p was not mapped by gm_open_shared", pointer);
}

void gm_close_all_shared(gm_allocator *allocator)
{
    gm_backend *backend = allocator->arena.backend;
    for (size_t i = 0; i < allocator->opened_share_count; i++)
        backend->operations->close_shared(backend, allocator->opened_shares[i].address, allocator->opened_shares[i].size);
    free(allocator->opened_shares);
    allocator->opened_shares = NULL;
    allocator->opened_share_count = allocator->opened_share_capacity = 0;
}
