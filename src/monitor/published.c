/*
 * published.c -- reading another process's published statistics, trusting nothing in the file.
 *
 * Anyone can create a file in /dev/shm, so a region is believed only if it is a regular file (opened
 * with O_NOFOLLOW: a symbolic link is refused), owned by this user, with the magic, the layout
 * version, the header and total sizes and the statistics' shape (numbers of pool statistics,
 * counters and call kinds) of this build, and the pid and device of its name. A region whose process
 * is gone (kill(pid, 0) fails with ESRCH: it was killed before it could remove it) is stale: reported
 * as such, never read as live numbers, and removable.
 *
 * The numbers are copied under the region's seqlock: read the sequence (acquire), copy, fence
 * (acquire), read it again; an odd or changed sequence means a write overlapped, so copy again -- but
 * not forever: a writer killed inside an update leaves the sequence odd for good, one stopped in a
 * debugger for long, and one in a tight loop may leave no pause long enough for a copy (read_snapshot).
 */
#include "monitor/published.h"

#include "base/error.h"
#include "base/process_stat.h"
#include "monitor/region.h"
#include "base/system_memory.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define READ_SPINS 64                  /* attempts before the reader yields its processor */
#define READ_YIELDS_BETWEEN_CHECKS 256  /* yields between two looks at the writer and the clock */
#define READ_PATIENCE_NS 200000000      /* how long a live writer may stay inside one update */
#define READ_BUSY_PATIENCE_NS 2000000000LL /* how long a live writer may update without a pause */

bool gm_published_process_alive(long pid)
{
    /* Beyond pid_t no process can be, and the cast would name another (2^32 + 1 is 1, 2^32 - 1 is -1:
     * every process). */
    return pid > 0 && pid <= INT_MAX && !(kill((pid_t)pid, 0) == -1 && errno == ESRCH);
}

/* A name as gpumem writes one in the header (its backend's, its engine's): a short run of lowercase
 * letters, digits and '_' ended by a NUL inside its field. Anything else would reach JSON, Prometheus
 * labels and the terminal as it stands. */
static bool is_plain_name(const char *text, size_t size)
{
    size_t length = strnlen(text, size);
    if (length == 0 || length == size)
        return false;
    for (size_t i = 0; i < length; i++)
        if (!((text[i] >= 'a' && text[i] <= 'z') || (text[i] >= '0' && text[i] <= '9') || text[i] == '_'))
            return false;
    return true;
}

/* "gpumem.<uid>.<pid>.<device>" of this user: its pid and device. */
static bool parse_name(const char *name, long *pid_out, int *device_out)
{
    char expected[64];
    snprintf(expected, sizeof expected, GM_REGION_NAME_PREFIX "%u.", (unsigned)getuid());
    size_t prefix_length = strlen(expected);
    if (strncmp(name, expected, prefix_length) != 0)
        return false;
    char *end = NULL;
    long pid = strtol(name + prefix_length, &end, 10);
    if (pid <= 0 || pid > INT_MAX || *end != '.' || end[1] < '0' || end[1] > '9')
        return false;
    long device = strtol(end + 1, &end, 10);
    if (*end || device > 1 << 20)
        return false;
    *pid_out = pid;
    *device_out = (int)device;
    return true;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static gm_status open_region_file(const char *path, int *descriptor_out, struct stat *status_out)
{
    int descriptor = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (descriptor < 0 && errno == ELOOP)
        return gm_fail(GM_ERROR_IO, "%s is a symbolic link, not a statistics region: refused", path);
    if (descriptor < 0)
        return gm_fail(GM_ERROR_IO, "cannot open %s: %s", path, strerror(errno));
    gm_status status = GM_OK;
    if (fstat(descriptor, status_out) != 0)
        status = gm_fail(GM_ERROR_IO, "cannot stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(status_out->st_mode))
        status = gm_fail(GM_ERROR_IO, "%s is not a regular file: refused", path);
    else if (status_out->st_uid != getuid())
        status = gm_fail(GM_ERROR_IO, "%s belongs to another user (uid %u, not %u): refused", path,
                         (unsigned)status_out->st_uid, (unsigned)getuid());
    if (status != GM_OK) {
        close(descriptor);
        return status;
    }
    *descriptor_out = descriptor;
    return GM_OK;
}

static gm_status check_header(const char *path, const gm_region_header *header, off_t file_size)
{
    if (memcmp(header->magic, GM_REGION_MAGIC, sizeof header->magic) != 0)
        return gm_fail(GM_ERROR_CORRUPT, "%s has a bad magic number: not a gpumem statistics region", path);
    if (header->layout_version != GM_REGION_LAYOUT_VERSION)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "%s has layout version %u (written by %s gpumem); this gpumem reads "
                       "version %u: read it with the gpumem that the process uses", path, header->layout_version,
                       header->layout_version < GM_REGION_LAYOUT_VERSION ? "an older" : "a newer",
                       GM_REGION_LAYOUT_VERSION);
    if (header->header_size != sizeof *header || header->total_size != sizeof(gm_region) ||
        (uint64_t)file_size != sizeof(gm_region))
        return gm_fail(GM_ERROR_CORRUPT, "%s has the wrong size (%lld bytes, header %u, total %llu; a region "
                       "has %zu)", path, (long long)file_size, header->header_size,
                       (unsigned long long)header->total_size, sizeof(gm_region));
    if (header->stats_size != sizeof(gm_stats) || header->pool_statistic_count != GM_REGION_POOL_STATISTIC_COUNT ||
        header->counter_count != GM_REGION_COUNTER_COUNT || header->call_kind_count != GM_CALL_KIND_COUNT)
        return gm_fail(GM_ERROR_NOT_SUPPORTED, "%s holds statistics of another shape (%u pool statistics, %u "
                       "counters, %u call kinds); this gpumem has %d, %d, %d", path, header->pool_statistic_count,
                       header->counter_count, header->call_kind_count, GM_REGION_POOL_STATISTIC_COUNT,
                       GM_REGION_COUNTER_COUNT, GM_CALL_KIND_COUNT);
    if (!is_plain_name(header->backend, sizeof header->backend) || !is_plain_name(header->engine, sizeof header->engine))
        return gm_fail(GM_ERROR_CORRUPT, "%s names its backend or engine with other than lowercase letters, digits "
                       "and '_': not a region gpumem wrote", path);
    long name_pid = 0;
    int name_device = 0;
    if (!parse_name(base_name(path), &name_pid, &name_device) || name_pid != header->pid ||
        name_device != header->device)
        return gm_fail(GM_ERROR_CORRUPT, "%s says it is process %lld's device %d, which its name does not", path,
                       (long long)header->pid, header->device);
    return GM_OK;
}

static gm_status read_header(const char *path, int descriptor, off_t file_size, gm_region_header *header)
{
    if (file_size < (off_t)sizeof *header)
        return gm_fail(GM_ERROR_CORRUPT, "%s is too short (%lld bytes; a region has %zu): not a statistics region",
                       path, (long long)file_size, sizeof(gm_region));
    if (pread(descriptor, header, sizeof *header, 0) != (ssize_t)sizeof *header)
        return gm_fail(GM_ERROR_IO, "cannot read %s", path);
    return check_header(path, header, file_size);
}

typedef enum snapshot_result {
    SNAPSHOT_CONSISTENT,
    SNAPSHOT_TORN,    /* the writer died in the middle of an update */
    SNAPSHOT_STUCK,   /* the writer, alive, stayed in one update past READ_PATIENCE_NS */
    SNAPSHOT_CHANGING /* the writer, alive, kept updating without a pause past READ_BUSY_PATIENCE_NS */
} snapshot_result;

static void copy_numbers(const gm_region *region, gm_stats *stats_out, gm_region_cache *cache_out,
                         gm_region_pinned_host *pinned_host_out)
{
    memcpy(stats_out, &region->stats, sizeof *stats_out);
    memcpy(cache_out, &region->cache, sizeof *cache_out);
    memcpy(pinned_host_out, &region->pinned_host, sizeof *pinned_host_out);
}

static int64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* What the reader saw of the writer at its looks (every READ_YIELDS_BETWEEN_CHECKS yields). */
typedef struct writer_watch {
    int64_t first_look_ns;     /* 0 before the first look */
    int64_t sequence_since_ns; /* the look at which the sequence last changed */
    uint64_t sequence;         /* the sequence at the last look */
} writer_watch;

/* A look at a writer that keeps the reader waiting. Two ways to wait are told apart: a sequence that
 * stays one odd number is one update that does not end (a writer stopped in a debugger), given up on
 * after READ_PATIENCE_NS; a sequence that moves is a writer making progress, update after update, with
 * gaps too short for a copy (a thread allocating in a tight loop holds the bracket for most of each
 * call), waited for longer, since each of its pauses is a chance, but not forever. */
static snapshot_result look_at_writer(gm_region *region, writer_watch *watch)
{
    int64_t now = monotonic_ns();
    uint64_t sequence = atomic_load_explicit(&region->sequence, memory_order_acquire);
    bool first_look = !watch->first_look_ns;
    if (first_look)
        watch->first_look_ns = now;
    if (first_look || sequence != watch->sequence) {
        watch->sequence = sequence;
        watch->sequence_since_ns = now;
    }
    if ((sequence & 1) && now - watch->sequence_since_ns > READ_PATIENCE_NS)
        return SNAPSHOT_STUCK;
    if (now - watch->first_look_ns > READ_BUSY_PATIENCE_NS)
        return SNAPSHOT_CHANGING;
    return SNAPSHOT_CONSISTENT; /* not yet a verdict: keep trying */
}

/* Copy the statistics under the seqlock. An update takes the writer microseconds (milliseconds when it
 * waits for the device), so a sequence that stays odd or changed is asked about now and then: a writer
 * that is gone will never finish its update (killed inside it), and its last numbers, stable now, are
 * taken as they are; a writer alive is waited for as look_at_writer says, rather than spun on forever.
 * A copy is started only at an even sequence: one begun inside an update is wasted. */
static snapshot_result read_snapshot(gm_region *region, long writer_pid, gm_stats *stats_out,
                                     gm_region_cache *cache_out, gm_region_pinned_host *pinned_host_out)
{
    writer_watch watch = {0};
    for (long attempt = 0;; attempt++) {
        uint64_t before = atomic_load_explicit(&region->sequence, memory_order_acquire);
        if (!(before & 1)) {
            copy_numbers(region, stats_out, cache_out, pinned_host_out);
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&region->sequence, memory_order_relaxed) == before)
                return SNAPSHOT_CONSISTENT;
        }
        if (attempt < READ_SPINS)
            continue;
        if ((attempt - READ_SPINS) % READ_YIELDS_BETWEEN_CHECKS == 0) {
            if (!gm_published_process_alive(writer_pid)) {
                copy_numbers(region, stats_out, cache_out, pinned_host_out); /* nothing writes them now */
                return atomic_load_explicit(&region->sequence, memory_order_acquire) & 1 ? SNAPSHOT_TORN
                                                                                         : SNAPSHOT_CONSISTENT;
            }
            snapshot_result verdict = look_at_writer(region, &watch);
            if (verdict != SNAPSHOT_CONSISTENT)
                return verdict;
        }
        sched_yield();
    }
}

/* The all-pools current, allocated and freed readings are sums the writer does not keep. False when a
 * reading is negative or a sum overflows: numbers no writer of gpumem's makes (another process's memory,
 * so nothing is taken on trust). */
static bool complete(gm_stats *stats)
{
    bool sound = true;
#define SUM(field, label, unit, origin)                                                                       \
    for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE; pool++)                                            \
        sound = sound && stats->field[pool].current >= 0 && stats->field[pool].peak >= 0 &&                 \
                stats->field[pool].allocated >= 0 && stats->field[pool].freed >= 0;                          \
    sound = sound && stats->field[GM_POOL_ALL].peak >= 0 &&                                                  \
            !__builtin_add_overflow(stats->field[GM_POOL_SMALL].current, stats->field[GM_POOL_LARGE].current, \
                                    &stats->field[GM_POOL_ALL].current) &&                                   \
            !__builtin_add_overflow(stats->field[GM_POOL_SMALL].allocated,                                   \
                                    stats->field[GM_POOL_LARGE].allocated, &stats->field[GM_POOL_ALL].allocated) && \
            !__builtin_add_overflow(stats->field[GM_POOL_SMALL].freed, stats->field[GM_POOL_LARGE].freed,     \
                                    &stats->field[GM_POOL_ALL].freed);
    GM_POOL_STATISTICS(SUM)
#undef SUM
#define COUNTER(field, label, origin) sound = sound && stats->field >= 0;
    GM_COUNTERS(COUNTER)
#undef COUNTER
    return sound;
}

static void copy_header(const gm_region_header *header, gm_published *published)
{
    published->pid = (long)header->pid;
    published->parent_pid = (long)header->parent_pid;
    published->device = header->device;
    snprintf(published->backend, sizeof published->backend, "%.15s", header->backend);
    snprintf(published->engine, sizeof published->engine, "%.15s", header->engine);
    published->page_size = header->page_size;
    published->device_total_bytes = header->device_total_bytes;
    published->start_time_ns = header->start_time_ns;
}

/* Field by field: the reader's struct is its own, not the file's layout. */
static void copy_pinned_host(const gm_region_pinned_host *part, gm_published_pinned_host *out)
{
    out->allocated_bytes = part->allocated_bytes;
    out->allocated_bytes_peak = part->allocated_bytes_peak;
    out->reserved_bytes = part->reserved_bytes;
    out->reserved_bytes_peak = part->reserved_bytes_peak;
    out->allocations = part->allocations;
    out->requested_bytes = part->requested_bytes;
    out->cache_hits = part->cache_hits;
    out->cache_misses = part->cache_misses;
    out->host_frees = part->host_frees;
    out->pending_blocks = part->pending_blocks;
    out->limit_bytes = part->limit_bytes;
}

struct gm_published_watch {
    gm_region *mapping;
    int descriptor; /* kept open: its size is looked at before each copy */
    gm_region_header header;
    char path[4096];
};

/* Whether process `pid` started more than two seconds after `realtime_ns` (CLOCK_REALTIME), the moment
 * its region was made: then that process is not the region's writer but a later one given its number.
 * /proc's start time counts clock ticks since boot (suspend included: CLOCK_BOOTTIME); the margin allows
 * for the tick and for the clock being set meanwhile. False when /proc says nothing. */
static bool started_after(long pid, int64_t realtime_ns)
{
    gm_process_stat stat;
    if (!gm_process_stat_read(NULL, pid, &stat) || !stat.has_start)
        return false;
    unsigned long long ticks = stat.start_ticks;
    long per_second = sysconf(_SC_CLK_TCK);
    struct timespec real, boot;
    if (per_second <= 0 || clock_gettime(CLOCK_REALTIME, &real) || clock_gettime(CLOCK_BOOTTIME, &boot))
        return false;
    int64_t since_boot_ns = (int64_t)(ticks / (unsigned long long)per_second) * 1000000000 +
                            (int64_t)(ticks % (unsigned long long)per_second) * (1000000000 / per_second);
    int64_t boot_realtime_ns = ((int64_t)real.tv_sec - boot.tv_sec) * 1000000000 + (real.tv_nsec - boot.tv_nsec);
    return boot_realtime_ns + since_boot_ns > realtime_ns + 2000000000LL;
}

/* Open, check and map a region; `require_alive`: refuse it when its writer is gone. */
static gm_status watch_region(const char *path, bool require_alive, gm_published_watch **watch_out)
{
    int descriptor = -1;
    struct stat file_status;
    gm_status status = open_region_file(path, &descriptor, &file_status);
    if (status != GM_OK)
        return status;
    gm_region_header header;
    status = read_header(path, descriptor, file_status.st_size, &header);
    if (status == GM_OK && require_alive && !gm_published_process_alive((long)header.pid))
        status = gm_fail(GM_ERROR_IO, "process %lld is gone (killed before it could remove %s): the region is stale",
                         (long long)header.pid, path);
    else if (status == GM_OK && require_alive && started_after((long)header.pid, header.start_time_ns))
        status = gm_fail(GM_ERROR_IO, "process %lld started after %s was made: its writer is gone and another "
                         "process has its number; the region is stale", (long long)header.pid, path);
    void *mapping = MAP_FAILED;
    if (status == GM_OK && (mapping = mmap(NULL, sizeof(gm_region), PROT_READ, MAP_SHARED, descriptor, 0)) == MAP_FAILED)
        status = gm_fail(GM_ERROR_IO, "cannot map %s: %s", path, strerror(errno));
    gm_published_watch *watch = status == GM_OK ? gm_system_calloc(1, sizeof *watch) : NULL;
    if (status == GM_OK && !watch)
        status = gm_fail(GM_ERROR_OUT_OF_MEMORY, "no host memory to watch %s", path);
    if (status != GM_OK) {
        if (mapping != MAP_FAILED)
            munmap(mapping, sizeof(gm_region));
        close(descriptor);
        return status;
    }
    watch->mapping = mapping;
    watch->descriptor = descriptor;
    watch->header = header;
    snprintf(watch->path, sizeof watch->path, "%s", path);
    *watch_out = watch;
    return GM_OK;
}

gm_status gm_published_watch_open(const char *path, gm_published_watch **watch_out)
{
    if (!path || !watch_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_published_watch_open: an argument is NULL");
    return watch_region(path, false, watch_out);
}

gm_status gm_published_watch_read(const gm_published_watch *watch, gm_published *published_out)
{
    if (!watch || !published_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_published_watch_read: an argument is NULL");
    memset(published_out, 0, sizeof *published_out);
    struct stat file_status; /* a file cut short under the mapping would end this process (SIGBUS) */
    if (fstat(watch->descriptor, &file_status) != 0 || file_status.st_size < (off_t)sizeof(gm_region))
        return gm_fail(GM_ERROR_CORRUPT, "%s was cut short after it was opened: not a statistics region now",
                       watch->path);
    copy_header(&watch->header, published_out);
    gm_region_cache cache;
    gm_region_pinned_host pinned_host;
    snapshot_result result = read_snapshot(watch->mapping, (long)watch->header.pid, &published_out->stats, &cache,
                                           &pinned_host);
    if (result == SNAPSHOT_STUCK)
        return gm_fail(GM_ERROR_IO, "%s: its writer, process %lld, has been inside one update for over %d ms "
                       "(stopped?); try again", watch->path, (long long)watch->header.pid,
                       (int)(READ_PATIENCE_NS / 1000000));
    if (result == SNAPSHOT_CHANGING)
        return gm_fail(GM_ERROR_IO, "%s: its writer, process %lld, changed its statistics without a pause long "
                       "enough for a copy for %d ms; try again", watch->path, (long long)watch->header.pid,
                       (int)(READ_BUSY_PATIENCE_NS / 1000000));
    published_out->torn = result == SNAPSHOT_TORN;
    if (!complete(&published_out->stats))
        return gm_fail(GM_ERROR_CORRUPT, "%s holds negative statistics, or sums past 2^63: not what gpumem writes",
                       watch->path);
    published_out->cached_free_bytes = cache.free_bytes;
    published_out->largest_free_block_bytes = cache.largest_free_block_bytes;
    copy_pinned_host(&pinned_host, &published_out->pinned_host);
    return GM_OK;
}

void gm_published_watch_close(gm_published_watch *watch)
{
    if (!watch)
        return;
    munmap(watch->mapping, sizeof(gm_region));
    close(watch->descriptor);
    free(watch);
}

gm_status gm_published_read(const char *path, gm_published *published_out)
{
    if (!path || !published_out)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_published_read: an argument is NULL");
    gm_published_watch *watch = NULL;
    gm_status status = watch_region(path, true, &watch);
    if (status != GM_OK)
        return status;
    status = gm_published_watch_read(watch, published_out);
    gm_published_watch_close(watch);
    return status;
}

gm_status gm_published_list(bool (*visit)(const char *path, long pid, int device, void *context), void *context)
{
    const char *directory = gm_region_directory();
    DIR *listing = opendir(directory);
    if (!listing)
        return gm_fail(GM_ERROR_IO, "cannot list %s: %s", directory, strerror(errno));
    char path[4096];
    struct dirent *entry;
    bool more = true;
    while (more && (entry = readdir(listing))) {
        long pid = 0;
        int device = 0;
        if (!parse_name(entry->d_name, &pid, &device))
            continue;
        if (snprintf(path, sizeof path, "%s/%s", directory, entry->d_name) >= (int)sizeof path)
            continue;
        more = visit(path, pid, device, context);
    }
    closedir(listing);
    return GM_OK;
}

typedef struct find_context {
    long pid;
    int device; /* wanted, or < 0 for the lowest */
    int found_device;
    char *path;
    size_t path_size;
} find_context;

static bool visit_for_find(const char *path, long pid, int device, void *context)
{
    find_context *find = context;
    if (pid != find->pid || (find->device >= 0 && device != find->device))
        return true;
    if (find->found_device >= 0 && device > find->found_device)
        return true;
    find->found_device = device;
    snprintf(find->path, find->path_size, "%s", path);
    return true;
}

gm_status gm_published_find(long pid, int device, char *path_out, size_t path_size)
{
    find_context find = {pid, device, -1, path_out, path_size};
    gm_status status = gm_published_list(visit_for_find, &find);
    if (status != GM_OK)
        return status;
    if (find.found_device >= 0)
        return GM_OK;
    const char *what = gm_published_process_alive(pid) ? "publishes no statistics (is it run with publish:true?)"
                                                       : "does not exist";
    if (device >= 0)
        return gm_fail(GM_ERROR_IO, "process %ld %s for device %d: no region in %s", pid, what, device,
                       gm_region_directory());
    return gm_fail(GM_ERROR_IO, "process %ld %s: no region in %s", pid, what, gm_region_directory());
}

/* A region whose process is alive but started after the region was made: a dead writer's (pid reuse). */
static bool made_before_its_process(const char *path, long pid)
{
    int descriptor = -1;
    struct stat file_status;
    if (open_region_file(path, &descriptor, &file_status) != GM_OK)
        return false;
    gm_region_header header;
    bool earlier = read_header(path, descriptor, file_status.st_size, &header) == GM_OK &&
                   started_after(pid, header.start_time_ns);
    close(descriptor);
    return earlier;
}

static bool visit_for_removal(const char *path, long pid, int device, void *context)
{
    (void)device;
    struct stat file_status;
    if ((!gm_published_process_alive(pid) || made_before_its_process(path, pid)) && lstat(path, &file_status) == 0 &&
        file_status.st_uid == getuid() && unlink(path) == 0)
        ++*(size_t *)context;
    return true;
}

size_t gm_published_remove_stale(void)
{
    size_t removed = 0;
    gm_published_list(visit_for_removal, &removed);
    return removed;
}
