/*
 * An intrusive chained hash table keyed by a 64-bit hash that the caller computes; the caller
 * compares full keys while walking a chain. It grows at load factor 1 and never shrinks.
 */
#ifndef TFAB_UTIL_HASH_H
#define TFAB_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

struct tfab_hnode {
	struct tfab_hnode *next;
	uint64_t hash;
};

struct tfab_htable {
	struct tfab_hnode **buckets;
	size_t nbuckets; /* a power of two */
	size_t count;
};

/* FNV-1a over len bytes, continuing from seed (0 to start). */
static inline uint64_t tfab__hash_bytes(const void *p, size_t len, uint64_t seed)
{
	const unsigned char *b = p;
	uint64_t h = seed ? seed : 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

int tfab__htable_init(struct tfab_htable *t, size_t initial);
void tfab__htable_fini(struct tfab_htable *t);
/* fini, first freeing every node: each must be the first member of an object from malloc. */
void tfab__htable_fini_free(struct tfab_htable *t);
/* Insert n under hash; -ENOMEM only if growing failed and the table is full past 8x. */
int tfab__htable_insert(struct tfab_htable *t, struct tfab_hnode *n, uint64_t hash);
void tfab__htable_remove(struct tfab_htable *t, struct tfab_hnode *n);

/* Walk the nodes that may have this hash: for (n = first(t, h); n; n = next(n, h)). */
static inline struct tfab_hnode *tfab__htable_next(struct tfab_hnode *n, uint64_t hash)
{
	for (n = n->next; n && n->hash != hash; n = n->next)
		;
	return n;
}

static inline struct tfab_hnode *tfab__htable_first(const struct tfab_htable *t, uint64_t hash)
{
	struct tfab_hnode *n = t->buckets[hash & (t->nbuckets - 1)];

	while (n && n->hash != hash)
		n = n->next;
	return n;
}

#endif
