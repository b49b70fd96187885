/*
 * test_descriptor_broker.c -- a process that shares memory hands its shared descriptors to processes
 * that may not take them with pidfd_getfd (descriptor_broker.h): only descriptors offered for sharing,
 * none once withdrawn, only to itself and its descendants, a clear error where no process serves (a
 * forked child keeps no socket of its parent's); and end to end, a child that has no right to trace
 * its parent (the parent not dumpable, the child without CAP_SYS_PTRACE: what Yama's ptrace_scope 1
 * makes of every child) maps and writes the block its parent shared. Every broker runs in a forked
 * child, so that this process never has a second thread when it forks (ThreadSanitizer's rule).
 */
#include "test.h"

#include "backend/backend.h"
#include "backend/descriptor_broker.h"
#include "pattern.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1ull << 20)

/* fork() with this process's output written first, so that no child writes it again. */
static pid_t fork_flushed(void)
{
    fflush(NULL);
    return fork();
}

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

/* Run `checks` in a child of its own; its checks' failures fail the test. */
static void in_a_child(void (*checks)(void))
{
    pid_t child = fork_flushed();
    REQUIRE(child >= 0);
    if (child == 0) {
        checks();
        _exit(test_failures ? 1 : 0);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void offered_only(void)
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

static void only_offered_descriptors_are_given(void)
{
    in_a_child(offered_only);
}

/* A process that is not its descendant (here: its parent) is refused, before anything is read. */
static void only_descendants_are_given(void)
{
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    int offered = memory_holding("offered");
    pid_t sharer = fork_flushed();
    REQUIRE(sharer >= 0);
    if (sharer == 0) {
        gm_broker_offer(offered);
        char byte = 1;
        if (write(ready[1], &byte, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char byte = 0;
    REQUIRE(read(ready[0], &byte, 1) == 1);
    int mine = -1;
    CHECK_STATUS(gm_broker_request(sharer, offered, &mine), GM_ERROR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not a descendant");
    CHECK(mine == -1);
    kill(sharer, SIGKILL);
    waitpid(sharer, NULL, 0);
    close(offered);
    close(ready[0]);
    close(ready[1]);
}

/* Whether `process` has a socket open. */
static bool holds_a_socket(pid_t process)
{
    char folder[64], path[320], target[64];
    snprintf(folder, sizeof folder, "/proc/%d/fd", (int)process);
    DIR *entries = opendir(folder);
    REQUIRE(entries != NULL);
    bool found = false;
    for (struct dirent *entry; (entry = readdir(entries));) {
        snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
        ssize_t length = readlink(path, target, sizeof target - 1);
        found = found || (length > 7 && !strncmp(target, "socket:", 7));
    }
    closedir(entries);
    return found;
}

/* A sharer's forked child (a data loader's worker) keeps no copy of its socket, which would keep its
 * name bound after the sharer is gone, with no thread to answer: askers would wait for nothing. */
static void a_forked_child_keeps_no_socket_of_its_parent(void)
{
    int worker_pid[2];
    REQUIRE(pipe(worker_pid) == 0);
    pid_t sharer = fork_flushed();
    REQUIRE(sharer >= 0);
    if (sharer == 0) {
        gm_broker_offer(memory_holding("offered"));
        pid_t worker = fork_flushed();
        if (worker == 0) { /* fork has returned here: its handlers have run */
            pid_t self = getpid();
            if (write(worker_pid[1], &self, sizeof self) != (ssize_t)sizeof self)
                _exit(1);
            pause();
            _exit(0);
        }
        _exit(0);
    }
    pid_t worker = 0;
    REQUIRE(read(worker_pid[0], &worker, sizeof worker) == (ssize_t)sizeof worker);
    REQUIRE(waitpid(sharer, NULL, 0) == sharer);
    CHECK(!holds_a_socket(worker));
    int mine = -1;
    CHECK_STATUS(gm_broker_request(sharer, 3, &mine), GM_ERROR_IO); /* no socket, or one closing */
    kill(worker, SIGKILL);
    close(worker_pid[0]);
    close(worker_pid[1]);
}

/* How many descriptors this process has open. */
static int open_descriptors(void)
{
    DIR *entries = opendir("/proc/self/fd");
    REQUIRE(entries != NULL);
    int count = 0;
    while (readdir(entries))
        count++;
    closedir(entries);
    return count;
}

/* A server in the broker's place (the process asked, its user) that answers "given" with `attached`
 * descriptors and waits to be killed. */
static pid_t false_broker(int attached)
{
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    pid_t server = fork_flushed();
    REQUIRE(server >= 0);
    if (server == 0) {
        struct sockaddr_un address = {.sun_family = AF_UNIX};
        int length = snprintf(address.sun_path + 1, sizeof address.sun_path - 1, "gpumem-descriptors-%d", (int)getpid());
        int listening = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (bind(listening, (struct sockaddr *)&address, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + length)) ||
            listen(listening, 4) || write(ready[1], "r", 1) != 1)
            _exit(1);
        int connection = accept(listening, NULL, NULL), files[4];
        for (int i = 0; i < attached; i++)
            files[i] = memory_holding("false");
        unsigned char given = 0;
        struct iovec part = {&given, 1};
        char room[CMSG_SPACE(sizeof files)] = {0};
        struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = room,
                                 .msg_controllen = CMSG_SPACE(attached * sizeof(int))};
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(attached * sizeof(int));
        memcpy(CMSG_DATA(header), files, attached * sizeof(int));
        if (sendmsg(connection, &message, 0) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    char byte = 0;
    REQUIRE(read(ready[0], &byte, 1) == 1);
    close(ready[0]);
    close(ready[1]);
    return server;
}

/* An answer that brings more than one descriptor is refused, and none of them stays open here. */
static void an_answer_with_several_descriptors_leaves_none_open(void)
{
    for (int attached = 2; attached <= 4; attached++) {
        pid_t server = false_broker(attached);
        int before = open_descriptors(), mine = -1;
        CHECK_STATUS(gm_broker_request(server, 3, &mine), GM_ERROR_IO);
        CHECK_MESSAGE("without exactly one descriptor");
        CHECK(mine == -1);
        CHECK_EQ_INT(open_descriptors(), before);
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
}

/* A process that never shared memory has no socket: a clear error, not a wait. */
static void a_process_that_shares_nothing_serves_nothing(void)
{
    pid_t quiet = fork_flushed();
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
    long process = syscall(SYS_pidfd_open, parent, 0); /* refused (EPERM), or unknown here (ENOSYS: valgrind) */
    long taken = process < 0 ? -1 : syscall(SYS_pidfd_getfd, (int)process, pieces[0].descriptor, 0);
    if (taken >= 0 || (errno != EPERM && errno != ENOSYS))
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
 * CAP_SYS_PTRACE can pass. With `again_in_a_child`, a child of the sharer (which inherits the block,
 * its chunks and their descriptors, but not the sharer's offers) shares the block again and is the
 * one its own child asks. */
static int share_with_a_child_that_cannot_trace(bool again_in_a_child)
{
    gm_allocator *sharer = NULL;
    void *block = NULL;
    if (gm_create("backend:host,capacity:1GiB", &sharer) != GM_OK || gm_malloc(sharer, 64 * MIB, 0, &block) != GM_OK)
        return 10;
    pattern_stamp(block, 64 * MIB, 7);
    gm_shared_piece pieces[64];
    uint64_t offset = 0;
    size_t count = 0;
    if (gm_share(sharer, block, &offset, pieces, 64, &count) != GM_OK)
        return 11;
    if (again_in_a_child) {
        pid_t middle = fork_flushed();
        if (middle != 0) {
            int status = 0;
            return middle > 0 && waitpid(middle, &status, 0) == middle && WIFEXITED(status) ? WEXITSTATUS(status) : 15;
        }
        if (gm_share(sharer, block, &offset, pieces, 64, &count) != GM_OK)
            _exit(16);
    }
    if (prctl(PR_SET_DUMPABLE, 0) != 0)
        return 17;
    pid_t parent = getpid(), child = fork_flushed();
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

/* share_with_a_child_that_cannot_trace in a sharer of its own, which must exit 0. */
static void check_a_sharer(bool again_in_a_child)
{
    pid_t sharer = fork_flushed();
    REQUIRE(sharer >= 0);
    if (sharer == 0)
        _exit(share_with_a_child_that_cannot_trace(again_in_a_child));
    int status = 0;
    REQUIRE(waitpid(sharer, &status, 0) == sharer);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
}

static void a_child_without_the_right_to_trace_maps_the_parents_block(void)
{
    check_a_sharer(false);
}

static void a_forked_child_serves_what_it_shares_again(void)
{
    check_a_sharer(true);
}

RUN_TESTS(TEST_CASE(only_offered_descriptors_are_given), TEST_CASE(only_descendants_are_given),
          TEST_CASE(a_forked_child_keeps_no_socket_of_its_parent), TEST_CASE(a_process_that_shares_nothing_serves_nothing),
          TEST_CASE(a_child_without_the_right_to_trace_maps_the_parents_block),
          TEST_CASE(a_forked_child_serves_what_it_shares_again),
          TEST_CASE(an_answer_with_several_descriptors_leaves_none_open))
