/* The intrusive hash table. */
#include <errno.h>
#include <stdlib.h>

#include "util/hash.h"

int tfab__htable_init(struct tfab_htable *t, size_t initial)
{
	size_t n = 16;

	while (n < initial)
		n <<= 1;
	t->buckets = calloc(n, sizeof(*t->buckets));
	if (!t->buckets)
		return -ENOMEM;
	t->nbuckets = n;
	t->count = 0;
	return 0;
}

void tfab__htable_fini(struct tfab_htable *t)
{
	free(t->buckets);
	t->buckets = NULL;
	t->nbuckets = t->count = 0;
}

void tfab__htable_fini_free(struct tfab_htable *t)
{
	for (size_t i = 0; t->buckets && i < t->nbuckets; i++) {
		struct tfab_hnode *n = t->buckets[i], *next;

		for (; n; n = next) {
			next = n->next;
			free(n);
		}
	}
	tfab__htable_fini(t);
}

static void grow(struct tfab_htable *t)
{
	size_t n = t->nbuckets * 2;
	struct tfab_hnode **b = calloc(n, sizeof(*b));

	if (!b)
		return; /* keep chaining in the old table */
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct tfab_hnode *node = t->buckets[i], *next;

		for (; node; node = next) {
			next = node->next;
			node->next = b[node->hash & (n - 1)];
			b[node->hash & (n - 1)] = node;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
}

int tfab__htable_insert(struct tfab_htable *t, struct tfab_hnode *n, uint64_t hash)
{
	struct tfab_hnode **b;

	if (t->count >= t->nbuckets)
		grow(t);
	if (t->count >= t->nbuckets * 8)
		return -ENOMEM;
	n->hash = hash;
	b = &t->buckets[hash & (t->nbuckets - 1)];
	n->next = *b;
	*b = n;
	t->count++;
	return 0;
}

void tfab__htable_remove(struct tfab_htable *t, struct tfab_hnode *n)
{
	struct tfab_hnode **pp = &t->buckets[n->hash & (t->nbuckets - 1)];

	for (; *pp; pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			n->next = NULL;
			t->count--;
			return;
		}
	}
}
