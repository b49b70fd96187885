/*
 * publish.c -- an allocator's statistics, kept current in a shared-memory region for other processes.
 *
 * The region (region.h, docs/formats.md) is created when the allocator is (publish:true), with
 * O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, mapped, and removed when the allocator is destroyed. A
 * file of the same name left by a dead process that had our pid is replaced (unlinked, then created
 * again with O_EXCL); one made by another allocator of this process (same device) is not.
 *
 * Updates are a seqlock: the sequence number goes odd, the numbers are copied, it goes even again,
 * with C11 release ordering (Boehm's seqlock pattern), so a reader that sees the same even number
 * before and after its copy has a consistent snapshot. There is one writer per region (the
 * allocator's mutex serializes it), so no lock, atomic read-modify-write or system call is needed.
 *
 * What is copied when: a malloc or free that made no device call changes only the statistics of its
 * block's pool (allocations, allocated, requested and active bytes, inactive splits), the all-pools
 * peaks and the counters; reserved memory and segments change only with device calls. So after such
 * a call the allocator publishes just those (gm_publisher_write_pool: one 32-byte gm_stat and one
 * peak per statistic, and the counters), and the published allocated bytes are exact after every
 * call. After a call that made a device call (or completed pending cross-stream frees, or every 256
 * calls, or on empty_cache, set_memory_limit and the resets) it publishes the whole gm_stats with the
 * device-call counts and costs, which live in the backend (gm_publisher_write_all).
 * Why not the whole 1.1 KiB, or all 920 bytes of pool statistics and counters, every call: that copy
 * measured 30-40 ns a call on the sim replays (25-40% of a malloc or free), far over the 5% target;
 * the per-pool copy is a few stores.
 */
#include "monitor/publish.h"

#include "base/error.h"
#include "monitor/region.h"

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
    uint64_t sequence; /* our copy of region->sequence: we are its only writer */
    gm_publisher *next_open;
    char path[4096];
};

/* The publishers of this process, so that a region of our pid can be told apart: ours (another
 * allocator publishing the same device) or a dead process's (pid reuse). */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static gm_publisher *open_publishers;

static bool published_here(const char *path)
{
    bool found = false;
    pthread_mutex_lock(&open_lock);
    for (gm_publisher *publisher = open_publishers; publisher && !found; publisher = publisher->next_open)
        found = strcmp(publisher->path, path) == 0;
    pthread_mutex_unlock(&open_lock);
    return found;
}

static void remember(gm_publisher *publisher, bool open)
{
    pthread_mutex_lock(&open_lock);
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
                            gm_publisher **publisher_out)
{
    *publisher_out = NULL;
    gm_publisher *publisher = calloc(1, sizeof *publisher);
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
    write_header(publisher->region, identity);
    gm_publisher_write_all(publisher, stats);
    remember(publisher, true);
    *publisher_out = publisher;
    return GM_OK;
}

static inline void begin_write(gm_publisher *publisher)
{
    atomic_store_explicit(&publisher->region->sequence, ++publisher->sequence, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static inline void end_write(gm_publisher *publisher)
{
    atomic_store_explicit(&publisher->region->sequence, ++publisher->sequence, memory_order_release);
}

void gm_publisher_write_pool(gm_publisher *publisher, const gm_stats *restrict stats, int pool)
{
    gm_stats *restrict published = &publisher->region->stats;
    begin_write(publisher);
#define COPY_POOL(field, label, unit, origin)                                                               \
    published->field[pool] = stats->field[pool];                                                           \
    published->field[GM_POOL_ALL].peak = stats->field[GM_POOL_ALL].peak;
    GM_POOL_STATISTICS(COPY_POOL)
#undef COPY_POOL
#define COPY_COUNTER(field, label, origin) published->field = stats->field;
    GM_COUNTERS(COPY_COUNTER)
#undef COPY_COUNTER
    end_write(publisher);
}

void gm_publisher_write_all(gm_publisher *publisher, const gm_stats *stats)
{
    begin_write(publisher);
    memcpy(&publisher->region->stats, stats, sizeof *stats);
    end_write(publisher);
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
    unlink(publisher->path);
    free(publisher);
}
