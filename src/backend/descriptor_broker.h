/*
 * descriptor_broker.h -- handing the descriptors of shared memory to another process that may not take
 * them itself.
 *
 * A process maps memory that another one shared by duplicating that process's descriptors with
 * pidfd_getfd, which needs the right to trace it. Under Yama's ptrace_scope 1 (Ubuntu's default) only
 * an ancestor has that right, so a child could not map what its parent shared -- torch.multiprocessing's
 * usual direction -- where CUDA's own IPC handles, which PyTorch's allocator uses, work. So a process
 * that shares memory also serves its shared descriptors itself: on its first export a thread starts to
 * listen on the abstract Unix socket "gpumem-descriptors-PID", and a process that is refused the
 * descriptor asks there and receives it (SCM_RIGHTS).
 *
 * What it gives: only descriptors exported for sharing and not yet closed -- the memory this process
 * offered for sharing, no other file it has open -- and only to itself and its descendants of the same
 * user (SO_PEERCRED, then /proc's parents), the processes that Yama lets it trace: what the rule keeps
 * from others stays kept. Who asks is checked before the request is read, so that no other process can
 * keep the broker waiting. The asker checks that the socket's owner is the process it asked for and of
 * its user, so that no other process can answer in its place, and waits at most 5 s to connect and 5 s
 * for the answer, with its signals held meanwhile. Any process may bind a name first (abstract names
 * have no owner): the sharer then serves nothing and askers refuse the squatter -- a denial, not a
 * leak. A child made by fork keeps neither the socket nor the offers (it serves its own exports on its
 * own socket).
 */
#ifndef GM_DESCRIPTOR_BROKER_H
#define GM_DESCRIPTOR_BROKER_H

#include "gpumem.h"

/* `descriptor` may be given to other processes of this user until withdrawn; the broker's thread starts
 * with the first. A failure to start it is not an error: processes that may trace this one still take
 * the descriptor with pidfd_getfd. */
void gm_broker_offer(int descriptor);

/* `descriptor` is about to be closed: no longer given. */
void gm_broker_withdraw(int descriptor);

/* Ask process `process`'s broker for its descriptor `descriptor`; *mine_out: a descriptor of this
 * process for the same file. Errors say why (no broker there, not offered, another user, ...). */
gm_status gm_broker_request(int process, int descriptor, int *mine_out);

#endif
