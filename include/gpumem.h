/*
 * gpumem.h -- the public interface of libgpumem, a caching allocator for GPU memory.
 *
 * An allocator (gm_allocator) manages the memory of one device through one backend:
 *   "sim"   a simulated device: a capacity, a page granularity, fake addresses, counted
 *           device calls and simulated streams; nothing is touched, it runs anywhere;
 *   "host"  real host memory behind the same interface, for data-integrity tests;
 *   "cuda"  the CUDA driver, loaded at run time.
 *
 * The front end has the calls deep-learning users know from PyTorch: malloc on a stream,
 * free (size and stream are looked up), record_stream, empty_cache, statistics with
 * torch.cuda.memory_stats() meanings and a memory_summary()-style table.
 *
 * Every call is thread-safe. Every call returns a gm_status; gm_strerror() names it and
 * gm_last_error() gives the detailed message of the last failed call on this thread.
 * A failed call changes nothing.
 *
 * Configuration is one string in PyTorch's "key:value,key:value" style (see docs/design.md
 * and gm_config_help()); gm_create_from_environment() reads it from GPUMEM_CONF.
 */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPUMEM_VERSION "0.1.0"

#if defined(GPUMEM_BUILDING) && defined(__GNUC__)
#define GM_API __attribute__((visibility("default")))
#else
#define GM_API
#endif

typedef struct gm_allocator gm_allocator;

/* A stream as the backend knows it: a CUstream for "cuda", any number for "sim" and "host".
 * 0 is the default stream. */
typedef uintptr_t gm_stream;

typedef enum gm_status {
    GM_OK = 0,
    GM_ERROR_INVALID_ARGUMENT = 1, /* a NULL where a value is needed, a bad size, ... */
    GM_ERROR_OUT_OF_MEMORY = 2,    /* the device has no room, even after releasing the cache */
    GM_ERROR_INVALID_POINTER = 3,  /* not a live allocation of this allocator (or already freed) */
    GM_ERROR_BAD_CONFIG = 4,       /* unknown key or bad value in a configuration string */
    GM_ERROR_NO_DEVICE = 5,        /* backend unavailable: no driver, no GPU, bad device index */
    GM_ERROR_DEVICE = 6,           /* a device call failed unexpectedly */
    GM_ERROR_NOT_SUPPORTED = 7,    /* the backend lacks what the call needs */
    GM_ERROR_IO = 8,               /* a file could not be read or written */
    GM_ERROR_PARSE = 9,            /* malformed input (trace file, number) */
    GM_ERROR_CORRUPT = 10,         /* gm_validate found an inconsistency */
    GM_ERROR_BUFFER_TOO_SMALL = 11 /* the caller's buffer is too small; the needed size is returned */
} gm_status;

/* The name of a status, e.g. "out of memory". Never NULL. */
GM_API const char *gm_strerror(gm_status status);

/* The detailed message of the last call on this thread that did not return GM_OK
 * (for example the OOM report or "unknown key 'foo' in configuration"). Never NULL. */
GM_API const char *gm_last_error(void);

/* Why an allocation ran out of memory: the one primary cause that the out-of-memory report names (its
 * second line, "Cause: ..."), with the remedies that fit it. */
typedef enum gm_oom_cause {
    GM_OOM_CAUSE_NONE = 0,            /* no out-of-memory report on this thread yet */
    GM_OOM_CAUSE_CAPACITY = 1,        /* the live allocations and the request exceed the whole device */
    GM_OOM_CAUSE_FRAGMENTATION = 2,   /* enough memory is free in total, but not in one piece that fits */
    GM_OOM_CAUSE_OTHER_PROCESSES = 3, /* it would fit but for the memory used outside this allocator */
    GM_OOM_CAUSE_MEMORY_LIMIT = 4,    /* it would fit on the device but not under the memory limit set */
    GM_OOM_CAUSE_HOST = 5,            /* host memory ran out (the host backend, or metadata) */
    GM_OOM_CAUSE_SOURCE = 6,          /* the memory source of gm_create_with_source could not give more */
    GM_OOM_CAUSE_ADDRESS_SPACE = 7    /* the device's virtual address space ran out (the pages engine reserves
                                         twice the device, or the memory limit, for each stream that allocates) */
} gm_oom_cause;

/* The cause of the last out-of-memory report written on this thread (gm_malloc's
 * GM_ERROR_OUT_OF_MEMORY); GM_OOM_CAUSE_NONE before any. */
GM_API gm_oom_cause gm_last_oom_cause(void);

/* "none", "capacity", "fragmentation", "other_processes", "memory_limit", "host", "source"; "unknown"
 * otherwise. */
GM_API const char *gm_oom_cause_name(gm_oom_cause cause);

/* ---------------------------------------------------------------- lifetime */

/* Create an allocator from a configuration string ("backend:sim,capacity:16GiB", NULL or "" for
 * the defaults). Keys: see gm_config_help(). */
GM_API gm_status gm_create(const char *config, gm_allocator **allocator_out);

/* Same, with the configuration taken from the environment variable GPUMEM_CONF, then the keys of
 * `overrides` (may be NULL) applied on top. */
GM_API gm_status gm_create_from_environment(const char *overrides, gm_allocator **allocator_out);

/* Parse GPUMEM_CONF, then `overrides` (may be NULL), as gm_create_from_environment does, creating
 * nothing: GM_OK, or GM_ERROR_BAD_CONFIG with gm_last_error() naming the key and why, so that a program
 * (an adapter at install time) can refuse a bad configuration before its first allocation. */
GM_API gm_status gm_check_configuration(const char *overrides);

/* Where an allocator's memory comes from when not from the device directly: a function that hands
 * out `size` bytes of device memory (*address_out; GM_ERROR_OUT_OF_MEMORY, or any other status, when
 * it cannot) and one that takes them back, both called with `context` and with the allocator's lock
 * held (they must not call back into it). PyTorch's MemPool(allocator=...) is such a source. */
typedef struct gm_segment_source {
    gm_status (*allocate)(void *context, uint64_t size, void **address_out);
    void (*free)(void *context, void *address, uint64_t size);
    void *context;
} gm_segment_source;

/* An allocator (configured as by gm_create) whose memory comes from `source` in segments: the
 * segments engine (engine:segments, PyTorch's caching rules) whatever the configuration says, each
 * segment one allocate call, given back by empty_cache, a retry after out of memory, or gm_destroy.
 * The backend still records its events. GM_ERROR_INVALID_ARGUMENT without both functions. */
GM_API gm_status gm_create_with_source(const char *config, const gm_segment_source *source,
                                       gm_allocator **allocator_out);

/* Destroy an allocator and give all its memory back to the device. Live allocations die with it;
 * gm_destroy reports how many there were through the optional live_allocations_out. */
GM_API void gm_destroy(gm_allocator *allocator, size_t *live_allocations_out);

/* A text listing every configuration key, its default and meaning. */
GM_API const char *gm_config_help(void);

/* ---------------------------------------------------------------- front end */

/* Allocate `size` bytes for use on `stream`. A size of 0 gives *pointer_out = NULL and GM_OK.
 * On GM_ERROR_OUT_OF_MEMORY, gm_last_error() holds a report that explains the failure. A size above
 * 2^60 bytes fits no device: GM_ERROR_OUT_OF_MEMORY at once (cause capacity, nothing released or
 * retried), its report giving the size asked for. */
GM_API gm_status gm_malloc(gm_allocator *allocator, size_t size, gm_stream stream, void **pointer_out);

/* gm_malloc for a stream that the caller does not own (PyTorch's torch.cuda.ExternalStream, another
 * library's stream), whose owner may destroy it at any moment after this call returns, while memory
 * freed on it is still cached. The allocator then never names that stream in a driver call: no event is
 * recorded on it, it is never asked whether it is busy or captured, and memory last used on it moves
 * to another stream or goes back to the device only after a wait for the whole device (as PyTorch's own
 * allocator waits before it frees cached memory), never by choice. The heap it keeps for the stream
 * stays marked so as long as it is kept. A capture into a CUDA graph on such a stream must allocate
 * through a private pool (gm_begin_allocate_to_pool), as PyTorch's do. */
GM_API gm_status gm_malloc_on_borrowed_stream(gm_allocator *allocator, size_t size, gm_stream stream,
                                              void **pointer_out);

/* Free a pointer returned by gm_malloc. NULL is accepted and does nothing. A pointer that is not a
 * live allocation returns GM_ERROR_INVALID_POINTER and changes nothing. */
GM_API gm_status gm_free(gm_allocator *allocator, void *pointer);

/* For a caller that holds a lock of its own while it calls gpumem (an interpreter's global lock): `hook`
 * is called, on this thread, right before this thread's next call first waits inside gpumem (for a
 * lock another thread holds, for the device, for a callback), so that the caller lets its lock go
 * then and not around every call. One-shot: called at most once, then forgotten; set it before the
 * call and clear it after (gm_set_blocking_hook(NULL, NULL)). A hook must not call gpumem. */
GM_API void gm_set_blocking_hook(void (*hook)(void *context), void *context);

/* Mark that `pointer` is also used on `stream` (PyTorch's record_stream): when freed, its memory
 * is not reused until the work queued on `stream` before the free has finished. */
GM_API gm_status gm_record_stream(gm_allocator *allocator, void *pointer, gm_stream stream);

/* Give every cached, entirely free piece of memory back to the device. */
GM_API gm_status gm_empty_cache(gm_allocator *allocator);

/* Defragment (the pages engine): give back the whole free pages of chunks that live blocks pin, which
 * gm_empty_cache cannot. Each such chunk with at least `min_free_bytes` of whole free pages (0: one
 * page) is split around its live pages: they are copied into new physical memory mapped at the same
 * addresses (no pointer changes, no byte is lost), and the chunk's free pages go back to the device.
 * The copies wait for the whole device first (every stream's queued work may use those pages), so call
 * it where no other thread launches work on the device: between training steps, say, from the thread
 * that runs them. Chunks of private pools (CUDA graphs, MemPools) and shared chunks stay whole.
 * *released_out (may be NULL): the bytes given back. A chunk that cannot be split (no room for its
 * copies on the device or under the memory limit, a device call refused) stays as it was. GM_ERROR_NOT_SUPPORTED under engine:segments (a
 * segment cannot be split) and while a stream of the allocator is being captured into a CUDA graph
 * (the wait would break the capture). */
GM_API gm_status gm_defragment(gm_allocator *allocator, uint64_t min_free_bytes, uint64_t *released_out);

/* Let device `peer` (an index, as GPUMEM_CONF's `device`) read and write this allocator's memory: every
 * mapping made so far and every later one (cuMemSetAccess for both devices, as PyTorch's expandable
 * segments do when torch enables peer access between two GPUs). The driver's peer access between the
 * devices (cuCtxEnablePeerAccess), which covers engine:segments' plain segments, is the caller's.
 * Memory of other processes mapped before the call (gm_open_shared) stays reachable from this device
 * only; what is mapped after reaches the peers too.
 * `peer` equal to the allocator's own device, or a peer enabled before: nothing to do.
 * GM_ERROR_INVALID_ARGUMENT for a negative peer or more than 16 peers; GM_ERROR_DEVICE when the driver
 * refuses (the devices cannot reach each other), and the peer is not recorded. */
GM_API gm_status gm_enable_peer_access(gm_allocator *allocator, int peer);

/* Memory shared with another process (what torch.multiprocessing does with a CUDA tensor): the physical
 * chunks under an allocation, each a file descriptor of the sharing process, back to back from
 * `offset` 0 of the shared range. */
typedef struct gm_shared_piece {
    uint64_t offset; /* from the start of the shared range */
    uint64_t size;
    int descriptor; /* a file descriptor of the process that shared it */
} gm_shared_piece;

/* Share live allocation `pointer` with another process: the chunks it lies in, into pieces (room for
 * `capacity`; *count_out: how many there are -- GM_ERROR_BUFFER_TOO_SMALL when more than `capacity`,
 * call again with room for them), and where the allocation starts in their range (*offset_out). The
 * descriptors stay open until their chunk goes back to the device, and the other process takes them
 * (gm_open_shared) while the allocation is live. GM_ERROR_INVALID_POINTER for a pointer that is not a
 * live allocation; GM_ERROR_NOT_SUPPORTED on the sim backend, engine:segments, or a device that cannot
 * export memory. */
GM_API gm_status gm_share(gm_allocator *allocator, const void *pointer, uint64_t *offset_out,
                          gm_shared_piece *pieces, size_t capacity, size_t *count_out);

/* Map memory that process `process` shared (gm_share) into this process, on this allocator's device,
 * readable and writable there and by its peers: *pointer_out is the start of the shared range (add the
 * sharer's offset). It is the other process's memory: not counted as reserved here. The descriptors
 * are taken with pidfd_getfd, which needs the right to trace that process (same user, and ptrace_scope
 * allowing it). GM_ERROR_INVALID_ARGUMENT for pieces that are not back to back from 0 in whole pages or
 * a process or descriptor that does not exist; GM_ERROR_NOT_SUPPORTED where the backend cannot. */
GM_API gm_status gm_open_shared(gm_allocator *allocator, int process, const gm_shared_piece *pieces, size_t count,
                                void **pointer_out);

/* Unmap memory mapped by gm_open_shared (its pointer); GM_ERROR_INVALID_POINTER for any other. */
GM_API gm_status gm_close_shared(gm_allocator *allocator, void *pointer);

/* Whether the allocator still keeps memory for `stream` (a heap: its live blocks or cached memory) into
 * *held_out (1 or 0). While it does it may call the driver on the stream later (an event recorded on
 * it before its idle memory moves elsewhere, a query whether it is busy), so the stream must stay
 * alive (unless it was given to gm_malloc_on_borrowed_stream); a stream it does not hold may be
 * destroyed. The heaps of idle streams are forgotten once an
 * allocator has more than 128 heaps, so a program that makes streams without end need not keep them
 * all: a binding that keeps its streams alive for gpumem asks this to let them go. */
GM_API gm_status gm_holds_stream(gm_allocator *allocator, gm_stream stream, int *held_out);

/* ---------------------------------------------------------------- private pools

 * A private pool keeps its memory for one owner: a captured CUDA graph, whose replays write to the
 * addresses the capture was given, or a torch.cuda.MemPool. While a pool is retained, its memory --
 * allocated or cached -- is never handed to allocations outside it, and gm_empty_cache keeps it;
 * blocks freed inside it are reused by its own later allocations. Pools are named by the caller's
 * pair of numbers (PyTorch's MempoolId_t; {0, 0} names no pool) and counted: the first retain or
 * begin makes a pool, each one adds a user (graphs may share a pool), each gm_release_pool takes one
 * away. At no users the pool's memory is no longer kept for it: its free memory is cached memory that
 * other allocations may take and that empty_cache (or a retry after out of memory) gives back to the
 * device, as PyTorch does with a released graph pool; once its last block is freed too, the pool is
 * gone and all of its memory goes back. */
typedef struct gm_pool_id {
    uint64_t first;
    uint64_t second;
} gm_pool_id;

/* Whether an allocation on `stream` goes to the pool being allocated to (called with the allocator's
 * lock held: it must not call gpumem). NULL as a filter: every stream. */
typedef int (*gm_stream_filter)(gm_stream stream, void *context);

/* From now on, allocations on streams that `filter` accepts come from `pool` (made if new), until
 * gm_end_allocate_to_pool. Adds a user, as gm_retain_pool does. Several pools may be allocated to at
 * once (captures on different streams, nested MemPools): the last begun whose filter accepts the stream
 * wins, as in PyTorch's allocator. */
GM_API gm_status gm_begin_allocate_to_pool(gm_allocator *allocator, gm_pool_id pool, gm_stream_filter filter,
                                           void *context);
/* Stop allocating to `pool` (the user stays: the memory is the owner's until gm_release_pool). */
GM_API gm_status gm_end_allocate_to_pool(gm_allocator *allocator, gm_pool_id pool);
/* Add a user to `pool`, made if new (torch.cuda.MemPool's creation). */
GM_API gm_status gm_retain_pool(gm_allocator *allocator, gm_pool_id pool);
/* Take a user away; GM_ERROR_INVALID_ARGUMENT for a pool that does not exist. */
GM_API gm_status gm_release_pool(gm_allocator *allocator, gm_pool_id pool);

/* Let allocations outside `pool` use its free memory when they would otherwise fail (`use_on_oom`
 * nonzero), as torch.cuda.MemPool(use_on_oom=True): their last retry may take the pool's cached free
 * memory, which is then no longer the pool's. GM_ERROR_INVALID_ARGUMENT for a pool that does not exist. */
GM_API gm_status gm_set_pool_use_on_oom(gm_allocator *allocator, gm_pool_id pool, int use_on_oom);

typedef struct gm_pool_info {
    uint32_t users;            /* retains and begins not yet released */
    uint64_t live_allocations; /* its blocks not yet freed (or waiting for a recorded stream) */
    uint64_t reserved_bytes;   /* device memory its heaps hold, allocated or cached */
} gm_pool_info;
/* A pool's state; GM_ERROR_INVALID_ARGUMENT when no pool of that name exists (any more). */
GM_API gm_status gm_get_pool_info(gm_allocator *allocator, gm_pool_id pool, gm_pool_info *info_out);
typedef struct gm_pool_allocation {
    uint64_t address;
    uint64_t size;      /* the block's bytes */
    uint64_t requested; /* bytes asked for */
} gm_pool_allocation;
/* The pool's allocated blocks (not those freed and waiting for a recorded stream), at most `capacity`
 * of them into `allocations` (NULL when capacity is 0), in no particular order; how many there are
 * goes to *count_out (more than capacity: call again with room for them). A pool that does not exist
 * has none. */
GM_API gm_status gm_get_pool_allocations(gm_allocator *allocator, gm_pool_id pool, gm_pool_allocation *allocations,
                                         size_t capacity, size_t *count_out);
/* Allocate exactly [address, address + size) of the pool's free memory, for `requested` bytes (as
 * gm_malloc would have): how a CUDA graph pool is put back to a checkpoint (torch.compile's cudagraph
 * trees restore the allocations of a recorded graph before recording a new branch). `size` is the
 * block's size, a multiple of 512. The range must lie in one free, mapped block of the pool's own
 * memory; anything else is GM_ERROR_INVALID_ARGUMENT and changes nothing. Free it with gm_free. */
GM_API gm_status gm_pool_allocate_at(gm_allocator *allocator, gm_pool_id pool, uint64_t address, uint64_t size,
                                     size_t requested);

/* Never reserve more than `bytes` of device memory from now on (0: the whole device); what is already
 * reserved beyond it is given back as it becomes free (torch.cuda.set_per_process_memory_fraction). */
GM_API gm_status gm_set_memory_limit(gm_allocator *allocator, uint64_t bytes);
GM_API gm_status gm_get_memory_limit(gm_allocator *allocator, uint64_t *bytes_out);

/* Cached memory: bytes free in reserved memory, and the largest free block that can be handed out
 * without a device call (for libraries that size workspaces by it, like cuDNN). */
GM_API gm_status gm_cache_info(gm_allocator *allocator, uint64_t *free_bytes_out, uint64_t *largest_block_out);
/* The largest single allocation that can be had now: the largest free cached block, or what can still be
 * reserved in whole pages (under the memory limit, within the device's free memory), whichever is
 * larger. What PyTorch's cacheInfo answers cuDNN, which leaves out every plan whose workspace is larger. */
GM_API gm_status gm_largest_allocation(gm_allocator *allocator, uint64_t *bytes_out);

/* The usable size of a live allocation (its size rounded up to the allocator's granularity). */
GM_API gm_status gm_allocation_size(gm_allocator *allocator, const void *pointer, size_t *size_out);

/* 1 when `pointer` is a live allocation of `allocator`, else 0 (also for NULL arguments). Never an
 * error and never touches gm_last_error(): for finding which of several allocators (one per device)
 * owns a pointer without a failed call per miss. */
GM_API int gm_owns(gm_allocator *allocator, const void *pointer);

/* ---------------------------------------------------------------- statistics */

/* One statistic with PyTorch's four readings. */
typedef struct gm_stat {
    int64_t current;
    int64_t peak;
    int64_t allocated; /* accumulated increases */
    int64_t freed;     /* accumulated decreases */
} gm_stat;

/* Index into each gm_stat array of gm_stats: all pools, the small pool (<= 1 MiB), the large pool. */
enum { GM_POOL_ALL = 0, GM_POOL_SMALL = 1, GM_POOL_LARGE = 2, GM_POOL_COUNT = 3 };

/* Kinds of device call, counted by the backend layer: X(ENUM_SUFFIX, name, what it is in CUDA). */
#define GM_DEVICE_CALLS(X)                                                                          \
    X(SEGMENT_ALLOCATE, segment_allocate, "cudaMalloc / cuMemAlloc")                                \
    X(SEGMENT_FREE, segment_free, "cudaFree / cuMemFree")                                           \
    X(ADDRESS_RESERVE, address_reserve, "cuMemAddressReserve")                                      \
    X(ADDRESS_FREE, address_free, "cuMemAddressFree")                                               \
    X(PHYSICAL_CREATE, physical_create, "cuMemCreate")                                              \
    X(PHYSICAL_RELEASE, physical_release, "cuMemRelease")                                           \
    X(MAP, map, "cuMemMap")                                                                         \
    X(SET_ACCESS, set_access, "cuMemSetAccess")                                                     \
    X(UNMAP, unmap, "cuMemUnmap")                                                                   \
    X(COPY, copy, "cuCtxSynchronize + cuMemcpyDtoD into new physical memory (compaction)")          \
    X(EVENT_RECORD, event_record, "cuEventRecord")                                                  \
    X(EVENT_QUERY, event_query, "cuEventQuery")                                                     \
    X(EVENT_SYNCHRONIZE, event_synchronize, "cuEventSynchronize")

typedef enum gm_device_call {
#define GM_DEVICE_CALL_ENUMERATOR_(suffix, name, cuda) GM_CALL_##suffix,
    GM_DEVICE_CALLS(GM_DEVICE_CALL_ENUMERATOR_)
#undef GM_DEVICE_CALL_ENUMERATOR_
    GM_CALL_KIND_COUNT
} gm_device_call;

/* The name of a device call kind, e.g. "physical_create"; "unknown" past the last. */
GM_API const char *gm_device_call_name(gm_device_call call);

/* The statistics kept per pool, each with PyTorch's four readings, in torch.cuda.memory_summary()'s
 * order: X(field, label in the summary table, BYTES or COUNT, origin). The origin is TORCH for a
 * statistic of torch.cuda.memory_stats() (same name, same meaning), GPUMEM for one of gpumem's own.
 * The struct, the names, the summary, validation, the Python binding and the PyTorch adapter all
 * follow this list: adding a statistic is one line here (and keeping it current in the code that
 * changes it). */
#define GM_POOL_STATISTICS(X)                                                                       \
    X(allocated_bytes, "Allocated memory", BYTES, TORCH)         /* bytes handed to the user */     \
    X(active_bytes, "Active memory", BYTES, TORCH)               /* + freed, still used on streams */\
    X(requested_bytes, "Requested memory", BYTES, TORCH)         /* bytes asked for (not rounded) */\
    X(reserved_bytes, "GPU reserved memory", BYTES, TORCH)       /* device memory held */           \
    X(inactive_split_bytes, "Non-releasable memory", BYTES, TORCH) /* free, beside blocks in use */ \
    X(allocation, "Allocations", COUNT, TORCH)                                                      \
    X(active, "Active allocs", COUNT, TORCH)                                                        \
    X(segment, "GPU reserved segments", COUNT, TORCH)            /* segments, or chunks of pages */ \
    X(inactive_split, "Non-releasable allocs", COUNT, TORCH)

/* Event counters: X(field, row label in the summary table or NULL, origin as above). */
#define GM_COUNTERS(X)                                                                              \
    X(num_alloc_retries, NULL, TORCH)      /* allocations retried after releasing the cache */     \
    X(num_ooms, NULL, TORCH)               /* allocations that failed with out of memory */        \
    X(num_sync_all_streams, NULL, TORCH)   /* waits for every pending cross-stream free */         \
    X(num_device_alloc, NULL, TORCH)       /* segment allocations or physical page creations */    \
    X(num_device_free, NULL, TORCH)        /* segment frees or physical page releases */           \
    X(num_page_maps, "Pages mapped", GPUMEM)     /* pages (of the backend's granularity) mapped */ \
    X(num_page_unmaps, "Pages unmapped", GPUMEM) /* pages unmapped */                               \
    X(num_stitches, "Stitches", GPUMEM)          /* requests laid across pinned chunks' free edges */ \
    X(stitch_lent_bytes, NULL, GPUMEM)           /* free edge bytes those stitches lent */            \
    X(num_pressure_rises, "Pressure rises", GPUMEM)          /* the pressure level rose to high */ \
    X(num_pressure_criticals, "Pressure criticals", GPUMEM)  /* failing allocations that called the \
                                                                pressure callbacks and retried */    \
    X(num_pressure_releases, "Pressure releases", GPUMEM)    /* ladder steps that released cache */  \
    X(pressure_released_bytes, NULL, GPUMEM)                 /* bytes those steps gave back */       \
    X(num_pressure_callbacks, "Pressure callbacks", GPUMEM)  /* pressure callbacks called */

typedef struct gm_stats {
#define GM_POOL_STATISTIC_FIELD_(field, label, unit, origin) gm_stat field[GM_POOL_COUNT];
    GM_POOL_STATISTICS(GM_POOL_STATISTIC_FIELD_)
#undef GM_POOL_STATISTIC_FIELD_
#define GM_COUNTER_FIELD_(field, label, origin) int64_t field;
    GM_COUNTERS(GM_COUNTER_FIELD_)
#undef GM_COUNTER_FIELD_
    /* Device calls made through the backend, by kind, and their total cost: measured time on real
     * backends, the H200 cost model on "sim". */
    int64_t device_calls[GM_CALL_KIND_COUNT];
    int64_t device_call_ns;
    int64_t device_call_ns_by_kind[GM_CALL_KIND_COUNT];
    /* The device. */
    uint64_t device_total_bytes;
    uint64_t page_size; /* the backend's mapping granularity */
} gm_stats;

/* The layout of gm_stats by name, for bindings that build it at run time (NULL past the last):
 * the pool statistics in order, the counters in order, and GM_CALL_KIND_COUNT device call kinds. */
GM_API const char *gm_stat_name(size_t index);
GM_API const char *gm_counter_name(size_t index);
GM_API size_t gm_device_call_count(void);

GM_API gm_status gm_get_stats(gm_allocator *allocator, gm_stats *stats_out);

/* Reset every peak to its current value (torch.cuda.reset_peak_memory_stats). Only the statistics
 * reset: where memory goes does not depend on when the peaks were last reset. */
GM_API gm_status gm_reset_peak_stats(gm_allocator *allocator);

/* Reset the accumulated readings ("allocated" and "freed") and the event counters. */
GM_API gm_status gm_reset_accumulated_stats(gm_allocator *allocator);

/* Render the statistics as a table in the layout of torch.cuda.memory_summary() into `buffer`.
 * If `buffer_size` is too small, returns GM_ERROR_BUFFER_TOO_SMALL; *needed_out (if not NULL)
 * always receives the size needed, terminating NUL included. */
GM_API gm_status gm_summary(gm_allocator *allocator, char *buffer, size_t buffer_size, size_t *needed_out);

/* The same table for statistics read elsewhere (another process's, through its published region), of
 * `backend`'s device `device`. */
GM_API gm_status gm_summary_of_stats(const gm_stats *stats, const char *backend, int device, char *buffer,
                                     size_t buffer_size, size_t *needed_out);

/* Walk every block, segment and page, check all invariants and recompute every current statistic
 * from them. GM_OK if consistent, GM_ERROR_CORRUPT with the first difference in gm_last_error(). */
GM_API gm_status gm_validate(gm_allocator *allocator);

/* ---------------------------------------------------------------- pinned host memory */

/* A cache of page-locked host memory for copies between host and device (PyTorch's
 * CachingHostAllocator): sizes are rounded up to a power of two (at least 512 bytes); a freed block
 * is reused only once the work queued before its free on every stream recorded for it
 * (gm_host_record_stream) has finished. When the block's streams are all the legacy default stream
 * (0 or CU_STREAM_LEGACY, which the driver never destroys and no graph captures) the free asks no
 * stream: a later gm_host_malloc that needs the block, or gm_host_empty_cache, asks each stream of the
 * freed blocks once (cuStreamQuery) and records an event on the busy ones. A small size class (up to
 * 32 KiB) may make a few new blocks (at most 64 KiB of them) before asking, so that one question serves
 * several freed blocks. Any other stream (the per-thread default stream too) may be destroyed once the
 * free returns, or be being captured into a CUDA graph: the free asks it then, and records an event on
 * it if it is busy; a block freed while one of its streams is being captured may be copied by every
 * replay of the graph, and is never reused (gm_destroy gives it back).
 * The memory comes from the backend: cuMemHostAlloc on "cuda", ordinary memory on "sim" and "host".
 * GPUMEM_CONF's host_limit:BYTES caps the bytes held: beyond it gm_host_malloc first looks at the
 * freed blocks, gives the idle ones back, then fails with GM_ERROR_OUT_OF_MEMORY.
 * A size of 0 gives *pointer_out = NULL and GM_OK. */
GM_API gm_status gm_host_malloc(gm_allocator *allocator, size_t size, void **pointer_out);
/* Free a pointer from gm_host_malloc (NULL: nothing). Anything else, or a second free, is
 * GM_ERROR_INVALID_POINTER and changes nothing. */
GM_API gm_status gm_host_free(gm_allocator *allocator, void *pointer);
/* gm_host_record_stream for each of `count` streams (a stream given twice, or recorded before, counts
 * once), then gm_host_free, in one call under one lock. The errors of those calls: NULL pointer:
 * nothing (GM_OK); not a live block or a second free: GM_ERROR_INVALID_POINTER; no memory to record
 * the streams: GM_ERROR_OUT_OF_MEMORY; an event for a busy non-default stream that cannot be made
 * or recorded: the backend's error (the block stays live, never reused while a copy may use it);
 * on an error the block stays live.
 * streams may be NULL when count is 0 (then it is gm_host_free); NULL with a count is
 * GM_ERROR_INVALID_ARGUMENT. */
GM_API gm_status gm_host_free_with_streams(gm_allocator *allocator, void *pointer, const gm_stream *streams,
                                           size_t count);
/* Mark a live block as used by work on `stream` (a copy): it is not reused before that work is done. */
GM_API gm_status gm_host_record_stream(gm_allocator *allocator, void *pointer, gm_stream stream);
/* Look at the freed blocks' streams, then give every idle cached block back to the backend (those
 * whose streams still run keep waiting). */
GM_API gm_status gm_host_empty_cache(gm_allocator *allocator);

/* The pinned host cache's statistics. */
typedef struct gm_host_stats {
    gm_stat allocated_bytes;  /* bytes in blocks handed out (rounded sizes) */
    gm_stat reserved_bytes;   /* bytes held from the backend, handed out or cached */
    gm_stat allocations;      /* blocks handed out */
    int64_t requested_bytes;  /* bytes asked for now (unrounded) by the live blocks */
    int64_t cache_hits;       /* gm_host_malloc served from the cache */
    int64_t cache_misses;     /* gm_host_malloc that needed a new backend allocation */
    int64_t host_allocations; /* backend allocations made (cuMemHostAlloc on cuda) */
    int64_t host_frees;       /* backend frees made (cuMemFreeHost on cuda) */
    int64_t pending_blocks;   /* freed blocks not reusable yet: their streams not asked yet (a look
                                 will), or busy and their events not done */
    uint64_t limit;           /* host_limit (0: none) */
} gm_host_stats;

GM_API gm_status gm_host_get_stats(gm_allocator *allocator, gm_host_stats *stats_out);

/* ---------------------------------------------------------------- published statistics */

/* Whether this allocator publishes its statistics for other processes (publish:true): GM_OK with the
 * region's path in path_out (`gpumem stats PID` reads it); otherwise the reason publication is off
 * (the option is off: GM_ERROR_NOT_SUPPORTED; the region could not be created: its error), with
 * gm_last_error() explaining it. An allocator is created even when its region cannot be. */
GM_API gm_status gm_publish_status(gm_allocator *allocator, char *path_out, size_t path_size);

/* ---------------------------------------------------------------- the device */

typedef struct gm_device_info {
    char backend[16];           /* "sim", "host", "cuda" */
    char name[128];             /* e.g. "NVIDIA H200" or "simulated device" */
    int device;                 /* this allocator's device index */
    int device_count;           /* devices the backend sees */
    int driver_version;         /* CUDA driver version (e.g. 13000), 0 elsewhere */
    uint64_t total_bytes;
    uint64_t free_bytes;
    int virtual_memory;         /* 1 if address reservation and page mapping are supported */
    uint64_t granularity;       /* mapping granularity in bytes */
    char engine[16];            /* the engine in use: "pages" or "segments" */
} gm_device_info;

GM_API gm_status gm_get_device_info(gm_allocator *allocator, gm_device_info *info_out);

/* ---------------------------------------------------------------- snapshots and history */

/* What a block of a snapshot is: handed to the user, freed but still used by a stream it was
 * recorded on, free and cached (mapped; with the pages engine also memory made ahead of need after an
 * empty_cache, which a growth there takes next), or addresses with no memory behind them (pages
 * engine). */
typedef enum gm_block_kind {
    GM_BLOCK_KIND_FREE = 0,
    GM_BLOCK_KIND_ALLOCATED = 1,
    GM_BLOCK_KIND_PENDING = 2,
    GM_BLOCK_KIND_UNMAPPED = 3
} gm_block_kind;

typedef struct gm_snapshot_block {
    uint64_t address;
    uint64_t size;
    uint64_t requested; /* bytes asked for (allocated and pending blocks), else 0 */
    gm_block_kind kind;
} gm_snapshot_block;

/* A region: a device segment (segments engine) or a reserved virtual range (pages engine), tiled by
 * its blocks, blocks[first_block .. first_block + block_count). */
typedef struct gm_snapshot_region {
    uint64_t address;
    uint64_t size;
    uint64_t mapped_bytes; /* backed by device memory: every block but unmapped ones */
    gm_stream stream;
    int pool;              /* GM_POOL_SMALL or GM_POOL_LARGE */
    int growth_lane;       /* 1 for a region of the pages engine's growth lane */
    gm_pool_id private_pool; /* the private pool whose region it is ({0, 0}: the stream's memory) */
    size_t first_block;
    size_t block_count;
} gm_snapshot_region;

typedef struct gm_snapshot {
    gm_stats stats;
    gm_device_info device;
    size_t region_count;
    gm_snapshot_region *regions;
    size_t block_count;
    gm_snapshot_block *blocks;
} gm_snapshot;

/* Every region and block of the allocator, with its statistics, at one moment. Free it with
 * gm_snapshot_free. */
GM_API gm_status gm_snapshot_take(gm_allocator *allocator, gm_snapshot **snapshot_out);
GM_API void gm_snapshot_free(gm_snapshot *snapshot);

/* Events of the history ring (GPUMEM_CONF history:N keeps the newest N; 0, the default, keeps none).
 * The names are those of PyTorch's memory snapshots ("alloc", "free_requested", ...). */
typedef enum gm_event_kind {
    GM_EVENT_ALLOC = 0,          /* gm_malloc handed out a block */
    GM_EVENT_FREE_REQUESTED = 1, /* gm_free called (every free, as in PyTorch's snapshots) */
    GM_EVENT_FREE_COMPLETED = 2, /* the block's memory is free for reuse: at once, or once the streams
                                    recorded on it have passed the free */
    GM_EVENT_SEGMENT_MAP = 3,    /* device memory mapped: a segment allocated or a chunk mapped */
    GM_EVENT_SEGMENT_UNMAP = 4,  /* device memory unmapped: a segment freed or a chunk unmapped */
    GM_EVENT_OOM = 5,            /* gm_malloc failed for lack of memory (address: the device's free bytes
                                    then, as PyTorch's trace entry; size: bytes asked for) */
    GM_EVENT_PRESSURE_HIGH = 6,     /* the pressure level rose to high (address: the signals at or above
                                       the high watermark, size: reserved bytes) */
    GM_EVENT_PRESSURE_CRITICAL = 7, /* an allocation would fail: the callbacks are called before the
                                       last retry (address: the signals, size: bytes asked for) */
    GM_EVENT_PRESSURE_NORMAL = 8,   /* the level fell back to normal (address 0, size: reserved bytes) */
    GM_EVENT_PRESSURE_RELEASE = 9,  /* a ladder step released cached memory (address: the step, 1 down
                                       to the low watermark, 2 everything; size: bytes released) */
    GM_EVENT_PRESSURE_CALLBACKS = 10, /* pressure callbacks were called (address: the level, size: how
                                         many) */
    GM_EVENT_KIND_COUNT
} gm_event_kind;

typedef struct gm_event {
    uint64_t time_ns; /* CLOCK_MONOTONIC */
    uint64_t address;
    uint64_t size;    /* the block's or mapping's size; for alloc, oom: bytes asked for */
    gm_stream stream;
    uint64_t tag;     /* what the tagger returned (0 without one) */
    gm_event_kind kind;
    gm_pool_id pool;  /* the private pool whose block or memory it is ({0, 0}: none) */
} gm_event;

/* "alloc", "free_requested", "free_completed", "segment_map", "segment_unmap", "oom", "pressure_high",
 * "pressure_critical", "pressure_normal", "pressure_release", "pressure_callbacks". */
GM_API const char *gm_event_name(gm_event_kind kind);

/* Copy the history, oldest first, into `events` (room for `capacity`); *count_out: events copied (with
 * `events` NULL: the events held, to size the array); *dropped_out (may be NULL): older events the ring
 * no longer holds. GM_ERROR_NOT_SUPPORTED when the
 * allocator keeps no history. */
GM_API gm_status gm_history_read(gm_allocator *allocator, gm_event *events, size_t capacity, size_t *count_out,
                                 uint64_t *dropped_out);

/* Start keeping the newest `capacity` events from now on (at most 1048576), or stop with 0, as
 * GPUMEM_CONF history:N does at creation: for torch.cuda.memory._record_memory_history, which switches
 * history on and off while the process runs. The events held so far are dropped; the tagger stays. */
GM_API gm_status gm_set_history(gm_allocator *allocator, size_t capacity);
/* The same, keeping the newest events held that fit in the new ring (what no longer fits counts as
 * dropped): torch's _record_memory_history(clear_history=False) with another max_entries. */
GM_API gm_status gm_resize_history(gm_allocator *allocator, size_t capacity);
/* How many events the history ring holds at most (0: none kept), as GPUMEM_CONF history:N or the last
 * gm_set_history / gm_resize_history set it. */
GM_API gm_status gm_history_capacity(gm_allocator *allocator, size_t *capacity_out);

/* A callback called (under the allocator's lock, so it must not call gpumem) for every event, whose
 * result becomes the event's tag -- for an adapter that records stack ids. NULL removes it.
 * GM_ERROR_NOT_SUPPORTED when the allocator keeps no history and has no observer. */
GM_API gm_status gm_set_history_tagger(gm_allocator *allocator, uint64_t (*tagger)(void *context), void *context);

/* A callback called with every event as it happens, whether or not history is kept: on the thread
 * whose call caused it, under the allocator's lock (it must not call gpumem), a segment_unmap before
 * the memory is unmapped (a device that then refuses the unmap is followed by a segment_map of the
 * same memory). For PyTorch's allocator trace trackers, through which NCCL registers and deregisters
 * memory. One per allocator; NULL removes it. */
typedef void (*gm_event_observer)(const gm_event *event, void *context);
GM_API gm_status gm_set_event_observer(gm_allocator *allocator, gm_event_observer observer, void *context);

/* A snapshot, or the history, as JSON (docs/formats.md): a string to release with gm_json_free. */
GM_API gm_status gm_snapshot_json(const gm_snapshot *snapshot, char **json_out);
GM_API gm_status gm_history_json(gm_allocator *allocator, char **json_out);
GM_API void gm_json_free(char *json);

/* ---------------------------------------------------------------- memory pressure */

/* A pressure policy watches signals against two watermarks and acts before memory runs out. The level
 * rises to HIGH when any signal reaches its high watermark, and falls back to NORMAL only when every
 * signal is below its low watermark (hysteresis: no flapping around one threshold). CRITICAL is the
 * level of the moment an allocation would fail.
 *
 * On a rise the allocator runs a ladder: (1) release idle cached memory down to the low watermark;
 * (2) if a signal is still at or above high, wait for the frees pending on other streams and release
 * every cached piece; (3) call the pressure callbacks (gm_on_pressure). When an allocation still fails after the allocator's own retries (which
 * release all cached memory), the callbacks are called with CRITICAL and the allocation is retried once
 * before GM_ERROR_OUT_OF_MEMORY (this needs only a callback, no policy). Each action is counted in
 * gm_stats (num_pressure_*) and recorded in the history (pressure_* events).
 *
 * Without a policy (the default) nothing is watched and gm_malloc and gm_free pay one branch. */
typedef enum gm_pressure_level {
    GM_PRESSURE_NORMAL = 0,
    GM_PRESSURE_HIGH = 1,
    GM_PRESSURE_CRITICAL = 2 /* an allocation would fail: the callbacks run before its last retry */
} gm_pressure_level;

/* The signals, as bits of gm_pressure_policy.signals. The byte signals are compared with thresholds
 * precomputed in bytes after each call that changes them (no division, no system call); the others
 * cost a driver call or file reads, so a thread of the allocator samples them every interval_ms. */
enum {
    GM_PRESSURE_SIGNAL_RESERVED = 1u << 0,  /* reserved bytes, a fraction of the memory limit (or device) */
    GM_PRESSURE_SIGNAL_ALLOCATED = 1u << 1, /* allocated bytes, a fraction of the memory limit (or device) */
    GM_PRESSURE_SIGNAL_DEVICE = 1u << 2,    /* the driver's used memory (total - free: every process's),
                                               a fraction of the device */
    GM_PRESSURE_SIGNAL_HOST = 1u << 3,      /* the host's used memory (MemTotal - MemAvailable), a
                                               fraction of MemTotal */
    GM_PRESSURE_SIGNAL_PSI = 1u << 4,       /* the host's memory pressure stall ("some avg10", percent)
                                               against psi_high and psi_low */
    GM_PRESSURE_SIGNAL_CGROUP = 1u << 5     /* this process's memory cgroup: memory.current (v1:
                                               usage_in_bytes) a fraction of the lower of memory.max and
                                               memory.high, where the container is throttled or killed
                                               first; never reached without a cgroup limit. The kernel
                                               counts page cache in it, which it reclaims before killing */
};

typedef struct gm_pressure_policy {
    double high;           /* the high watermark, a fraction in (0, 1] */
    double low;            /* the low watermark, a fraction in (0, high) */
    uint32_t signals;      /* GM_PRESSURE_SIGNAL_* bits; 0: reserved and allocated bytes */
    uint32_t interval_ms;  /* the sampled signals (device, host, psi, cgroup) are read this often; 0: 100 */
    double psi_high;       /* PSI percent that raises the level; 0: 10 */
    double psi_low;        /* PSI percent under which it may fall; 0: half of psi_high */
    const char *host_root; /* where /proc and /sys/fs/cgroup are read: NULL or "/" for this machine, a
                              fixture tree for tests */
} gm_pressure_policy;

/* The readings behind a level. */
typedef struct gm_pressure_readings {
    gm_pressure_level level;
    uint32_t signals_high;        /* signals at or above their high watermark (GM_PRESSURE_SIGNAL_* bits) */
    uint64_t reserved_bytes;
    uint64_t allocated_bytes;
    uint64_t limit_bytes;         /* the memory limit, or the device's size: what high and low are of */
    uint64_t high_bytes;          /* the watermarks in bytes (rounded to the nearest byte; 0 without policy) */
    uint64_t low_bytes;
    uint64_t device_used_bytes;   /* sampled: the driver's used memory, all processes (0 if not sampled) */
    uint64_t device_total_bytes;
    int64_t host_available_bytes; /* sampled: MemAvailable (-1 if not read) */
    int64_t host_total_bytes;     /* MemTotal (-1 if not read) */
    double host_psi_avg10;        /* memory PSI "some avg10" in percent (-1 if not read) */
    uint64_t request_bytes;       /* CRITICAL: the allocation that would fail; else 0 */
    uint64_t released_bytes;      /* bytes the ladder released at this change */
    uint64_t changes;             /* level changes so far on this allocator: orders calls made on threads */
    int64_t cgroup_current_bytes; /* sampled: this process's memory cgroup's memory.current (-1 if not read) */
    int64_t cgroup_limit_bytes;   /* the lower of its memory.max and memory.high (-1 if not read or no limit) */
} gm_pressure_readings;

/* Called when the level changes (with the new level; CRITICAL before an allocation's last retry), with
 * no lock of the allocator held: it may call gm_malloc, gm_free, gm_empty_cache, gm_get_stats, ... on
 * `allocator`. A change that a callback's own calls cause is not dispatched inside it: it follows once
 * the callbacks return. Callbacks run on the thread whose call changed the level, or on the allocator's
 * sampling thread, possibly on several threads at once. They must not destroy the allocator. */
typedef void (*gm_pressure_callback)(gm_allocator *allocator, gm_pressure_level level,
                                     const gm_pressure_readings *readings, void *context);

/* Watch memory with `policy` (copied), or stop with NULL. Setting it evaluates the signals at once (a
 * rise runs the ladder and calls the callbacks before this returns) and, with a sampled signal, starts
 * the sampling thread (stopped and joined by the next call and by gm_destroy). GPUMEM_CONF keys
 * pressure_high, pressure_low, ... set one at creation. GM_ERROR_INVALID_ARGUMENT for a bad policy
 * (low must be below high, both in (0, 1]) or when called from a callback on the sampling thread. */
GM_API gm_status gm_set_pressure_policy(gm_allocator *allocator, const gm_pressure_policy *policy);

/* The policy in force (high is 0 without one); host_root points into the allocator, valid until the
 * policy changes. */
GM_API gm_status gm_get_pressure_policy(gm_allocator *allocator, gm_pressure_policy *policy_out);

/* The current level and the latest readings (the byte signals as of now, sampled ones as last read). */
GM_API gm_status gm_get_pressure(gm_allocator *allocator, gm_pressure_readings *readings_out);

/* Read the sampled signals now and evaluate, as the sampling thread does (for a program that checks at
 * its own moments, e.g. between training steps); callbacks run on this thread. readings_out may be NULL. */
GM_API gm_status gm_check_pressure(gm_allocator *allocator, gm_pressure_readings *readings_out);

/* Register a callback (at most 16); the same function with another context is another registration. */
GM_API gm_status gm_on_pressure(gm_allocator *allocator, gm_pressure_callback callback, void *context);

/* Remove the registration of `callback` with `context`. Once this returns the callback is not called
 * again, and calls of it on other threads have returned (unless those threads are themselves, from inside
 * a callback, removing one or changing the policy). May be called from a callback.
 * GM_ERROR_INVALID_ARGUMENT if not registered. */
GM_API gm_status gm_remove_pressure_callback(gm_allocator *allocator, gm_pressure_callback callback, void *context);

/* "normal", "high", "critical"; "unknown" otherwise. */
GM_API const char *gm_pressure_level_name(gm_pressure_level level);

/* For tests of failure paths, on any backend: after `after_calls` more successful device calls of kind
 * `call`, the next `failures` ones fail with GM_ERROR_DEVICE (the device is not asked). 0 failures
 * cancels. A failed device call never corrupts the allocator: the call that needed it fails (or
 * finds another way) and everything else stays exact (gm_validate). */
GM_API gm_status gm_inject_device_failures(gm_allocator *allocator, gm_device_call call, uint64_t after_calls,
                                           uint64_t failures);

/* The stream named `name` on the allocator's device, for tools that replay a recorded program's
 * streams (gpumem replay): on sim and host the name itself (any number names a simulated stream); on
 * cuda name 0 is the default stream and any other a CUDA stream made on its first use and destroyed
 * with the allocator. */
GM_API gm_status gm_named_stream(gm_allocator *allocator, uint64_t name, gm_stream *stream_out);

/* ---------------------------------------------------------------- simulated streams */

/* The "sim" and "host" backends simulate the work queued on streams so that tests can decide when
 * it finishes. gm_sim_stream_enqueue queues `units` of work on a stream; gm_sim_stream_complete
 * finishes all of it. Events recorded on a stream complete once the work queued before them has.
 * Other backends return GM_ERROR_NOT_SUPPORTED. */
GM_API gm_status gm_sim_stream_enqueue(gm_allocator *allocator, gm_stream stream, uint64_t units);
GM_API gm_status gm_sim_stream_complete(gm_allocator *allocator, gm_stream stream);
/* Finish the oldest work queued on a simulated stream until at most `units_left` units remain queued
 * (nothing when no more are queued): a device running behind its host (gpumem replay --lead). */
GM_API gm_status gm_sim_stream_finish_until(gm_allocator *allocator, gm_stream stream, uint64_t units_left);
/* The units of simulated work that the allocator's waits for streams (event synchronizations) have
 * finished early since it was created: on a GPU the host would stall while that work ran. */
GM_API gm_status gm_sim_work_waited_for(gm_allocator *allocator, uint64_t *units_out);
/* Mark a simulated stream as being captured into a CUDA graph (1) or not (0), for tests of what the
 * allocator does during capture: as on a GPU, an event recorded on it meanwhile can never be queried
 * or waited for (the query fails, as CUDA's invalidates the capture). */
GM_API gm_status gm_sim_stream_set_capturing(gm_allocator *allocator, gm_stream stream, int capturing);

/* The "sim" and "host" backends' device is the allocator's alone; this makes `bytes` of it used elsewhere
 * (as by another process, or the CUDA context), from now on: the driver's free memory drops by it and
 * allocations find that much less room. For tests of the "other processes" cause and the device signal.
 * GM_ERROR_OUT_OF_MEMORY when the device has not that much free; GM_ERROR_NOT_SUPPORTED on "cuda". */
GM_API gm_status gm_sim_set_used_elsewhere(gm_allocator *allocator, uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_H */
