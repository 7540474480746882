/*
 * Fixed-size items (a backend's per-operation contexts) handed out from chunks that are
 * allocated on demand and kept until the list is finished: getting and putting an item is a
 * pointer swap, with no allocation once the list has grown to the load. A free item's first
 * pointer-sized bytes hold the link; an item handed out is all the caller's, holding whatever
 * was left in it (its last user's fields, the link): the caller sets what it reads.
 */
#ifndef TFAB_UTIL_FREELIST_H
#define TFAB_UTIL_FREELIST_H

#include <stddef.h>
#include <string.h>

struct tfab_freelist {
	size_t item_size;   /* at least a pointer */
	unsigned per_chunk; /* items a chunk holds */
	void *free;	    /* first free item */
	void *chunks;	    /* each starts with the next chunk's address */
};

#define TFAB_FREELIST_INIT(type, n) \
	((struct tfab_freelist){.item_size = sizeof(type), .per_chunk = (n)})

/* Adds a chunk's items to the free list: 0, or -ENOMEM. */
int tfab__freelist_grow(struct tfab_freelist *fl);

/* An item, or NULL when a new chunk cannot be allocated. Inline: it is on every write. */
static inline void *tfab__freelist_get(struct tfab_freelist *fl)
{
	void *item;

	if (!fl->free && tfab__freelist_grow(fl))
		return NULL;
	item = fl->free;
	memcpy(&fl->free, item, sizeof(fl->free));
	return item;
}

static inline void tfab__freelist_put(struct tfab_freelist *fl, void *item)
{
	memcpy(item, &fl->free, sizeof(fl->free));
	fl->free = item;
}

/* Frees every chunk: items still handed out are gone too. */
void tfab__freelist_fini(struct tfab_freelist *fl);

#endif
