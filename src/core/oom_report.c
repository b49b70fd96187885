/*
 * oom_report.c -- explain an out-of-memory failure, in the spirit of PyTorch's message but with a
 * diagnosis: which of five causes it is (a request larger than the device, a memory limit, memory
 * held outside gpumem, fragmentation, or live allocations that simply fill the device) and what to do about it.
 *
 * Runs when memory is short, so it allocates nothing: it writes into the thread's error buffer.
 */
#include "core/oom_report.h"

#include "base/error.h"
#include "base/format.h"

#include <inttypes.h>

static uint64_t largest_free_block(const gm_heap *heap, int pool)
{
    const gm_block *largest = gm_size_index_largest(&heap->free_blocks[pool]);
    return largest ? largest->size : 0;
}

void gm_write_oom_report(gm_arena *arena, gm_heap *heap, uint64_t size, const gm_oom_attempts *attempts)
{
    gm_stats completed = *arena->stats;
    gm_stats_complete(&completed);
    const gm_stats *stats = &completed;
    char requested[32], total[32], free_text[32], reserved[32], allocated[32], cached[32], largest[32], pending[32],
        limit[32], outside[32], released[32], chunk[32];
    uint64_t free_bytes = 0, total_bytes = 0;
    gm_backend_memory_info(arena->backend, &free_bytes, &total_bytes);
    uint64_t reserved_bytes = (uint64_t)stats->reserved_bytes[GM_POOL_ALL].current;
    uint64_t allocated_bytes = (uint64_t)stats->allocated_bytes[GM_POOL_ALL].current;
    uint64_t pending_bytes = (uint64_t)(stats->active_bytes[GM_POOL_ALL].current - stats->allocated_bytes[GM_POOL_ALL].current);
    uint64_t cached_bytes = reserved_bytes - allocated_bytes - pending_bytes;
    int pool = size <= arena->options->small_size ? GM_POOL_SMALL : GM_POOL_LARGE;
    uint64_t largest_bytes = largest_free_block(heap, pool);
    uint64_t used_outside = total_bytes - free_bytes > reserved_bytes ? total_bytes - free_bytes - reserved_bytes : 0;

    gm_fail(GM_ERROR_OUT_OF_MEMORY,
            "gpumem: out of memory. Tried to allocate %s (%" PRIu64 " bytes after rounding) on stream %" PRIuPTR
            " of %s device %d.\n",
            gm_format_bytes(requested, sizeof requested, size), size, (uintptr_t)heap->stream,
            arena->backend->operations->name, arena->options->device);
    gm_error_append("Device: %s total, %s free.\n", gm_format_bytes(total, sizeof total, total_bytes),
                    gm_format_bytes(free_text, sizeof free_text, free_bytes));
    gm_error_append("gpumem holds %s reserved: %s allocated to %" PRId64 " live allocations, %s cached free "
                    "(largest free block in this pool: %s), %s freed but still in use on other streams.\n",
                    gm_format_bytes(reserved, sizeof reserved, reserved_bytes),
                    gm_format_bytes(allocated, sizeof allocated, allocated_bytes),
                    stats->allocation[GM_POOL_ALL].current, gm_format_bytes(cached, sizeof cached, cached_bytes),
                    gm_format_bytes(largest, sizeof largest, largest_bytes),
                    gm_format_bytes(pending, sizeof pending, pending_bytes));
    gm_format_bytes(released, sizeof released, attempts->released_bytes);
    gm_error_append("Already tried: %s%s.\n",
                    attempts->waited_for_streams ? "waiting for the frees pending on other streams, " : "",
                    attempts->retried ? "releasing all cached memory and retrying" : "nothing else");
    if (attempts->retried)
        gm_error_append("  (the release gave back %s)\n", released);

    gm_format_bytes(limit, sizeof limit, arena->memory_limit);
    if (size > total_bytes)
        gm_error_append("Diagnosis: the request alone is larger than the whole device (%s). Split the work: a "
                        "smaller batch, shorter sequences, or the tensor in pieces.", total);
    else if (arena->memory_limit < total_bytes && reserved_bytes + size > arena->memory_limit)
        gm_error_append("Diagnosis: the memory limit of %s (memory_limit in GPUMEM_CONF, or the process's memory "
                        "fraction) is reached. Raise the limit or free tensors.", limit);
    else if (used_outside >= size)
        gm_error_append("Diagnosis: %s of device memory is used outside gpumem (the CUDA context, other allocators "
                        "or other processes). Free it there, or give gpumem a smaller share.",
                        gm_format_bytes(outside, sizeof outside, used_outside));
    else if (cached_bytes >= size && arena->engine == &gm_page_engine)
        gm_error_append("Diagnosis: fragmentation. %s is cached free, enough for the request, but it lies in "
                        "physical chunks that live allocations also use, and a chunk can only be unmapped and "
                        "moved whole. A smaller max_chunk_size in GPUMEM_CONF (now %s) makes chunks finer, for "
                        "more device calls.", cached,
                        arena->options->max_chunk_size
                            ? gm_format_bytes(chunk, sizeof chunk, arena->options->max_chunk_size)
                            : "no limit");
    else if (cached_bytes >= size)
        gm_error_append("Diagnosis: fragmentation. %s is cached free, enough for the request, but no free piece "
                        "is large enough. The pages engine (engine:pages in GPUMEM_CONF) remaps free pages to "
                        "avoid this.", cached);
    else
        gm_error_append("Diagnosis: the live allocations fill the device. Free tensors that are no longer needed, "
                        "or use a smaller batch or sequence length.");
}
