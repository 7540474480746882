/*
 * The registered pool for destinations the library allocates (handed to the caller as a
 * DLManagedTensor whose deleter returns the block). Blocks come in power-of-two size classes
 * from 4 KiB, each registered once for remote writes and kept on a free list for reuse, up to
 * a bound of cached bytes.
 *
 * Threads: tfab__pool_free may be called from any thread (a DLPack deleter) and never calls
 * the provider; every other function is called under the engine's lock, and only they
 * register or deregister.
 */
#ifndef TFAB_ENGINE_POOL_H
#define TFAB_ENGINE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "providers/provider.h"

struct tfab_cuda;
struct tfab_pool;

struct tfab_pool_stats {
	uint64_t allocs;	    /* blocks handed out */
	uint64_t reuses;	    /* of which came from a free list */
	uint64_t registrations;	    /* calls of ops->mr_reg */
	uint64_t blocks_out;	    /* handed out and not yet freed */
	uint64_t bytes_cached;	    /* in free blocks, still registered */
	uint64_t bytes_quarantined; /* discarded: kept, never reused, until the pool ends */
	uint64_t pins; /* pinnings for GPU copies (tfab__pool_pin), each block's once */
};

/*
 * A pool over the context's endpoints (eps[0..neps), one per path; blocks come from the first
 * that has mem_alloc, else the heap). max_cached: bytes of free blocks kept registered; more
 * is released.
 */
int tfab__pool_create(struct tfab_ep *const *eps, unsigned neps, size_t max_cached,
		      struct tfab_pool **pool_p);

/* Deregisters and frees everything. -EBUSY (nothing done) while blocks are out. */
int tfab__pool_destroy(struct tfab_pool *p);

/*
 * A block of at least len bytes (len 0 gets the smallest block), page-aligned, with its
 * registration on endpoint `path` (an index into the create's eps; remote writes allowed),
 * unless mr_p is NULL. Outputs are written only on success.
 */
int tfab__pool_alloc(struct tfab_pool *p, unsigned path, size_t len, void **buf_p,
		     struct tfab_mr **mr_p);

/*
 * Bytes kept with each block for its holder (tfab__pool_alloc_owned): the DLManagedTensor a
 * receive hands the block out in, so that it costs no allocation of its own.
 */
#define TFAB_POOL_OWNER_BYTES 384

/*
 * tfab__pool_alloc, and *owner_p: TFAB_POOL_OWNER_BYTES of storage (suitably aligned) that go
 * with the block while it is out; tfab__pool_free_owned(owner) returns the block.
 */
int tfab__pool_alloc_owned(struct tfab_pool *p, unsigned path, size_t len, void **buf_p,
			   struct tfab_mr **mr_p, void **owner_p);

/* A handed-out block's registration on endpoint `path`, made there at its first use. */
int tfab__pool_mr(struct tfab_pool *p, void *buf, unsigned path, struct tfab_mr **mr_p);

/*
 * Pin a handed-out block for copies between it and a GPU (a proxy of a GPU tensor), at its
 * first such use; it stays pinned, free or out, until it is released. cu is the context's
 * copier, the same for every call. Where pinning fails the block serves unpinned, and it is
 * not tried again; a block larger than the cache's bound (released when it comes back) is
 * not pinned. Engine lock held.
 */
void tfab__pool_pin(struct tfab_pool *p, void *buf, struct tfab_cuda *cu);

/* Return a block from tfab__pool_alloc. Any thread; does not deregister. */
void tfab__pool_free(struct tfab_pool *p, void *buf);

/*
 * Return the block whose holder's storage is owner (tfab__pool_alloc_owned), without looking
 * its address up. Any thread; owner is the pool's again on return.
 */
void tfab__pool_free_owned(struct tfab_pool *p, void *owner);

/*
 * Take a block out of use for good instead of returning it (engine lock held): a peer may
 * still write into it. It is deregistered now, and its memory kept, never reused, until the
 * pool is destroyed (a fabric may honour a closed region's key for a while).
 */
void tfab__pool_discard(struct tfab_pool *p, void *buf);

/* Deregister and free returned blocks beyond the bound (engine lock held). */
void tfab__pool_trim(struct tfab_pool *p);

void tfab__pool_get_stats(struct tfab_pool *p, struct tfab_pool_stats *s);

#endif
