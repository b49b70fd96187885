/*
 * allocator.h -- what the front end (allocator.c) lends the rest of core: its lock, around the
 * arena, and the readings that need it held. The gm_allocator struct itself stays private to
 * allocator.c.
 */
#ifndef GM_ALLOCATOR_H
#define GM_ALLOCATOR_H

#include "core/arena.h"

/* Lock the allocator and give its arena; gm_unlock_arena ends it. */
gm_arena *gm_lock_arena(gm_allocator *allocator);
void gm_unlock_arena(gm_allocator *allocator);
/* gm_get_stats and gm_get_device_info with the lock held. */
void gm_read_stats_locked(gm_allocator *allocator, gm_stats *stats_out);
gm_status gm_read_device_info_locked(gm_allocator *allocator, gm_device_info *info_out);

#endif
