/*
 * doctor.c -- the audit behind `gpumem doctor`: host memory, kernel settings, the cgroup, limits,
 * /dev/shm, the GPUs and, with a pid, a process tree's memory.
 *
 * Every file is read under a root directory, so tests build fixture trees of /proc and /sys. What a
 * file does not give becomes a finding of severity unknown that names it. The thresholds:
 *
 *   memory.available   MemAvailable < 10% of MemTotal warn, < 5% fail
 *   memory.swap        swap used > 25% of swap total warn; and memory PSI some avg10 > 10 fail ("swap storm")
 *   memory.pressure    PSI some avg10 > 10 warn; full avg10 > 10 fail
 *   vm.swappiness      > 10 on a machine with swap warn
 *   vm.min_free_kbytes < 65536 (64 MiB) on a machine of 32 GiB or more warn
 *   vm.overcommit      overcommit_memory 2 (strict accounting) warn
 *   memory.thp         transparent hugepages "always" warn (compaction stalls, memory bloat); madvise, never ok
 *   cgroup.memory_max  a limit (v2 memory.max, v1 memory.limit_in_bytes) below MemTotal warn
 *   cgroup.memory_high memory.high below memory.max and below MemTotal warn (throttling before the limit)
 *   cgroup.memory_current > 90% of the cgroup's limit warn
 *   limits.memlock     RLIMIT_MEMLOCK < 64 MiB warn (pinned memory)
 *   limits.open_files  RLIMIT_NOFILE < 4096 warn (DataLoader workers pass tensors as file descriptors)
 *   shm.size           /dev/shm < 1 GiB or < 10% of MemTotal warn; used > 80% warn
 *   gpu.N              PCIe link width below its maximum warn
 *   process.tree       any swapped memory in the --pid tree warn
 *   numa.nodes, memory.total, cgroup.path, cgroup.swap_max, gpu.driver: reported as ok
 *
 * The cgroup is read by host_memory.c (gm_cgroup_memory_read), which the pressure policy's cgroup signal
 * shares; this file only judges its readings.
 *
 * Limits: with a pid, /proc/PID/limits; without, getrlimit on the live machine and /proc/self/limits
 * under another root. /dev/shm: statvfs on the live machine; under another root the fixture file
 * ROOT/.statvfs/dev/shm with the lines "total BYTES" and "available BYTES". The GPUs are read through
 * NVML on the live machine only; under another root the GPU finding says it was not read.
 */
#include "monitor/doctor.h"

#include "base/error.h"
#include "monitor/host_memory.h"
#include "monitor/nvml.h"

#include <ctype.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

typedef struct audit {
    const char *root; /* "" on the live machine */
    bool live;
    long pid;
    char process_directory[32]; /* "/proc/self" or "/proc/PID" */
    gm_doctor_report *report;
    gm_host_memory memory;
    bool memory_known;
} audit;

const char *gm_doctor_severity_name(gm_doctor_severity severity)
{
    switch (severity) {
    case GM_DOCTOR_OK: return "ok";
    case GM_DOCTOR_UNKNOWN: return "unknown";
    case GM_DOCTOR_WARN: return "warn";
    case GM_DOCTOR_FAIL: return "fail";
    }
    return "unknown";
}

gm_doctor_severity gm_doctor_worst(const gm_doctor_report *report)
{
    gm_doctor_severity worst = GM_DOCTOR_OK;
    for (size_t i = 0; i < report->finding_count; i++)
        if (report->findings[i].severity > worst && report->findings[i].severity != GM_DOCTOR_UNKNOWN)
            worst = report->findings[i].severity;
    return worst;
}

static gm_doctor_finding *add_finding(audit *audit, const char *id, gm_doctor_severity severity, const char *why,
                                      const char *fix, const char *value_format, ...)
    __attribute__((format(printf, 6, 7)));

static gm_doctor_finding *add_finding(audit *audit, const char *id, gm_doctor_severity severity, const char *why,
                                      const char *fix, const char *value_format, ...)
{
    static gm_doctor_finding overflow;
    gm_doctor_report *report = audit->report;
    gm_doctor_finding *finding = report->finding_count < GM_DOCTOR_FINDINGS_MAX
                                     ? &report->findings[report->finding_count++] : &overflow;
    memset(finding, 0, sizeof *finding);
    snprintf(finding->id, sizeof finding->id, "%s", id);
    finding->severity = severity;
    snprintf(finding->why, sizeof finding->why, "%s", why ? why : "");
    snprintf(finding->fix, sizeof finding->fix, "%s", fix ? fix : "");
    va_list arguments;
    va_start(arguments, value_format);
    vsnprintf(finding->value, sizeof finding->value, value_format, arguments);
    va_end(arguments);
    return finding;
}

static void add_unreadable(audit *audit, const char *id, const char *path, const char *why)
{
    add_finding(audit, id, GM_DOCTOR_UNKNOWN, why, "", "cannot read %s%s", audit->root, path);
}

static void path_of(const audit *audit, char *buffer, size_t size, const char *path)
{
    snprintf(buffer, size, "%s%s", audit->root, path);
}

/* The first line of a file under the root, without its newline; false if unreadable or empty. */
static bool read_line(const audit *audit, const char *path, char *buffer, size_t size)
{
    return gm_read_first_line(audit->root, path, buffer, size);
}

static bool read_integer(const audit *audit, const char *path, int64_t *value)
{
    return gm_read_integer_file(audit->root, path, value);
}

static double percent(int64_t part, int64_t whole)
{
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

/* ---- host memory ---- */

static void audit_host_memory(audit *audit)
{
    if (gm_host_memory_read(audit->root, &audit->memory) != GM_OK || audit->memory.available_bytes < 0) {
        add_unreadable(audit, "memory.total", "/proc/meminfo", "MemTotal and MemAvailable are the measure of every other limit");
        char line[64];
        if (!read_line(audit, "/proc/pressure/memory", line, sizeof line))
            add_unreadable(audit, "memory.pressure", "/proc/pressure/memory", "memory PSI: time stalled waiting for memory");
        else
            add_finding(audit, "memory.pressure", GM_DOCTOR_UNKNOWN, "memory PSI: time stalled waiting for memory", "",
                        "not read: %s/proc/meminfo is unreadable", audit->root);
        return;
    }
    audit->memory_known = true;
    const gm_host_memory *memory = &audit->memory;
    add_finding(audit, "memory.total", GM_DOCTOR_OK, "the host RAM that the trainer, its DataLoader workers and pinned buffers share",
                "", "%.1f GiB", (double)memory->total_bytes / GIB);
    double available = percent(memory->available_bytes, memory->total_bytes);
    gm_doctor_severity severity = available < 5 ? GM_DOCTOR_FAIL : available < 10 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
    add_finding(audit, "memory.available", severity,
                "MemAvailable is what can still be allocated without swapping; below 10% of MemTotal (warn) or 5% "
                "(fail) the next DataLoader batch or pinned buffer risks the OOM killer",
                severity == GM_DOCTOR_OK ? "" : "find the largest processes (gpumem doctor --pid PID, ps aux --sort=-rss); "
                                                "fewer DataLoader workers (num_workers) or a smaller prefetch_factor",
                "%.1f GiB of %.1f GiB (%.1f%%)", (double)memory->available_bytes / GIB,
                (double)memory->total_bytes / GIB, available);

    bool pressure_known = memory->pressure_some_avg10 >= 0;
    if (memory->swap_total_bytes <= 0) {
        add_finding(audit, "memory.swap", GM_DOCTOR_OK, "without swap the kernel cannot stall the job by swapping; "
                    "it kills instead when memory runs out", "", "no swap");
    } else {
        int64_t used = memory->swap_total_bytes - (memory->swap_free_bytes > 0 ? memory->swap_free_bytes : 0);
        double used_percent = percent(used, memory->swap_total_bytes);
        severity = used_percent > 25 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        if (severity == GM_DOCTOR_WARN && pressure_known && memory->pressure_some_avg10 > 10)
            severity = GM_DOCTOR_FAIL;
        add_finding(audit, "memory.swap", severity,
                    "swap used above 25% (warn) means the working set does not fit in RAM; with memory pressure "
                    "(PSI some avg10 > 10) it is a swap storm (fail): the input pipeline stalls and the GPU idles",
                    severity == GM_DOCTOR_OK ? "" : "reduce host memory use (num_workers, dataset caching) or add RAM; "
                                                    "sysctl -w vm.swappiness=10",
                    "%.1f GiB of %.1f GiB used (%.1f%%)", (double)used / GIB, (double)memory->swap_total_bytes / GIB,
                    used_percent);
    }
    if (!pressure_known) {
        add_unreadable(audit, "memory.pressure", "/proc/pressure/memory",
                       "memory PSI says how much time tasks stall waiting for memory (kernel 4.20+ with CONFIG_PSI)");
    } else {
        severity = memory->pressure_full_avg10 > 10 ? GM_DOCTOR_FAIL
                   : memory->pressure_some_avg10 > 10 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        add_finding(audit, "memory.pressure", severity,
                    "the share of time tasks waited for memory: some avg10 > 10% (warn) slows the input pipeline, "
                    "full avg10 > 10% (fail) stalls every task, the GPU starves",
                    severity == GM_DOCTOR_OK ? "" : "free host memory: fewer DataLoader workers, smaller prefetch_factor, "
                                                    "no in-memory dataset copies per worker",
                    "some avg10=%.2f avg60=%.2f, full avg10=%.2f avg60=%.2f", memory->pressure_some_avg10,
                    memory->pressure_some_avg60, memory->pressure_full_avg10, memory->pressure_full_avg60);
    }
}

/* ---- kernel settings ---- */

/* vm.swappiness: how eagerly the kernel swaps, with swap present. */
static void audit_swappiness(audit *audit)
{
    int64_t swappiness;
    if (!read_integer(audit, "/proc/sys/vm/swappiness", &swappiness)) {
        add_unreadable(audit, "vm.swappiness", "/proc/sys/vm/swappiness", "how eagerly the kernel swaps anonymous memory");
    } else {
        bool has_swap = audit->memory_known && audit->memory.swap_total_bytes > 0;
        gm_doctor_severity severity = has_swap && swappiness > 10 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        add_finding(audit, "vm.swappiness", severity,
                    "above 10 on a machine with swap (warn) the kernel swaps out trainer and worker memory while page "
                    "cache from the dataset is kept, and the job stalls on swap-ins",
                    severity == GM_DOCTOR_OK ? "" : "sysctl -w vm.swappiness=10; echo 'vm.swappiness = 10' >> /etc/sysctl.d/90-gpu.conf",
                    "%" PRId64 "%s", swappiness, has_swap ? "" : " (no swap)");
    }
}

/* vm.min_free_kbytes: the kernel's free-memory reserve on a large machine. */
static void audit_min_free(audit *audit)
{
    int64_t min_free;
    if (!read_integer(audit, "/proc/sys/vm/min_free_kbytes", &min_free)) {
        add_unreadable(audit, "vm.min_free_kbytes", "/proc/sys/vm/min_free_kbytes", "the kernel's free-memory reserve");
    } else {
        bool large = audit->memory_known && audit->memory.total_bytes >= 32 * (int64_t)GIB;
        gm_doctor_severity severity = large && min_free < 65536 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        add_finding(audit, "vm.min_free_kbytes", severity,
                    "the reserve the kernel keeps free for atomic allocations (network, driver); below 64 MiB on a "
                    "machine of 32 GiB or more (warn) bursts of pinned-memory and I/O allocations hit direct reclaim",
                    severity == GM_DOCTOR_OK ? "" : "sysctl -w vm.min_free_kbytes=262144; "
                                                    "echo 'vm.min_free_kbytes = 262144' >> /etc/sysctl.d/90-gpu.conf",
                    "%" PRId64 " KiB", min_free);
    }
}

/* vm.overcommit_memory: strict accounting fails DataLoader forks. */
static void audit_overcommit(audit *audit)
{
    int64_t overcommit, ratio = -1;
    if (!read_integer(audit, "/proc/sys/vm/overcommit_memory", &overcommit)) {
        add_unreadable(audit, "vm.overcommit", "/proc/sys/vm/overcommit_memory", "the kernel's policy for virtual memory commitments");
    } else {
        read_integer(audit, "/proc/sys/vm/overcommit_ratio", &ratio);
        gm_doctor_severity severity = overcommit == 2 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        add_finding(audit, "vm.overcommit", severity,
                    "overcommit_memory 2 (strict accounting, warn) makes fork() of DataLoader workers and the CUDA "
                    "runtime's large virtual reservations fail with ENOMEM long before RAM is used; 0 (heuristic) "
                    "and 1 (always) are fine",
                    severity == GM_DOCTOR_OK ? "" : "sysctl -w vm.overcommit_memory=0; "
                                                    "echo 'vm.overcommit_memory = 0' >> /etc/sysctl.d/90-gpu.conf",
                    "overcommit_memory %" PRId64 ", overcommit_ratio %" PRId64, overcommit, ratio);
    }
}

/* transparent hugepages: "always" stalls and bloats workers. */
static void audit_transparent_hugepages(audit *audit)
{
    char line[256];
    if (!read_line(audit, "/sys/kernel/mm/transparent_hugepage/enabled", line, sizeof line)) {
        add_unreadable(audit, "memory.thp", "/sys/kernel/mm/transparent_hugepage/enabled", "transparent hugepages mode");
    } else {
        const char *open = strchr(line, '['), *close = open ? strchr(open, ']') : NULL;
        char mode[32] = "?";
        if (open && close && close - open - 1 < (long)sizeof mode)
            snprintf(mode, sizeof mode, "%.*s", (int)(close - open - 1), open + 1);
        gm_doctor_severity severity = !strcmp(mode, "always") ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        add_finding(audit, "memory.thp", severity,
                    "\"always\" (warn) backs every large anonymous mapping with huge pages: direct compaction stalls "
                    "and memory bloat in DataLoader workers; \"madvise\" gives huge pages to the programs that ask",
                    severity == GM_DOCTOR_OK ? "" : "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled "
                                                    "(or transparent_hugepage=madvise on the kernel command line)",
                    "%s", mode);
    }
}

/* The NUMA nodes: on more than one, each rank belongs on its GPU's node. */
static void audit_numa_nodes(audit *audit)
{
    char path[4096];
    path_of(audit, path, sizeof path, "/sys/devices/system/node");
    DIR *directory = opendir(path);
    if (!directory) {
        add_unreadable(audit, "numa.nodes", "/sys/devices/system/node", "the NUMA nodes the GPUs and memory sit on");
    } else {
        int nodes = 0;
        struct dirent *entry;
        while ((entry = readdir(directory)))
            if (!strncmp(entry->d_name, "node", 4) && isdigit((unsigned char)entry->d_name[4]))
                nodes++;
        closedir(directory);
        add_finding(audit, "numa.nodes", GM_DOCTOR_OK,
                    "on more than one node, memory on the far node of a GPU halves host-to-device bandwidth",
                    nodes > 1 ? "run each rank on its GPU's node: numactl --cpunodebind=N --membind=N "
                                "(nvidia-smi topo -m shows the node of each GPU)" : "",
                    "%d", nodes);
    }
}

static void audit_kernel_settings(audit *audit)
{
    audit_swappiness(audit);
    audit_min_free(audit);
    audit_overcommit(audit);
    audit_transparent_hugepages(audit);
    audit_numa_nodes(audit);
}

/* ---- the cgroup ---- */

/* "12.5 GiB", or "512.0 MiB" below 1 GiB. */
static void format_bytes(char *buffer, size_t size, int64_t bytes)
{
    if (bytes >= (int64_t)GIB)
        snprintf(buffer, size, "%.1f GiB", (double)bytes / GIB);
    else
        snprintf(buffer, size, "%.1f MiB", (double)bytes / MIB);
}

static void format_limit(char *buffer, size_t size, int64_t bytes)
{
    if (bytes < 0)
        snprintf(buffer, size, "max");
    else
        format_bytes(buffer, size, bytes);
}

/* memory.max (or v1's limit) against the machine's RAM. */
static void audit_cgroup_max(audit *audit, const gm_cgroup_memory *cgroup)
{
    if (!cgroup->max_known) {
        add_unreadable(audit, "cgroup.memory_max", cgroup->max_file, "the cgroup's memory limit");
        return;
    }
    int64_t limit = cgroup->max_bytes, total = audit->memory_known ? audit->memory.total_bytes : -1;
    bool below = limit >= 0 && total > 0 && limit < total;
    char text[64];
    format_limit(text, sizeof text, limit);
    add_finding(audit, "cgroup.memory_max", below ? GM_DOCTOR_WARN : GM_DOCTOR_OK,
                "a cgroup limit below the machine's RAM (warn) is where the OOM killer strikes, whatever free "
                "shows: the job has less host memory than the machine",
                below ? "size num_workers and caches for the cgroup's limit, or raise it: docker run --memory=..., "
                        "systemctl set-property UNIT MemoryMax=..., Kubernetes resources.limits.memory" : "",
                "%s (RAM %.1f GiB)", text, total > 0 ? (double)total / GIB : 0.0);
}

/* memory.high, where the kernel starts to throttle. */
static void audit_cgroup_high(audit *audit, const gm_cgroup_memory *cgroup)
{
    if (!cgroup->high_known)
        return;
    int64_t limit = cgroup->max_bytes, high = cgroup->high_bytes;
    bool throttles = high >= 0 && (limit < 0 || high < limit) &&
                     (!audit->memory_known || high < audit->memory.total_bytes);
    char text[64];
    format_limit(text, sizeof text, high);
    add_finding(audit, "cgroup.memory_high", throttles ? GM_DOCTOR_WARN : GM_DOCTOR_OK,
                "above memory.high the kernel throttles and reclaims the cgroup's memory (warn when it is below "
                "memory.max and RAM): the job slows down before any OOM",
                throttles ? "raise it: systemctl set-property UNIT MemoryHigh=... or echo max > memory.high" : "",
                "%s", text);
}

/* The cgroup's memory in use, as a share of its limit. */
static void audit_cgroup_current(audit *audit, const gm_cgroup_memory *cgroup)
{
    if (!cgroup->current_known) {
        add_unreadable(audit, "cgroup.memory_current", cgroup->current_file, "the cgroup's memory in use");
        return;
    }
    if (!cgroup->max_known)
        return;
    int64_t limit = cgroup->max_bytes;
    double used = limit > 0 ? percent(cgroup->current_bytes, limit) : 0.0;
    char current_text[64];
    format_bytes(current_text, sizeof current_text, cgroup->current_bytes);
    char share[64] = "no limit";
    if (limit > 0)
        snprintf(share, sizeof share, "%.1f%% of the limit", used);
    gm_doctor_severity severity = limit > 0 && used > 90 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
    add_finding(audit, "cgroup.memory_current", severity,
                "the cgroup's memory in use, page cache included; above 90% of its limit (warn) the next "
                "allocation triggers reclaim or the OOM killer",
                severity == GM_DOCTOR_OK ? "" : "free memory in the cgroup or raise its limit",
                "%s (%s)", current_text, share);
}

/* The cgroup as gm_cgroup_memory_read finds it (v2 when its memory.max reads, else v1's memory
 * controller): a finding per reading, none for a file the hierarchy does not have. */
static void audit_cgroup(audit *audit)
{
    char relative[64];
    snprintf(relative, sizeof relative, "%s/cgroup", audit->process_directory);
    gm_cgroup_memory cgroup;
    if (gm_cgroup_memory_read(audit->root, audit->pid, &cgroup) != GM_OK) {
        add_unreadable(audit, "cgroup.path", relative, "the cgroup whose memory limit applies to the job");
        return;
    }
    static const char *const version_names[] = {[GM_CGROUP_NONE] = "none", [GM_CGROUP_V1] = "v1",
                                                [GM_CGROUP_V2] = "v2"};
    bool none = cgroup.version == GM_CGROUP_NONE;
    /* A v2 cgroup without memory files (the root cgroup, or no memory controller) is still named v2. */
    add_finding(audit, "cgroup.path", GM_DOCTOR_OK, "the cgroup whose memory limit applies to the job", "", "%s %s",
                none && cgroup.v2_listed ? "v2" : version_names[cgroup.version], cgroup.path);
    if (none) {
        if (cgroup.v2_listed && !strcmp(cgroup.path, "/") && audit->memory_known)
            add_finding(audit, "cgroup.memory_max", GM_DOCTOR_OK, "the root cgroup has no memory limit of its own", "",
                        "max (root cgroup, RAM %.1f GiB)", (double)audit->memory.total_bytes / GIB);
        else if (cgroup.v2_listed)
            add_unreadable(audit, "cgroup.memory_max", cgroup.max_file,
                           "the cgroup's memory limit (no memory controller here?)");
        return;
    }
    audit_cgroup_max(audit, &cgroup);
    audit_cgroup_high(audit, &cgroup);
    audit_cgroup_current(audit, &cgroup);
    if (cgroup.swap_max_known) {
        char text[64];
        format_limit(text, sizeof text, cgroup.swap_max_bytes);
        add_finding(audit, "cgroup.swap_max", GM_DOCTOR_OK,
                    "how much the cgroup may swap: 0 means it is killed, not slowed, at its limit", "", "%s", text);
    }
}

/* ---- limits, /dev/shm ---- */

/* The soft limit of a /proc/PID/limits line ("Max locked memory  65536  65536  bytes"): -1 unlimited. */
static bool read_limits_line(const audit *audit, const char *name, int64_t *soft)
{
    char relative[64], full[4096], line[256];
    snprintf(relative, sizeof relative, "%s/limits", audit->process_directory);
    path_of(audit, full, sizeof full, relative);
    FILE *file = fopen(full, "r");
    if (!file)
        return false;
    bool found = false;
    size_t length = strlen(name);
    while (!found && fgets(line, sizeof line, file)) {
        if (strncmp(line, name, length) || line[length] != ' ')
            continue;
        char value[64];
        if (sscanf(line + length, " %63s", value) != 1)
            break;
        *soft = !strcmp(value, "unlimited") ? -1 : strtoll(value, NULL, 10);
        found = true;
    }
    fclose(file);
    return found;
}

static bool read_resource_limit(const audit *audit, const char *name, int resource, int64_t *soft)
{
    if (audit->live && audit->pid == 0) {
        struct rlimit limit;
        if (getrlimit(resource, &limit) != 0)
            return false;
        *soft = limit.rlim_cur == RLIM_INFINITY ? -1 : (int64_t)limit.rlim_cur;
        return true;
    }
    return read_limits_line(audit, name, soft);
}

static void audit_limits(audit *audit)
{
    char limits_path[64];
    snprintf(limits_path, sizeof limits_path, "%s/limits", audit->process_directory);
    int64_t memlock;
    if (!read_resource_limit(audit, "Max locked memory", RLIMIT_MEMLOCK, &memlock)) {
        add_unreadable(audit, "limits.memlock", limits_path, "RLIMIT_MEMLOCK bounds page-locked (pinned) host memory");
    } else {
        gm_doctor_severity severity = memlock >= 0 && memlock < 64 * (int64_t)MIB ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        char text[64];
        if (memlock < 0)
            snprintf(text, sizeof text, "unlimited");
        else
            snprintf(text, sizeof text, "%.1f MiB", (double)memlock / MIB);
        add_finding(audit, "limits.memlock", severity,
                    "pinned host memory (pin_memory=True, cudaHostAlloc, RDMA/NCCL buffers) is locked memory; below "
                    "64 MiB (warn) registering buffers fails or falls back to slow pageable copies",
                    severity == GM_DOCTOR_OK ? "" : "ulimit -l unlimited; '* - memlock unlimited' in "
                                                    "/etc/security/limits.conf; docker run --ulimit memlock=-1",
                    "%s", text);
    }
    int64_t files;
    if (!read_resource_limit(audit, "Max open files", RLIMIT_NOFILE, &files)) {
        add_unreadable(audit, "limits.open_files", limits_path, "RLIMIT_NOFILE bounds the open file descriptors");
    } else {
        gm_doctor_severity severity = files >= 0 && files < 4096 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
        char text[64];
        if (files < 0)
            snprintf(text, sizeof text, "unlimited");
        else
            snprintf(text, sizeof text, "%" PRId64, files);
        add_finding(audit, "limits.open_files", severity,
                    "DataLoader workers hand tensors over as file descriptors; below 4096 (warn) many workers fail "
                    "with \"Too many open files\"",
                    severity == GM_DOCTOR_OK ? "" : "ulimit -n 65536; '* - nofile 65536' in /etc/security/limits.conf",
                    "%s", text);
    }
}

static bool shm_capacity(const audit *audit, int64_t *total, int64_t *available)
{
    if (audit->live) {
        struct statvfs file_system;
        if (statvfs("/dev/shm", &file_system) != 0)
            return false;
        *total = (int64_t)file_system.f_blocks * (int64_t)file_system.f_frsize;
        *available = (int64_t)file_system.f_bavail * (int64_t)file_system.f_frsize;
        return true;
    }
    char full[4096], line[128];
    path_of(audit, full, sizeof full, "/.statvfs/dev/shm");
    FILE *file = fopen(full, "r");
    if (!file)
        return false;
    *total = *available = -1;
    while (fgets(line, sizeof line, file)) {
        long long value;
        if (sscanf(line, "total %lld", &value) == 1)
            *total = value;
        else if (sscanf(line, "available %lld", &value) == 1)
            *available = value;
    }
    fclose(file);
    return *total >= 0 && *available >= 0;
}

static void audit_shm(audit *audit)
{
    int64_t total, available;
    if (!shm_capacity(audit, &total, &available)) {
        add_unreadable(audit, "shm.size", audit->live ? "/dev/shm" : "/.statvfs/dev/shm",
                       "DataLoader workers pass batches through /dev/shm");
        return;
    }
    int64_t used = total - available;
    double used_percent = percent(used, total);
    bool small = total < (int64_t)GIB || (audit->memory_known && total < audit->memory.total_bytes / 10);
    char total_text[64], used_text[64];
    format_bytes(total_text, sizeof total_text, total);
    format_bytes(used_text, sizeof used_text, used);
    gm_doctor_severity severity = small || used_percent > 80 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
    add_finding(audit, "shm.size", severity,
                "DataLoader workers pass every batch through shared memory in /dev/shm; below 1 GiB or 10% of RAM, "
                "or over 80% used (warn), workers die with \"bus error\" or \"No space left on device\"",
                severity == GM_DOCTOR_OK ? "" : "docker run --shm-size=16g (or --ipc=host); "
                                                "mount -o remount,size=16G /dev/shm; remove stale files in /dev/shm",
                "%s, %s used (%.1f%%)", total_text, used_text, used_percent);
}

/* ---- the GPUs ---- */

static const char *on_off(int mode)
{
    return mode < 0 ? "?" : mode ? "on" : "off";
}

static void audit_gpus(audit *audit)
{
    if (!audit->live) {
        add_finding(audit, "gpu", GM_DOCTOR_UNKNOWN, "NVML reads the live machine's GPUs only", "",
                    "not read under --root %s", audit->root);
        return;
    }
    gm_gpu_reading gpus[16];
    size_t count = 0;
    if (gm_read_gpus(gpus, 16, &count) != GM_OK) {
        add_finding(audit, "gpu", GM_DOCTOR_UNKNOWN, "the GPU section needs the NVIDIA driver's NVML (optional)", "",
                    "%s", gm_last_error());
        return;
    }
    char driver[80] = "?";
    int cuda_version = 0;
    gm_gpu_driver_versions(driver, sizeof driver, &cuda_version);
    add_finding(audit, "gpu.driver", GM_DOCTOR_OK, "the driver must be as new as the CUDA version the framework was built for",
                "", "driver %s, CUDA %d.%d, %zu GPU%s", driver, cuda_version / 1000, (cuda_version % 1000) / 10, count,
                count == 1 ? "" : "s");
    for (size_t i = 0; i < count; i++) {
        char id[48], details_text[160] = "";
        snprintf(id, sizeof id, "gpu.%d", gpus[i].index);
        gm_gpu_details details;
        bool narrow = false;
        if (gm_read_gpu_details(gpus[i].index, &details) == GM_OK) {
            narrow = details.pcie_width > 0 && details.pcie_max_width > 0 && details.pcie_width < details.pcie_max_width;
            snprintf(details_text, sizeof details_text,
                     "; persistence %s, ECC %s, MIG %s, PCIe gen%d x%d (max gen%d x%d), %d process%s holding %.1f GiB",
                     on_off(details.persistence_mode), on_off(details.ecc_mode), on_off(details.mig_mode),
                     details.pcie_generation, details.pcie_width, details.pcie_max_generation, details.pcie_max_width,
                     details.processes, details.processes == 1 ? "" : "es", (double)details.processes_bytes / GIB);
        }
        add_finding(audit, id, narrow ? GM_DOCTOR_WARN : GM_DOCTOR_OK,
                    "the device memory the job shares with the other processes on the GPU; a PCIe link narrower than "
                    "its maximum (warn) slows every host-to-device copy (the generation drops at idle, the width should "
                    "not); persistence mode off makes each job wait for the driver to start",
                    narrow ? "reseat the GPU or check the slot and riser (nvidia-smi -q -d PCIE)" : "",
                    "%s, %.1f GiB, %.1f GiB used%s", gpus[i].name, (double)gpus[i].total_bytes / GIB,
                    (double)gpus[i].used_bytes / GIB, details_text);
    }
}

/* ---- a process tree ---- */

static void read_process(const audit *audit, gm_doctor_process *process)
{
    char relative[64], full[4096], line[256];
    process->rss_bytes = process->pss_bytes = process->uss_bytes = process->swap_bytes = process->locked_bytes = -1;
    snprintf(process->name, sizeof process->name, "?");
    snprintf(relative, sizeof relative, "/proc/%ld/smaps_rollup", process->pid);
    path_of(audit, full, sizeof full, relative);
    FILE *file = fopen(full, "r");
    if (file) {
        int64_t private_clean = -1, private_dirty = -1;
        while (fgets(line, sizeof line, file)) {
            long long kilobytes;
            char key[64];
            if (sscanf(line, "%63[^:]: %lld kB", key, &kilobytes) != 2)
                continue;
            int64_t bytes = kilobytes * 1024;
            if (!strcmp(key, "Rss"))
                process->rss_bytes = bytes;
            else if (!strcmp(key, "Pss"))
                process->pss_bytes = bytes;
            else if (!strcmp(key, "Swap"))
                process->swap_bytes = bytes;
            else if (!strcmp(key, "Private_Clean"))
                private_clean = bytes;
            else if (!strcmp(key, "Private_Dirty"))
                private_dirty = bytes;
        }
        fclose(file);
        if (private_clean >= 0 && private_dirty >= 0)
            process->uss_bytes = private_clean + private_dirty;
    }
    snprintf(relative, sizeof relative, "/proc/%ld/status", process->pid);
    path_of(audit, full, sizeof full, relative);
    file = fopen(full, "r");
    if (!file)
        return;
    while (fgets(line, sizeof line, file)) {
        long long kilobytes;
        if (!strncmp(line, "Name:", 5)) {
            char *name = line + 5;
            name += strspn(name, " \t");
            name[strcspn(name, "\n")] = '\0';
            snprintf(process->name, sizeof process->name, "%s", name);
        } else if (sscanf(line, "VmLck: %lld kB", &kilobytes) == 1) {
            process->locked_bytes = kilobytes * 1024;
        } else if (process->rss_bytes < 0 && sscanf(line, "VmRSS: %lld kB", &kilobytes) == 1) {
            process->rss_bytes = kilobytes * 1024;
        } else if (process->swap_bytes < 0 && sscanf(line, "VmSwap: %lld kB", &kilobytes) == 1) {
            process->swap_bytes = kilobytes * 1024;
        }
    }
    fclose(file);
}

static int compare_links(const void *a, const void *b)
{
    long left = ((const gm_process_link *)a)->pid, right = ((const gm_process_link *)b)->pid;
    return (left > right) - (left < right);
}

/* A sum over the process tree: a process whose reading is unknown (-1: a file it could not read) makes
 * the sum a lower bound, said as ">= ". */
typedef struct tree_total {
    int64_t bytes;
    bool known;
} tree_total;

static void add_to_total(tree_total *total, int64_t bytes)
{
    if (bytes < 0)
        total->known = false;
    else
        total->bytes += bytes;
}

static const char *at_least(const tree_total *total)
{
    return total->known ? "" : ">= ";
}

static double mebibytes(const tree_total *total)
{
    return (double)total->bytes / MIB;
}

/* The process and its descendants, depth first, children in pid order. */
static void add_subtree(audit *audit, const gm_process_link *links, size_t count, long pid, long parent, int depth)
{
    gm_doctor_report *report = audit->report;
    if (report->process_count >= GM_DOCTOR_PROCESSES_MAX) {
        report->processes_left_out++;
    } else {
        gm_doctor_process *process = &report->processes[report->process_count++];
        memset(process, 0, sizeof *process);
        process->pid = pid;
        process->parent = parent;
        process->depth = depth;
        read_process(audit, process);
    }
    if (depth > 64)
        return;
    for (size_t i = 0; i < count; i++)
        if (links[i].parent == pid && links[i].pid != pid)
            add_subtree(audit, links, count, links[i].pid, pid, depth + 1);
}

static void audit_process_tree(audit *audit)
{
    size_t count = 0;
    gm_process_link *links = gm_process_list(audit->root, &count);
    if (links)
        qsort(links, count, sizeof *links, compare_links);
    add_subtree(audit, links, count, audit->pid, gm_process_parent(audit->root, audit->pid), 0);
    free(links);

    const gm_doctor_report *report = audit->report;
    tree_total rss = {0, true}, pss = {0, true}, uss = {0, true}, swap = {0, true}, locked = {0, true};
    for (size_t i = 0; i < report->process_count; i++) {
        const gm_doctor_process *process = &report->processes[i];
        add_to_total(&rss, process->rss_bytes);
        add_to_total(&pss, process->pss_bytes);
        add_to_total(&uss, process->uss_bytes);
        add_to_total(&swap, process->swap_bytes);
        add_to_total(&locked, process->locked_bytes);
    }
    gm_doctor_severity severity = swap.bytes > 0 ? GM_DOCTOR_WARN : GM_DOCTOR_OK;
    add_finding(audit, "process.tree", severity,
                "PSS adds up across the trainer and its DataLoader workers (RSS counts shared copy-on-write pages once "
                "per worker); USS growing in each worker is copy-on-write turning shared pages private; swapped "
                "memory in the tree (warn) stalls it; locked memory is pinned",
                severity == GM_DOCTOR_OK ? "" : "reduce the tree's memory (num_workers, prefetch_factor) or free host memory",
                "%zu process%s, RSS %s%.1f MiB, PSS %s%.1f MiB, USS %s%.1f MiB, swap %s%.1f MiB, locked %s%.1f MiB",
                report->process_count, report->process_count == 1 ? "" : "es", at_least(&rss), mebibytes(&rss),
                at_least(&pss), mebibytes(&pss), at_least(&uss), mebibytes(&uss), at_least(&swap), mebibytes(&swap),
                at_least(&locked), mebibytes(&locked));
}

gm_status gm_doctor_run(const gm_doctor_options *options, gm_doctor_report *report)
{
    if (!options || !report)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "gm_doctor_run: options or report is NULL");
    memset(report, 0, sizeof *report);
    const char *root = options->root && *options->root && strcmp(options->root, "/") ? options->root : "";
    audit audit = {.root = root, .live = !*root, .pid = options->pid, .report = report};
    struct stat information;
    if (*root && (stat(root, &information) != 0 || !S_ISDIR(information.st_mode)))
        return gm_fail(GM_ERROR_IO, "the root %s is not a readable directory", root);
    if (options->pid < 0)
        return gm_fail(GM_ERROR_INVALID_ARGUMENT, "bad pid %ld", options->pid);
    if (options->pid > 0) {
        char relative[64], full[4096];
        snprintf(relative, sizeof relative, "/proc/%ld", options->pid);
        path_of(&audit, full, sizeof full, relative);
        if (stat(full, &information) != 0)
            return gm_fail(GM_ERROR_IO, "no process %ld (%s does not exist)", options->pid, full);
        snprintf(audit.process_directory, sizeof audit.process_directory, "/proc/%ld", options->pid);
    } else {
        snprintf(audit.process_directory, sizeof audit.process_directory, "/proc/self");
    }
    audit_host_memory(&audit);
    audit_kernel_settings(&audit);
    audit_cgroup(&audit);
    audit_limits(&audit);
    audit_shm(&audit);
    audit_gpus(&audit);
    if (options->pid > 0)
        audit_process_tree(&audit);
    return GM_OK;
}
