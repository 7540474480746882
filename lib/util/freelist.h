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

/*
 * Under AddressSanitizer a free item is poisoned past its link, so that a use after put is
 * reported as malloc's would be (the items are not malloc'd one by one).
 */
#if defined(__SANITIZE_ADDRESS__)
#define TFAB_FREELIST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TFAB_FREELIST_ASAN 1
#endif
#endif
#ifdef TFAB_FREELIST_ASAN
#include <sanitizer/asan_interface.h>
#define TFAB_FREELIST_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define TFAB_FREELIST_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define TFAB_FREELIST_POISON(p, n) ((void)(p), (void)(n))
#define TFAB_FREELIST_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

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
	TFAB_FREELIST_UNPOISON(item, fl->item_size);
	return item;
}

static inline void tfab__freelist_put(struct tfab_freelist *fl, void *item)
{
	memcpy(item, &fl->free, sizeof(fl->free));
	fl->free = item;
	TFAB_FREELIST_POISON((char *)item + sizeof(fl->free), fl->item_size - sizeof(fl->free));
}

/* Frees every chunk: items still handed out are gone too. */
void tfab__freelist_fini(struct tfab_freelist *fl);

#endif
