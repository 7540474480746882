/* The chunked free list of fixed-size items. */
#include <stdalign.h>
#include <stdlib.h>

#include "util/freelist.h"

#define ALIGN alignof(max_align_t)

static size_t stride(const struct tfab_freelist *fl)
{
	return (fl->item_size + ALIGN - 1) / ALIGN * ALIGN;
}

void *tfab__freelist_get(struct tfab_freelist *fl)
{
	void *item = fl->free;

	if (!item) {
		size_t s = stride(fl);
		char *c = calloc(1, ALIGN + (size_t)fl->per_chunk * s);

		if (!c)
			return NULL;
		memcpy(c, &fl->chunks, sizeof(fl->chunks));
		fl->chunks = c;
		for (unsigned i = fl->per_chunk; i-- > 0;)
			tfab__freelist_put(fl, c + ALIGN + (size_t)i * s);
		item = fl->free;
	}
	memcpy(&fl->free, item, sizeof(fl->free));
	return item;
}

void tfab__freelist_fini(struct tfab_freelist *fl)
{
	while (fl->chunks) {
		void *c = fl->chunks;

		memcpy(&fl->chunks, c, sizeof(fl->chunks));
		free(c);
	}
	fl->free = NULL;
}
