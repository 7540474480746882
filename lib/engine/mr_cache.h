/*
 * The registration cache for caller-provided buffers (source tensors, caller destinations):
 * register once, reuse while the memory stays registered, bounded in entries, with explicit
 * invalidation. Regions are registered page-aligned around what was asked, so a later lookup
 * inside a registered span is a hit. Not thread-safe: the engine calls it under its lock.
 */
#ifndef TFAB_ENGINE_MR_CACHE_H
#define TFAB_ENGINE_MR_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "providers/provider.h"

struct tfab_mr_cache;

struct tfab_mr_cache_stats {
	uint64_t hits;
	uint64_t misses;
	uint64_t registrations; /* calls of ops->mr_reg */
	uint64_t evictions;	/* registrations dropped to stay under the bound */
	uint64_t entries;	/* live now */
};

int tfab__mr_cache_create(const struct tfab_provider_ops *ops, struct tfab_ep *ep,
			  size_t max_entries, struct tfab_mr_cache **cache_p);

/* Deregisters every entry. -EBUSY (and nothing done) while an entry is in use. */
int tfab__mr_cache_destroy(struct tfab_mr_cache *c);

/*
 * A registration covering [addr, addr + len) with at least `access` (TFAB_MR_*), registering
 * one if needed; it stays in use (never evicted or deregistered) until tfab__mr_cache_put.
 * The offset of addr inside it is addr - (*mr_p)->addr. len 0 is -EINVAL.
 */
int tfab__mr_cache_get(struct tfab_mr_cache *c, void *addr, size_t len, unsigned access,
		       struct tfab_mr **mr_p);

/* Release one use of a registration returned by get. */
void tfab__mr_cache_put(struct tfab_mr_cache *c, struct tfab_mr *mr);

/*
 * Forget every registration overlapping [addr, addr + len): unused ones are deregistered now,
 * ones in use when their last user puts them (and no later get returns them). Returns how
 * many were dropped or marked.
 */
int tfab__mr_cache_invalidate(struct tfab_mr_cache *c, const void *addr, size_t len);

void tfab__mr_cache_get_stats(const struct tfab_mr_cache *c, struct tfab_mr_cache_stats *s);

#endif
