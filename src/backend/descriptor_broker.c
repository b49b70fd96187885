/*
 * descriptor_broker.c -- see descriptor_broker.h. One thread per sharing process answers one request per
 * connection: {magic, descriptor} in, a status byte out, with the descriptor attached when it is given.
 * The list of offered descriptors is short (one per shared chunk) and changes only when a chunk is
 * exported or closed, so it is a plain array behind one mutex; a descriptor is sent with that mutex
 * held, so that it cannot be closed and its number reused meanwhile. fork() takes the mutex first, so
 * that a child never starts with it held by a thread it does not have.
 */
#include "backend/descriptor_broker.h"

#include "base/error.h"
#include "base/process_stat.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_MAGIC 0x676d6264u /* "gmbd" */

enum reply { GIVEN = 0, NOT_OFFERED = 1, ANOTHER_USER = 2, BAD_REQUEST = 3, NOT_RELATED = 4 };

typedef struct request {
    uint32_t magic;
    int32_t descriptor;
} request;

static struct {
    pthread_mutex_t mutex;
    pid_t serving;   /* the process whose thread serves (a forked child serves anew); 0: none */
    int listening;   /* its socket, -1 when none */
    int *offered;
    size_t count, capacity;
} broker = {PTHREAD_MUTEX_INITIALIZER, 0, -1, NULL, 0, 0};

/* The abstract socket address of `process`'s broker, and its length. */
static socklen_t address_of(pid_t process, struct sockaddr_un *address)
{
    memset(address, 0, sizeof *address);
    address->sun_family = AF_UNIX;
    int length = snprintf(address->sun_path + 1, sizeof address->sun_path - 1, "gpumem-descriptors-%d", (int)process);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)length);
}

static bool is_offered(int descriptor)
{
    for (size_t i = 0; i < broker.count; i++)
        if (broker.offered[i] == descriptor)
            return true;
    return false;
}

static void reply(int connection, enum reply answer, int descriptor)
{
    unsigned char status = (unsigned char)answer;
    struct iovec part = {&status, 1};
    union {
        struct cmsghdr header;
        char room[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1};
    if (answer == GIVEN) {
        memset(&control, 0, sizeof control);
        message.msg_control = control.room;
        message.msg_controllen = sizeof control.room;
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(header), &descriptor, sizeof descriptor);
    }
    (void)sendmsg(connection, &message, MSG_NOSIGNAL);
}

/* The parent of `process` from /proc (0 when unknown). */
static pid_t parent_of(pid_t process)
{
    gm_process_stat stat;
    return gm_process_stat_read(NULL, process, &stat) && stat.parent > 0 ? (pid_t)stat.parent : 0;
}

/* `process` is this process or one of its descendants: a process Yama's ptrace_scope 1 lets this one
 * trace, and the one that cannot take this process's descriptors itself. */
static bool is_this_or_descendant(pid_t process)
{
    pid_t self = getpid();
    for (int depth = 0; depth < 64 && process > 0; depth++) {
        if (process == self)
            return true; /* a sharer that is process 1 (a container's) has every process below it */
        if (process == 1)
            return false;
        process = parent_of(process);
    }
    return false;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* The process that connected has not exited since (its number cannot have gone to another process
 * while /proc was read): its pidfd (SO_PEERPIDFD, Linux 6.5) does not read as exited. Older kernels
 * have none to ask; there the number is taken as it was read. */
static bool still_the_asker(int connection)
{
    int process = -1;
    socklen_t length = sizeof process;
    if (getsockopt(connection, SOL_SOCKET, SO_PEERPIDFD, &process, &length) != 0)
        return errno == ENOPROTOOPT;
    struct pollfd exited = {process, POLLIN, 0};
    bool alive = poll(&exited, 1, 0) == 0;
    close(process);
    return alive;
}

/* One request. Who asks is checked before anything is read, so that no other process can keep the
 * broker waiting; a descendant that sends nothing is dropped after a second. */
static void answer(int connection)
{
    struct ucred peer = {0, 0, 0};
    socklen_t length = sizeof peer;
    if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
        reply(connection, BAD_REQUEST, -1);
        return;
    }
    if (peer.uid != geteuid()) {
        reply(connection, ANOTHER_USER, -1);
        return;
    }
    if (!is_this_or_descendant(peer.pid) || !still_the_asker(connection)) {
        reply(connection, NOT_RELATED, -1);
        return;
    }
    struct timeval second = {1, 0};
    setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &second, sizeof second);
    request asked;
    if (recv(connection, &asked, sizeof asked, 0) != (ssize_t)sizeof asked || asked.magic != REQUEST_MAGIC) {
        reply(connection, BAD_REQUEST, -1);
        return;
    }
    pthread_mutex_lock(&broker.mutex);
    bool offered = broker.serving == getpid() && is_offered(asked.descriptor);
    reply(connection, offered ? GIVEN : NOT_OFFERED, asked.descriptor);
    pthread_mutex_unlock(&broker.mutex);
}

/* What start_serving hands its thread: the socket, and a semaphore the thread posts once it runs. */
typedef struct serving_start {
    int listening;
    sem_t running;
} serving_start;

static void *serve(void *argument)
{
    serving_start *start = argument;
    int socket_descriptor = start->listening;
    sem_post(&start->running); /* `start` is gone once start_serving returns */
    for (;;) {
        int connection = accept4(socket_descriptor, NULL, NULL, SOCK_CLOEXEC);
        if (connection < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                struct timespec pause = {0, 10 * 1000 * 1000}; /* the connection waits; the process is short */
                nanosleep(&pause, NULL);
                continue;
            }
            break;
        }
        answer(connection);
        close(connection);
    }
    pthread_mutex_lock(&broker.mutex); /* an error no retry mends: the next offer serves anew */
    if (broker.listening == socket_descriptor) {
        close(broker.listening);
        broker.listening = -1;
        broker.serving = 0;
    }
    pthread_mutex_unlock(&broker.mutex);
    return NULL;
}

/* This process's socket and thread (mutex held); false when either cannot be had (tried again at the
 * next offer). The thread blocks every signal, which stay the application's. It returns once the thread
 * runs: a thread still starting allocates (its stack's attributes, a sanitizer's records), and a fork
 * made then by the application (a DataLoader worker) would copy an allocator lock held by a thread the
 * child does not have, where the allocator does not guard fork itself (AddressSanitizer's does not): the
 * child's first allocation of that size would wait forever. */
static bool start_serving(void)
{
    int listening = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un address;
    socklen_t length = address_of(getpid(), &address);
    if (listening < 0 || bind(listening, (struct sockaddr *)&address, length) != 0 || listen(listening, 16) != 0) {
        if (listening >= 0)
            close(listening);
        return false;
    }
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    serving_start start = {.listening = listening};
    bool started = sem_init(&start.running, 0, 0) == 0;
    pthread_t thread;
    if (started && pthread_create(&thread, &attributes, serve, &start) != 0) {
        sem_destroy(&start.running);
        started = false;
    }
    pthread_attr_destroy(&attributes);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (!started) {
        close(listening);
        return false;
    }
    while (sem_wait(&start.running) != 0 && errno == EINTR)
        ;
    sem_destroy(&start.running);
    broker.listening = listening;
    broker.serving = getpid();
    return true;
}

/* A child made by fork has no broker thread: it must not hold the parent's socket (whose name would
 * outlive the parent, unanswered), nor offer what the parent offered (mutex held). */
static void forget_the_parents(void)
{
    if (broker.listening >= 0)
        close(broker.listening);
    broker.listening = -1;
    broker.serving = 0;
    broker.count = 0;
}

static void lock_for_fork(void) { pthread_mutex_lock(&broker.mutex); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&broker.mutex); }

static void forget_after_fork(void)
{
    forget_the_parents();
    pthread_mutex_unlock(&broker.mutex);
}

static void watch_forks(void) { pthread_atfork(lock_for_fork, unlock_after_fork, forget_after_fork); }

void gm_broker_offer(int descriptor)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, watch_forks);
    pthread_mutex_lock(&broker.mutex);
    if (broker.serving && broker.serving != getpid())
        forget_the_parents(); /* a child made without fork's handlers (_Fork, clone) */
    if (!broker.serving)
        start_serving();
    if (broker.count == broker.capacity) {
        size_t capacity = broker.capacity ? broker.capacity * 2 : 16;
        int *grown = realloc(broker.offered, capacity * sizeof *grown);
        if (grown) {
            broker.offered = grown;
            broker.capacity = capacity;
        }
    }
    if (broker.count < broker.capacity && !is_offered(descriptor))
        broker.offered[broker.count++] = descriptor;
    pthread_mutex_unlock(&broker.mutex);
}

void gm_broker_withdraw(int descriptor)
{
    pthread_mutex_lock(&broker.mutex);
    for (size_t i = 0; i < broker.count; i++)
        if (broker.offered[i] == descriptor) {
            broker.offered[i] = broker.offered[--broker.count];
            break;
        }
    pthread_mutex_unlock(&broker.mutex);
}

/* The one descriptor attached to a reply, or -1; any others that came are closed (an answer that is
 * not the broker's may carry several, or more than fitted: MSG_CTRUNC). */
static int attached_descriptor(struct msghdr *message)
{
    int found = -1, count = 0;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(message); header; header = CMSG_NXTHDR(message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS || header->cmsg_len < CMSG_LEN(0))
            continue;
        size_t descriptors = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < descriptors; i++) {
            int descriptor;
            memcpy(&descriptor, CMSG_DATA(header) + i * sizeof(int), sizeof descriptor);
            if (count++ == 0)
                found = descriptor;
            else
                close(descriptor);
        }
    }
    if (count == 1 && !(message->msg_flags & MSG_CTRUNC))
        return found;
    if (found >= 0)
        close(found);
    return -1;
}

static gm_status exchange(int connection, int process, int descriptor, int *mine_out)
{
    struct ucred owner = {0, 0, 0};
    socklen_t length = sizeof owner;
    if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &owner, &length) != 0 || owner.pid != process ||
        owner.uid != geteuid())
        return gm_fail(GM_ERROR_IO, "the descriptor socket of process %d is held by process %d of user %d", process,
                       (int)owner.pid, (int)owner.uid);
    request asked = {REQUEST_MAGIC, descriptor};
    bool sent = send(connection, &asked, sizeof asked, MSG_NOSIGNAL) == (ssize_t)sizeof asked;
    int send_error = errno; /* a broker that refuses the asker answers before reading: its answer waits */
    unsigned char status = BAD_REQUEST;
    struct iovec part = {&status, 1};
    union {
        struct cmsghdr header;
        char room[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control.room,
                             .msg_controllen = sizeof control.room};
    ssize_t got = recvmsg(connection, &message, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == ECONNRESET) /* closed with the request unread: the error comes first, the answer next */
        got = recvmsg(connection, &message, MSG_CMSG_CLOEXEC);
    int mine = got >= 0 ? attached_descriptor(&message) : -1;
    if (got == 1 && status == GIVEN && mine >= 0 && !(message.msg_flags & MSG_TRUNC)) {
        *mine_out = mine;
        return GM_OK;
    }
    if (mine >= 0)
        close(mine);
    if (got != 1 && !sent)
        return gm_fail(GM_ERROR_IO, "cannot ask process %d for descriptor %d: %s", process, descriptor,
                       strerror(send_error));
    if (got != 1)
        return gm_fail(GM_ERROR_IO, "process %d did not answer for descriptor %d", process, descriptor);
    if (status == GIVEN)
        return gm_fail(GM_ERROR_IO, "process %d answered for descriptor %d without exactly one descriptor", process,
                       descriptor);
    return gm_fail(GM_ERROR_INVALID_ARGUMENT, "process %d did not give descriptor %d: %s", process, descriptor,
                   status == NOT_OFFERED    ? "it is not memory that process shares"
                   : status == ANOTHER_USER ? "this process runs as another user"
                   : status == NOT_RELATED  ? "this process is not a descendant of it (a process hands its shared "
                                              "memory only to the processes it started, directly or not)"
                                            : "it refused the request");
}

/* Signals stay pending while a request runs (at most 5 s to connect and 5 s for the answer), so that
 * none cuts a call short. */
gm_status gm_broker_request(int process, int descriptor, int *mine_out)
{
    int connection = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (connection < 0)
        return gm_fail(GM_ERROR_IO, "cannot make a socket to ask process %d for memory: %s", process, strerror(errno));
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    struct timeval wait = {5, 0}; /* bounds connect (a full queue), send and the answer */
    setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
    setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    struct sockaddr_un address;
    socklen_t length = address_of(process, &address);
    gm_status status;
    if (connect(connection, (struct sockaddr *)&address, length) != 0)
        status = gm_fail(GM_ERROR_IO, "process %d serves no shared memory (no socket gpumem-descriptors-%d: %s)",
                         process, process, strerror(errno));
    else
        status = exchange(connection, process, descriptor, mine_out);
    close(connection);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    return status;
}
