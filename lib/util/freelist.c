/* The chunked free list of fixed-size items. */
#include <errno.h>
#include <stdalign.h>
#include <stdlib.h>

#include "util/freelist.h"

#define ALIGN alignof(max_align_t)

static size_t stride(const struct tfab_freelist *fl)
{
	return (fl->item_size + ALIGN - 1) / ALIGN * ALIGN;
}

int tfab__freelist_grow(struct tfab_freelist *fl)
{
	size_t s = stride(fl);
	char *c = calloc(1, ALIGN + (size_t)fl->per_chunk * s);

	if (!c)
		return -ENOMEM;
	memcpy(c, &fl->chunks, sizeof(fl->chunks));
	fl->chunks = c;
	for (unsigned i = fl->per_chunk; i-- > 0;)
		tfab__freelist_put(fl, c + ALIGN + (size_t)i * s);
	return 0;
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
