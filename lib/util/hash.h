/*
 * An intrusive chained hash table keyed by a 64-bit hash that the caller computes; the caller
 * compares full keys while walking a chain. It grows at load factor 1 and never shrinks.
 */
#ifndef TFAB_UTIL_HASH_H
#define TFAB_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct tfab_hnode {
	struct tfab_hnode *next;
	uint64_t hash;
};

struct tfab_htable {
	struct tfab_hnode **buckets;
	size_t nbuckets; /* a power of two */
	size_t count;
};

/*
 * A hash of len bytes, continuing from seed (0 to start): eight bytes a step, each folded in
 * by a multiply and a shift, then murmur3's 64-bit finaliser, so that the low bits a table
 * masks depend on every byte. Byte-at-a-time FNV-1a cost a dependent multiply per byte: a
 * 100-byte key (a TensorFlow rendezvous key) took about 400 cycles, several times per send.
 * Not keyed: the tables compare full keys, and a peer that makes colliding keys slows only its
 * own chains (as with FNV).
 */
static inline uint64_t tfab__hash_mix(uint64_t h, uint64_t w)
{
	h = (h ^ w) * 0x9e3779b97f4a7c15ull;
	return h ^ (h >> 32);
}

static inline uint64_t tfab__hash_bytes(const void *p, size_t len, uint64_t seed)
{
	const unsigned char *b = p;
	uint64_t h = tfab__hash_mix(seed ? seed : 0xcbf29ce484222325ull, len), w;

	for (; len >= 8; b += 8, len -= 8) {
		memcpy(&w, b, 8);
		h = tfab__hash_mix(h, w);
	}
	/* The last 1 to 7 bytes in at most two loads (overlapping: the length is in h already). */
	if (len >= 4) {
		uint32_t lo, hi;

		memcpy(&lo, b, 4);
		memcpy(&hi, b + len - 4, 4);
		h = tfab__hash_mix(h, (uint64_t)hi << 32 | lo);
	} else if (len) {
		h = tfab__hash_mix(h, (uint64_t)b[0] | (uint64_t)b[len / 2] << 8 |
					  (uint64_t)b[len - 1] << 16);
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 33);
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
