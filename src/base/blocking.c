/*
 * blocking.c -- the thread's pending blocking hook (blocking.h) and gm_set_blocking_hook.
 */
#include "base/blocking.h"

#include "gpumem.h"

_Thread_local gm_blocking_hook_state gm_blocking_hook_pending;

void gm_set_blocking_hook(void (*hook)(void *context), void *context)
{
    gm_blocking_hook_pending.hook = hook;
    gm_blocking_hook_pending.context = context;
}
