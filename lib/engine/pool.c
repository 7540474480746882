/*
 * The registered pool for library-allocated destinations (see pool.h).
 *
 * Blocks come in power-of-two classes from 4 KiB; class k holds 4 KiB << k bytes. Each class
 * has a LIFO free list (push and pop O(1)). A chained hash keyed by block address maps the
 * pointer handed to the caller back to its block in O(1) on average; the block itself carries
 * no header, since all of it is the tensor. The free lists, the hash and the counters are under
 * the pool's mutex, because tfab__pool_free runs on any thread. Provider calls (register,
 * deregister) happen only in alloc, mr, trim and destroy, which the engine serialises, and
 * never with the mutex held.
 *
 * A block is registered on each endpoint (path) it goes to, lazily: on the one alloc names,
 * and on another when tfab__pool_mr first asks for it there, so one block can serve peers on
 * different paths. Where an endpoint offers memory its peers write with one copy (mem_alloc),
 * blocks come from there.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include <tfab/status.h>

#include "cuda/cuda.h"
#include "engine/pool.h"
#include "util/list.h"
#include "util/log.h"

#define SUBSYS "pool"

#define POOL_MIN_SHIFT 12
#define POOL_NCLASSES ((int)(sizeof(size_t) * 8) - POOL_MIN_SHIFT)
#define POOL_ACCESS (TFAB_MR_REMOTE_WRITE | TFAB_MR_LOCAL_WRITE)

struct pool_block {
	void *buf;
	size_t size;
	int cls;
	bool out;			    /* handed out; else on its free list */
	bool shared;			    /* from the mem_alloc endpoint, else from the heap */
	bool pinned;			    /* for GPU copies, by the pool's copier */
	bool pin_tried;			    /* pinning was asked for (and failed, unless pinned) */
	struct tfab_mr *mr[TFAB_MAX_PATHS]; /* per endpoint, NULL until used there */
	struct pool_block *next;	    /* free list, or trim's victims */
	struct pool_block *hnext;	    /* hash */
	/* its holder's (tfab__pool_alloc_owned) while out */
	_Alignas(max_align_t) unsigned char owner[TFAB_POOL_OWNER_BYTES];
};

struct tfab_pool {
	struct tfab_ep *eps[TFAB_MAX_PATHS];
	unsigned neps;
	struct tfab_ep *mem_ep; /* where blocks come from, or NULL for the heap */
	size_t max_cached;
	size_t align;
	struct tfab_cuda *cuda; /* the copier that pinned blocks, once one was pinned */

	pthread_mutex_t lock; /* everything below */
	struct pool_block *free_list[POOL_NCLASSES];
	struct pool_block **buckets;
	size_t nbuckets; /* a power of two */
	size_t nblocks;
	/*
	 * Discarded blocks (tfab__pool_discard): deregistered, but their memory kept to the end,
	 * since a fabric may honour a region's key after it is closed (libfabric's registration
	 * cache, verbs' lazy deregistration) and a late write must land nowhere that is in use.
	 */
	struct pool_block *quarantine;
	struct tfab_pool_stats st;
};

/* The class of a request, or -1 when it is too large for any. */
static int size_class(size_t len)
{
	int k = 0;

	while (k < POOL_NCLASSES && ((size_t)1 << (POOL_MIN_SHIFT + k)) < len)
		k++;
	return k < POOL_NCLASSES ? k : -1;
}

static size_t hash_buf(const void *buf, size_t nbuckets)
{
	uint64_t x = (uint64_t)(uintptr_t)buf >> POOL_MIN_SHIFT;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (size_t)x & (nbuckets - 1);
}

/* Lock held. Grows the table so one more block fits; the only allocation under the lock. */
static int hash_reserve(struct tfab_pool *p)
{
	struct pool_block **nb, *b, *next;
	size_t n, i, h;

	if (p->nblocks + 1 <= p->nbuckets)
		return 0;
	n = p->nbuckets * 2;
	nb = calloc(n, sizeof(*nb));
	if (!nb)
		return -ENOMEM;
	for (i = 0; i < p->nbuckets; i++) {
		for (b = p->buckets[i]; b; b = next) {
			next = b->hnext;
			h = hash_buf(b->buf, n);
			b->hnext = nb[h];
			nb[h] = b;
		}
	}
	free(p->buckets);
	p->buckets = nb;
	p->nbuckets = n;
	return 0;
}

static void hash_add(struct tfab_pool *p, struct pool_block *b)
{
	size_t h = hash_buf(b->buf, p->nbuckets);

	b->hnext = p->buckets[h];
	p->buckets[h] = b;
	p->nblocks++;
}

static struct pool_block *hash_find(struct tfab_pool *p, const void *buf)
{
	struct pool_block *b;

	for (b = p->buckets[hash_buf(buf, p->nbuckets)]; b; b = b->hnext)
		if (b->buf == buf)
			return b;
	return NULL;
}

static void hash_del(struct tfab_pool *p, struct pool_block *b)
{
	struct pool_block **pp = &p->buckets[hash_buf(b->buf, p->nbuckets)];

	while (*pp != b)
		pp = &(*pp)->hnext;
	*pp = b->hnext;
	p->nblocks--;
}

/* Not under the lock: the block is in no list or table. */
static void block_release(struct tfab_pool *p, struct pool_block *b)
{
	for (unsigned i = 0; i < p->neps; i++) {
		int rc = b->mr[i] ? p->eps[i]->ops->mr_dereg(b->mr[i]) : 0;

		if (rc)
			TFAB_WARN(SUBSYS, "deregistering a %zu-byte block: %s", b->size,
				  tfab_strerror(rc));
	}
	if (b->pinned)
		tfab__cuda_unpin(p->cuda, b->buf);
	if (b->shared)
		p->mem_ep->ops->mem_free(p->mem_ep, b->buf, b->size);
	else
		free(b->buf);
	free(b);
}

/* The block's region on endpoint i, registering it there first (engine lock held). */
static int block_mr(struct tfab_pool *p, struct pool_block *b, unsigned i, struct tfab_mr **mr_p)
{
	int rc;

	if (i >= p->neps)
		return -EINVAL;
	if (!b->mr[i]) {
		rc = p->eps[i]->ops->mr_reg(p->eps[i], b->buf, b->size, POOL_ACCESS, &b->mr[i]);
		if (rc)
			return rc;
		pthread_mutex_lock(&p->lock);
		p->st.registrations++;
		pthread_mutex_unlock(&p->lock);
	}
	*mr_p = b->mr[i];
	return 0;
}

int tfab__pool_create(struct tfab_ep *const *eps, unsigned neps, size_t max_cached,
		      struct tfab_pool **pool_p)
{
	struct tfab_pool *p;
	long pg;
	int rc;

	if (!eps || neps < 1 || neps > TFAB_MAX_PATHS || !pool_p)
		return -EINVAL;
	for (unsigned i = 0; i < neps; i++)
		if (!eps[i] || !eps[i]->ops->mr_reg || !eps[i]->ops->mr_dereg)
			return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p) {
		rc = -ENOMEM;
		goto err_pool;
	}
	p->nbuckets = 64;
	p->buckets = calloc(p->nbuckets, sizeof(*p->buckets));
	if (!p->buckets) {
		rc = -ENOMEM;
		goto err_buckets;
	}
	rc = -pthread_mutex_init(&p->lock, NULL);
	if (rc)
		goto err_lock;
	pg = sysconf(_SC_PAGESIZE);
	p->align = (pg > 0 && !(pg & (pg - 1))) ? (size_t)pg : 4096;
	for (unsigned i = 0; i < neps; i++) {
		p->eps[i] = eps[i];
		if (!p->mem_ep && eps[i]->ops->mem_alloc && eps[i]->ops->mem_free)
			p->mem_ep = eps[i];
	}
	p->neps = neps;
	p->max_cached = max_cached;
	*pool_p = p;
	return 0;

err_lock:
	free(p->buckets);
err_buckets:
	free(p);
err_pool:
	return rc;
}

int tfab__pool_destroy(struct tfab_pool *p)
{
	struct pool_block *b, *next;
	int k;

	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	if (p->st.blocks_out) {
		pthread_mutex_unlock(&p->lock);
		return -EBUSY;
	}
	pthread_mutex_unlock(&p->lock);
	/* Nothing is out, so no other thread can still be freeing into the pool. */
	for (k = 0; k < POOL_NCLASSES; k++) {
		for (b = p->free_list[k]; b; b = next) {
			next = b->next;
			block_release(p, b);
		}
	}
	for (b = p->quarantine; b; b = next) {
		next = b->next;
		block_release(p, b);
	}
	pthread_mutex_destroy(&p->lock);
	free(p->buckets);
	free(p);
	return 0;
}

int tfab__pool_alloc(struct tfab_pool *p, unsigned path, size_t len, void **buf_p,
		     struct tfab_mr **mr_p)
{
	return tfab__pool_alloc_owned(p, path, len, buf_p, mr_p, NULL);
}

int tfab__pool_alloc_owned(struct tfab_pool *p, unsigned path, size_t len, void **buf_p,
			   struct tfab_mr **mr_p, void **owner_p)
{
	struct pool_block *b;
	int cls, rc;

	if (!p || !buf_p || path >= p->neps)
		return -EINVAL;
	cls = size_class(len);
	if (cls < 0)
		return -ENOMEM;

	pthread_mutex_lock(&p->lock);
	b = p->free_list[cls];
	if (b) {
		p->free_list[cls] = b->next;
		b->next = NULL;
		b->out = true;
		p->st.bytes_cached -= b->size;
		p->st.blocks_out++;
		p->st.allocs++;
		p->st.reuses++;
		pthread_mutex_unlock(&p->lock);
		if (mr_p && (rc = block_mr(p, b, path, mr_p)) != 0) {
			tfab__pool_free(p, b->buf);
			return rc;
		}
		*buf_p = b->buf;
		if (owner_p)
			*owner_p = b->owner;
		return 0;
	}
	pthread_mutex_unlock(&p->lock);

	b = calloc(1, sizeof(*b));
	if (!b) {
		rc = -ENOMEM;
		goto err_block;
	}
	b->cls = cls;
	b->size = (size_t)1 << (POOL_MIN_SHIFT + cls);
	if (p->mem_ep) {
		rc = p->mem_ep->ops->mem_alloc(p->mem_ep, b->size, &b->buf);
		b->shared = rc == 0;
	} else {
		rc = -posix_memalign(&b->buf, p->align, b->size);
	}
	if (rc) {
		TFAB_ERROR(SUBSYS, "allocating a %zu-byte block: %s", b->size, tfab_strerror(rc));
		goto err_mem;
	}
	if (mr_p) {
		rc = block_mr(p, b, path, mr_p);
		if (rc)
			goto err_reg;
	}

	pthread_mutex_lock(&p->lock);
	rc = hash_reserve(p);
	if (rc) {
		pthread_mutex_unlock(&p->lock);
		goto err_reg;
	}
	b->out = true;
	hash_add(p, b);
	p->st.blocks_out++;
	p->st.allocs++;
	pthread_mutex_unlock(&p->lock);
	*buf_p = b->buf;
	if (owner_p)
		*owner_p = b->owner;
	return 0;

err_reg:
	block_release(p, b);
	return rc;
err_mem:
	free(b);
err_block:
	return rc;
}

/*
 * With the lock held: whether b, the block of buf (NULL where buf is none of ours), is handed
 * out; where it is not, the lock is dropped and the misuse logged once, here.
 */
static bool block_out(struct tfab_pool *p, struct pool_block *b, const void *buf, const char *what)
{
	if (b && b->out)
		return true;
	pthread_mutex_unlock(&p->lock);
	TFAB_ERROR(SUBSYS, "%p is %s; not %s", buf,
		   b ? "already free (freed twice?)" : "not a block of this pool", what);
	return false;
}

/* With the lock taken, the handed-out block of buf; on NULL the lock is dropped (block_out). */
static struct pool_block *lock_block_out(struct tfab_pool *p, void *buf, const char *what)
{
	struct pool_block *b;

	pthread_mutex_lock(&p->lock);
	b = hash_find(p, buf);
	return block_out(p, b, buf, what) ? b : NULL;
}

/* b, out, back on its free list; the lock held, and dropped here. */
static void block_put_unlock(struct tfab_pool *p, struct pool_block *b)
{
	b->out = false;
	b->next = p->free_list[b->cls];
	p->free_list[b->cls] = b;
	p->st.bytes_cached += b->size;
	p->st.blocks_out--;
	pthread_mutex_unlock(&p->lock);
}

void tfab__pool_free(struct tfab_pool *p, void *buf)
{
	struct pool_block *b;

	if (!p || !buf || !(b = lock_block_out(p, buf, "freed")))
		return;
	block_put_unlock(p, b);
}

void tfab__pool_free_owned(struct tfab_pool *p, void *owner)
{
	struct pool_block *b;

	if (!p || !owner)
		return;
	b = tfab_container_of(owner, struct pool_block, owner);
	pthread_mutex_lock(&p->lock);
	if (block_out(p, b, b->buf, "freed"))
		block_put_unlock(p, b);
}

void tfab__pool_trim(struct tfab_pool *p)
{
	struct pool_block *victims = NULL, *b;
	int k = POOL_NCLASSES - 1;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	while (p->st.bytes_cached > p->max_cached) {
		while (k >= 0 && !p->free_list[k])
			k--;
		if (k < 0)
			break; /* not reached: bytes_cached counts listed blocks */
		b = p->free_list[k];
		p->free_list[k] = b->next;
		hash_del(p, b);
		p->st.bytes_cached -= b->size;
		b->next = victims;
		victims = b;
	}
	pthread_mutex_unlock(&p->lock);
	/* Out of every list and table: a concurrent free of these pointers is a foreign one. */
	while (victims) {
		b = victims;
		victims = b->next;
		block_release(p, b);
	}
}

void tfab__pool_get_stats(struct tfab_pool *p, struct tfab_pool_stats *s)
{
	if (!p) {
		*s = (struct tfab_pool_stats){0};
		return;
	}
	pthread_mutex_lock(&p->lock);
	*s = p->st;
	pthread_mutex_unlock(&p->lock);
}

void tfab__pool_discard(struct tfab_pool *p, void *buf)
{
	struct pool_block *b;

	if (!p || !buf || !(b = lock_block_out(p, buf, "discarded")))
		return;
	hash_del(p, b);
	p->st.blocks_out--;
	p->st.bytes_quarantined += b->size;
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->neps; i++) {
		int rc = b->mr[i] ? p->eps[i]->ops->mr_dereg(b->mr[i]) : 0;

		if (rc)
			TFAB_WARN(SUBSYS, "deregistering a discarded %zu-byte block: %s", b->size,
				  tfab_strerror(rc));
		b->mr[i] = NULL;
	}
	pthread_mutex_lock(&p->lock);
	b->next = p->quarantine;
	p->quarantine = b;
	pthread_mutex_unlock(&p->lock);
}

int tfab__pool_mr(struct tfab_pool *p, void *buf, unsigned path, struct tfab_mr **mr_p)
{
	struct pool_block *b;

	if (!p || !buf || !mr_p || !(b = lock_block_out(p, buf, "registered")))
		return -EINVAL;
	pthread_mutex_unlock(&p->lock);
	return block_mr(p, b, path, mr_p);
}

void tfab__pool_pin(struct tfab_pool *p, void *buf, struct tfab_cuda *cu)
{
	struct pool_block *b;
	bool tried;

	if (!p || !buf || !cu || !(b = lock_block_out(p, buf, "pinned")))
		return;
	/*
	 * A block larger than the cache keeps is released when it comes back: pinning it would
	 * cost a page walk (and one back) for every tensor, more than the pageable copy loses.
	 */
	tried = b->pin_tried || b->size > p->max_cached;
	b->pin_tried = true;
	pthread_mutex_unlock(&p->lock);
	if (tried)
		return;
	/* Out of the mutex: pinning walks the pages. The engine lock keeps b ours. */
	if (tfab__cuda_pin(cu, b->buf, b->size) != 0)
		return;
	pthread_mutex_lock(&p->lock);
	p->cuda = cu;
	b->pinned = true;
	p->st.pins++;
	pthread_mutex_unlock(&p->lock);
}
