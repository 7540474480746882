/* Intrusive doubly linked lists (circular, with a head node). */
#ifndef TFAB_UTIL_LIST_H
#define TFAB_UTIL_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct tfab_list {
	struct tfab_list *next, *prev;
};

#define tfab_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void tfab__list_init(struct tfab_list *h)
{
	h->next = h->prev = h;
}

static inline bool tfab__list_empty(const struct tfab_list *h)
{
	return h->next == h;
}

static inline void tfab__list_add_tail(struct tfab_list *h, struct tfab_list *n)
{
	n->prev = h->prev;
	n->next = h;
	h->prev->next = n;
	h->prev = n;
}

/* Unlink n and leave it pointing at itself, so a second del is harmless. */
static inline void tfab__list_del(struct tfab_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n->prev = n;
}

#define tfab_list_for_each_safe(pos, tmp, head)                          \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); \
	     (pos) = (tmp), (tmp) = (pos)->next)

#endif
