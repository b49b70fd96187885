/*
 * publish.c -- an allocator's statistics, kept current in a shared-memory region for other processes.
 *
 * The region (region.h, docs/formats.md) is created when the allocator is (publish:true), with
 * O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, mapped, and removed when the allocator is destroyed. A
 * file of the same name left by a dead process that had our pid is replaced (unlinked, then created
 * again with O_EXCL); one made by another allocator of this process (same device) is not.
 *
 * The region's gm_stats is not a copy: once the region exists, the allocator keeps its statistics
 * there (gm_publisher_stats), so publishing costs no copying at all. Every call that changes them
 * does so between gm_publish_begin and gm_publish_end, a seqlock: the sequence number goes odd, the
 * numbers change, it goes even again, with C11 release ordering (Boehm's seqlock pattern, as the Linux
 * kernel's seqcount), so a reader that sees the same even number before and after its copy has a
 * consistent snapshot, and the published numbers are exact after every call. There is one writer
 * per region (the allocator's mutex serializes it), so no lock, atomic read-modify-write or system
 * call is needed: two stores per call. Only the device-call counts and costs live elsewhere (in the
 * backend); the allocator copies them in, inside the bracket, when a device call happened. The pinned
 * host cache's numbers (gm_host_stats, kept by core/host_cache.c) are copied in too, inside the bracket
 * of each gm_host_malloc, gm_host_free and gm_host_empty_cache: those calls are far rarer than gm_malloc,
 * and a copy of eleven words keeps the region's layout independent of the public struct.
 *
 * Why not a copy after each call: copying the whole gm_stats (1.1 KiB), or even only the readings of
 * the pool a call touched (about 40 words), measured 8-12 ns a call on the sim (plain malloc+free
 * pairs take 56 ns), over the 5% target; the two stores of the bracket are within it.
 */
#include "monitor/publish.h"
#include "base/blocking.h"

#include "base/error.h"
#include "monitor/region.h"
#include "base/system_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct gm_publisher {
    gm_region *region;
    gm_seqlock_writer seqlock;
    gm_publisher *next_open;
    pid_t owner; /* the process that created it (a forked child inherits the list, not the region) */
    char path[4096];
};

/* The publishers of this process, so that a region of our pid can be told apart: ours (another
 * allocator publishing the same device) or a dead process's (pid reuse). */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static gm_publisher *open_publishers;

static bool published_here(const char *path)
{
    bool found = false;
    gm_mutex_lock(&open_lock);
    for (gm_publisher *publisher = open_publishers; publisher && !found; publisher = publisher->next_open)
        found = strcmp(publisher->path, path) == 0;
    pthread_mutex_unlock(&open_lock);
    return found;
}

/* At exit, the regions of allocators never destroyed (PyTorch never destroys its allocator) are
 * removed, so that processes that end normally leave nothing in /dev/shm. A reader that mapped one
 * (gpumem run) keeps its last numbers. Registered with atexit, which glibc also runs when a library
 * loaded with dlopen is unloaded. */
static void remove_regions_at_exit(void)
{
    gm_mutex_lock(&open_lock);
    for (gm_publisher *publisher = open_publishers; publisher; publisher = publisher->next_open)
        if (publisher->owner == getpid())
            unlink(publisher->path);
    pthread_mutex_unlock(&open_lock);
}

/* A child made by fork shares the parent's regions (MAP_SHARED) and would write its own allocations
 * into the parent's numbers, under the parent's seqlock. Each is replaced, at the same address (the
 * allocator's pointers into it stay good), by a private copy: the child's allocators keep counting
 * there, unpublished, and the parent's region stays the parent's alone. Runs in the child, alone. */
static void keep_private_copies(void)
{
    static gm_region copy;
    for (gm_publisher *publisher = open_publishers; publisher; publisher = publisher->next_open) {
        memcpy(&copy, publisher->region, sizeof copy);
        void *mapping = mmap(publisher->region, sizeof(gm_region), PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (mapping != MAP_FAILED)
            memcpy(publisher->region, &copy, sizeof copy);
    }
    pthread_mutex_unlock(&open_lock);
}

static void lock_for_fork(void) { gm_mutex_lock(&open_lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&open_lock); }

static void register_exit_handler(void)
{
    atexit(remove_regions_at_exit);
    pthread_atfork(lock_for_fork, unlock_after_fork, keep_private_copies);
}

static void remember(gm_publisher *publisher, bool open)
{
    static pthread_once_t exit_handler_once = PTHREAD_ONCE_INIT;
    if (open)
        pthread_once(&exit_handler_once, register_exit_handler);
    gm_mutex_lock(&open_lock);
    gm_publisher **link = &open_publishers;
    while (*link && *link != publisher)
        link = &(*link)->next_open;
    if (open && !*link) {
        publisher->next_open = open_publishers;
        open_publishers = publisher;
    } else if (!open && *link) {
        *link = publisher->next_open;
    }
    pthread_mutex_unlock(&open_lock);
}

static int create_file(const char *path)
{
    int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int descriptor = open(path, flags, 0600);
    if (descriptor >= 0 || errno != EEXIST)
        return descriptor;
    if (published_here(path)) {
        errno = EEXIST;
        return -1;
    }
    /* Our pid, not ours: left by a dead process whose pid we were given. */
    if (unlink(path) != 0)
        return -1;
    return open(path, flags, 0600);
}

static void write_header(gm_region *region, const gm_publish_identity *identity)
{
    gm_region_header *header = &region->header;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    header->layout_version = GM_REGION_LAYOUT_VERSION;
    header->header_size = sizeof *header;
    header->total_size = sizeof *region;
    header->pid = (int64_t)getpid();
    header->parent_pid = (int32_t)getppid();
    header->device = identity->device;
    header->stats_size = sizeof(gm_stats);
    header->pool_statistic_count = GM_REGION_POOL_STATISTIC_COUNT;
    header->counter_count = GM_REGION_COUNTER_COUNT;
    header->call_kind_count = GM_CALL_KIND_COUNT;
    snprintf(header->backend, sizeof header->backend, "%s", identity->backend);
    snprintf(header->engine, sizeof header->engine, "%s", identity->engine);
    header->page_size = identity->page_size;
    header->device_total_bytes = identity->device_total_bytes;
    header->start_time_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    atomic_thread_fence(memory_order_release); /* the magic last: a reader seeing it sees the rest */
    memcpy(header->magic, GM_REGION_MAGIC, sizeof header->magic);
}

static gm_status map_region(gm_publisher *publisher, int descriptor)
{
    if (fchmod(descriptor, 0600) != 0 || ftruncate(descriptor, (off_t)sizeof(gm_region)) != 0)
        return gm_fail(GM_ERROR_IO, "cannot size the statistics region %s: %s", publisher->path, strerror(errno));
    void *mapping = mmap(NULL, sizeof(gm_region), PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0);
    if (mapping == MAP_FAILED)
        return gm_fail(GM_ERROR_IO, "cannot map the statistics region %s: %s", publisher->path, strerror(errno));
    publisher->region = mapping;
    return GM_OK;
}

gm_status gm_publisher_open(const gm_publish_identity *identity, const gm_stats *stats,
                            const gm_host_stats *pinned_host, gm_publisher **publisher_out)
{
    *publisher_out = NULL;
    gm_publisher *publisher = gm_system_calloc(1, sizeof *publisher);
    if (!publisher)
        return gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to publish statistics");
    if (!gm_region_path(publisher->path, sizeof publisher->path, (long)getpid(), identity->device)) {
        free(publisher);
        return gm_fail(GM_ERROR_IO, "the statistics region's path under %s is too long", gm_region_directory());
    }
    int descriptor = create_file(publisher->path);
    if (descriptor < 0) {
        gm_status status = errno == EEXIST
            ? gm_fail(GM_ERROR_IO, "cannot publish statistics: %s exists (another allocator of this process "
                      "publishes device %d)", publisher->path, identity->device)
            : gm_fail(GM_ERROR_IO, "cannot create the statistics region %s: %s", publisher->path, strerror(errno));
        free(publisher);
        return status;
    }
    gm_status status = map_region(publisher, descriptor);
    close(descriptor);
    if (status != GM_OK) {
        unlink(publisher->path);
        free(publisher);
        return status;
    }
    publisher->seqlock.sequence = &publisher->region->sequence;
    publisher->owner = getpid();
    memcpy(&publisher->region->stats, stats, sizeof *stats); /* before the magic: nobody reads yet */
    gm_publisher_set_pinned_host(publisher, pinned_host);
    write_header(publisher->region, identity);
    remember(publisher, true);
    *publisher_out = publisher;
    return GM_OK;
}

gm_stats *gm_publisher_stats(gm_publisher *publisher)
{
    return &publisher->region->stats;
}

void gm_publisher_set_cache(gm_publisher *publisher, uint64_t free_bytes, uint64_t largest_free_block_bytes)
{
    publisher->region->cache.free_bytes = free_bytes;
    publisher->region->cache.largest_free_block_bytes = largest_free_block_bytes;
}

static uint64_t non_negative(int64_t value)
{
    return value > 0 ? (uint64_t)value : 0; /* never negative in a consistent cache; a reader sees 0, not 2^64-1 */
}

void gm_publisher_set_pinned_host(gm_publisher *publisher, const gm_host_stats *pinned_host)
{
    gm_region_pinned_host *part = &publisher->region->pinned_host;
    part->allocated_bytes = non_negative(pinned_host->allocated_bytes.current);
    part->allocated_bytes_peak = non_negative(pinned_host->allocated_bytes.peak);
    part->reserved_bytes = non_negative(pinned_host->reserved_bytes.current);
    part->reserved_bytes_peak = non_negative(pinned_host->reserved_bytes.peak);
    part->allocations = non_negative(pinned_host->allocations.current);
    part->requested_bytes = non_negative(pinned_host->requested_bytes);
    part->cache_hits = non_negative(pinned_host->cache_hits);
    part->cache_misses = non_negative(pinned_host->cache_misses);
    part->host_frees = non_negative(pinned_host->host_frees);
    part->pending_blocks = non_negative(pinned_host->pending_blocks);
    part->limit_bytes = pinned_host->limit;
}

gm_seqlock_writer *gm_publisher_seqlock(gm_publisher *publisher)
{
    return &publisher->seqlock;
}

const char *gm_publisher_path(const gm_publisher *publisher)
{
    return publisher->path;
}

void gm_publisher_close(gm_publisher *publisher)
{
    if (!publisher)
        return;
    remember(publisher, false);
    munmap(publisher->region, sizeof(gm_region));
    if (publisher->owner == getpid()) /* not a forked child's copy: the region is its parent's */
        unlink(publisher->path);
    free(publisher);
}
