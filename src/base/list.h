/*
 * list.h -- intrusive doubly linked lists: gm_list (its first item only) and gm_queue (both ends).
 *
 * An item holds a gm_link; insertion and removal are O(1) and allocate nothing, so the allocator's hot
 * paths keep blocks, chunks and regions in lists. A gm_list grows at the front (the size index's
 * lists, unmapped blocks, chunks, regions); a gm_queue also at the back, for items kept in the order
 * they came (a growth lane's blocks, oldest first). gm_list_item turns a link back into its item
 * (NULL stays NULL):
 *     for (gm_link *link = list.first; link; link = link->next) {
 *         gm_block *block = gm_list_item(link, gm_block, link); ...
 */
#ifndef GM_LIST_H
#define GM_LIST_H

#include <stddef.h>

typedef struct gm_link {
    struct gm_link *previous;
    struct gm_link *next;
} gm_link;

typedef struct gm_list {
    gm_link *first;
} gm_list;

typedef struct gm_queue {
    gm_link *first;
    gm_link *last;
} gm_queue;

#define gm_list_item(link_pointer, type, member)                                                       \
    ((type *)gm_list_item_address_((link_pointer), offsetof(type, member)))

static inline void *gm_list_item_address_(gm_link *link, size_t offset)
{
    return link ? (void *)((char *)link - offset) : NULL;
}

static inline void gm_list_push_front(gm_list *list, gm_link *link)
{
    link->previous = NULL;
    link->next = list->first;
    if (list->first)
        list->first->previous = link;
    list->first = link;
}

static inline void gm_list_remove(gm_list *list, gm_link *link)
{
    if (link->previous)
        link->previous->next = link->next;
    else
        list->first = link->next;
    if (link->next)
        link->next->previous = link->previous;
    link->previous = link->next = NULL;
}

static inline void gm_queue_push_back(gm_queue *queue, gm_link *link)
{
    link->next = NULL;
    link->previous = queue->last;
    if (queue->last)
        queue->last->next = link;
    else
        queue->first = link;
    queue->last = link;
}

static inline void gm_queue_remove(gm_queue *queue, gm_link *link)
{
    if (link->previous)
        link->previous->next = link->next;
    else
        queue->first = link->next;
    if (link->next)
        link->next->previous = link->previous;
    else
        queue->last = link->previous;
    link->previous = link->next = NULL;
}

#endif
