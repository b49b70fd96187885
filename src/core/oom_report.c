/*
 * oom_report.c -- explain an out-of-memory failure: the one primary cause, with its numbers, and the
 * remedies that fit that cause, in the order to try them.
 *
 * The first line keeps PyTorch's shape ("gpumem: out of memory. Tried to allocate ..."), because that
 * is what users search for; the second names the cause, because that is what they need first. Then
 * the facts (the device, what gpumem holds, what was already tried) and "What to do, in order".
 *
 * The cause is decided from a few totals (gm_classify_oom): whether live memory and the request fit
 * the device, the memory limit, and what memory used outside gpumem leaves; whether the host ran out;
 * if all of those leave room, the memory was there but not in one piece: fragmentation. One cause
 * each time, in a fixed order, so that gm_last_oom_cause() is exact and a program (the torch adapter,
 * a governor) can act on it.
 *
 * Runs when device memory is short, under the allocator's lock: it writes into the thread's error
 * buffer and reads the host's /proc/meminfo; only for the "other processes" cause on a real GPU does
 * it ask NVML (loaded on first use) which processes hold the device.
 */
#include "core/oom_report.h"

#include "base/error.h"
#include "base/format.h"
#include "core/block.h"
#include "monitor/host_memory.h"
#include "monitor/nvml.h"

#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#define HOST_LOW_BYTES (256ull << 20)
#define LISTED_PROCESSES 8

static _Thread_local gm_oom_cause last_cause;

gm_oom_cause gm_last_oom_cause(void)
{
    return last_cause;
}

void gm_set_last_oom_cause(gm_oom_cause cause)
{
    last_cause = cause;
}

const char *gm_oom_cause_name(gm_oom_cause cause)
{
    switch (cause) {
    case GM_OOM_CAUSE_NONE: return "none";
    case GM_OOM_CAUSE_CAPACITY: return "capacity";
    case GM_OOM_CAUSE_FRAGMENTATION: return "fragmentation";
    case GM_OOM_CAUSE_OTHER_PROCESSES: return "other_processes";
    case GM_OOM_CAUSE_MEMORY_LIMIT: return "memory_limit";
    case GM_OOM_CAUSE_HOST: return "host";
    case GM_OOM_CAUSE_SOURCE: return "source";
    case GM_OOM_CAUSE_ADDRESS_SPACE: return "address_space";
    }
    return "unknown";
}

static bool host_is_low(const gm_oom_facts *facts)
{
    if (facts->host_available < 0 || facts->host_total <= 0)
        return false;
    uint64_t threshold = (uint64_t)facts->host_total / 100;
    threshold = threshold < HOST_LOW_BYTES ? threshold : HOST_LOW_BYTES;
    return (uint64_t)facts->host_available < threshold;
}

/* The request in the whole pages it needs (the request itself without a page size); for a request no
 * larger than the device, so that the rounding cannot wrap around. */
static uint64_t request_in_pages(const gm_oom_facts *facts)
{
    return facts->page_size ? gm_round_up(facts->size, facts->page_size) : facts->size;
}

/* Whether the request alone is larger than the whole device: in bytes, or in the whole pages it
 * needs against the whole pages the device has (a 70 MiB request needs two 64 MiB pages, and a 100 MiB
 * device has room for one). */
static bool request_alone_too_large(const gm_oom_facts *facts)
{
    uint64_t page = facts->page_size;
    return facts->size > facts->device_total ||
           (page && request_in_pages(facts) > facts->device_total / page * page);
}

gm_oom_cause gm_classify_oom(const gm_oom_facts *facts)
{
    uint64_t need = facts->live + facts->size;
    if (facts->host_failed)
        return GM_OOM_CAUSE_HOST;
    if (need > facts->device_total || request_alone_too_large(facts))
        return GM_OOM_CAUSE_CAPACITY;
    if (facts->address_space_failed)
        return GM_OOM_CAUSE_ADDRESS_SPACE;
    if (facts->memory_limit < facts->device_total && need > facts->memory_limit)
        return GM_OOM_CAUSE_MEMORY_LIMIT;
    if (need > facts->device_total - facts->outside)
        return GM_OOM_CAUSE_OTHER_PROCESSES;
    if (host_is_low(facts))
        return GM_OOM_CAUSE_HOST;
    return GM_OOM_CAUSE_FRAGMENTATION;
}

/* ---------------------------------------------------------------- the numbers */

/* Byte counts as text, from a pool of buffers that lives as long as one report. */
typedef struct byte_texts {
    char text[32][32];
    unsigned used;
} byte_texts;

static const char *bytes(byte_texts *texts, uint64_t value)
{
    return gm_format_bytes(texts->text[texts->used++ % 32], sizeof texts->text[0], value);
}

/* Free memory: in the request's pool of its stream's heap, and everywhere. */
typedef struct free_pieces {
    uint64_t largest_here;  /* the largest free block in the heap's pool */
    uint64_t largest;       /* the largest anywhere */
    uint64_t elsewhere;     /* free bytes in other heaps or the other pool */
    uint64_t pinned_pages;  /* whole free pages inside chunks that live blocks pin (what compaction and
                               gm_defragment give back): asked only for fragmentation, since finding
                               them takes host memory, which another cause may lack; else 0 */
    bool pinned_counted;    /* false: host memory ran out before every pinned page was counted */
} free_pieces;

static free_pieces find_free_pieces(gm_arena *arena, const gm_heap *heap, int pool)
{
    free_pieces pieces = {.pinned_counted = true};
    for (size_t h = 0; h < arena->heap_count; h++)
        for (int p = GM_POOL_SMALL; p <= GM_POOL_LARGE; p++) {
            const gm_size_index *index = &arena->heaps[h]->free_blocks[p];
            const gm_block *largest = gm_size_index_largest(index);
            uint64_t size = largest ? largest->size : 0;
            pieces.largest = size > pieces.largest ? size : pieces.largest;
            if (arena->heaps[h] == heap && p == pool)
                pieces.largest_here = size;
            else
                pieces.elsewhere += index->bytes;
        }
    return pieces;
}

static gm_oom_facts gather_facts(gm_arena *arena, uint64_t size, const gm_oom_attempts *attempts)
{
    gm_stats stats;
    gm_arena_read_stats(arena, &stats);
    gm_oom_facts facts = {.size = size, .page_size = arena->backend->page_size, .memory_limit = arena->memory_limit,
                          .host_failed = arena->backend->host_memory_failed,
                          .address_space_failed = arena->backend->address_space_failed};
    gm_backend_memory_info(arena->backend, &facts.device_free, &facts.device_total);
    facts.reserved = (uint64_t)stats.reserved_bytes[GM_POOL_ALL].current;
    facts.live = (uint64_t)stats.active_bytes[GM_POOL_ALL].current;
    uint64_t used = facts.device_total > facts.device_free ? facts.device_total - facts.device_free : 0;
    facts.outside = used > facts.reserved ? used - facts.reserved : 0;
    gm_host_memory host;
    bool read = gm_host_memory_read(attempts->host_root, &host) == GM_OK;
    facts.host_available = read ? host.available_bytes : -1;
    facts.host_total = read ? host.total_bytes : -1;
    return facts;
}

/* ---------------------------------------------------------------- the causes */

static void explain_capacity(const gm_oom_facts *facts, byte_texts *t)
{
    if (facts->size > facts->device_total) {
        gm_error_append("Cause: capacity. The request alone (%s) is larger than the whole device (%s).\n",
                        bytes(t, facts->size), bytes(t, facts->device_total));
        return;
    }
    if (request_alone_too_large(facts)) {
        gm_error_append("Cause: capacity. The request alone (%s) needs %s in whole pages of %s, more than the whole "
                        "device's %s holds in such pages.\n", bytes(t, facts->size), bytes(t, request_in_pages(facts)),
                        bytes(t, facts->page_size), bytes(t, facts->device_total));
        return;
    }
    gm_error_append("Cause: capacity. Live allocations hold %s of the device's %s and the request needs %s "
                    "more: %s in all, more than the whole device.\n", bytes(t, facts->live),
                    bytes(t, facts->device_total), bytes(t, facts->size), bytes(t, facts->live + facts->size));
}

static void remedy_capacity(const gm_oom_facts *facts, uint64_t peak_live, uint64_t room, byte_texts *t)
{
    if (request_alone_too_large(facts)) {
        gm_error_append("  1. Split the work so that no single tensor needs %s: a smaller micro-batch or shorter "
                        "sequences (with gradient accumulation to keep the batch), or this tensor computed in "
                        "pieces.\n", bytes(t, facts->size));
        return;
    }
    gm_error_append("  1. Peak live is %s of %s: halve the micro-batch and accumulate gradients over 2 steps (the "
                    "optimizer sees the same batch).\n", bytes(t, peak_live), bytes(t, room));
    gm_error_append("  2. Enable activation checkpointing on the repeated blocks (the transformer layers, the "
                    "residual stages): their activations are recomputed in the backward pass instead of kept.\n");
    gm_error_append("  3. Keep weights and activations in bf16 or fp16 (mixed precision), and shard or offload "
                    "the optimizer state.\n");
    gm_error_append("  4. Look for tensors kept alive by mistake (a loss appended to a list, outputs cached "
                    "across steps): live memory that grows from step to step.\n");
}

static void explain_limit(const gm_oom_facts *facts, byte_texts *t)
{
    gm_error_append("Cause: memory limit. The limit of %s (memory_limit in GPUMEM_CONF, gm_set_memory_limit, or "
                    "torch.cuda.set_per_process_memory_fraction) is reached: live allocations hold %s and the "
                    "request needs %s more, %s in all; the device has %s, %s of it free.\n",
                    bytes(t, facts->memory_limit), bytes(t, facts->live), bytes(t, facts->size),
                    bytes(t, facts->live + facts->size), bytes(t, facts->device_total), bytes(t, facts->device_free));
}

static void remedy_limit(const gm_oom_facts *facts, uint64_t peak_live, byte_texts *t)
{
    uint64_t need = facts->live + facts->size;
    gm_error_append("  1. Raise the limit to at least %s if this process may use that much of the device "
                    "(%s).\n", bytes(t, gm_round_up(need, 1ull << 20)), bytes(t, facts->device_total));
    gm_error_append("  2. Or fit the job under the limit: peak live is %s of %s; halve the micro-batch with "
                    "gradient accumulation, or enable activation checkpointing on the repeated blocks.\n",
                    bytes(t, peak_live), bytes(t, facts->memory_limit));
}

/* The processes NVML lists on the GPU, read before the report is written (a failure's message would
 * overwrite it). */
typedef struct gpu_processes {
    bool asked;
    gm_status status;
    gm_gpu_process entries[LISTED_PROCESSES];
    size_t count;
    char failure[256];
} gpu_processes;

static void read_gpu_processes(gm_arena *arena, gpu_processes *processes)
{
    if (!arena->backend->pci_bus_id[0])
        return;
    processes->asked = true;
    processes->status = gm_gpu_processes(arena->backend->pci_bus_id, processes->entries, LISTED_PROCESSES,
                                         &processes->count);
    if (processes->status != GM_OK)
        snprintf(processes->failure, sizeof processes->failure, "%s", gm_last_error());
}

static void list_processes(gm_arena *arena, const gpu_processes *processes, byte_texts *t)
{
    if (arena->backend->used_elsewhere) {
        gm_error_append("The %s backend counts %s as used elsewhere (gm_sim_set_used_elsewhere).\n",
                        arena->backend->operations->name, bytes(t, arena->backend->used_elsewhere));
        return;
    }
    if (!processes->asked)
        return;
    if (processes->status != GM_OK) {
        gm_error_append("(NVML cannot tell which processes: %s)\n", processes->failure);
        return;
    }
    gm_error_append("Processes on this GPU (NVML)%s", processes->count ? ":" : ": none listed (another container's, "
                    "or NVML sees another pid namespace)");
    for (size_t i = 0; i < processes->count; i++) {
        const gm_gpu_process *process = &processes->entries[i];
        gm_error_append("%s PID %ld%s %s", i ? "," : "", process->pid,
                        process->pid == (long)getpid() ? " (this process)" : "",
                        process->used_bytes ? bytes(t, process->used_bytes) : "(size unknown)");
    }
    gm_error_append(".\n");
}

static void explain_other_processes(gm_arena *arena, const gm_oom_facts *facts, const gpu_processes *processes,
                                    byte_texts *t)
{
    gm_error_append("Cause: other processes. %s of the device is used outside this allocator (other processes, "
                    "this process's CUDA context, other allocators): without it the live allocations (%s) and the "
                    "request (%s) would fit in the device's %s.\n", bytes(t, facts->outside), bytes(t, facts->live),
                    bytes(t, facts->size), bytes(t, facts->device_total));
    list_processes(arena, processes, t);
}

static void remedy_other_processes(const gm_oom_facts *facts, uint64_t peak_live, byte_texts *t)
{
    gm_error_append("  1. Stop the other processes on this GPU, or give each job a GPU of its own "
                    "(CUDA_VISIBLE_DEVICES).\n");
    gm_error_append("  2. If the memory is this process's (a second allocator, cuBLAS or cuDNN workspaces, NCCL "
                    "buffers, another framework), route it through gpumem or cap it.\n");
    gm_error_append("  3. Otherwise fit in the %s left: peak live is %s; halve the micro-batch with gradient "
                    "accumulation, or enable activation checkpointing.\n",
                    bytes(t, facts->device_total - facts->outside), bytes(t, peak_live));
}

static void explain_fragmentation(gm_arena *arena, const gm_oom_facts *facts, const free_pieces *pieces,
                                  byte_texts *t)
{
    uint64_t cached = facts->reserved - facts->live;
    uint64_t room = facts->memory_limit < facts->device_total - facts->outside ? facts->memory_limit
                                                                               : facts->device_total - facts->outside;
    uint64_t device_room = room > facts->reserved ? room - facts->reserved : 0;
    gm_error_append("Cause: fragmentation. %s is free in total, enough for the request: %s cached in gpumem's "
                    "reserved memory and %s more that the device %s. But no free piece is large enough: the "
                    "largest in this stream's %s pool is %s (the largest anywhere %s)%s.\n",
                    bytes(t, cached + device_room), bytes(t, cached), bytes(t, device_room),
                    facts->memory_limit < facts->device_total ? "and the limit allow" : "allows",
                    facts->size <= arena->options->small_size ? "small" : "large", bytes(t, pieces->largest_here),
                    bytes(t, pieces->largest),
                    arena->engine == &gm_page_engine ? "; a live block pins the free pages of every chunk it touches"
                                                     : "; a free segment goes back to the device only when wholly free");
    if (!pieces->pinned_counted)
        gm_error_append("How much of the cached memory is whole free pages inside chunks that live blocks pin "
                        "(what gm_defragment would give back) could not be counted: the host's memory ran out; "
                        "at least %s.\n", bytes(t, pieces->pinned_pages));
    else if (pieces->pinned_pages)
        gm_error_append("%s of the cached memory is whole free pages inside chunks that live blocks pin, which "
                        "gm_defragment would give back.\n", bytes(t, pieces->pinned_pages));
    else if (arena->engine->pinned_free_bytes)
        gm_error_append("No whole free page of the cached memory is pinned: it lies in pieces that hold no whole "
                        "page (free bytes that share their pages with live blocks) or in other heaps, and "
                        "gm_defragment cannot give any of it back.\n");
}

/* The pages engine makes chunks of up to max_chunk_size, and a live block pins all of one; page-sized
 * chunks let every free page move to where a request needs it, so a program that nearly fills the
 * device fits in little more than its live peak, for a device call per page made. Small chunks that
 * settle are the cheaper middle. Offered while chunks may be larger than a page and whole free pages
 * are pinned (or may be: their count ran out of host memory); free bytes in pieces of pages no chunk
 * size joins. */
static void remedy_finer_chunks(gm_arena *arena, const free_pieces *pieces, unsigned *step, byte_texts *t)
{
    uint64_t page = arena->backend->page_size, largest = arena->options->max_chunk_size;
    if ((largest && largest <= page) || (!pieces->pinned_pages && pieces->pinned_counted))
        return;
    gm_error_append("  %u. max_chunk_size:%" PRIu64 "%s in GPUMEM_CONF (now %s): page-sized chunks, so free pages "
                    "anywhere serve a request, with no copies, for a device call per page as memory is first "
                    "made and page moves in steps whose shapes change; max_chunk_size:8MiB,move_slack:0.01 "
                    "costs fewer calls and lets a repeating step settle, for a little more memory.\n",
                    (*step)++, page % (1u << 20) ? page >> 10 : page >> 20, page % (1u << 20) ? "KiB" : "MiB",
                    largest ? bytes(t, largest) : "no limit");
}

static void remedy_fragmentation(gm_arena *arena, const free_pieces *pieces, byte_texts *t)
{
    unsigned step = 1;
    if (arena->engine == &gm_page_engine)
        remedy_finer_chunks(arena, pieces, &step, t);
    if (arena->engine == &gm_page_engine && !arena->options->stitch)
        gm_error_append("  %u. stitch:true in GPUMEM_CONF (the default; now false): a request may lie across second "
                        "mappings of the free end of one pinned chunk and the free start of another, so their free "
                        "pages serve it without copies (docs/engine.md, \"Stitching\").\n", step++);
    /* gm_defragment is offered only where it would give memory back now (or may: its count ran out of
     * host memory); compact_min acts throughout the run, so it may help a program that pins no whole
     * page at the moment it fails. */
    if (arena->engine == &gm_page_engine && !arena->options->compact_min)
        gm_error_append("  %u. compact_min:2MiB in GPUMEM_CONF: a chunk that a few live blocks pin is split, its live "
                        "pages copied to new memory at the same addresses and its free pages given back (for a "
                        "program in which one thread at a time launches work on the device, as a training loop "
                        "does; docs/engine.md, \"Compaction\")%s.\n", step++,
                        pieces->pinned_pages || !pieces->pinned_counted
                            ? "; or the same at a moment the program chooses, between steps: gm_defragment, "
                              "gpumem.torch.defragment()"
                            : "");
    if (arena->engine == &gm_page_engine && !arena->options->chunk_room_share)
        gm_error_append("  %u. chunk_room_share:1000 in GPUMEM_CONF (the default; now 0): no chunk larger than a "
                        "thousandth of the room the device (or the memory limit) leaves, so that near its capacity "
                        "live blocks pin little free memory.\n", step++);
    if (arena->engine != &gm_page_engine)
        gm_error_append("  %u. Use the pages engine (engine:pages in GPUMEM_CONF): it remaps free pages so that "
                        "scattered free memory serves one request, as PyTorch's expandable_segments:True does.\n",
                        step++);
    gm_error_append("  %u. Empty the cache between phases (gm_empty_cache, torch.cuda.empty_cache() after "
                    "evaluation), so that the next phase starts from whole free memory.\n", step++);
    gm_error_append("  %u. Allocate long-lived tensors (weights, optimizer state, KV cache) first and temporaries "
                    "after them, so that they do not end up scattered between temporaries.\n", step++);
    if (pieces->elsewhere)
        gm_error_append("  %u. %s of the free memory is in other streams' heaps or the other pool: allocate on the "
                        "stream that freed it, or synchronize those streams and empty the cache.\n", step,
                        bytes(t, pieces->elsewhere));
    if (arena->engine == &gm_page_engine)
        gm_error_append("Which setting lets this program fit: gpumem run --tune -- python train.py replays its "
                        "allocations under each (gpumem tune) on what its GPU leaves it.\n");
}

static void explain_host(const gm_oom_facts *facts, byte_texts *t)
{
    if (facts->host_failed)
        gm_error_append("Cause: host. Host memory ran out: the backend could not map host memory.");
    else
        gm_error_append("Cause: host. The host is nearly out of memory, though the device's numbers leave room (the "
                        "driver needs host memory too).");
    if (facts->host_available >= 0)
        gm_error_append(" MemAvailable is %s of %s.", bytes(t, (uint64_t)facts->host_available),
                        bytes(t, (uint64_t)facts->host_total));
    gm_error_append("\n");
}

static void remedy_host(void)
{
    gm_error_append("  1. Free host memory: fewer DataLoader workers or a smaller prefetch_factor, smaller pinned "
                    "buffers, datasets not held in memory twice.\n");
    gm_error_append("  2. See what uses it: `gpumem top` shows each process's RSS, PSS and swap with its "
                    "children.\n");
    gm_error_append("  3. If the limit is a cgroup's or a ulimit (RLIMIT_AS), raise it.\n");
}

static void explain_address_space(const gm_arena *arena)
{
    gm_error_append("Cause: address space. The device's virtual address space ran out: each stream that allocates "
                    "(%zu now) has a range of addresses of its own, twice the device's memory (or the memory limit "
                    "the allocator was made with), so that memory can move between streams without copies; the "
                    "device's memory itself would fit.\n", (size_t)arena->heap_count);
}

static void remedy_address_space(void)
{
    gm_error_append("  1. Allocate on fewer streams: reuse a few side streams (a pool of them) rather than a new one "
                    "for each piece of work.\n");
    gm_error_append("  2. Set memory_limit:N in GPUMEM_CONF near what the program needs: each stream's range is then "
                    "twice N.\n");
}

/* Memory from a source of the caller's (gm_create_with_source): the source is the capacity. */
static void explain_source(const gm_oom_facts *facts, byte_texts *t)
{
    gm_error_append("Cause: the memory source (the allocator this memory comes from, such as the one of a "
                    "PyTorch MemPool) could not give %s more; everything cached was given back to it first.\n",
                    bytes(t, facts->size));
}

static void remedy_source(void)
{
    gm_error_append("  1. Free tensors of this pool, or allocate fewer of them at a time.\n");
    gm_error_append("  2. Give the source more memory (it decides how much it hands out).\n");
}

/* ---------------------------------------------------------------- the report */

static void write_facts(gm_arena *arena, const gm_stats *stats, const gm_oom_facts *facts, const free_pieces *pieces,
                        const gm_oom_attempts *attempts, byte_texts *t)
{
    uint64_t allocated = (uint64_t)stats->allocated_bytes[GM_POOL_ALL].current;
    gm_error_append("Device: %s total, %s free, %s of it used outside gpumem.\n", bytes(t, facts->device_total),
                    bytes(t, facts->device_free), bytes(t, facts->outside));
    gm_error_append("gpumem holds %s reserved: %s allocated to %" PRId64 " live allocations, %s cached free "
                    "(largest free block in this pool: %s), %s freed but still in use on other streams.\n",
                    bytes(t, facts->reserved), bytes(t, allocated), stats->allocation[GM_POOL_ALL].current,
                    bytes(t, facts->reserved - facts->live), bytes(t, pieces->largest_here),
                    bytes(t, facts->live - allocated));
    if (arena->memory_limit < facts->device_total)
        gm_error_append("Memory limit: %s.\n", bytes(t, arena->memory_limit));
    gm_error_append("Already tried: %s%s%s.\n",
                    attempts->waited_for_streams ? "waiting for the frees pending on other streams, " : "",
                    attempts->retried ? "releasing all cached memory and retrying" : "nothing else",
                    attempts->called_callbacks ? ", calling the pressure callbacks (level critical) and retrying" : "");
    if (attempts->retried)
        gm_error_append("  (the releases gave back %s)\n", bytes(t, attempts->released_bytes));
    if (attempts->called_callbacks)
        gm_error_append("  (%u pressure callback call%s)\n", attempts->callbacks_called,
                        attempts->callbacks_called == 1 ? "" : "s");
}

uint64_t gm_write_oom_report(gm_arena *arena, gm_heap *heap, uint64_t size, const gm_oom_attempts *attempts)
{
    byte_texts texts = {.used = 0};
    byte_texts *t = &texts;
    gm_stats stats;
    gm_arena_read_stats(arena, &stats);
    gm_oom_facts facts = gather_facts(arena, size, attempts);
    int pool = size <= arena->options->small_size ? GM_POOL_SMALL : GM_POOL_LARGE;
    free_pieces pieces = find_free_pieces(arena, heap, pool);
    uint64_t peak_live = (uint64_t)stats.allocated_bytes[GM_POOL_ALL].peak;
    bool from_source = arena->backend->source.allocate != NULL;
    gm_oom_cause cause = from_source ? GM_OOM_CAUSE_SOURCE : gm_classify_oom(&facts);
    last_cause = cause;
    arena->backend->host_memory_failed = false;
    arena->backend->address_space_failed = false;
    gpu_processes processes = {.asked = false};
    if (cause == GM_OOM_CAUSE_OTHER_PROCESSES)
        read_gpu_processes(arena, &processes);
    if (!from_source && cause == GM_OOM_CAUSE_FRAGMENTATION && arena->engine->pinned_free_bytes)
        pieces.pinned_counted = arena->engine->pinned_free_bytes(arena, &pieces.pinned_pages);

    gm_fail(GM_ERROR_OUT_OF_MEMORY,
            "gpumem: out of memory. Tried to allocate %s (%" PRIu64 " bytes after rounding) on stream %" PRIuPTR
            " of %s device %d.\n", bytes(t, size), size, (uintptr_t)heap->stream, arena->backend->operations->name,
            arena->options->device);
    if (from_source)
        explain_source(&facts, t);
    else switch (cause) {
    case GM_OOM_CAUSE_CAPACITY: explain_capacity(&facts, t); break;
    case GM_OOM_CAUSE_MEMORY_LIMIT: explain_limit(&facts, t); break;
    case GM_OOM_CAUSE_OTHER_PROCESSES: explain_other_processes(arena, &facts, &processes, t); break;
    case GM_OOM_CAUSE_HOST: explain_host(&facts, t); break;
    case GM_OOM_CAUSE_ADDRESS_SPACE: explain_address_space(arena); break;
    default: explain_fragmentation(arena, &facts, &pieces, t); break;
    }
    write_facts(arena, &stats, &facts, &pieces, attempts, t);
    gm_error_append("What to do, in order:\n");
    if (from_source)
        remedy_source();
    else switch (cause) {
    case GM_OOM_CAUSE_CAPACITY: remedy_capacity(&facts, peak_live, facts.device_total, t); break;
    case GM_OOM_CAUSE_MEMORY_LIMIT: remedy_limit(&facts, peak_live, t); break;
    case GM_OOM_CAUSE_OTHER_PROCESSES: remedy_other_processes(&facts, peak_live, t); break;
    case GM_OOM_CAUSE_HOST: remedy_host(); break;
    case GM_OOM_CAUSE_ADDRESS_SPACE: remedy_address_space(); break;
    default: remedy_fragmentation(arena, &pieces, t); break;
    }
    return facts.device_free;
}

uint64_t gm_write_impossible_request_report(gm_arena *arena, gm_stream stream, uint64_t size, uint64_t largest_request)
{
    byte_texts texts = {.used = 0};
    byte_texts *t = &texts;
    uint64_t device_free = 0, device_total = 0;
    gm_backend_memory_info(arena->backend, &device_free, &device_total);
    last_cause = GM_OOM_CAUSE_CAPACITY;
    gm_fail(GM_ERROR_OUT_OF_MEMORY,
            "gpumem: out of memory. Tried to allocate %s (%" PRIu64 " bytes) on stream %" PRIuPTR " of %s device %d.\n",
            bytes(t, size), size, (uintptr_t)stream, arena->backend->operations->name, arena->options->device);
    gm_error_append("Cause: capacity. No device has %s: gpumem serves at most %s in one request (this device has "
                    "%s).\n", bytes(t, size), bytes(t, largest_request), bytes(t, device_total));
    gm_error_append("Nothing was released or retried: no memory could make room for it.\n");
    gm_error_append("What to do, in order:\n");
    gm_error_append("  1. Check how the size was computed: one this large is usually a negative number converted "
                    "to an unsigned size, or a product of dimensions that overflowed.\n");
    return device_free;
}
