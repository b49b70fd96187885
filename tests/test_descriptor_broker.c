/*
 * test_descriptor_broker.c -- a process that shares memory hands its shared descriptors to processes
 * that may not take them with pidfd_getfd (descriptor_broker.h): only descriptors offered for sharing,
 * none once withdrawn, a clear error where no process serves; and end to end, a child that has no right
 * to trace its parent (the parent not dumpable, the child without CAP_SYS_PTRACE: what Yama's
 * ptrace_scope 1 makes of every child) maps and writes the block its parent shared.
 */
#include "test.h"

#include "backend/backend.h"
#include "backend/descriptor_broker.h"
#include "pattern.h"

#include <errno.h>
#include <stdbool.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1ull << 20)

/* A memfd holding `text`. */
static int memory_holding(const char *text)
{
    int descriptor = memfd_create("broker-test", MFD_CLOEXEC);
    REQUIRE(descriptor >= 0);
    REQUIRE(write(descriptor, text, strlen(text)) == (ssize_t)strlen(text));
    return descriptor;
}

static bool reads(int descriptor, const char *text)
{
    char seen[64] = {0};
    return pread(descriptor, seen, sizeof seen - 1, 0) == (ssize_t)strlen(text) && !strcmp(seen, text);
}

static void only_offered_descriptors_are_given(void)
{
    int offered = memory_holding("offered"), other = memory_holding("other");
    gm_broker_offer(offered);
    int mine = -1;
    CHECK_OK(gm_broker_request(getpid(), offered, &mine));
    CHECK(mine >= 0 && mine != offered && reads(mine, "offered"));
    close(mine);
    mine = -1;
    CHECK_STATUS(gm_broker_request(getpid(), other, &mine), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not memory that process shares");
    CHECK(mine == -1);
    CHECK_STATUS(gm_broker_request(getpid(), 0, &mine), GM_ERROR_INVALID_ARGUMENT); /* standard input */
    gm_broker_withdraw(offered);
    CHECK_STATUS(gm_broker_request(getpid(), offered, &mine), GM_ERROR_INVALID_ARGUMENT);
    CHECK(mine == -1);
    close(offered);
    close(other);
}

/* A process that never shared memory has no socket: a clear error, not a wait. */
static void a_process_that_shares_nothing_serves_nothing(void)
{
    pid_t quiet = fork();
    REQUIRE(quiet >= 0);
    if (quiet == 0) {
        pause();
        _exit(0);
    }
    int mine = -1;
    CHECK_STATUS(gm_broker_request(quiet, 3, &mine), GM_ERROR_IO);
    CHECK_MESSAGE("serves no shared memory");
    CHECK(mine == -1);
    kill(quiet, SIGKILL);
    waitpid(quiet, NULL, 0);
}

/* The child's side: no right to trace the parent (checked), and the block mapped all the same. */
static int child_maps_without_tracing(pid_t parent, const gm_shared_piece *pieces, size_t count, uint64_t offset)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &header, data) != 0)
        return 2;
    data[0].effective &= ~(1u << CAP_SYS_PTRACE);
    data[0].permitted &= ~(1u << CAP_SYS_PTRACE);
    if (syscall(SYS_capset, &header, data) != 0)
        return 3;
    long process = syscall(SYS_pidfd_open, parent, 0);
    if (process < 0 || syscall(SYS_pidfd_getfd, (int)process, pieces[0].descriptor, 0) >= 0 || errno != EPERM)
        return 4; /* the test would not reach the broker */
    gm_allocator *taker = NULL;
    void *mapped = NULL;
    if (gm_create("backend:host,capacity:1GiB", &taker) != GM_OK ||
        gm_open_shared(taker, parent, pieces, count, &mapped) != GM_OK) {
        fprintf(stderr, "child: %s\n", gm_last_error());
        return 5;
    }
    if (!pattern_intact((char *)mapped + offset, 64 * MIB, 7))
        return 6;
    pattern_stamp((char *)mapped + offset, 64 * MIB, 8);
    return 0;
}

/* The sharer's side, in a process of its own: it makes itself undumpable, which only a tracer with
 * CAP_SYS_PTRACE can pass. */
static int share_with_a_child_that_cannot_trace(void)
{
    gm_allocator *sharer = NULL;
    void *block = NULL;
    if (gm_create("backend:host,capacity:1GiB", &sharer) != GM_OK || gm_malloc(sharer, 64 * MIB, 0, &block) != GM_OK)
        return 10;
    pattern_stamp(block, 64 * MIB, 7);
    gm_shared_piece pieces[64];
    uint64_t offset = 0;
    size_t count = 0;
    if (gm_share(sharer, block, &offset, pieces, 64, &count) != GM_OK || prctl(PR_SET_DUMPABLE, 0) != 0)
        return 11;
    pid_t parent = getpid(), child = fork();
    if (child < 0)
        return 12;
    if (child == 0)
        _exit(child_maps_without_tracing(parent, pieces, count, offset));
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status))
        return 13;
    if (WEXITSTATUS(status) != 0)
        return 20 + WEXITSTATUS(status);
    return pattern_intact(block, 64 * MIB, 8) ? 0 : 14;
}

static void a_child_without_the_right_to_trace_maps_the_parents_block(void)
{
    pid_t sharer = fork();
    REQUIRE(sharer >= 0);
    if (sharer == 0)
        _exit(share_with_a_child_that_cannot_trace());
    int status = 0;
    REQUIRE(waitpid(sharer, &status, 0) == sharer);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
}

RUN_TESTS(TEST_CASE(only_offered_descriptors_are_given), TEST_CASE(a_process_that_shares_nothing_serves_nothing),
          TEST_CASE(a_child_without_the_right_to_trace_maps_the_parents_block))
