/*
 * defragment.c -- gm_defragment: the whole free pages of chunks that live blocks pin, given back on
 * demand.
 *
 * gm_empty_cache gives back what is wholly free; under the pages engine a chunk with one live block in
 * it keeps all its pages, and that is the memory a fragmented process lacks. The engine can split such
 * a chunk after the fact (compaction.c: its live pages copied into new memory mapped at the same
 * addresses), and does so by itself with compact_min when a growth would lift the peak. This is the
 * same split at a moment the program chooses -- between training steps, from the thread that launches
 * the work, where no kernel of another thread can touch the pages while they change place -- for every
 * pinned chunk at once. Frees waiting for other streams are settled first where their streams are
 * done, so that their blocks no longer pin anything.
 */
#include "core/allocator.h"

#include "base/error.h"

gm_status gm_defragment(gm_allocator *allocator, uint64_t min_free_bytes, uint64_t *released_out)
{
    if (!allocator)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_defragment: allocator is NULL");
    if (!allocator->arena.engine->defragment)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "gm_defragment: the %s engine cannot split its memory (engine:pages "
                       "can)", allocator->arena.engine->name);
    uint64_t released = 0;
    gm_lock_for_change(allocator);
    if (allocator->pending_queues)
        gm_process_pending_frees_locked(allocator, false);
    gm_status status = allocator->arena.engine->defragment(&allocator->arena, min_free_bytes, &released);
    gm_unlock_after_change(allocator);
    if (released_out)
        *released_out = released;
    return status;
}
